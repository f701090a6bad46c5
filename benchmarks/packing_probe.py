"""Padding-free packing for reward-model training: a prototype outside the package, and what it would gain.

Three layouts of the same batches of real pairs (chosen and rejected sequences of 16 pairs), one training
step each (forward, Bradley-Terry loss, backward, AdamW) of the same random-init Qwen2-shaped reward model,
in a plain loop (no Trainer), variants alternating, medians over rounds:
  random padded    random batches, each padded to its longest sequence (what TRL's RewardTrainer does);
  grouped padded   length-grouped batches (w2s_shift.training.LengthGroupedPairSampler), padded;
  grouped packed   the same batches with no padding: the 2B sequences first-fit-decreasing packed into rows
                   of at most max_length tokens, ``position_ids`` restarting at 0 for each sequence and no
                   attention mask, so transformers builds a block-diagonal causal mask (masking_utils
                   ``find_packed_sequence_indices``; SDPA and eager attention); the reward is read at each
                   sequence's last token;
  ... prompt shared the same packing with each pair as one segment [prompt | chosen | rejected]: the prompt
                   is computed once (4D mask hides the chosen response from the rejected one; the rejected
                   response's positions continue from the prompt). UltraFeedback pairs up to 1024 tokens: the
                   shared prompt is 20% of all tokens.
Before timing, the packed rewards are checked against the padded ones (float32, same weights).

    .venv/bin/python benchmarks/packing_probe.py            # about 2 minutes on 2 quiet cores
    .venv/bin/python benchmarks/packing_probe.py --smoke
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", category=FutureWarning)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=4, help="batches per variant per round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--tokenizer", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    return ap


def pack_rows(lengths: list, capacity: int) -> list:
    """First-fit-decreasing rows (the package's :func:`w2s_shift.models.reward_model.pack_sequences`, which grew
    out of this prototype)."""
    from w2s_shift.models.reward_model import pack_sequences

    return pack_sequences(lengths, capacity)


def padded_batch(seqs: list, pad_id: int) -> dict:
    from w2s_shift.inference import pad_sequences

    ids, am = pad_sequences(seqs, pad_id)
    return {"input_ids": ids, "attention_mask": am, "last": (torch.arange(len(seqs)), am.sum(1) - 1)}


def packed_batch(seqs: list, pad_id: int, capacity: int) -> dict:
    """Rows of packed sequences: input_ids and position_ids (R, L); ``last`` = (row, position) of each
    sequence's last token, in the order of ``seqs``."""
    rows = pack_rows([len(s) for s in seqs], capacity)
    width = max(sum(len(seqs[i]) for i in r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    row_of, end_of = [0] * len(seqs), [0] * len(seqs)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = len(seqs[i])
            ids[r, at : at + n] = torch.tensor(seqs[i])
            pos[r, at : at + n] = torch.arange(n)
            row_of[i], end_of[i] = r, at + n - 1
            at += n
        if at < width:  # the row's tail: a dummy sequence of its own (positions restart), never read
            pos[r, at:] = torch.arange(width - at)
    return {"input_ids": ids, "position_ids": pos, "last": (torch.tensor(row_of), torch.tensor(end_of))}


def shared_prefix(pair) -> int:
    """Length of the prompt the chosen and rejected sequences share token for token (0 when truncation made
    them differ): the tokens before the first response token of both."""
    c, r = pair.chosen, pair.rejected
    p = c.response_mask.index(1) if 1 in c.response_mask else 0
    if p == 0 or r.response_mask.index(1) != p or c.input_ids[:p] != r.input_ids[:p]:
        return 0
    return p


def shared_batch(pairs: list, pad_id: int, capacity: int) -> dict:
    """Packed rows where each pair is one segment [prompt | chosen response | rejected response]: the prompt
    is computed once. Positions of the rejected response continue from the prompt; a 4D boolean mask
    (R, 1, L, L) is causal inside a segment, closed between segments, and hides the chosen response from the
    rejected one. ``last``: (row, position) of the chosen then the rejected sequences' last tokens."""
    segs = []  # per segment: pieces (token ids, first position, kind 0 prompt / 1 chosen / 2 rejected)
    for p in pairs:
        n = shared_prefix(p)
        c, r = p.chosen.input_ids, p.rejected.input_ids
        if n:
            segs.append([(c[:n], 0, 0), (c[n:], n, 1), (r[n:], n, 2)])
        else:  # no shared prompt: two separate segments
            segs += [[(c, 0, 1)], [(r, 0, 2)]]
    lens = [sum(len(t) for t, _, _ in sg) for sg in segs]
    rows = pack_rows(lens, max(capacity, max(lens)))
    width = max(sum(lens[i] for i in r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    seg = torch.full((len(rows), width), -1, dtype=torch.long)
    part = torch.zeros((len(rows), width), dtype=torch.long)
    ends = {1: {}, 2: {}}
    for ri, members in enumerate(rows):
        at = 0
        for si in members:
            for toks, start, kind in segs[si]:
                n = len(toks)
                ids[ri, at : at + n] = torch.tensor(toks, dtype=torch.long)
                pos[ri, at : at + n] = torch.arange(start, start + n)
                seg[ri, at : at + n] = si
                part[ri, at : at + n] = kind
                at += n
                if kind:
                    ends[kind][si] = (ri, at - 1)
        if at < width:  # the tail: a dummy segment of its own, never read
            pos[ri, at:] = torch.arange(width - at)
            seg[ri, at:] = -2 - ri
    idx = torch.arange(width)
    same = seg[:, :, None] == seg[:, None, :]
    hide = (part[:, :, None] == 2) & (part[:, None, :] == 1)
    mask = (same & (idx[None, None, :] <= idx[None, :, None]) & ~hide)[:, None]
    last = [ends[1][si] for si in sorted(ends[1])] + [ends[2][si] for si in sorted(ends[2])]
    return {
        "input_ids": ids,
        "position_ids": pos,
        "attention_mask": mask,
        "last": (torch.tensor([x for x, _ in last]), torch.tensor([t for _, t in last])),
    }


def rewards(backbone, head, batch: dict) -> torch.Tensor:
    kw = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    h = backbone(**kw, use_cache=False).last_hidden_state
    r, t = batch["last"]
    return head(h[r, t].float()).squeeze(-1)


def step(backbone, head, opt, batch: dict, bf16: bool) -> None:
    with torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16, enabled=bf16):
        r = rewards(backbone, head, batch)
    b = r.shape[0] // 2
    loss = -F.logsigmoid(r[:b] - r[b:]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv: list | None = None) -> dict:
    a = build_parser().parse_args(argv)
    if a.smoke:
        a.rounds, a.batches, a.batch_size, a.max_length, a.hidden, a.layers = 1, 2, 4, 256, 32, 2
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    from w2s_shift.models.loading import load_tokenizer
    from w2s_shift.training import LengthGroupedPairSampler

    tok = load_tokenizer(a.tokenizer)
    pad = tok.pad_token_id
    n = a.batch_size * a.batches
    pairs = C.real_pairs(n * a.rounds, tok, a.max_length)
    config = C.decoder_config("qwen2", len(tok), a.hidden, a.layers, 4, 2, 4 * a.hidden, pad_token_id=pad)
    backbone = C.make_backbone(config, seed=0)
    head = torch.nn.Linear(a.hidden, 1, bias=False)

    def seqs_of(idx):
        return [pairs[i].chosen.input_ids for i in idx] + [pairs[i].rejected.input_ids for i in idx]

    # correctness: packed rewards equal padded rewards (float32), with every sequence packed into one row
    probe = seqs_of(range(min(4, len(pairs))))
    with torch.no_grad():
        ref = rewards(backbone, head, padded_batch(probe, pad))
        got = rewards(backbone, head, packed_batch(probe, pad, sum(len(s) for s in probe)))  # all in one row
        sharing = [p for p in pairs if shared_prefix(p)][:4] or pairs[:4]  # pairs whose prompt is shared, if any
        n_shared = sum(1 for p in sharing if shared_prefix(p))
        ref_s = rewards(
            backbone,
            head,
            padded_batch([p.chosen.input_ids for p in sharing] + [p.rejected.input_ids for p in sharing], pad),
        )
        got_shared = rewards(backbone, head, shared_batch(sharing, pad, 10**6))  # all in one row
    max_err = float(max((ref - got).abs().max(), (ref_s - got_shared).abs().max()))
    if not (torch.allclose(ref, got, atol=1e-4, rtol=1e-4) and torch.allclose(ref_s, got_shared, atol=1e-4, rtol=1e-4)):
        raise AssertionError(f"packed rewards differ from padded ones by up to {max_err}")

    layouts = {}
    for r in range(a.rounds):
        idx = list(range(r * n, (r + 1) * n))
        rnd = idx[:]
        random.Random(r).shuffle(rnd)
        lengths = [max(len(pairs[i].chosen.input_ids), len(pairs[i].rejected.input_ids)) for i in idx]
        order = [idx[k] for k in LengthGroupedPairSampler(lengths, a.batch_size, 16, r)]
        batches_rand = [rnd[k : k + a.batch_size] for k in range(0, n, a.batch_size)]
        batches_grp = [order[k : k + a.batch_size] for k in range(0, n, a.batch_size)]
        layouts.setdefault("random padded", []).append([padded_batch(seqs_of(b), pad) for b in batches_rand])
        layouts.setdefault("grouped padded", []).append([padded_batch(seqs_of(b), pad) for b in batches_grp])
        layouts.setdefault("grouped packed", []).append(
            [packed_batch(seqs_of(b), pad, a.max_length) for b in batches_grp]
        )
        layouts.setdefault("grouped packed, prompt shared", []).append(
            [shared_batch([pairs[i] for i in b], pad, 2 * a.max_length) for b in batches_grp]
        )

    real = {r: C.real_tokens([pairs[i] for i in range(r * n, (r + 1) * n)]) for r in range(a.rounds)}
    opt = torch.optim.AdamW(list(backbone.parameters()) + list(head.parameters()), lr=1e-5)
    step(backbone, head, opt, layouts["grouped padded"][0][0], a.bf16)  # warm-up
    times = {k: [] for k in layouts}
    names = list(layouts)
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            C._sync()
            t = time.perf_counter()
            for b in layouts[name][r]:
                step(backbone, head, opt, b, a.bf16)
            C._sync()
            times[name].append(time.perf_counter() - t)
            print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", file=sys.stderr, flush=True)

    base = names[0]
    rows, out_rows = [], []
    for name in names:
        positions = [sum(b["input_ids"].numel() for b in layouts[name][r]) for r in range(a.rounds)]
        pps = C.median([n / t for t in times[name]])
        speed = C.median([tb / t for t, tb in zip(times[name], times[base])])
        ratio = C.median([positions[r] / real[r] for r in range(a.rounds)])
        rows.append([name, f"{pps:.2f}", f"{100 * ratio:.0f}%", f"{speed:.2f}x"])
        out_rows.append(
            {"layout": name, "pairs_per_s": pps, "positions_pct_of_real_tokens": 100 * ratio, "speed_vs_random": speed}
        )
    print(
        f"\npacking probe: Qwen2-shaped random init (hidden {a.hidden}, {a.layers} layers), UltraFeedback real pairs, "
        f"batch {a.batch_size}, max {a.max_length} tokens, {'bf16 autocast' if a.bf16 else 'fp32'}, plain loop, "
        f"CPU {torch.get_num_threads()} threads; packed vs padded rewards max |diff| {max_err:.1e} (fp32; "
        f"{n_shared} pairs with a shared prompt in the check); "
        f"median of {a.rounds} rounds x {n} pairs"
    )
    print(C.markdown_table(["layout", "pairs/s", "positions computed / real tokens", "speed vs random padded"], rows))
    out = {
        "benchmark": "packing_probe",
        "args": vars(a),
        "env": C.environment(),
        "max_abs_reward_diff": max_err,
        "shared_pairs_checked": n_shared,
        "rows": out_rows,
    }
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

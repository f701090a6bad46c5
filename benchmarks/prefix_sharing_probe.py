"""Sharing the prompt's trunk states within a pair: the package's shared-prefix trunk pass against the plain one.

The default job's largest cost on a CPU is the student's frozen trunk over every sequence. A causal
decoder's states at a position depend only on the tokens before it, so the tokens a pair's chosen and rejected
sequences share at their start (the chat template's system prompt and, under rendering version 3, the whole
prompt) need computing once. The probe runs the frozen trunk of the quickstart's student (SmolLM2-135M, top 2 of
30 blocks cut off, float32) over real pairs of the default's ID test split two ways, alternating, medians over
rounds (the first round of each is also the check):

  full      ``compute_trunk_states`` (every sequence whole, token-budget batches: ``trunk_share_prefixes: false``);
  shared    ``compute_trunk_states(..., share_prefixes=True)`` (``trunk_share_prefixes: true``): each pair in one
            row, [shared prefix, chosen tail, rejected tail], the rejected tail at positions continuing the
            prefix and masked off the chosen tail, so the prefix runs once.

Before timing, the two are compared: every state must agree within float32 rounding (relative to the states'
scale; bfloat16 rounding with ``--bf16``). It prints the tokens each computes and their times.

    .venv/bin/python benchmarks/prefix_sharing_probe.py            # about 2 minutes on 2 quiet cores
    .venv/bin/python benchmarks/prefix_sharing_probe.py --smoke    # tiny random-init Llama, a check only
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import torch

warnings.filterwarnings("ignore", category=FutureWarning)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--bf16", action="store_true", help="trunk in bfloat16 (as bf16: auto on AMX / AVX512_BF16)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    return ap


def tokens_computed(seqs: list) -> int:
    """Tokens the shared-prefix pass runs through the trunk for ``seqs`` = [chosen..., rejected...]: per pair its
    common prefix once, then both tails."""
    from w2s_shift.inference import _pair_rows

    return sum(len(c) + len(r) - p for p, c, r in _pair_rows(seqs))


def main(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from w2s_shift.inference import compute_trunk_states
    from w2s_shift.models.reward_model import split_decoder

    if a.smoke:
        from transformers import LlamaConfig, LlamaModel

        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128,
        )  # fmt: skip
        backbone = LlamaModel(cfg).eval()
        g = torch.Generator().manual_seed(0)
        system = torch.randint(5, 64, (6,), generator=g).tolist()
        seqs_c, seqs_r = [], []
        for i in range(6):
            prompt = torch.randint(5, 64, (3 + i,), generator=g).tolist()
            seqs_c.append(system + prompt + torch.randint(5, 64, (2 + i % 3,), generator=g).tolist())
            seqs_r.append(system + prompt + torch.randint(5, 64, (4 + i % 2,), generator=g).tolist())
        seqs, pad_id, rounds = seqs_c + seqs_r, 0, 1
    else:
        from w2s_shift.config_io import load_config
        from w2s_shift.data.render import encode_pairs
        from w2s_shift.models.loading import load_backbone
        from w2s_shift.pipeline.prepare import prepare_data

        splits, _, _ = prepare_data(load_config("quickstart"))
        loaded = load_backbone("smollm2-135m")
        enc, _ = encode_pairs(splits["test"][: a.pairs], loaded.tokenizer, a.max_length)
        seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
        backbone, pad_id, rounds = loaded.backbone.eval(), loaded.tokenizer.pad_token_id or 0, a.rounds
    trunk, _ = split_decoder(backbone, 2 if not a.smoke else 1)
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    trunk.eval().to(dtype)
    times = {"full": [], "shared": []}
    t = time.perf_counter()
    full = compute_trunk_states(trunk, seqs, pad_id, dtype=dtype)
    times["full"].append(time.perf_counter() - t)
    t = time.perf_counter()
    shared = compute_trunk_states(trunk, seqs, pad_id, dtype=dtype, share_prefixes=True)
    computed = tokens_computed(seqs)
    times["shared"].append(time.perf_counter() - t)
    scale = max(float(s.abs().max()) for s in full)
    rel_diff = max(float((x - y).abs().max()) for x, y in zip(full, shared)) / scale
    if rel_diff > (1e-2 if a.bf16 else 1e-5):
        raise SystemExit(f"shared-prefix states differ from the full ones: {rel_diff:.3g} of their scale")
    for _ in range(rounds - 1):  # the checked pass above is the first round
        for name, fn in (
            ("full", lambda: compute_trunk_states(trunk, seqs, pad_id, dtype=dtype)),
            ("shared", lambda: compute_trunk_states(trunk, seqs, pad_id, dtype=dtype, share_prefixes=True)),
        ):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    total = sum(len(s) for s in seqs)
    med = {k: C.median(v) for k, v in times.items()}
    out = {
        "sequences": len(seqs),
        "tokens": total,
        "tokens_computed_shared": computed,
        "token_saving": 1 - computed / total,
        "max_rel_state_diff": rel_diff,
        "dtype": str(dtype),
        "seconds": med,
        "speedup": med["full"] / med["shared"] if med["shared"] else float("nan"),
        "environment": C.environment(),
    }
    print(
        C.markdown_table(
            ["variant", "tokens computed", "seconds (median)", "tokens/s of the full sequences"],
            [
                ["full", total, f"{med['full']:.1f}", f"{total / med['full']:.0f}"],
                ["shared prefixes", computed, f"{med['shared']:.1f}", f"{total / med['shared']:.0f}"],
            ],
        )
    )
    saving, speedup = 100 * out["token_saving"], out["speedup"]
    print(f"token saving {saving:.1f}%, speed-up {speedup:.2f}x, states agree to {rel_diff:.1e} of their scale")
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

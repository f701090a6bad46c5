"""Small isolated experiments on the CPU quickstart's costly parts (what would make the whole run faster).

Each experiment runs a few steps of one part of the quickstart with the real models (the offline presets) on
real pairs, variants in turn over rounds (medians), and prints one table:

  teacher step   MiniLM-L6 top 3 layers on cached trunk states, batch 16, 256 tokens, mean pooling (the
                 quickstart teacher): dropout off (current, ``disable_dropout``) vs BERT's 0.1, bf16 autocast
                 (current) vs float32, SDPA vs eager attention;
  collator       building a batch from cached bf16 trunk states (float32 inputs_embeds) vs float32 states;
  student trunk  the frozen SmolLM2-135M trunk (26 of 30 layers) forward over real sequences (192 tokens),
                 weights in bf16 (current) vs float32, in tokens/s;
  threads        the teacher step with 1 thread vs the default.

    .venv/bin/python benchmarks/quickstart_probe.py            # about 3 minutes on 2 quiet cores
    .venv/bin/python benchmarks/quickstart_probe.py --smoke    # tiny random models, seconds
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="teacher optimizer steps per variant per round")
    ap.add_argument("--trunk-seqs", type=int, default=48, help="sequences per student-trunk measurement")
    ap.add_argument("--teacher", default="minilm-l6")
    ap.add_argument("--student", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny random-init models (BERT and Llama), one round")
    return ap


def _tiny_models(tok):
    """Random-init stand-ins with the presets' structure (for --smoke): a 6-layer BERT and a 30-layer Llama."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=6,
            num_attention_heads=4,
            max_position_embeddings=512,
        ),
        add_pooling_layer=False,
    )
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=30,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    )
    return bert, llama


def _set_attn(module, impl: str) -> None:
    """Set the attention implementation on every config the module's layers read (a split head's layers keep
    their own copy of the config, so the top-level setter would not reach them)."""
    seen = set()
    for m in module.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and id(cfg) not in seen and hasattr(cfg, "_attn_implementation"):
            seen.add(id(cfg))
            cfg._attn_implementation = impl


def teacher_step(
    base_head, states, pairs, pad_id: int, steps: int, bf16: bool, attn: str, dropout: bool = False
) -> float:
    """Seconds per optimizer step of the quickstart teacher's training (split head on cached states);
    ``dropout``: keep the model's dropout (BERT: 0.1 on attention probabilities and hidden states)."""
    import copy

    from w2s_shift.models.reward_model import RewardModel, disable_dropout
    from w2s_shift.training import PairDataset

    head = copy.deepcopy(base_head)
    _set_attn(head, attn)
    model = RewardModel(head, head.config.hidden_size, pooling="mean")
    if not dropout:
        disable_dropout(model)
    n = 16 * steps
    sel = (
        states[:n]
        if states[0][0].dtype == (torch.bfloat16 if bf16 else torch.float32)
        else [
            (c.to(torch.bfloat16 if bf16 else torch.float32), r.to(torch.bfloat16 if bf16 else torch.float32))
            for c, r in states[:n]
        ]
    )
    cfg = C.our_config(epochs=1.0, batch_size=16, learning_rate=1e-4, warmup_ratio=0.1, bf16=bf16, seed=0)
    return C.train_ours(model, PairDataset(pairs[:n], [1.0] * n, sel), pad_id, cfg)["seconds"] / steps


def collator_ms(pairs, states, pad_id: int, dtype) -> float:
    """Milliseconds to collate one batch of 16 pairs with cached trunk states stored in ``dtype``."""
    from w2s_shift.training import PairCollator

    col = PairCollator(pad_id)
    items = [
        {"pair": p, "label": 1.0, "states": (c.to(dtype), r.to(dtype))} for p, (c, r) in zip(pairs[:16], states[:16])
    ]
    col(items)
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        col(items)
    return 1000 * (time.perf_counter() - t) / reps


def trunk_tokens_per_s(trunk, seqs, pad_id: int, dtype) -> float:
    from w2s_shift.inference import compute_trunk_states

    m = trunk.to(dtype)
    t = time.perf_counter()
    compute_trunk_states(m, seqs, pad_id, dtype=dtype)
    return sum(len(s) for s in seqs) / (time.perf_counter() - t)


def main(argv: list | None = None) -> dict:
    a = build_parser().parse_args(argv)
    if a.smoke:
        a.rounds, a.steps, a.trunk_seqs = 1, 1, 4
    import transformers

    transformers.logging.set_verbosity_error()
    from w2s_shift.inference import compute_trunk_states
    from w2s_shift.models.loading import load_backbone, load_tokenizer
    from w2s_shift.models.reward_model import split_decoder

    if a.smoke:
        tt = st = load_tokenizer(a.student)
        bert, llama = _tiny_models(tt)
    else:
        tl, sl = load_backbone(a.teacher), load_backbone(a.student)
        tt, st, bert, llama = tl.tokenizer, sl.tokenizer, tl.backbone, sl.backbone
    n = 16 * a.steps
    tpairs = C.real_pairs(n, tt, 256)
    trunk, head = split_decoder(bert, 3)
    tseqs = [p.chosen.input_ids for p in tpairs] + [p.rejected.input_ids for p in tpairs]
    flat = compute_trunk_states(trunk.to(torch.bfloat16), tseqs, tt.pad_token_id, dtype=torch.bfloat16)
    tstates = [(flat[i], flat[i + n]) for i in range(n)]
    spairs = C.real_pairs(a.trunk_seqs, st, 192, seed=1)
    sseqs = [p.chosen.input_ids for p in spairs]
    strunk, _ = split_decoder(llama, 4)
    threads = torch.get_num_threads()

    tv = [
        ("bf16 autocast, sdpa, no dropout (current)", True, "sdpa", threads, False),
        ("bf16 autocast, sdpa, dropout 0.1", True, "sdpa", threads, True),
        ("float32, sdpa, no dropout", False, "sdpa", threads, False),
        ("bf16 autocast, eager, no dropout", True, "eager", threads, False),
        ("bf16 autocast, sdpa, no dropout, 1 thread", True, "sdpa", 1, False),
    ]
    if threads == 1:
        tv = tv[:4]
    res = {name: [] for name, *_ in tv}
    res.update({"collate bf16 states": [], "collate float32 states": [], "trunk bf16": [], "trunk float32": []})
    teacher_step(head, tstates, tpairs, tt.pad_token_id, 1, True, "sdpa")  # warm-up
    for r in range(a.rounds):
        for name, bf16, attn, th, drop in tv if r % 2 == 0 else tv[::-1]:
            torch.set_num_threads(th)
            res[name].append(teacher_step(head, tstates, tpairs, tt.pad_token_id, a.steps, bf16, attn, drop))
            torch.set_num_threads(threads)
            print(f"round {r + 1} teacher {name}: {res[name][-1]:.2f} s/step", file=sys.stderr, flush=True)
        res["collate bf16 states"].append(collator_ms(tpairs, tstates, tt.pad_token_id, torch.bfloat16))
        res["collate float32 states"].append(collator_ms(tpairs, tstates, tt.pad_token_id, torch.float32))
        for dt, key in ((torch.bfloat16, "trunk bf16"), (torch.float32, "trunk float32")):
            res[key].append(trunk_tokens_per_s(strunk, sseqs, st.pad_token_id, dt))
            print(f"round {r + 1} {key}: {res[key][-1]:.0f} tokens/s", file=sys.stderr, flush=True)

    med = {k: C.median(v) for k, v in res.items()}
    cur = med[tv[0][0]]
    rows = [
        ["teacher step (16 pairs, 256 tok)", name, f"{med[name]:.2f} s/step", f"{cur / med[name]:.2f}x"]
        for name, *_ in tv
    ]
    rows += [
        [
            "collator (16 pairs)",
            "bf16 states -> float32 embeds (current)",
            f"{med['collate bf16 states']:.1f} ms/batch",
            "1.00x",
        ],
        [
            "collator (16 pairs)",
            "float32 states",
            f"{med['collate float32 states']:.1f} ms/batch",
            f"{med['collate bf16 states'] / med['collate float32 states']:.2f}x",
        ],
        [
            "student trunk forward (26 layers, 192 tok)",
            "bf16 weights (current)",
            f"{med['trunk bf16']:.0f} tokens/s",
            "1.00x",
        ],
        [
            "student trunk forward (26 layers, 192 tok)",
            "float32 weights",
            f"{med['trunk float32']:.0f} tokens/s",
            f"{med['trunk float32'] / med['trunk bf16']:.2f}x",
        ],
    ]
    print(
        "\nquickstart probes: "
        f"{'tiny random models (smoke)' if a.smoke else f'{a.teacher} teacher, {a.student} student'}, "
        f"real UltraFeedback pairs, CPU {threads} threads; median of {a.rounds} rounds"
    )
    print(C.markdown_table(["part", "variant", "time", "speed vs current"], rows))
    out = {"benchmark": "quickstart_probe", "args": vars(a), "env": C.environment(), "medians": med, "runs": res}
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

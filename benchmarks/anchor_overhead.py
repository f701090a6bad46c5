"""Benchmark 2: ANCHOR's cost over Naive W2S (time and peak memory), per way of getting the reference states.

ANCHOR (Le et al. 2026) adds lambda * MSE(student hidden, frozen-reference hidden) on response tokens. The
reference can be
  frozen copy        a copy of the backbone run forward every step (full fine-tuning; the usual way); the
                     package runs it under the trainer's bf16 autocast with its linear weights stored in bf16
                     once (``make_reference(autocast_bf16=True)``: bit-identical outputs, no per-step casts);
  frozen copy, fp32  the same copy with float32 weights cast by autocast at every step (the package before);
  adapter disabled   under LoRA (peft), the same model with its adapters switched off
                     (``with model.disable_adapter():``): no second copy of the weights;
  cached             the reference's last-layer states on response tokens computed once
                     (``w2s_shift.inference.compute_reference_states``) and read from the dataset
                     (``PairDataset(ref_states=...)``), shared by every run on the same data and base model.
Every variant trains the same random-init Qwen2-shaped model on the same real pairs with
``w2s_shift.training.train_pairs`` (length-grouped, padding-free packed batches, the package default for
decoders); variants alternate inside each round and figures are medians over rounds.

Columns: pairs/s; time and peak memory relative to Naive with the same fine-tuning (full or LoRA) in the same
round; "per run in a grid of G": (t_cache / G + t_run) / t_naive, the cost when G runs (seeds, lambdas,
methods) share one cache; the same two by the process's CPU time (steadier on a shared machine: use
``--threads 1`` there), the training loop alone and per run in the grid (cache CPU time / G added). Peak memory:
GPU max allocated; CPU sampled resident set size above the level before the model was
built (cache computation and states included).

    .venv/bin/python benchmarks/anchor_overhead.py            # about 3 minutes on 2 quiet cores
    .venv/bin/python benchmarks/anchor_overhead.py --smoke    # seconds
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

warnings.filterwarnings("ignore", category=FutureWarning)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOKE = {**C.SMOKE, "grid": 4}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=64, help="pairs per variant per round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=512)
    C.add_model_shape_args(ap)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--grid", type=int, default=4, help="G: runs sharing one reference cache")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--packing", action=argparse.BooleanOptionalAction, default=True, help="padding-free packed batches"
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tokenizer", default="smollm2-135m")
    ap.add_argument("--dataset", default="ultrafeedback")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    return ap


class AdapterOffReference(torch.nn.Module):
    """ANCHOR reference = the peft model with adapters disabled, for package versions without
    ``reference_mode='adapter_disabled'``. Holds the peft model without registering it as a child."""

    def __init__(self, peft_model):
        super().__init__()
        self.__dict__["peft_model"] = peft_model

    def forward(self, **kw):
        with self.peft_model.disable_adapter():
            return self.peft_model(**kw)


def pairs_of(flat: list) -> list:
    b = len(flat) // 2
    return [(flat[i], flat[i + b]) for i in range(b)]


def reference_cache(config, state, pairs, pad_id: int, bf16: bool) -> tuple:
    """The base model's last-layer states on response tokens (one forward, no gradient); returns (states per
    pair, wall seconds, CPU seconds)."""
    from transformers import AutoModel

    from w2s_shift.inference import compute_reference_states

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    base = AutoModel.from_config(config)
    base.load_state_dict(state)
    base = base.to(dev)
    seqs = [p.chosen.input_ids for p in pairs] + [p.rejected.input_ids for p in pairs]
    masks = [p.chosen.response_mask for p in pairs] + [p.rejected.response_mask for p in pairs]
    C._sync()
    t, c = time.perf_counter(), time.process_time()
    states = compute_reference_states(
        base, seqs, masks, pad_id, dtype=torch.bfloat16 if bf16 else torch.float32, bf16=bf16
    )
    C._sync()
    return pairs_of(states), time.perf_counter() - t, time.process_time() - c


def run(
    a, config, state, pad_id: int, pairs, *, lora: bool, reference: str | None, bf16_reference: bool = True
) -> dict:
    """One training run. reference: None (Naive), 'frozen_copy', 'adapter_disabled' or 'cached';
    ``bf16_reference``: the frozen copy's linear weights in bf16 (the package default under bf16)."""
    from transformers import AutoModel

    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import PairDataset, make_reference

    rng = random.Random(1)
    labels = [rng.random() for _ in pairs]
    cache_s = cache_cpu = 0.0
    with C.PeakMemory() as pm:
        ref_states = None
        if reference == "cached":
            ref_states, cache_s, cache_cpu = reference_cache(config, state, pairs, pad_id, a.bf16)
        backbone = AutoModel.from_config(config)
        backbone.load_state_dict(state)
        ref_module = None
        if reference == "frozen_copy":
            try:
                ref_module = make_reference(backbone, autocast_bf16=a.bf16 and bf16_reference)
            except TypeError:  # a package version before autocast_bf16
                ref_module = make_reference(backbone)
        if lora:
            from peft import LoraConfig, get_peft_model

            backbone = get_peft_model(
                backbone, LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS)
            )
        model = RewardModel(backbone, config.hidden_size)
        mode = reference or "frozen_copy"
        if reference == "adapter_disabled" and not C.has_objective():
            ref_module, mode = AdapterOffReference(backbone), "frozen_copy"
        if ref_module is not None and torch.cuda.is_available():
            ref_module = ref_module.to("cuda")
        cfg = C.our_config(
            epochs=1.0,
            batch_size=a.batch_size,
            learning_rate=1e-4,
            warmup_ratio=0.1,
            bf16=a.bf16,
            seed=0,
            packing=a.packing,
        )
        obj = C.our_objective(1e-4 if reference else 0.0, mode, ref_module)
        res = C.train_ours(model, PairDataset(pairs, labels, ref_states=ref_states), pad_id, cfg, objective=obj)
    return {
        "seconds": res["seconds"],
        "cpu_seconds": res["cpu_seconds"],
        "cache_seconds": cache_s,
        "cache_cpu_seconds": cache_cpu,
        "peak": pm.peak,
        "pairs": len(pairs),
    }


VARIANTS = [  # (name, lora, reference, baseline name, frozen copy's linear weights in bf16)
    ("full FT, Naive", False, None, None, True),
    ("full FT, ANCHOR frozen copy", False, "frozen_copy", "full FT, Naive", True),
    ("full FT, ANCHOR frozen copy, fp32 weights", False, "frozen_copy", "full FT, Naive", False),
    ("full FT, ANCHOR cached", False, "cached", "full FT, Naive", True),
    ("LoRA, Naive", True, None, None, True),
    ("LoRA, ANCHOR adapter disabled", True, "adapter_disabled", "LoRA, Naive", True),
    ("LoRA, ANCHOR cached", True, "cached", "LoRA, Naive", True),
]


def main(argv: list | None = None) -> dict:
    a = build_parser().parse_args(argv)
    tok, warm, rounds = C.prepare_run(a, SMOKE)
    config, state = C.shared_model(a, tok)
    pad = tok.pad_token_id

    if not a.smoke:
        for _, lora, ref, _, bf in VARIANTS:
            run(a, config, state, pad, warm, lora=lora, reference=ref, bf16_reference=bf)
    res = {v[0]: [] for v in VARIANTS}
    for r, rp in enumerate(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for name, lora, ref, _, bf in order:
            res[name].append(run(a, config, state, pad, rp, lora=lora, reference=ref, bf16_reference=bf))
            x = res[name][-1]
            print(
                f"round {r + 1}/{a.rounds} {name}: {x['seconds']:.1f} s (+ cache {x['cache_seconds']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    rows, out_rows = [], []
    for name, lora, ref, base, _ in VARIANTS:
        rs = res[name]
        pps = C.median([x["pairs"] / x["seconds"] for x in rs])
        peak = C.median([x["peak"] for x in rs]) / 2**20
        cache = C.median([x["cache_seconds"] for x in rs])
        if base is None:
            t1 = tg = mem = None
        else:
            bs = res[base]
            t1 = C.median([(x["seconds"] + x["cache_seconds"]) / y["seconds"] for x, y in zip(rs, bs)])
            tg = C.median([(x["seconds"] + x["cache_seconds"] / a.grid) / y["seconds"] for x, y in zip(rs, bs)])
            mem = C.median([x["peak"] / y["peak"] for x, y in zip(rs, bs)])
            c1 = C.median([x["cpu_seconds"] / y["cpu_seconds"] for x, y in zip(rs, bs)])
            cg = C.median(
                [(x["cpu_seconds"] + x["cache_cpu_seconds"] / a.grid) / y["cpu_seconds"] for x, y in zip(rs, bs)]
            )
        if base is None:
            c1 = cg = None

        def fmt(v):
            return "–" if v is None else f"{v:.2f}x"

        rows.append(
            [
                name,
                f"{pps:.2f}",
                f"{cache:.1f}" if ref == "cached" else "–",
                fmt(t1),
                fmt(tg),
                fmt(c1),
                fmt(cg),
                f"{peak:.0f}",
                "–" if mem is None else f"{100 * (mem - 1):+.0f}%",
            ]
        )
        out_rows.append(
            {
                "variant": name,
                "lora": lora,
                "reference": ref,
                "pairs_per_s": pps,
                "cache_seconds": cache,
                "time_vs_naive_single_run": t1,
                f"time_vs_naive_per_run_grid_{a.grid}": tg,
                "train_cpu_time_vs_naive": c1,
                f"cpu_time_vs_naive_per_run_grid_{a.grid}": cg,
                "peak_mib": peak,
                "peak_vs_naive": mem,
                "runs": rs,
            }
        )
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\nANCHOR overhead: Qwen2-shaped random init (hidden {a.hidden}, {a.layers} layers; LoRA r={a.lora_r} on all "
        f"linear layers), {a.dataset} real pairs, batch {a.batch_size}, max {a.max_length} tokens, "
        f"{'bf16 autocast' if a.bf16 else 'fp32'}, {'packed' if a.packing else 'padded'} batches, {dev}; "
        f"median of {a.rounds} rounds x {a.pairs} pairs"
    )
    print(
        C.markdown_table(
            [
                "variant",
                "pairs/s",
                "cache s",
                "time vs Naive, 1 run",
                f"per run, grid of {a.grid}",
                "CPU time vs Naive, training",
                f"CPU time per run, grid of {a.grid}",
                "peak MiB",
                "peak vs Naive",
            ],
            rows,
        )
    )
    out = {"benchmark": "anchor_overhead", "args": vars(a), "env": C.environment(), "rows": out_rows}
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

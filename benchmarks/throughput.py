"""Benchmark 1: student training throughput, this project against TRL's RewardTrainer, in one process.

Same random-init Qwen2-shaped model (same weights), same real pairs (a seeded sample of the bundled
UltraFeedback subset, rendered and truncated by the project's renderer, so both trainers see identical token
ids), same batch size, length cap, learning rate, schedule, precision and hardware. The variants run in
rounds, in turn, each round on a fresh sample of pairs, so background load hits them alike; each figure is
the median over rounds. Time is the training loop only (a Trainer callback from train-begin to train-end:
data loading, collation, forward, backward, optimizer, logging); model and trainer set-up are not timed.

Variants:
  TRL             trl.RewardTrainer (random batches, padding to the batch's longest; per-step .item() metrics),
                  gradient checkpointing OFF (TRL's default is on: ``--trl-defaults`` adds that row too)
  ours, shuffled  w2s_shift.training.train_pairs, Naive (soft Bradley-Terry), plain shuffle (length_group_size 0)
  ours, grouped   the same, length-grouped batches, padded
  ours, packed    length-grouped and padding-free packed (the package default for decoders)
  ours ANCHOR     length-grouped, packed, + ANCHOR (lambda 1e-4) against a frozen copy run every step

The data: pairs rendered and truncated to at most ``--max-length`` tokens (default 1024, as in the H200
measurement of protocol.md), with the real length distribution.

Columns: pairs/s and tokens/s (real, non-padding tokens; wall time), padding share of the batches, peak
memory (GPU: max allocated; CPU: sampled resident set size above the level before the model was built), and
the speed relative to the first row by wall time and by the process's CPU time (steadier on a shared machine,
most of all with ``--threads 1``).

    .venv-bench/bin/python benchmarks/throughput.py            # about 10 minutes on 2 quiet cores
    .venv-bench/bin/python benchmarks/throughput.py --smoke    # seconds; tiny shapes
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import warnings

import torch

warnings.filterwarnings("ignore", category=FutureWarning)

import _common as C


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once (median over rounds)")
    ap.add_argument("--pairs", type=int, default=96, help="pairs per variant per round")
    ap.add_argument("--batch-size", type=int, default=16, help="pairs per optimizer step")
    ap.add_argument("--max-length", type=int, default=1024, help="tokens per sequence (prompt truncated first)")
    C.add_model_shape_args(ap)
    ap.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=True, help="bfloat16 autocast (both trainers)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument(
        "--tokenizer", default="smollm2-135m", help="tokenizer spec (w2s_shift.models.loading.load_tokenizer)"
    )
    ap.add_argument("--dataset", default="ultrafeedback")
    ap.add_argument("--trl-defaults", action="store_true", help="also run TRL with its default gradient checkpointing")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL even when it is importable")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes, one round (a test of the script, not a benchmark)"
    )
    return ap


SMOKE = C.SMOKE


def trl_available() -> str | None:
    """None when trl and datasets import, else the reason."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
        from trl import RewardConfig, RewardTrainer  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- ImportError, or any version clash raised inside trl's import
        return f"{type(e).__name__}: {e}"
    return None


class _CountingCollator:
    """Wraps a collator and counts real and padded positions of ``attention_mask``."""

    def __init__(self, inner):
        self.inner, self.real, self.total = inner, 0, 0

    def __call__(self, items):
        out = self.inner(items)
        am = out["attention_mask"]
        self.real += int(am.sum())
        self.total += am.numel()
        return out


def run_trl(a, config, backbone_state, tok, pairs, grad_ckpt: bool) -> dict:
    """One TRL RewardTrainer run (1 epoch over ``pairs``); returns seconds, steps, padding share, peak bytes."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    ds = Dataset.from_dict(
        {"chosen_ids": [p.chosen.input_ids for p in pairs], "rejected_ids": [p.rejected.input_ids for p in pairs]}
    )
    steps = -(-len(pairs) // a.batch_size)
    with tempfile.TemporaryDirectory(prefix="w2s-bench-trl-") as out, C.PeakMemory() as pm:
        cfg = config.__class__.from_dict({**config.to_dict(), "num_labels": 1})
        cfg._attn_implementation = config._attn_implementation
        model = AutoModelForSequenceClassification.from_config(cfg)
        model.model.load_state_dict(backbone_state)
        args = RewardConfig(
            output_dir=out,
            per_device_train_batch_size=a.batch_size,
            num_train_epochs=1,
            learning_rate=1e-4,
            warmup_steps=int(0.1 * steps),
            lr_scheduler_type="linear",
            max_grad_norm=1.0,
            bf16=a.bf16,
            gradient_checkpointing=grad_ckpt,
            max_length=a.max_length,
            report_to="none",
            save_strategy="no",
            logging_steps=10,
            use_cpu=not torch.cuda.is_available(),
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        timer = C.LoopTimer()
        trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[timer])
        counter = _CountingCollator(trainer.data_collator)
        trainer.data_collator = counter
        trainer.train()
    return {
        "seconds": timer.seconds,
        "cpu_seconds": timer.cpu_seconds,
        "steps": timer.steps,
        "padding": 100.0 * (1 - counter.real / max(1, counter.total)),
        "peak": pm.peak,
    }


def run_ours(a, config, backbone_state, tok, pairs, group: int, anchor: bool, packing: bool = False) -> dict:
    """One run of ``train_pairs`` (Naive soft BT, or ANCHOR with a frozen copy) over ``pairs``."""
    from transformers import AutoModel

    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import LengthGroupedPairSampler, PairDataset, make_reference

    rng = random.Random(1)
    labels = [rng.random() for _ in pairs]  # soft labels q_i: the same cost as gold ones
    with C.PeakMemory() as pm:
        backbone = AutoModel.from_config(config)
        backbone.load_state_dict(backbone_state)
        model = RewardModel(backbone, config.hidden_size)
        reference = make_reference(backbone) if anchor else None
        if reference is not None and torch.cuda.is_available():
            reference = reference.to("cuda")
        cfg = C.our_config(
            epochs=1.0,
            batch_size=a.batch_size,
            learning_rate=1e-4,
            warmup_ratio=0.1,
            bf16=a.bf16,
            seed=0,
            length_group_size=group,
            packing=packing,
        )
        obj = C.our_objective(1e-4 if anchor else 0.0, "frozen_copy", reference)
        res = C.train_ours(model, PairDataset(pairs, labels), tok.pad_token_id, cfg, objective=obj)
    order = list(
        iter(
            LengthGroupedPairSampler(
                [max(len(p.chosen.input_ids), len(p.rejected.input_ids)) for p in pairs], a.batch_size, group, 0
            )
        )
    )
    batches = [order[i : i + a.batch_size] for i in range(0, len(order), a.batch_size)]
    return {
        "seconds": res["seconds"],
        "cpu_seconds": res["cpu_seconds"],
        "steps": res["steps"],
        "padding": (C.packed_padding_share if packing else C.padding_share)(pairs, batches),
        "peak": pm.peak,
    }


def main(argv: list | None = None) -> dict:
    a = build_parser().parse_args(argv)
    tok, warm, rounds = C.prepare_run(a, SMOKE)
    config, state = C.shared_model(a, tok)

    trl_reason = "skipped (--no-trl)" if a.no_trl else trl_available()
    variants = []
    if trl_reason is None:
        import trl

        variants.append(
            (
                f"TRL RewardTrainer {trl.__version__} (no grad. checkpointing)",
                lambda p: run_trl(a, config, state, tok, p, grad_ckpt=False),
            )
        )
        if a.trl_defaults:
            variants.append(
                (
                    f"TRL RewardTrainer {trl.__version__} (defaults: grad. checkpointing)",
                    lambda p: run_trl(a, config, state, tok, p, grad_ckpt=True),
                )
            )
    variants += [
        ("ours Naive, plain shuffle, padded", lambda p: run_ours(a, config, state, tok, p, group=0, anchor=False)),
        ("ours Naive, length-grouped, padded", lambda p: run_ours(a, config, state, tok, p, group=16, anchor=False)),
        (
            "ours Naive, length-grouped, packed",
            lambda p: run_ours(a, config, state, tok, p, group=16, anchor=False, packing=True),
        ),
        (
            "ours ANCHOR frozen copy, grouped, packed",
            lambda p: run_ours(a, config, state, tok, p, group=16, anchor=True, packing=True),
        ),
    ]

    for _, fn in variants:  # warm-up: lazy kernels, first-call allocations
        fn(warm)
    results = {name: [] for name, _ in variants}
    for r, rp in enumerate(rounds):
        order = variants if r % 2 == 0 else variants[::-1]  # alternate the order between rounds
        for name, fn in order:
            res = fn(rp)
            res.update(pairs=len(rp), tokens=C.real_tokens(rp))
            results[name].append(res)
            print(f"round {r + 1}/{a.rounds} {name}: {res['seconds']:.1f} s", file=sys.stderr, flush=True)

    ref = results[variants[0][0]]
    rows, out_rows = [], []
    for name, _ in variants:
        rs = results[name]
        pps = C.median([x["pairs"] / x["seconds"] for x in rs])
        tps = C.median([x["tokens"] / x["seconds"] for x in rs])
        speed = C.median([x["pairs"] / x["seconds"] / (y["pairs"] / y["seconds"]) for x, y in zip(rs, ref)])
        cpu_speed = C.median([y["cpu_seconds"] / x["cpu_seconds"] for x, y in zip(rs, ref)])
        pad = C.median([x["padding"] for x in rs])
        peak = C.median([x["peak"] for x in rs]) / 2**20
        rows.append(
            [name, f"{pps:.2f}", f"{tps:.0f}", f"{pad:.0f}%", f"{peak:.0f}", f"{speed:.2f}x", f"{cpu_speed:.2f}x"]
        )
        out_rows.append(
            {
                "variant": name,
                "pairs_per_s": pps,
                "tokens_per_s": tps,
                "padding_pct": pad,
                "peak_mib": peak,
                "speed_vs_first": speed,
                "cpu_time_speed_vs_first": cpu_speed,
                "runs": rs,
            }
        )
    first = variants[0][0].split(" (")[0]
    table = C.markdown_table(
        ["variant", "pairs/s", "tokens/s", "padding", "peak MiB", f"vs {first}", f"vs {first}, CPU time"], rows
    )
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\nthroughput: Qwen2-shaped random init (hidden {a.hidden}, {a.layers} layers), {a.dataset} real pairs, "
        f"batch {a.batch_size}, max {a.max_length} tokens, {'bf16 autocast' if a.bf16 else 'fp32'}, {dev}; "
        f"median of {a.rounds} rounds x {a.pairs} pairs"
    )
    if trl_reason is not None:
        print(f"TRL not run: {trl_reason}")
    print(table)
    out = {
        "benchmark": "throughput",
        "args": vars(a),
        "env": C.environment(),
        "trl_skipped": trl_reason,
        "rows": out_rows,
    }
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

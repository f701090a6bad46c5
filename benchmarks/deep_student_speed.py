"""Deep students on a CPU: seconds per training pair of the top-N-blocks student (frozen trunk cached) against LoRA
on every block, through the package's own pipeline pieces (featurizer, dataset, train_pairs), on real HH pairs.

Sizes the deep-student preset (``evidence-deep``): it picks whichever regime trains faster per pair, and its
s/pair times the preset's trainings give the run's training time. Each variant: a fresh student, ``--pairs`` real
student-train pairs of the preset's source, 1 epoch, the preset's batch size and sequence length; the time is the
training loop only (a Trainer callback), and separately the one-off trunk-state cache of the top-N variant.

    .venv/bin/python benchmarks/deep_student_speed.py                 # ~5 min on 2 quiet cores (float32)
    .venv/bin/python benchmarks/deep_student_speed.py --smoke --student DIR --layers 2   # a tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="evidence-deep", help="the run config whose data and student are used")
    ap.add_argument("--student", default=None, help="student model (default: the preset's)")
    ap.add_argument("--layers", type=int, default=16, help="top blocks trained in the top-N variant")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank of the all-blocks variant")
    ap.add_argument("--pairs", type=int, default=48, help="training pairs per variant")
    ap.add_argument("--smoke", action="store_true", help="8 pairs of at most 48 tokens (tests the script)")
    ap.add_argument("--json", default=None, help="write the figures here")
    return ap


def _variant(cfg, name: str, overrides: dict, n_pairs: int) -> dict:
    from w2s_shift.pipeline.featurizer import SourceContext
    from w2s_shift.pipeline.stages import train_args
    from w2s_shift.training import train_pairs

    student = cfg.student.model_copy(update=overrides)
    vcfg = cfg.model_copy(update={"student": student})
    with tempfile.TemporaryDirectory(prefix="w2s-deep-") as out:
        ctx = SourceContext(vcfg, vcfg.data.sources[0], Path(out))
        pairs = ctx.splits["student_train"][:n_pairs]
        t0 = time.perf_counter()
        sf = ctx.student()
        model = sf.new_model(0)
        ds = sf.dataset("student_train", pairs, [0.7] * len(pairs))
        cache_s = time.perf_counter() - t0
        timer = C.LoopTimer()
        args = train_args(student, 0, vcfg, f"student {name}", model)
        train_pairs(model, ds, sf.pad_id, args, str(Path(out) / "ckpt"), callbacks=[timer])
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "variant": name,
        "pairs": len(pairs),
        "train_seconds": timer.seconds,
        "seconds_per_pair": timer.seconds / len(pairs),
        "setup_and_cache_seconds": cache_s,
        "trainable_params": trainable,
    }


def cpu_class() -> str:
    """The CPU's model name and whether it computes bfloat16 natively (AMX-BF16 / AVX512_BF16 flags)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "CPU")
    flags = "amx_bf16" if "amx_bf16" in info else "avx512_bf16" if "avx512_bf16" in info else "no native bf16"
    return f"{name}, {os.cpu_count()} cores, {flags}"


def main(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    from w2s_shift.config import LoraSettings
    from w2s_shift.config_io import load_config
    from w2s_shift.models.precision import resolve_precisions

    over = [f"student.name={a.student}"] if a.student else []
    if a.smoke:
        over += ["student.max_length=48", "student.bf16=false", "teacher.bf16=false"]
    cfg = resolve_precisions(load_config(a.preset, over))
    n = 8 if a.smoke else a.pairs
    rows = [
        _variant(cfg, f"top {a.layers} blocks", {"trainable_layers": a.layers, "lora": None}, n),
        _variant(
            cfg,
            f"LoRA r={a.lora_r} on every block",
            {"trainable_layers": None, "lora": LoraSettings(r=a.lora_r, alpha=2.0 * a.lora_r)},
            n,
        ),
    ]
    faster = min(rows, key=lambda r: r["seconds_per_pair"])["variant"]
    print(f"| variant | pairs | s/pair (training loop) | setup + trunk cache s | trainable params |  # {cpu_class()}")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['pairs']} | {r['seconds_per_pair']:.3f} | {r['setup_and_cache_seconds']:.1f} | "
            f"{r['trainable_params']:,} |"
        )
    print(f"\nfaster per pair: {faster}")
    out = {"rows": rows, "faster": faster, "machine": cpu_class(), "smoke": a.smoke}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()

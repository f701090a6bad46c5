"""``w2s-shift plan``: its command-line options and what it prints (:mod:`w2s_shift.plan`; ``--power``:
:mod:`w2s_shift.power`)."""

from __future__ import annotations

from ..metrics.claims import MARGIN_PP
from . import METHODS, MFU, PEAK_TFLOPS, REFERENCES, SHAPES

#: the options of the GPU estimate (argparse dests), which --power does not read
GPU_OPTIONS = (
    "set",
    "params",
    "method",
    "reference",
    "backend",
    "gpus",
    "gpu_mem",
    "finetune",
    "lora_rank",
    "precision",
    "gradient_checkpointing",
    "seq_len",
    "batch",
    "pairs",
    "mean_tokens",
    "mfu",
    "peak_tflops",
    "json",
)
#: the defaults of the options that have one (argparse's default is None, so that a flag given is told apart)
DEFAULTS = {"backend": "fsdp", "gpus": "1,2,4,8", "gpu_mem": 80.0, "margin": MARGIN_PP, "seed_sd": 2.0}


def _given(a, dests) -> list:
    """The command-line flags among ``dests`` that were given (their value is not argparse's None / False)."""
    return ["--" + d.replace("_", "-") for d in dests if getattr(a, d) is not None and getattr(a, d) is not False]


def _cmd_plan(a) -> int:
    import math

    from . import Plan, format_plan, parse_gpus, plan_json, resolve

    if a.power and _given(a, GPU_OPTIONS):
        raise ValueError(
            f"{', '.join(_given(a, GPU_OPTIONS))}: options of the GPU estimate, which --power does not read; leave "
            "them out (--power reads --margin, --seed-sd)"
        )
    if not a.power and _given(a, ("margin", "seed_sd")):
        raise ValueError(f"{', '.join(_given(a, ('margin', 'seed_sd')))}: options of --power only; add --power")
    for k, v in DEFAULTS.items():
        setattr(a, k, v if getattr(a, k) is None else getattr(a, k))
    if a.power:  # a finished pilot run: the seeds and test pairs each claim needs at the margin
        from pathlib import Path

        from ..power import power_report

        if not (math.isfinite(a.margin) and 0 < a.margin <= 100):
            raise ValueError(f"--margin must be a number of percentage points above 0 and at most 100, got {a.margin}")
        if not (math.isfinite(a.seed_sd) and 0 <= a.seed_sd <= 100):
            raise ValueError(f"--seed-sd must be a number of percentage points from 0 to 100, got {a.seed_sd}")
        print(power_report(Path(a.model), a.margin, a.seed_sd))
        return 0
    shape, d = resolve(a.model, a.set, a.reference)
    gpus = parse_gpus(a.gpus)
    if not (isinstance(a.gpu_mem, float) and math.isfinite(a.gpu_mem) and a.gpu_mem > 0):
        raise ValueError(f"--gpu-mem must be a positive number of GiB, got {a.gpu_mem!r}")
    flags = {
        "method": a.method,
        "reference": a.reference,
        "finetune": a.finetune,
        "precision": a.precision,
        "seq_len": a.seq_len,
        "lora_rank": a.lora_rank,
        "pairs": a.pairs,
        "mean_tokens": a.mean_tokens,
        "mfu": a.mfu,
        "peak_tflops": a.peak_tflops,
        "gradient_checkpointing": True if a.gradient_checkpointing else None,
    }
    fields = {**d, **{k: v for k, v in flags.items() if v is not None}}
    fields.setdefault("lora_targets", ["q_proj", "k_proj", "v_proj", "o_proj"])
    plan = Plan(shape, backend=a.backend, batch=a.batch, params=a.params, **fields)
    if plan.anchored and plan.reference == "adapter_disabled" and plan.finetune != "lora":
        plan.reference = "frozen_copy"
    print(plan_json(plan, gpus, a.gpu_mem) if a.json else format_plan(plan, gpus, a.gpu_mem))
    return 0


def add_plan_parser(sub) -> None:
    """Register ``w2s-shift plan`` (:mod:`w2s_shift.plan`) on the CLI's sub-parsers."""
    pp = sub.add_parser(
        "plan",
        help="estimate GPU and host memory, disk and GPU time for a backend and GPU counts (no GPU needed)",
        description="Estimate GPU memory per device (weights, gradients, AdamW, ANCHOR reference, activations "
        "with and without gradient checkpointing) for each GPU count, host memory per node (base model, frozen "
        "copy, cached trunk and reference states), checkpoint sizes on disk and the run's GPU hours. "
        "See w2s_shift/plan/.",
    )
    pp.add_argument(
        "model",
        metavar="CONFIG_OR_MODEL",
        help=f"a run config (YAML or preset), a model folder or config.json, or a known shape "
        f"({', '.join(s.name for s in SHAPES.values())})",
    )
    pp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field of the run config")
    pp.add_argument(
        "--power",
        action="store_true",
        help="CONFIG_OR_MODEL is a finished pilot run directory: print the seeds and test pairs each claim needs "
        "to be decided at --margin, and their cost (w2s_shift/power.py)",
    )
    pp.add_argument("--margin", type=float, help="with --power: the claims' margin in pp (default 3.8)")
    pp.add_argument(
        "--seed-sd", type=float, help="with --power: training SD (pp) assumed for a 1-seed pilot (default 2)"
    )
    pp.add_argument(
        "--params", type=float, help="override the parameter count, e.g. 8e9 (activations still from the shape)"
    )
    pp.add_argument("--method", help=f"{'|'.join(METHODS)} (default: anchor, or the config's)")
    pp.add_argument(
        "--reference", help=f"ANCHOR reference: {'|'.join(REFERENCES)} (default frozen_copy, or the config's)"
    )
    pp.add_argument("--backend", help="ddp|fsdp|zero2|zero3 (default fsdp)")
    pp.add_argument("--gpus", help="GPU counts, comma-separated (default 1,2,4,8)")
    pp.add_argument("--gpu-mem", type=float, help="GiB per GPU (default 80)")
    pp.add_argument("--finetune", help="full|lora (default full, or the config's)")
    pp.add_argument("--lora-rank", type=int, help="LoRA rank (default 8, or the config's)")
    pp.add_argument(
        "--precision",
        help="mixed (bf16 compute, fp32 master/grads/AdamW) or bf16 (all bf16, as protocol.md's cost table); "
        "default: the config's pure_bf16, else mixed",
    )
    pp.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="headline peak with gradient checkpointing (default: the config's gradient_checkpointing, else off)",
    )
    pp.add_argument(
        "--seq-len", type=int, help="tokens per sequence (default 1024, or the config's student.max_length)"
    )
    pp.add_argument(
        "--batch",
        type=int,
        help="pairs per GPU per forward (default: the config's batch_size / (gradient_accumulation_steps x GPUs), "
        "else 2)",
    )
    pp.add_argument(
        "--pairs", type=int, help="student-train pairs for host memory and time (default the config's, else 20000)"
    )
    pp.add_argument(
        "--mean-tokens", type=int, help="mean tokens per sequence for host memory and time (default --seq-len)"
    )
    pp.add_argument("--mfu", type=float, help=f"achieved share of the peak for the time estimate (default {MFU:g})")
    pp.add_argument(
        "--peak-tflops", type=float, help=f"bf16 dense peak per GPU, TFLOP/s (default {PEAK_TFLOPS:g}: H100/H200)"
    )
    pp.add_argument("--json", action="store_true", help="print the estimate as JSON")
    pp.set_defaults(func=_cmd_plan)

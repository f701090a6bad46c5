"""``w2s-shift plan``'s plan of a run config or a model (:func:`resolve`) and its report (:func:`format_plan`,
:func:`plan_json`); the estimates are :mod:`w2s_shift.plan.costs`'."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..methods import BASELINE
from .costs import (
    ACCELERATE_CONFIG,
    DEFAULT_PAIRS,
    FITS_SHARE,
    GIB,
    GPUS_PER_NODE,
    PRECISION,
    RESPONSE_SHARE,
    SHAPES,
    Plan,
    Shape,
    disk_bytes,
    estimate,
    gpu_flops,
    gpu_seconds,
    host_bytes,
    host_cache_bytes,
    known_shape,
    shape_from_config_json,
)

RECOMMENDATION = (
    "ANCHOR reference: one GPU with an 8B student -> LoRA with reference: adapter_disabled (no extra weights), or full "
    "fine-tuning with gradient checkpointing where it fits; 8 GPUs -> FSDP2 (fsdp) full fine-tuning with reference: "
    "frozen_copy (sharded like the student); reference: cached only for partial fine-tuning (top layers) where the "
    "host-memory estimate of its caches fits."
)


def fits(total_gib: float, gpu_mem_gib: float) -> str:
    """'yes' up to 90% of the GPU's memory, 'tight' up to 100%, else 'no'."""
    return "yes" if total_gib <= FITS_SHARE * gpu_mem_gib else ("tight" if total_gib <= gpu_mem_gib else "no")


def parse_gpus(text: str) -> list:
    """'1,2,4,8' -> [1, 2, 4, 8]. Raises ValueError on anything but positive integers."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpus {text!r}: expected a comma-separated list of GPU counts, e.g. 1,2,4,8") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"--gpus {text!r}: GPU counts must be positive integers")
    return sorted(set(out))


def run_defaults(cfg, shape: Shape, reference: str | None = None) -> dict:
    """Plan fields read from a run config (``RunConfig``): the student's sequence length, batch, accumulation,
    checkpointing, precision (``pure_bf16``), fine-tuning, and the run's pairs, cells and students for host memory,
    disk and GPU time. Unknown sizes (no ``n_student_train``, ``n_test`` or ``n_ood`` cap) are assumed and noted.
    ``reference`` (``--reference``): every ANCHOR entry of the config counted with that reference instead."""
    from ..models.reward_model import resolve_layer_spec

    st, data = cfg.student, cfg.data
    methods = cfg.expanded_methods()
    anchors = [m for m in methods if m.method.needs_reference]
    if reference is not None:
        anchors = [m.model_copy(update={"reference": reference}) for m in anchors]
    first = next((m for m in anchors if m.reference == "frozen_copy"), anchors[0] if anchors else None)
    d = {"seq_len": st.max_length, "method": first.name if first else BASELINE, "notes": []}
    if first is not None:
        d["reference"] = first.reference
    lora = getattr(st, "lora", None)
    d["finetune"] = "lora" if lora else "full"
    if lora:
        d["lora_rank"], d["lora_targets"] = lora.r, list(lora.target_modules)
    d["batch_size"], d["grad_accum"] = st.batch_size, st.gradient_accumulation_steps
    d["gradient_checkpointing"] = bool(getattr(st, "gradient_checkpointing", False))
    d["precision"] = "bf16" if getattr(st, "pure_bf16", False) else "mixed"
    if st.trainable_layers and not lora:
        d["trainable_layers"], d["trunk_cache"] = st.trainable_layers, bool(st.trunk_cache)
    d["epochs"] = float(st.epochs)
    d["checkpoint_fraction"] = float(getattr(cfg, "checkpoint_fraction", 0.25))
    d["mechanism"] = bool(getattr(cfg, "mechanism", True))
    d["fit_pairs"] = data.n_teacher_train or data.n_student_train or DEFAULT_PAIRS  # the probes' fit set
    d["pairs"] = data.n_student_train or DEFAULT_PAIRS
    if data.n_student_train is None:
        d["notes"].append(f"data.n_student_train is not capped: {DEFAULT_PAIRS:,} student-train pairs assumed")
    f = data.split_fractions
    n_test = data.n_test or round(d["pairs"] * f[2] / f[1])
    n_ood = data.n_ood or 2000
    if data.n_test is None or data.n_ood is None:
        d["notes"].append(
            f"data.n_test / n_ood not capped: {n_test:,} test pairs (the split fractions) and {n_ood:,} per OOD set "
            "assumed"
        )
    srcs = [s.display for s in data.sources]
    ood = sum(len([o for o in data.ood if o.display != s]) for s in srcs) / max(len(srcs), 1)
    d["eval_pairs"] = int(n_test + n_ood * ood)
    d["cells"] = len(srcs) * len(cfg.seeds)
    d["students"] = trained_students(methods, cfg.seeds)
    d["step_references"] = sum(1 for m in anchors if m.reference != "cached")
    n_layers = shape.layers
    sets = {tuple(resolve_layer_spec(m.anchor_layers, n_layers)): m.reference for m in anchors}
    d["cached_layer_sets"] = [len(k) for k, r in sorted(sets.items()) if r == "cached"]
    d["anchor_layers"] = max([len(k) for k, r in sets.items() if r != "cached"], default=1)

    # a method that builds its own labels asks the strong model (SEAM); one that does not train scores it (zero-shot)
    d["seam"] = any(m.method.label_stage(m) is not None for m in methods)
    d["zero_shot"] = any(not m.method.trains for m in methods)
    return d


def resolve(spec: str, overrides: list | None = None, reference: str | None = None) -> tuple:
    """A model shape and run-config defaults from CONFIG_OR_MODEL: a known shape name, a folder or config.json
    of a decoder, or a w2s-shift run config (YAML file or preset, with ``overrides`` as ``--set KEY=VALUE``) whose
    student is one of those.

    Returns:
        (Shape, dict of Plan fields from the run config (:func:`run_defaults`); empty for a model).

    Raises:
        ValueError: none of these (the message lists the known shapes).
    """
    s = known_shape(spec)
    p = Path(spec)
    if s is not None or p.is_dir() or p.name == "config.json":
        if overrides:
            raise ValueError("--set applies to a run config, not to a model")
        return (s or shape_from_config_json(p)), {}
    from ..config import ConfigError
    from ..config_io import load_config, preset_names

    if p.suffix in (".yaml", ".yml") or spec in preset_names():
        try:
            cfg = load_config(spec, overrides or None)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        st = cfg.student
        shape = known_shape(st.name)
        if shape is None:
            if Path(st.name).is_dir():
                shape = shape_from_config_json(st.name)
            else:
                raise ValueError(
                    f"{spec}: student {st.name!r} is neither a known shape "
                    f"({', '.join(x.name for x in SHAPES.values())}) "
                    "nor a local model folder; pass the model (or its config.json) instead"
                )
        d = run_defaults(cfg, shape, reference)
        return shape, d
    raise ValueError(
        f"{spec}: not a known model shape ({', '.join(x.name for x in SHAPES.values())}), a model folder or "
        "config.json, or a w2s-shift run config"
    )


def _gib(x: float) -> str:
    return f"{x / GIB:,.1f} GiB"


def format_plan(plan: Plan, gpus: list, gpu_mem: float) -> str:
    """The text printed by ``w2s-shift plan``: GiB per device for each GPU count and whether it fits, host memory per
    node, hours of the run, host and disk breakdowns, and the ANCHOR reference recommendation."""
    rows = [estimate(plan, n) for n in gpus]
    s = plan.shape
    w, master, g, adam = PRECISION[plan.precision]
    ref = plan.reference if plan.anchored else "none"
    ck = plan.gradient_checkpointing
    how = f"top {plan.top} of {s.layers} blocks" if plan.top < s.layers and plan.finetune == "full" else "full"
    lines = [
        f"model {s.name}: {rows[0]['params']:.3g} parameters "
        f"(reward model: backbone + head){' [--params]' if plan.params else ''}; "
        f"{s.layers} layers, hidden {s.hidden}, MLP {s.intermediate}, vocab {s.vocab}, heads {s.heads}/{s.kv_heads}",
        f"method {plan.method} (reference: {ref}), {how if plan.finetune == 'full' else 'lora'} fine-tuning"
        + (
            f" (rank {plan.lora_rank} on {','.join(plan.lora_targets)}: {rows[0]['trainable_params']:.3g} trainable)"
            if plan.finetune == "lora"
            else ""
        )
        + (" with cached trunk states" if plan.split else "")
        + f", backend {plan.backend}, precision {plan.precision}, gradient checkpointing {'on' if ck else 'off'}",
        f"bytes per trained parameter: weights {w} (bf16) + master {master} + gradients {g} + AdamW moments {adam} "
        f"= {w + master + g + adam}; frozen weights "
        + ("4 (float32 as loaded; bf16 compute by autocast)" if plan.precision == "mixed" else "2 (bf16)"),
    ]
    if plan.batch is None and plan.batch_size is not None:
        lines.append(
            f"per GPU: batch_size {plan.batch_size} / (gradient_accumulation_steps {plan.grad_accum} x GPUs) pairs "
            f"x {plan.seq_len} tokens (chosen + rejected) per forward"
        )
    else:
        lines.append(
            f"per GPU: {plan.pairs_per_gpu(1)} pairs x {plan.seq_len} tokens "
            f"({rows[0]['tokens_per_device']} tokens, chosen + rejected); "
            f"global batch = {plan.pairs_per_gpu(1)} x GPUs pairs/step"
        )
    alt = "no ckpt" if ck else "ckpt"
    lines += [
        "",
        f"{'GPUs':>4} | {'pairs':>5} | {'weights':>7} | {'grads':>6} | {'AdamW':>6} | {'ref':>5} | "
        f"{'gather':>6} | {'act':>6} | {'other':>5} | {'peak':>6} | "
        f"{'fits ' + format(gpu_mem, 'g') + ' GiB':>11} | {'peak ' + alt:>12} | {'host/node':>9} | {'hours':>7}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        a = r["activations_ckpt"] if ck else r["activations"]
        lines.append(
            f"{r['gpus']:>4} | {r['pairs_per_gpu']:>5} | {r['weights']:>7.1f} | {r['grads']:>6.1f} | "
            f"{r['adamw']:>6.1f} | {r['reference']:>5.1f} | {r['gathered']:>6.1f} | {a:>6.1f} | {r['other']:>5.1f} | "
            f"{r['peak']:>6.1f} | {fits(r['peak'], gpu_mem):>11} | "
            f"{(r['total'] if ck else r['total_ckpt']):>12.1f} | {r['host']:>9.1f} | {r['hours']:>7.2f}"
        )
    lines += [
        "",
        "GiB per GPU. peak = max(weights + AdamW + ref + gather + act + other, weights + AdamW + ref + grads) "
        "(gradients are freed after each step; DDP buckets and ZeRO gradient partitions stay and count in both), "
        f"{'with' if ck else 'without'} gradient checkpointing (the config's gradient_checkpointing); 'peak {alt}': "
        f"{'without' if ck else 'with'} it. 'yes': at most {FITS_SHARE:.0%} of the GPU; 'tight': at most 100%.",
    ]
    if plan.anchored and plan.reference == "frozen_copy":
        lines.append(
            "ref: the frozen copy in bf16, "
            + (
                "sharded like the student (FSDP2)."
                if plan.backend == "fsdp"
                else f"a full replica on every GPU under {plan.backend} (DeepSpeed and DDP do not shard it)."
            )
        )
    if plan.batch is None and plan.batch_size is not None:
        bad = [n for n in gpus if plan.batch_size % (plan.grad_accum * n)]
        if bad:
            lines.append(
                f"batch_size {plan.batch_size} is not a multiple of gradient_accumulation_steps x GPUs for "
                f"{','.join(map(str, bad))} GPU(s): the run refuses those counts (pairs rounded up here)."
            )
    h, dk, fl = host_bytes(plan), disk_bytes(plan), gpu_flops(plan)
    lines += [
        f"host/node: GiB of host memory on one node of min(GPUs, {GPUS_PER_NODE}) processes, each holding its own: "
        f"base model {_gib(h['base'])} + the student's copy while built {_gib(h['student'])} + frozen copy while "
        f"built {_gib(h['frozen_copy'])} + cached trunk states "
        f"{_gib(h['trunk'])} + cached reference states {_gib(h['reference'])} = {_gib(h['total'])} per process "
        f"({plan.pairs:,} student-train pairs, {plan.eval_pairs:,} scored pairs, {plan.tokens_per_seq} tokens per "
        f"sequence, {RESPONSE_SHARE:.0%} of them response).",
        f"disk: {_gib(dk['state'])} per trained student's state file, {_gib(dk['states'])} for the run's "
        f"{plan.students * plan.cells} student(s); one Trainer checkpoint at a time: {_gib(dk['checkpoint'])} (the "
        f"trainable weights and their AdamW moments), {_gib(dk['checkpoints_written'])} written over the run "
        f"(a checkpoint every {plan.checkpoint_fraction:g} of each training's steps).",
        f"hours: wall-clock hours of the run ({plan.cells} cell(s) x {plan.students} trained student(s), "
        f"{plan.epochs:g} epoch(s)): {fl['total']:.3g} FLOPs (training {fl['train']:.3g}, reference "
        f"{fl['reference']:.3g}, scoring {fl['scoring']:.3g}, mechanism stage {fl['mechanism']:.3g}) at "
        f"{plan.mfu:.0%} MFU of {plan.peak_tflops:g} TFLOP/s per GPU (989: the H100 / H200 SXM bfloat16 dense "
        "peak; an assumption, --mfu and --peak-tflops; perfect scaling over GPUs; teacher not counted; the "
        "mechanism stage is config mechanism: true, switch it off to save its share).",
        RECOMMENDATION,
    ]
    lines += plan.notes
    ok = next((r["gpus"] for r in rows if fits(r["peak"], gpu_mem) == "yes"), None)
    cfgname = ACCELERATE_CONFIG[plan.backend]
    if ok is None:
        lines.append(
            "No listed GPU count fits; try a sharded backend, LoRA, gradient checkpointing, fewer pairs per GPU or "
            "more GPUs."
        )
    else:
        bs = plan.batch_size if plan.batch is None and plan.batch_size else plan.pairs_per_gpu(ok) * ok
        lines.append(
            f"Smallest fit: {ok} GPU(s): accelerate launch --config_file w2s_shift/configs/accelerate/{cfgname}.yaml "
            f"--num_processes {ok} -m w2s_shift run CONFIG  (student.batch_size = {bs})"
        )
    return "\n".join(lines)


def plan_json(plan: Plan, gpus: list, gpu_mem: float) -> str:
    rows = [dict(e, fits=fits(e["peak"], gpu_mem)) for e in (estimate(plan, n) for n in gpus)]
    d = {k: v for k, v in asdict(plan).items() if k != "shape"}
    extra = {"host_bytes_per_process": host_bytes(plan), "disk_bytes": disk_bytes(plan), "flops": gpu_flops(plan)}
    return json.dumps({"shape": asdict(plan.shape), "plan": d, "gpu_mem_gib": gpu_mem, "rows": rows, **extra}, indent=2)


__all__ = [
    "Shape",
    "SHAPES",
    "Plan",
    "RECOMMENDATION",
    "estimate",
    "fits",
    "gpu_flops",
    "gpu_seconds",
    "host_bytes",
    "host_cache_bytes",
    "disk_bytes",
    "parse_gpus",
    "resolve",
    "run_defaults",
    "shape_from_config_json",
    "known_shape",
    "format_plan",
    "plan_json",
]


def trained_students(methods: list, seeds: list) -> int:
    """Trainings per cell, on average over the run's seeds, rounded up: an entry trained on some seeds only
    (``seeds:``) counts for its share of them, and entries that share one training count once: a post-hoc method's
    :meth:`~w2s_shift.methods.Method.trained_as` (e.g. WiSE-FT's a values), and that training with a grid entry of
    the same settings (WiSE-FT beside naive; the run's rule: ``pipeline.stages.twin_training``)."""
    import math

    own = [m for m in methods if m.method.trains and m.method.trained_as(m) is None]
    share: dict = {}
    for m in methods:
        if not m.method.trains:
            continue
        trained = m.method.trained_as(m)
        key = m.display
        if trained is not None:
            twin = next((x for x in own if x.training_settings() == trained.training_settings()), None)
            key = (twin or trained).display
        part = len(set(m.seeds) & set(seeds)) / max(len(seeds), 1) if m.seeds is not None else 1.0
        share[key] = max(share.get(key, 0.0), part)
    return max(1, math.ceil(sum(share.values()) - 1e-9))

"""The main job: every source x seed x method of a config, stage by stage, then metrics.json and the report."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import __version__
from ..config import RunConfig
from ..distributed import init_distributed, run_on_main, state, world
from ..io import read_json, read_jsonl
from .featurizer import SourceContext
from .intervene import cell_mechanism
from .preflight import load_check_all, preflight
from .rundir import (
    DEFAULT_THREADS,
    changed_inputs,
    claim_run_dir,
    log,
    prepare_run_dir,
    refuse_cell_dir,
    refuse_file_as_run_dir,
    write_json_on_main,
    write_jsonl_on_main,
)
from .score_stage import cell_scores, export_students
from .stages import cell_labels, cell_student, cell_teacher, label_stage, student_digest, teacher_digest
from .timings import RunTimes


def method_dict(m, finetune: str) -> dict:
    """A method entry of metrics.json: label, name, fine-tuning mode and the method's own fields
    (:meth:`w2s_shift.methods.Method.describe`)."""
    return {
        "label": m.display,
        "name": m.name,
        "finetune": finetune if m.method.trains else "none",
        **m.method.describe(m),
    }


def describe_grid(cfg: RunConfig) -> str:
    """The grid a config runs, without loading data or models: sources with their OOD targets, seeds, methods,
    and where each dataset and model comes from (a name unknown offline is flagged, not fetched)."""
    from ..data.adapters import DATASETS
    from ..models.loading import PRESETS

    def where_data(ref):
        if ref.name:
            s = DATASETS.get(ref.name)
            return "unknown name" if s is None else ("bundled" if s.bundled else "shared" if s.files else "hub")
        return "file" if ref.path else "hub"

    def where_model(name):
        p = Path(name)
        return (
            "local folder"
            if p.is_dir()
            else ".gguf file"
            if p.suffix == ".gguf"
            else "offline preset"
            if name in PRESETS
            else "hub id"
        )

    methods = cfg.expanded_methods()
    lines = [
        f"grid: {len(cfg.data.sources)} source(s) x {len(cfg.seeds)} seed(s) x {len(methods)} method(s) "
        f"-> {len(cfg.data.sources) * len(cfg.seeds)} teacher run(s), "
        f"{len(cfg.data.sources) * sum(len(m.seeds or cfg.seeds) for m in methods)} student stage(s)",
        f"output: {cfg.output_dir}",
    ]
    for src in cfg.data.sources:
        lines.append(
            f"source {src.display} ({where_data(src)}) -> OOD "
            + ", ".join(f"{o.display} ({where_data(o)})" for o in cfg.data.ood_for(src))
        )
    lines.append(f"seeds: {cfg.seeds}")
    lines.append(
        f"teacher: {cfg.teacher.name} ({where_model(cfg.teacher.name)}); student: {cfg.student.name} "
        f"({where_model(cfg.student.name)}, {cfg.student.finetune})"
    )
    from ..models.precision import precision_lines, resolve_precisions

    lines += precision_lines(resolve_precisions(cfg))
    for m in methods:
        settings = m.method.summary(m)
        only = f", seeds {m.seeds}" if m.seeds is not None else ""
        lines.append(f"  method {m.display}: {m.name}" + (f" ({settings}{only})" if settings or only else ""))
    trained = [m.display for m in methods if m.method.trains]
    if trained:  # what `export:` and `w2s-shift export RUN_DIR LABEL` accept
        lines.append(f"exportable students (export: or `w2s-shift export RUN_DIR LABEL`): {', '.join(trained)}")
    return "\n".join(lines)


def run(cfg: RunConfig, overwrite: bool = False, wait: bool = False) -> dict:
    """:func:`_run` holding the run directory's lock (:mod:`w2s_shift.runlock`) from start to end: one writer
    per run directory. ``wait``: wait for a run holding it to finish instead of refusing.

    Raises:
        RunDirError: another live process holds the directory (its PID named), or the lock cannot be created;
            and whatever :func:`_run` raises.
        ValueError: ``report_to`` wandb without credentials or ``WANDB_MODE=offline``.
    """
    from ..runlock import holding
    from ..tracking import check_wandb_credentials

    check_wandb_credentials(cfg.report_to)  # before any data loads (wandb itself refuses at the first training)
    refuse_file_as_run_dir(Path(cfg.output_dir))  # before the lock file is created there
    refuse_cell_dir(Path(cfg.output_dir))
    with holding(cfg.output_dir, wait=wait):
        metrics = _run(cfg, overwrite)
        if cfg.bon.enabled:  # best-of-n of every model just trained or reused (evaluation only)
            from .bon import run_bon

            if state().num_processes > 1:
                log(f"bon.enabled: best-of-n runs in one process: `w2s-shift bon {cfg.output_dir}` after this run")
            else:
                run_bon(Path(cfg.output_dir), cfg, metrics, cfg.bon)
    if "wandb" in cfg.report_to:  # each trained model's final ID/OOD metrics in its wandb run
        from ..results.summaries import log_summaries

        log_summaries(cfg.output_dir, metrics)
    return metrics


def _run(cfg: RunConfig, overwrite: bool = False) -> dict:
    """Run the whole grid for ``cfg`` (every source x seed x method); returns the metrics dict (also written to
    ``metrics.json``) and writes ``report.md``/``report.html``.

    Raises:
        RunDirError, ConfigError, DataError, ModelError, TrainingDiverged: each with a clear message.
    """
    t0 = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from ..models.precision import environment, precision_lines, resolve_precisions

    cfg = resolve_precisions(cfg)  # bf16: auto -> this machine's precision, once, before any digest
    if world()[1] > 1:  # launched: the process group (and this process's device) exist before any model moves
        init_distributed()
    run_dir = prepare_run_dir(cfg, overwrite)
    changed_inputs(run_dir, cfg)  # logs each data file or model folder changed in place since the last run
    evaluated = earlier_evaluated_targets(run_dir, cfg)
    for line in precision_lines(cfg):
        log(line)
    import transformers

    transformers.logging.set_verbosity_error()
    from ..report import write_report
    from ..results import METRICS_FORMAT, aggregate

    all_methods = cfg.expanded_methods()
    cells = []
    claimed = False
    times = RunTimes(run_dir, t0)  # every run's times: a rerun adds its own to what the results cost before
    for src in cfg.data.sources:
        ts = time.time()
        ctx = SourceContext(cfg, src, run_dir)
        _log_data(ctx)
        t_data = time.time() - ts
        if not claimed:
            load_check_all(cfg)
        preflight(ctx, all_methods)
        if not claimed:
            claim_run_dir(cfg, run_dir)
            claimed = True
        for seed in cfg.seeds:
            timings = times.cell(f"{ctx.name}/seed{seed}")
            timings["data"] = t_data
            cells.append(_cell(ctx, run_dir, seed, all_methods, timings))
        del ctx

    metrics = {
        "metrics_format": METRICS_FORMAT,
        "cells": cells,
        "aggregate": aggregate(cells),
        "config": cfg.model_dump(mode="json"),
        "w2s_shift_version": __version__,
        "environment": environment(cfg, DEFAULT_THREADS),
        "wall_seconds": round(times.wall(), 1),
        "wall_seconds_this_run": round(time.time() - t0, 1),
    }
    times.save()
    write_json_on_main(run_dir / "metrics.json", metrics)
    table = run_on_main(write_report, run_dir, metrics) or ""
    print(table, flush=True)
    log(
        f"done in {metrics['wall_seconds_this_run']:.0f} s; results in {run_dir}/ (report.md, report.html, "
        "metrics.json, <source>/seed<k>/ with rewards, labels, logs, drift)"
    )
    times.log_reuse()
    if evaluated:
        _log_evaluated_left_out(run_dir, evaluated)
    return metrics


def _cell(ctx: SourceContext, run_dir: Path, seed: int, all_methods: list, timings: dict) -> dict:
    """One cell of the grid (a source x a seed), each stage reused when finished: the teacher and its scores, the
    label stages (SEAM), every student's training, scores and mechanism, the exports; then the cell's metrics,
    written to ``<source>/seed<k>/metrics.json`` and returned. ``timings``: the cell's stage times (s), filled in."""
    from ..results import build_cell_metrics

    cfg = ctx.cfg
    ctx.use_seed(seed)
    methods = [m for m in all_methods if m.seeds is None or seed in m.seeds]  # an entry may name its seeds
    cell_dir = run_dir / ctx.name / f"seed{seed}"
    ts = time.time()
    need_labels = {}  # label stages (SEAM) still to run: they need the trained teacher
    for m in methods:
        st = label_stage(ctx, cell_dir, seed, m)
        if st is not None and not st.done() and st.name not in need_labels:
            need_labels[st.name] = (m, st)
    teacher = cell_teacher(ctx, cell_dir, seed, need_model=bool(need_labels))
    cell_scores(ctx, cell_dir, seed, "teacher", "teacher", teacher_digest(ctx, seed), model=teacher)
    for m, st in need_labels.values():
        rows, info = cell_labels(ctx, cell_dir, seed, m, teacher)
        file = m.method.label_file(m)
        write_jsonl_on_main(cell_dir / file, rows)
        write_json_on_main(cell_dir / file.replace(".jsonl", ".info.json"), info)
        st.finish(
            [file, file.replace(".jsonl", ".info.json")],
            **{k: info[k] for k in m.method.marker_fields},
        )
    del teacher
    timings["teacher"] = time.time() - ts
    labels = [r["q"] for r in read_jsonl(cell_dir / "teacher_labels.jsonl")]
    ts = time.time()
    # the ceiling first: with the teacher's scores it gives the weak-to-strong gap check, said before the other
    # students spend their time (each student seeds its own init and batches, so the order changes no result)
    for m in sorted(methods, key=lambda m: not m.method.ceiling):
        own = m.method.builds_labels
        built = [r["q"] for r in read_jsonl(cell_dir / m.method.label_file(m))] if own else None
        t1 = time.time()
        model = cell_student(ctx, cell_dir, seed, m, labels, built) if m.method.trains else None
        kind = m.name if m.method.trains else "pretrained"
        cell_scores(ctx, cell_dir, seed, m.display, kind, student_digest(ctx, seed, m), model=model)
        if cfg.mechanism and m.method.trains:
            cell_mechanism(ctx, cell_dir, seed, m.display, student_digest(ctx, seed, m), model)
        del model
        timings[f"student-{m.display}"] = time.time() - t1
        if m.method.ceiling:
            _log_gap(cfg, ctx.name, cell_dir, seed, m.display)
    timings["students"] = time.time() - ts
    export_students(ctx, cell_dir, seed, methods)
    ceiling = next((m.display for m in methods if m.method.ceiling), None)
    zero = next((m.display for m in methods if not m.method.trains), None)
    cell = {
        "source": ctx.name,
        "seed": seed,
        "dir": f"{ctx.name}/seed{seed}",
        "id": ctx.name,
        "ood": list(ctx.ood),
        "models": ["teacher", *[m.display for m in methods]],
        "methods": [method_dict(m, cfg.student.finetune) for m in methods],
        "ceiling": ceiling,
        "zero_shot": zero,
        "data": ctx.summary,
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "stages": {p.stem: read_json(p) for p in sorted((cell_dir / "stages").glob("*.json"))},
    }
    cm = build_cell_metrics(cell_dir, cell, cfg.bootstrap, seed)
    write_json_on_main(cell_dir / "metrics.json", cm)
    if not cm.get("teacher_beats_chance_id", True):
        lo, hi = cm["accuracy_ci95"]["teacher"][ctx.name]
        log(
            f"WARNING: {ctx.name} seed {seed}: the teacher does not beat chance on the ID test split "
            f"(95% interval {lo:.1f}-{hi:.1f} includes 50%): its labels carry little signal and W2S gains "
            "are not interpretable; use more teacher data or epochs"
        )
    return cm


def _log_gap(cfg: RunConfig, name: str, cell_dir: Path, seed: int, ceiling: str) -> None:
    """Say the cell's weak-to-strong gap check as soon as the ceiling is scored, with the numbers its metrics will
    hold (:func:`w2s_shift.results.cells.cell_gap_check`, same bootstrap and seed); a failed check withholds every
    verdict of the source, whatever the other seeds show, so the warning comes before the other students train."""
    from ..results.cells import cell_gap_check
    from ..results.files import reward_rows

    correct = {}
    for model in ("teacher", ceiling):
        _, chosen, rejected = reward_rows(cell_dir, model, name)
        correct[model] = {name: chosen - rejected > 0}
    g = cell_gap_check(correct, name, ceiling, cfg.bootstrap, seed)
    said = f"{ceiling} - teacher {g['gap_pp']:+.2f} pp [{g['ci'][0]:+.2f}, {g['ci'][1]:+.2f}] on {g['n']} ID test pairs"
    if g["passed"]:
        log(f"{name} seed {seed}: weak-to-strong gap check passed: {said}")
    else:
        log(
            f"WARNING: {name} seed {seed}: no weak-to-strong gap: {said} (needs >= {g['min_gap_pp']:g} pp with its "
            "95% interval above 0): every verdict of this source will be withheld, whatever the other seeds show; "
            "the other students still train and their comparisons are reported"
        )


def _log_data(ctx: SourceContext) -> None:
    """Log a source's split sizes, the invalid rows skipped and the OOD pairs removed for prompt overlap per set,
    and a warning for every split that got fewer pairs than requested."""
    log(
        f"data: source {ctx.name}: "
        + ", ".join(f"{k} {len(v)}" for k, v in ctx.splits.items())
        + "; OOD "
        + ", ".join(f"{k} {len(v)}" for k, v in ctx.ood.items())
    )
    sets = [("source " + ctx.name, ctx.summary["source"])] + [(f"OOD {k}", v) for k, v in ctx.summary["ood"].items()]
    for what, summ in sets:
        sk = summ["invalid_rows_skipped"]
        if sk["skipped"]:
            log(f"data: {what}: skipped {sk['skipped']} invalid rows (skip_invalid is on): {sk['by_reason']}")
        if summ.get("prompt_overlap_removed"):
            log(f"data: {what}: removed {summ['prompt_overlap_removed']} pairs whose prompt is in the source")
    for sf_ in ctx.summary.get("shortfalls", []):
        log(
            f"WARNING: data: source {ctx.name}: {sf_['split']}: requested {sf_['requested']} pairs, only "
            f"{sf_['available']} available"
        )


def _log_evaluated_left_out(run_dir: Path, evaluated: list) -> None:
    """Say which targets an earlier ``evaluate`` added that this config's report leaves out, and the command that
    adds each back without scoring again."""
    log(
        f"NOTE: target(s) {', '.join(e['name'] for e in evaluated)} added to this run earlier by `w2s-shift "
        "evaluate` are not in this config, so this report leaves them out; their rewards are kept and "
        + "; ".join(
            f"`w2s-shift evaluate {run_dir} {e.get('path') or e['name']}"
            + (f" --n-pairs {e['n_pairs']}" if e.get("n_pairs") not in (None, "all") else "")
            + (" --headline" if e.get("role", "headline") == "headline" else "")
            + "`"
            for e in evaluated
        )
        + " adds them back without scoring again"
    )


def earlier_evaluated_targets(run_dir: Path, cfg: RunConfig) -> list:
    """The ``evaluated_targets`` entries of the run directory's previous metrics.json (targets ``w2s-shift
    evaluate`` added) that are not OOD targets of ``cfg``: a rerun rebuilds metrics.json from its config and says
    how to add them back. [] when there is no readable metrics.json."""
    try:
        old = read_json(Path(run_dir) / "metrics.json")
    except (OSError, ValueError):
        return []
    entries = old.get("evaluated_targets") if isinstance(old, dict) else None
    names = {r.display for r in cfg.data.ood}
    return [e for e in entries or [] if isinstance(e, dict) and e.get("name") and e["name"] not in names]

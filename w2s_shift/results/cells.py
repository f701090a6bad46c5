"""Per-cell metrics (:func:`build_cell_metrics`): accuracies, W2S metrics with paired bootstrap intervals,
the weak-to-strong gap check, calibration, drift and the cuts of :mod:`.cuts`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..methods import is_baseline, is_w2s_student
from ..metrics.registry import model_metrics
from ..metrics.stats import (
    expected_calibration_error,
    gap_check,
    joint_bootstrap,
)
from .cuts import cell_label_effect, cell_length_baseline, cell_truncation
from .files import read_cell_jsonl, read_drift, reward_rows, training_curves

LEVEL = 0.95


def _ci(x) -> list | None:
    return None if x is None else [float(x[0]), float(x[1])]


def values_and_ci(tree):
    """Split joint_bootstrap's {"value", "ci"} leaves into a values tree and a ci95 tree."""
    if isinstance(tree, dict) and set(tree) == {"value", "ci"}:
        return tree["value"], _ci(tree["ci"])
    vals, cis = {}, {}
    for k, v in tree.items():
        vals[k], cis[k] = values_and_ci(v)
    return vals, cis


# ---- gap check of a cell --------------------------------------------------------------------------

NO_GAP = "no weak-to-strong gap: PGR undefined, W2S metrics not meaningful"


def cell_gap_check(correct: dict, id_name: str, ceiling: str | None, n_boot: int, seed: int) -> dict | None:
    """The cell's weak-to-strong gap check (:func:`w2s_shift.metrics.stats.gap_check`): ceiling minus teacher on the
    ID test pairs, paired bootstrap interval; None when the cell has no ceiling. Adds "ceiling": its label."""
    if not ceiling or ceiling not in correct:
        return None
    out = gap_check(correct[ceiling][id_name], correct["teacher"][id_name], n_boot=n_boot, seed=seed, level=LEVEL)
    return {"ceiling": ceiling, **out}


def _undefine_pgr(metrics: dict) -> None:
    """PGR of every student set to None (value and interval) in a cell that fails the gap check."""
    for m in metrics.values():
        m["PGR"] = {d: None for d in m.get("PGR", {})}
        m.setdefault("ci95", {})["PGR"] = {d: None for d in m["ci95"].get("PGR", {})}


def _margins(cell_dir: Path, models: list, datasets: list) -> tuple:
    """({model: {set: (n,) reward margins}}, {set: n}) from the cell's rewards files.

    Raises:
        ValueError: a missing or broken rewards file, or one whose pairs (ids, order) differ from the first model's.
    """
    margins: dict = {m: {} for m in models}
    n_pairs: dict = {}
    for d in datasets:
        ref_ids = None
        for m in models:
            ids, c, r = reward_rows(cell_dir, m, d)
            if ref_ids is None:
                ref_ids = ids
            elif ids != ref_ids:
                raise ValueError(
                    f"{cell_dir / 'rewards' / f'{m}__{d}.jsonl'}: its pairs (ids/order) differ from "
                    f"those of {models[0]} on {d}; paired metrics need the same pairs"
                )
            margins[m][d] = c - r
        n_pairs[d] = len(ref_ids)
    return margins, n_pairs


def _w2s_metrics(boot: dict) -> dict:
    """{student: {"WRG", "AOG", "AOG_mean", "NTS", "PGR", "ci95": the same layout, "PGR_undefined_share"}} from
    :func:`~w2s_shift.metrics.stats.joint_bootstrap`'s value/interval leaves."""
    metrics = {}
    for s, tree in boot["metrics"].items():
        undefined = tree.pop("PGR_undefined_share", {})
        vals, cis = values_and_ci(tree)
        vals.setdefault("PGR", {})
        cis.setdefault("PGR", {})
        metrics[s] = {**vals, "ci95": cis, "PGR_undefined_share": undefined}
    return metrics


def _teacher_labels(f: Path) -> dict | None:
    """The weak teacher's soft labels on student-train (``teacher_labels.jsonl``): {"n", "mean_q", "agree_with_gold"
    (%), "ece" (pp)}; None without the file or rows.

    Raises:
        ValueError: a row without a number ``q``.
    """
    if not f.is_file():
        return None
    rows = read_cell_jsonl(f)
    try:
        q = np.array([r["q"] for r in rows], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{f}: every row needs a number 'q'") from None
    if not q.size:
        return None
    agree = [bool(r.get("gold_agrees", qi > 0.5)) for r, qi in zip(rows, q)]
    return {
        "n": int(q.size),
        "mean_q": float(q.mean()),
        "agree_with_gold": float(100.0 * np.mean(agree)),
        "ece": expected_calibration_error(np.clip(q, 0.0, 1.0))[0],
    }


def _side_targets(correct: dict, id_name: str, side: list, models: list, w2s: list, bootstrap: int, seed: int) -> dict:
    """Accuracy and AOG of the side targets, from a bootstrap of their own (the headline's stays unchanged)."""
    sb = joint_bootstrap(correct, id_name, side, w2s, n_boot=bootstrap, seed=seed, level=LEVEL)
    acc, acc_ci = values_and_ci({m: {d: sb["accuracy"][m][d] for d in side} for m in models})
    aog, aog_ci = values_and_ci({lab: sb["metrics"][lab]["AOG"] for lab in w2s})
    return {"accuracy": acc, "accuracy_ci95": acc_ci, "AOG": aog, "AOG_ci95": aog_ci}


def build_cell_metrics(cell_dir: Path, cell: dict, bootstrap: int, seed: int) -> dict:
    """All metrics of one (source, seed) cell from its saved rewards, labels, logs and drift files.

    Args:
        cell_dir: ``RUN/<source>/seed<k>/``.
        cell: {"source", "seed", "dir", "id", "ood": [headline targets], "side": [side targets] (optional: sets
            added with ``evaluate``, scored and reported beside, outside AOG mean, NTS and the claims),
            "models": ["teacher", label, ...],
            "methods": [{"label", "name", "anchor_lambda", "anchor_layers", "layer_spec", "finetune"}],
            "ceiling": label or None, "zero_shot": label or None, "data": data summary, "timings": {stage: s}};
            other keys are copied into the result.
        bootstrap: bootstrap replicates (pairs resampled; ID and each OOD target independently, paired across
            models); seed: the bootstrap's seed.

    Returns:
        {"source", "seed", "dir", "id", "ood", "datasets", "models", "methods", "ceiling", "zero_shot",
         "n_pairs": {dataset: pairs},
         "accuracy": {model: {dataset: pp}}, "accuracy_ci95": {model: {dataset: [lo, hi]}},
         "accuracy_ood_mean": {model: pp}, "accuracy_ood_mean_ci95": {model: [lo, hi]},
         "metrics": {W2S label: {"WRG", "AOG": {t}, "AOG_mean", "NTS" (pp), "PGR": {dataset: ratio or None},
                                 "ci95": the same layout with [lo, hi] or None}},
         "differences": {W2S label: {"vs": naive label, "accuracy": {dataset}, "WRG", "AOG": {t}, "AOG_mean",
                                     "NTS", "ci95": {...}}} (label minus the naive student, paired),
         "model_metrics": {metric: {model: {dataset: value or None}}} of every registered per-model metric
             (:mod:`w2s_shift.metrics.registry`: ECE and agreement with the teacher, and any registered one),
         "drift": {label: drift file}, "teacher_labels": {"n", "mean_q", "agree_with_gold", "ece"} or None,
         "teacher_beats_chance_id": bool (the lower 95% bound of the teacher's ID accuracy is above 50),
         "gap_check": {"ceiling", "gap_pp", "ci", "n", "level", "min_gap_pp", "passed"} or None without a ceiling
             (:func:`cell_gap_check`; when it fails every student's PGR and its interval are None),
         "length_baseline": :func:`cell_length_baseline` or None (rewards files without response lengths),
         "truncation": :func:`cell_truncation`, "label_effect": :func:`cell_label_effect` (None when not recorded),
         "training": {model: curves}, "bootstrap": {"n", "seed", "level"}, "data", "timings_seconds",
         "side": [side targets], "side_targets": {"accuracy": {model: {t: pp}}, "accuracy_ci95": {...},
             "AOG": {W2S label: {t: pp}}, "AOG_ci95": {...}} or None without side targets, ...}.
        W2S students are the methods whose name is not ceiling or zero_shot.

    Raises:
        ValueError: a missing cell field, a missing/broken rewards file, or rewards files of one dataset that
            list different pairs for different models (the file is named).
    """
    cell_dir = Path(cell_dir)
    for k in ("source", "seed", "id", "ood", "models", "methods"):
        if k not in cell:
            raise ValueError(f"cell {cell_dir}: field {k!r} is missing")
    id_name, oods = cell["id"], list(cell["ood"])
    side = [d for d in cell.get("side") or [] if d not in oods and d != id_name]
    datasets = [id_name, *oods]
    models = list(dict.fromkeys(["teacher", *cell["models"]]))
    methods = list(cell["methods"])
    w2s = [m["label"] for m in methods if is_w2s_student(m) and m["label"] in models]
    ceiling = cell.get("ceiling")
    baseline = next((m["label"] for m in methods if is_baseline(m) and m["label"] in models), None)

    margins, n_pairs = _margins(cell_dir, models, [*datasets, *side])
    correct = {m: {d: margins[m][d] > 0 for d in [*datasets, *side]} for m in models}
    boot = joint_bootstrap(
        correct,
        id_name,
        oods,
        w2s,
        teacher="teacher",
        ceiling=ceiling,
        baseline=baseline,
        n_boot=bootstrap,
        seed=seed,
        level=LEVEL,
    )
    accuracy, accuracy_ci = values_and_ci(boot["accuracy"])
    ood_mean, ood_mean_ci = values_and_ci(boot["accuracy_ood_mean"])
    metrics = _w2s_metrics(boot)
    gap = cell_gap_check(correct, id_name, ceiling, bootstrap, seed)
    if gap is not None and not gap["passed"]:
        _undefine_pgr(metrics)
    length = cell_length_baseline(cell_dir, models, datasets, margins, id_name, oods, w2s, ceiling)
    differences = {}
    for s, tree in boot["differences"].items():
        vals, cis = values_and_ci(tree)
        differences[s] = {"vs": baseline, **vals, "ci95": cis}

    per_model = model_metrics({m: {d: margins[m][d] for d in datasets} for m in models})

    drift = {
        m: read_drift(cell_dir / "drift" / f"{m}.json") for m in models if (cell_dir / "drift" / f"{m}.json").is_file()
    }
    training = {m: c for m in models if (c := training_curves(cell_dir / "logs" / f"{m}.jsonl")) is not None}
    side_targets = None
    if side:  # their own bootstrap: the headline's replicates (and numbers) stay those of a run without them
        side_targets = _side_targets(correct, id_name, side, models, w2s, bootstrap, seed)

    t_lo = accuracy_ci["teacher"][id_name][0]
    consumed = {"timings"}
    extra = {k: v for k, v in cell.items() if k not in consumed}
    return {
        **extra,
        "source": cell["source"],
        "seed": cell["seed"],
        "dir": cell.get("dir", str(cell_dir)),
        "id": id_name,
        "ood": oods,
        "datasets": datasets,
        "models": models,
        "methods": methods,
        "ceiling": ceiling,
        "zero_shot": cell.get("zero_shot"),
        "n_pairs": n_pairs,
        "accuracy": accuracy,
        "accuracy_ci95": accuracy_ci,
        "accuracy_ood_mean": ood_mean,
        "accuracy_ood_mean_ci95": ood_mean_ci,
        "metrics": metrics,
        "differences": differences,
        "model_metrics": per_model,
        "drift": drift,
        "teacher_labels": _teacher_labels(cell_dir / "teacher_labels.jsonl"),
        "teacher_beats_chance_id": bool(t_lo > 50.0),
        "gap_check": gap,
        "length_baseline": length,
        "truncation": cell_truncation(cell_dir, cell, [*datasets, *side]),
        "label_effect": cell_label_effect(cell_dir, cell, methods),
        "training": training,
        "bootstrap": {"n": int(bootstrap), "seed": int(seed), "level": LEVEL},
        "data": cell.get("data", {}),
        "timings_seconds": {k: round(float(v), 1) for k, v in (cell.get("timings") or {}).items()},
        "side": side,
        "side_targets": side_targets,
    }

"""Aggregation of per-cell metrics over seeds: mean and standard deviation of every numeric leaf."""

from __future__ import annotations

import numpy as np

from ..metrics.mechanism import drift_aog_correlation
from ..metrics.registry import MODEL_METRICS

# ---- aggregation over seeds --------------------------------------------------------------------------------


_SKIP = ("ci95", "bins", "vs")


def _stat(values: list) -> dict:
    ok = [float(v) for v in values if v is not None]
    return {
        "mean": float(np.mean(ok)) if ok else None,
        "std": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
        "values": [None if v is None else float(v) for v in values],
    }


def _stats(trees: list):
    """Mean / std / per-seed values at every numeric leaf of equally shaped trees (None where one lacks it)."""
    present = [t for t in trees if t is not None]
    if not present:
        return None
    if all(isinstance(t, dict) for t in present):
        keys = list(dict.fromkeys(k for t in present for k in t if k not in _SKIP))
        out = {}
        for k in keys:
            sub = _stats([t.get(k) if isinstance(t, dict) else None for t in trees])
            if sub is not None:
                out[k] = sub
        return out
    if all(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool)) for t in trees):
        return _stat(trees)
    return None  # strings, lists: not aggregated


def _model_metrics(cells: list) -> dict:
    """The registered per-model metrics over seeds: every stat also holds "value", the metric's combination."""
    out = _stats([c.get("model_metrics") for c in cells]) or {}
    for name, per in out.items():
        metric = MODEL_METRICS.get(name)
        for sets in per.values():
            for st in sets.values():
                st["value"] = metric.combine(st["values"]) if metric else st["mean"]
    return out


def aggregate(cells: list) -> dict:
    """Per source, over its seeds: mean, standard deviation (ddof=1; None for one seed) and per-seed values
    (ordered as "seeds") of every accuracy and metric.

    Returns:
        {source: {"seeds": [...], "id", "ood", "side" (side targets), "side_targets" ({"accuracy", "AOG"} of stat),
                  "datasets", "models", "methods", "ceiling", "zero_shot",
                  "accuracy": {model: {dataset: stat}}, "accuracy_ood_mean": {model: stat},
                  "metrics": {label: {"WRG": stat, "AOG": {t: stat}, "AOG_mean", "NTS", "PGR": {d: stat}}},
                  "differences": {label: {...}},
                  "model_metrics": {metric: {model: {dataset: stat + "value"}}}, "value" the metric's own
                      combination over seeds (:meth:`w2s_shift.metrics.registry.ModelMetric.combine`),
                  "drift_final": {label: {dataset: {layer: {"rel_sq_err": stat, "cka": stat}}}},
                  "teacher_labels": {"n", "mean_q", "agree_with_gold", "ece": stat},
                  "teacher_beats_chance_id": [bool per seed],
                  "drift_vs_aog": :func:`w2s_shift.metrics.mechanism.drift_aog_correlation` over every W2S
                  student, seed and OOD target (None with too few points)}}
        with stat = {"mean", "std", "values"}; a mean over seeds where the value is defined (PGR may be None).
    """
    by_source: dict = {}
    for c in cells:
        by_source.setdefault(c["source"], []).append(c)
    out = {}
    for src, cs in by_source.items():
        cs = sorted(cs, key=lambda c: c["seed"])
        methods = list({m["label"]: m for c in cs for m in c["methods"]}.values())
        out[src] = {
            "seeds": [c["seed"] for c in cs],
            "id": cs[0]["id"],
            "ood": list(dict.fromkeys(d for c in cs for d in c["ood"])),
            "side": list(dict.fromkeys(d for c in cs for d in c.get("side") or [])),
            "side_targets": _stats([c.get("side_targets") for c in cs]) or {},
            "datasets": list(dict.fromkeys(d for c in cs for d in c["datasets"])),
            "models": list(dict.fromkeys(m for c in cs for m in c["models"])),
            "methods": methods,
            "ceiling": next((c["ceiling"] for c in cs if c.get("ceiling")), None),
            "zero_shot": next((c["zero_shot"] for c in cs if c.get("zero_shot")), None),
            "accuracy": _stats([c["accuracy"] for c in cs]),
            "accuracy_ood_mean": _stats([c.get("accuracy_ood_mean") for c in cs]),
            "metrics": _stats([c["metrics"] for c in cs]),
            "differences": _stats([c.get("differences") for c in cs]) or {},
            "model_metrics": _model_metrics(cs),
            "drift_final": _stats([{lab: v["final"] for lab, v in c.get("drift", {}).items()} for c in cs]) or {},
            "teacher_labels": _stats([c.get("teacher_labels") for c in cs]) or {},
            "teacher_beats_chance_id": [c["teacher_beats_chance_id"] for c in cs],
            "drift_vs_aog": drift_aog_correlation(cs),
        }
    return out

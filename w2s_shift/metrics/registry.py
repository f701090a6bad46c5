"""Per-model metrics, declared once: each :class:`ModelMetric` says how it is computed from a model's reward margins
on an evaluation set, whether higher is better, how it is combined over seeds and how it is shown. Every consumer
iterates :data:`MODEL_METRICS`: the cell metrics (``metrics.json``'s ``model_metrics``), the aggregate over seeds,
the report's per-model table, ``compare``, the notebook API's ``Run.model_metrics`` frame and the W&B summaries.

A metric of one's own is one registration (a decorator on its function), e.g. in a notebook or a plugin module::

    @register_metric("mean_abs_margin", title="mean |margin|", higher_is_better=None)
    def mean_abs_margin(margins, teacher_margins):
        return float(np.mean(np.abs(margins)))

Pairwise accuracy and the weak-to-strong metrics (WRG, AOG, NTS, PGR), whose intervals come from one joint
bootstrap over models, stay in :mod:`w2s_shift.metrics.stats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .stats import agreement_rate, expected_calibration_error, sigmoid


@dataclass(frozen=True)
class ModelMetric:
    """One per-model metric.

    Attributes:
        name: its key in ``metrics.json`` (``model_metrics.<name>.<model>.<set>``), the API frame and W&B
            (``<name>/<set>``); letters, digits and '_'.
        compute: ``compute(margins, teacher_margins) -> float | None``: margins (n,) = r(chosen) - r(rejected) of
            the model on the set's n pairs, teacher_margins (n,) the weak teacher's on the same pairs (float64).
        title: the report's column header (``<title> <set>``).
        description: one sentence for the report, with its unit and source.
        higher_is_better: True, False, or None (neither: a diagnostic).
        over_seeds: "mean" or "median" of the per-seed values (shown with the standard deviation).
        digits: decimals shown.
        teacher: computed for the weak teacher too (False: "–" in its row; agreement with itself means nothing).
    """

    name: str
    compute: Callable
    title: str
    description: str = ""
    higher_is_better: bool | None = None
    over_seeds: str = "mean"
    digits: int = 2
    teacher: bool = True

    def combine(self, values: list) -> float | None:
        """The value over seeds of the per-seed ``values`` (None where undefined; None when none is defined)."""
        ok = [float(v) for v in values if v is not None]
        if not ok:
            return None
        return float(np.median(ok) if self.over_seeds == "median" else np.mean(ok))


MODEL_METRICS: dict[str, ModelMetric] = {}


def register_metric(name: str, *, replace: bool = False, **fields) -> Callable:
    """Decorator: register the function it wraps as :class:`ModelMetric` ``name`` (``fields``: its other
    attributes). Returns the function unchanged.

    Raises:
        ValueError: a name taken (unless ``replace``) or not letters, digits and '_'; ``over_seeds`` not mean or
            median.
    """

    def deco(fn: Callable) -> Callable:
        if not name.replace("_", "").isalnum() or not name.isascii():
            raise ValueError(f"metric name {name!r}: letters, digits and '_' only")
        if name in MODEL_METRICS and not replace:
            raise ValueError(f"metric {name!r} is already registered")
        metric = ModelMetric(name=name, compute=fn, **fields)
        if metric.over_seeds not in ("mean", "median"):
            raise ValueError(f"metric {name}: over_seeds must be mean or median, got {metric.over_seeds!r}")
        MODEL_METRICS[name] = metric
        return fn

    return deco


def unregister_metric(name: str) -> None:
    """Take metric ``name`` out of the registry (no error when it is not there)."""
    MODEL_METRICS.pop(name, None)


def model_metrics(margins: dict, teacher: str = "teacher") -> dict:
    """Every registered metric of every model on every set.

    Args:
        margins: {model: {set: (n,) reward margins}}; every model on a set has the same pairs in the same order,
            and ``teacher`` is one of the models.

    Returns:
        {metric: {model: {set: value or None}}}; None where the metric skips the teacher or returns None.
    """
    out = {}
    for name, metric in MODEL_METRICS.items():
        out[name] = {
            m: {
                d: (None if m == teacher and not metric.teacher else _number(metric, v, margins[teacher][d]))
                for d, v in per.items()
            }
            for m, per in margins.items()
        }
    return out


def _number(metric: ModelMetric, margins, teacher_margins) -> float | None:
    v = metric.compute(np.asarray(margins, dtype=np.float64), np.asarray(teacher_margins, dtype=np.float64))
    return None if v is None else float(v)


@register_metric(
    "ece",
    title="ECE",
    description="expected calibration error (pp) of sigmoid(reward margin) against gold, each pair folded to its "
    "predicted side, 10 equal-width confidence bins over [0.5, 1] (Guo et al. 2017)",
    higher_is_better=False,
)
def ece(margins: np.ndarray, teacher_margins: np.ndarray) -> float:
    """:func:`w2s_shift.metrics.stats.expected_calibration_error` of the model's preference probabilities, in pp."""
    return expected_calibration_error(sigmoid(margins))[0]


@register_metric(
    "agreement_with_teacher",
    title="agree w/ teacher",
    description="pairs (%) on which the model prefers the same response as the weak teacher (a tie counts as "
    "preferring rejected)",
    higher_is_better=None,
    digits=1,
    teacher=False,
)
def agreement_with_teacher(margins: np.ndarray, teacher_margins: np.ndarray) -> float:
    """:func:`w2s_shift.metrics.stats.agreement_rate` with the weak teacher, in pp."""
    return agreement_rate(margins, teacher_margins)

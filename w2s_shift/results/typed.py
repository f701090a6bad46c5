"""A finished run's results as typed objects: :class:`RunResult` is ``metrics.json`` validated (pydantic; an error
names the field), :class:`CellResult` one (source, seed) cell, and :class:`Estimate` the one regular view of every
metric with its 95% interval, whatever key the file keeps it under. The file keeps its layout (other tools read it;
its version is ``metrics_format``); code reads results through these accessors.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

#: The W2S metrics of a student (Le et al. 2026; PGR: Burns et al. 2023): one value each, or one per target.
W2S_SCALARS = ("WRG", "AOG_mean", "NTS")
W2S_PER_TARGET = ("AOG", "PGR")


class Estimate(NamedTuple):
    """A metric's value and its 95% interval (None where undefined or not computed): pp for accuracies and the W2S
    metrics, a ratio for PGR."""

    value: float | None
    low: float | None = None
    high: float | None = None


def _estimate(value, ci) -> Estimate:
    lo, hi = (ci[0], ci[1]) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
    return Estimate(value, lo, hi)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class CellResult(_Open):
    """One cell of ``metrics.json`` (:func:`w2s_shift.results.cells.build_cell_metrics` lists every key)."""

    source: str
    seed: int
    dir: str
    id: str
    ood: list[str]
    datasets: list[str]
    models: list[str]
    methods: list[dict]
    ceiling: str | None = None
    zero_shot: str | None = None
    n_pairs: dict[str, int]
    accuracy: dict[str, dict[str, float]]
    accuracy_ci95: dict[str, dict[str, list[float] | None]] = Field(default_factory=dict)
    metrics: dict[str, dict] = Field(default_factory=dict)
    model_metrics: dict[str, dict[str, dict[str, float | None]]] = Field(default_factory=dict)
    gap_check: dict | None = None
    teacher_beats_chance_id: bool | None = None
    side: list[str] = Field(default_factory=list)

    def accuracy_of(self, model: str, dataset: str) -> Estimate:
        """Pairwise accuracy (pp) of ``model`` on ``dataset`` with its 95% bootstrap interval over pairs."""
        return _estimate(self.accuracy[model][dataset], self.accuracy_ci95.get(model, {}).get(dataset))

    def w2s(self, label: str, metric: str, target: str | None = None) -> Estimate:
        """A W2S metric of student ``label``: WRG, AOG_mean, NTS (pp), or per ``target`` AOG (pp) and PGR (ratio; the
        ID set), with its paired 95% interval.

        Raises:
            KeyError: not a W2S student of the cell, an unknown metric, or a target it has no value for.
        """
        m = self.metrics[label]
        ci = m.get("ci95") or {}
        if metric in W2S_SCALARS:
            return _estimate(m[metric], ci.get(metric))
        if metric in W2S_PER_TARGET:
            return _estimate(m[metric][target], (ci.get(metric) or {}).get(target))
        raise KeyError(f"unknown W2S metric {metric!r} (known: {', '.join(W2S_SCALARS + W2S_PER_TARGET)})")

    def w2s_rows(self) -> list:
        """[(student, metric, target or None, Estimate)] of every W2S metric of every student (AOG per OOD target,
        PGR on the ID set)."""
        rows = []
        for label, m in self.metrics.items():
            rows += [(label, k, None, self.w2s(label, k)) for k in W2S_SCALARS]
            rows += [(label, "AOG", t, self.w2s(label, "AOG", t)) for t in m.get("AOG", {})]
            rows.append(
                (
                    label,
                    "PGR",
                    self.id,
                    self.w2s(label, "PGR", self.id) if self.id in m.get("PGR", {}) else Estimate(None),
                )
            )
        return rows

    def model_metric(self, name: str, model: str, dataset: str) -> float | None:
        """A registered per-model metric (:mod:`w2s_shift.metrics.registry`); None where the metric skips the model
        or the cell has none."""
        return self.model_metrics.get(name, {}).get(model, {}).get(dataset)


class RunResult(_Open):
    """``metrics.json`` of a finished run: its cells, and the aggregate over seeds, config, environment and wall time
    as the file has them."""

    metrics_format: int = 1
    cells: list[CellResult] = Field(min_length=1)
    aggregate: dict | None = None
    config: dict | None = None

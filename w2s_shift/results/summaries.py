"""A finished run's final metrics in each trained model's Weights & Biases run (``report_to: [wandb]``): flat summary
keys read through the typed results (:class:`~w2s_shift.results.typed.CellResult`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..tracking import init_wandb_run
from .typed import CellResult


def summary_of(cell: dict, label: str) -> dict:
    """The final metrics of one model of one cell (``metrics.json``'s cell) as flat wandb summary keys:
    ``accuracy/<set>`` (pp), ``accuracy_ci95_low/<set>``, ``accuracy_ci95_high/<set>``, ``n_pairs/<set>``, and for
    a W2S student ``WRG``, ``AOG/<target>``, ``AOG_mean``, ``NTS`` (pp) and ``PGR`` (ID; None when undefined), and
    ``<metric>/<set>`` of every registered per-model metric (:mod:`w2s_shift.metrics.registry`) it has."""
    c = CellResult.model_validate(cell)
    out = {}
    for ds in c.datasets:
        est = c.accuracy_of(label, ds)
        out[f"accuracy/{ds}"] = est.value
        out[f"accuracy_ci95_low/{ds}"], out[f"accuracy_ci95_high/{ds}"] = est.low, est.high
        out[f"n_pairs/{ds}"] = c.n_pairs[ds]
    for name, per in c.model_metrics.items():
        out.update({f"{name}/{ds}": v for ds, v in (per.get(label) or {}).items() if v is not None})
    if label in c.metrics:
        for _, metric, target, est in (r for r in c.w2s_rows() if r[0] == label):
            key = f"AOG/{target}" if metric == "AOG" else metric
            out[key] = est.value
    return out


def log_summaries(run_dir: str | os.PathLike, metrics: dict) -> list:
    """Write every trained model's final metrics (:func:`summary_of`) into its wandb run's summary (the run its
    training logged to, resumed by id; created when it trained before wandb was on), then finish it.

    Returns:
        [(group, model, wandb run id)] of the runs written.
    """
    import wandb

    if wandb.run is not None:
        wandb.finish()  # the last model's training run
    run_dir, done = Path(run_dir), []
    from ..methods import get_method

    for cell in metrics["cells"]:
        group = f"{cell['source']}/seed{cell['seed']}"
        trains = {"teacher"} | {m["label"] for m in cell.get("methods", []) if get_method(m["name"]).trains}
        for label in [m for m in cell["models"] if m in trains]:
            run = init_wandb_run(run_dir, group, label)
            run.summary.update(summary_of(cell, label))
            run.finish()
            done.append((group, label, run.id))
    return done

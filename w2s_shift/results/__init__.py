"""A finished run's results, read in one place: :func:`open_run` is the reader of ``w2s-shift report``,
``evaluate``, ``export`` and ``compare`` and of the notebook API's ``load_run``, with one set of errors
(:class:`RunDirError`, naming the file, the field and what to give instead).

It also computes a run's results from its files, for ``metrics.json`` and the report (which only renders them):
:mod:`.cells` (a cell's metrics with their intervals), :mod:`.cuts` (length baseline, truncation, the labels methods
built), :mod:`.seeds` (aggregation over seeds), :mod:`.verdicts` (the paper's claims, ANCHOR's competitors and the
mechanism by intervention), :mod:`.ensembles` (seed ensembles as models). :mod:`.errors` holds
:class:`RunDirError`; :mod:`.files` reads a cell's rewards, logs and drift files and checks a metrics file and the
rewards it was computed from; :mod:`.typed` is the results as typed objects (:class:`RunResult`, :class:`CellResult`,
:class:`Estimate`: every metric with its interval), which the notebook API and :mod:`.summaries` (the W&B summaries)
read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..io import read_json
from .cells import NO_GAP, build_cell_metrics, cell_gap_check
from .cuts import cell_label_effect, cell_length_baseline, cell_truncation
from .errors import RunDirError
from .files import check_cell_rewards, check_metrics, load_rewards, read_cell_jsonl, read_drift, reward_rows
from .seeds import aggregate
from .typed import CellResult, Estimate, RunResult

__all__ = [
    "NO_GAP",
    "aggregate",
    "build_cell_metrics",
    "cell_gap_check",
    "cell_label_effect",
    "cell_length_baseline",
    "cell_truncation",
    "METRICS_FORMAT",
    "CellResult",
    "Estimate",
    "RunResult",
    "FinishedRun",
    "RunDirError",
    "check_cell_rewards",
    "check_metrics",
    "exportable_labels",
    "upgrade_metrics",
    "load_rewards",
    "open_run",
    "read_cell_jsonl",
    "read_drift",
    "reward_rows",
]


#: The layout of metrics.json this code writes: 2 has per-model metrics under "model_metrics" and the labels methods
#: built under "label_effect"; 1 (files without "metrics_format") had "calibration", "agreement_with_teacher" and
#: "seam_effect", and is upgraded when read (:func:`upgrade_metrics`).
METRICS_FORMAT = 2


@dataclass(frozen=True)
class FinishedRun:
    """A finished run directory as :func:`open_run` read it.

    Attributes:
        path: the run directory. metrics: ``metrics.json`` (cells, aggregate, config, environment) as a dict.
        result: the same, typed (:class:`~w2s_shift.results.typed.RunResult`: a cell's metrics as
            :class:`~w2s_shift.results.typed.Estimate` with their intervals).
        config: the run's :class:`~w2s_shift.config.RunConfig` from ``config.yaml`` (checked against ``run.json``'s
            digest), or None when it was not asked for.
    """

    path: Path
    metrics: dict
    config: object = None
    result: RunResult | None = None

    @property
    def cells(self) -> list:
        """The per-(source, seed) cell dicts of ``metrics.json``."""
        return self.metrics["cells"]

    def cell_dir(self, cell: dict) -> Path:
        """The folder of one cell: ``RUN/<source>/seed<k>``."""
        return self.path / cell.get("dir", f"{cell['source']}/seed{cell['seed']}")


def exportable_labels(cells: list) -> list:
    """The labels of the trained students of a run's cells (``metrics.json`` cells), in the run's order: what
    ``export`` accepts (teacher, zero-shot and other untrained models have no student weights to export; a method
    this version does not know is left out)."""
    from ..methods import method_of

    out: dict = {}
    for c in cells:
        for m in c.get("methods") or []:
            if isinstance(m, dict) and m.get("label") and getattr(method_of(m), "trains", False):
                out[m["label"]] = None
    return list(out)


def open_run(run_dir: str | os.PathLike, *, config: bool = False, rewards: bool = False) -> FinishedRun:
    """Open a finished run directory: its ``metrics.json`` with every number finite and numeric where one is read,
    and at least one cell.

    Args:
        run_dir: the run directory (``RUN``, not ``RUN/metrics.json`` nor a cell ``RUN/<source>/seed<k>``).
        config: also read ``run.json`` and ``config.yaml`` and check that the config is the run's (its digest is
            ``run.json``'s): what a command that loads the run's models or data needs.
        rewards: also check that every rewards file the cells were computed from is there, with the pairs and the
            accuracy ``metrics.json`` records (what rendering a report needs).

    Raises:
        RunDirError: naming the file (and the field) and what to give or do instead: a file or a cell directory
            given for the run, not a directory, a missing file (``metrics.json``: the run has not finished), a file
            that is not JSON, a damaged number, no cells, a changed ``config.yaml``, a damaged rewards file.
    """
    d = Path(run_dir)
    if d.is_file():  # e.g. RUN/metrics.json: the folder is what is asked for
        raise RunDirError(f"{d}: is a file; give the run directory ({d.parent})")
    if not d.is_dir():
        raise RunDirError(f"{d}: not a directory; give the directory of a finished w2s-shift run")
    if (d / "stages").is_dir() and not (d / "run.json").is_file():
        raise RunDirError(
            f"{d}: this is a cell directory (<source>/seed<k>); give the run directory ({d.parent.parent})"
        )
    for name, what in (("run.json", "the run marker"), ("config.yaml", "the run's config")) if config else ():
        if not (d / name).is_file():
            raise RunDirError(f"{d}: not a finished w2s-shift run directory: {name} ({what}) is missing")
    f = d / "metrics.json"
    if not f.is_file():
        finish = "; finish the run first (`w2s-shift run` resumes it)" if (d / "run.json").is_file() else ""
        raise RunDirError(f"{f}: not found; is {d} a finished w2s-shift run directory?{finish}")
    try:
        metrics = read_json(f)
    except json.JSONDecodeError as e:
        raise RunDirError(f"{f}: not JSON ({e.msg}, line {e.lineno}): the file is damaged") from None
    except (OSError, ValueError) as e:
        raise RunDirError(f"{f}: not a w2s-shift metrics file ({type(e).__name__}: {e})") from None
    check_metrics(f, metrics)
    fmt = metrics.get("metrics_format", 1) if isinstance(metrics, dict) else None
    if fmt is not None and (isinstance(fmt, bool) or not isinstance(fmt, int) or fmt > METRICS_FORMAT):
        raise RunDirError(
            f"{f}: metrics_format {fmt!r} was written by a newer w2s-shift (this one reads formats 1 to "
            f"{METRICS_FORMAT}); upgrade w2s-shift to read it"
        )
    cfg = _run_config(d) if config else None
    upgrade_metrics(metrics)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("cells"), list) or not metrics["cells"]:
        raise RunDirError(f"{f}: no 'cells' (a metrics.json from an older w2s-shift version?)")
    try:
        result = RunResult.model_validate(metrics)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise RunDirError(
            f"{f}: field {where}: {err['msg']}: the file is damaged; rerun the run to rewrite it"
        ) from None
    if rewards:
        try:
            check_cell_rewards(d, metrics)
        except ValueError as e:
            raise RunDirError(str(e)) from None
    return FinishedRun(d, metrics, cfg, result)


def upgrade_metrics(metrics: dict) -> dict:
    """Bring a ``metrics.json`` of an older layout to this one, in place (and return it): cells with ``calibration``
    ({model: {set: {"ece", "bins"}}}) and ``agreement_with_teacher`` but no ``model_metrics`` get them as the
    registered metrics ``ece`` and ``agreement_with_teacher``; an aggregate without ``model_metrics`` is dropped
    (the report computes it again from the cells). Its ``metrics_format`` becomes :data:`METRICS_FORMAT`."""
    if not isinstance(metrics, dict):
        return metrics
    cells = metrics.get("cells")
    for c in cells if isinstance(cells, list) else []:
        if not isinstance(c, dict) or "model_metrics" in c or "calibration" not in c:
            continue
        models = [m for m in c.get("models") or [] if m in c["calibration"]]
        c["model_metrics"] = {
            "ece": {m: {d: v.get("ece") for d, v in c["calibration"][m].items()} for m in models},
            "agreement_with_teacher": {
                m: dict((c.get("agreement_with_teacher") or {}).get(m) or dict.fromkeys(c["calibration"][m]))
                for m in models
            },
        }
    if isinstance(metrics.get("aggregate"), dict) and any(
        isinstance(a, dict) and "model_metrics" not in a for a in metrics["aggregate"].values()
    ):
        del metrics["aggregate"]
    metrics["metrics_format"] = METRICS_FORMAT
    return metrics


def _run_config(d: Path):
    """The run's config from ``config.yaml``, checked against ``run.json``'s digest."""
    import yaml

    from ..config import RunConfig

    f = d / "config.yaml"  # each file named in its error
    try:
        cfg = RunConfig.model_validate(yaml.safe_load(f.read_text(encoding="utf-8")))
        f = d / "run.json"
        marker = read_json(f)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise RunDirError(f"{f}: cannot read this file of the run ({type(e).__name__}): {e}") from None
    if not isinstance(marker, dict) or marker.get("config_digest") != cfg.digest():
        raise RunDirError(
            f"{d / 'config.yaml'}: its digest {cfg.digest()} is not the run's "
            f"({marker.get('config_digest') if isinstance(marker, dict) else None}, run.json): the file was "
            "changed after the run; restore it"
        )
    return cfg

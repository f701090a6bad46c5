"""The Python API for notebooks: :func:`run_grid` runs a config as ``w2s-shift run`` does, :func:`load_run` opens a
finished run directory; both return a :class:`Run` whose results are pandas DataFrames.

    from w2s_shift import run_grid, load_run
    run = run_grid("quickstart", overrides=["student.epochs=2"], output_dir="runs/nb")
    run.accuracy      # one row per (source, seed, model, dataset): accuracy (%) with its 95% interval, n pairs
    run.w2s_metrics   # one row per (source, seed, W2S student, metric[, target]): value (pp) with its interval
    run.rewards       # one row per (source, seed, model, dataset, pair): rewards, margin, correct

pandas is needed for the DataFrames (``pip install -e '.[notebook]'``; the test extra has it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .config import RunConfig


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("the notebook API returns pandas DataFrames: pip install -e '.[notebook]'") from None
    return pandas


@dataclass
class Run:
    """A finished run directory and its results.

    Attributes:
        run_dir: the directory.
        metrics: ``metrics.json`` as a dict (cells, aggregate, config, environment).
    """

    run_dir: Path
    metrics: dict = field(repr=False)

    @property
    def cells(self) -> list:
        """The per-(source, seed) cell dicts of ``metrics.json``."""
        return list(self.metrics["cells"])

    @cached_property
    def result(self):
        """The results typed (:class:`w2s_shift.results.RunResult`; each metric with its interval as an
        :class:`w2s_shift.results.Estimate`)."""
        from .results import RunResult

        return RunResult.model_validate(self.metrics)

    @property
    def accuracy(self):
        """DataFrame, one row per (source, seed, model, dataset): ``split`` ("ID" or "OOD"), ``accuracy``,
        ``ci95_low``, ``ci95_high`` (pairwise accuracy in %, 95% bootstrap interval) and ``n_pairs``."""
        rows = []
        for c in self.result.cells:
            for m in c.models:
                for d in c.datasets:
                    est = c.accuracy_of(m, d)
                    rows.append(
                        {
                            "source": c.source,
                            "seed": c.seed,
                            "model": m,
                            "dataset": d,
                            "split": "ID" if d == c.id else "OOD",
                            "accuracy": est.value,
                            "ci95_low": est.low,
                            "ci95_high": est.high,
                            "n_pairs": c.n_pairs[d],
                        }
                    )
        return _pandas().DataFrame(rows)

    @property
    def w2s_metrics(self):
        """DataFrame, one row per (source, seed, W2S student, metric, target): ``metric`` WRG, AOG, AOG_mean, NTS
        (pp) or PGR (ratio; None where undefined), ``target`` (the OOD set of AOG, the ID set of PGR, else None),
        ``value``, ``ci95_low``, ``ci95_high`` (paired bootstrap; None where undefined)."""
        rows = [
            {
                "source": c.source,
                "seed": c.seed,
                "model": label,
                "metric": metric,
                "target": target,
                "value": est.value,
                "ci95_low": est.low,
                "ci95_high": est.high,
            }
            for c in self.result.cells
            for label, metric, target, est in c.w2s_rows()
        ]
        return _pandas().DataFrame(rows)

    @property
    def model_metrics(self):
        """DataFrame, one row per (source, seed, model, dataset, metric) of every registered per-model metric
        (:mod:`w2s_shift.metrics.registry`: ``ece`` in pp, ``agreement_with_teacher`` in %, and any registered one):
        ``value`` (None where the metric skips the model) and ``higher_is_better`` (True, False or None)."""
        from .metrics.registry import MODEL_METRICS

        rows = [
            {
                "source": c["source"],
                "seed": c["seed"],
                "model": m,
                "dataset": d,
                "metric": name,
                "value": v,
                "higher_is_better": getattr(MODEL_METRICS.get(name), "higher_is_better", None),
            }
            for c in self.cells
            for name, per in (c.get("model_metrics") or {}).items()
            for m, sets in per.items()
            for d, v in sets.items()
        ]
        return _pandas().DataFrame(rows)

    @property
    def rewards(self):
        """DataFrame, one row per scored pair: source, seed, model, dataset, ``index`` (the pair's position in
        the set), ``id``, ``reward_chosen``, ``reward_rejected``, ``margin`` (chosen minus rejected) and
        ``correct`` (margin > 0; a tie counts as wrong), read from each cell's ``rewards/<model>__<set>.jsonl``."""
        from .io import read_jsonl

        pd = _pandas()
        frames = []
        for c in self.cells:
            cell_dir = self.run_dir / c.get("dir", f"{c['source']}/seed{c['seed']}")
            for m in c["models"]:
                for d in c["datasets"]:
                    df = pd.DataFrame(read_jsonl(cell_dir / "rewards" / f"{m}__{d}.jsonl"))
                    df.insert(0, "dataset", d)
                    df.insert(0, "model", m)
                    df.insert(0, "seed", c["seed"])
                    df.insert(0, "source", c["source"])
                    frames.append(df)
        out = pd.concat(frames, ignore_index=True)
        out["margin"] = out["reward_chosen"] - out["reward_rejected"]
        out["correct"] = out["margin"] > 0
        return out

    def report(self) -> str:
        """``report.md`` of the run (its tables, as ``w2s-shift report`` prints them)."""
        return (self.run_dir / "report.md").read_text(encoding="utf-8")


def _plain(v):
    """A deep copy of a config value with every path (``os.PathLike``) as its string."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return os.fspath(v) if isinstance(v, os.PathLike) else v


def load_run(run_dir: str | os.PathLike) -> Run:
    """Open a finished run directory (its ``metrics.json``, read by :func:`w2s_shift.results.open_run`).

    Raises:
        RunDirError: not a finished run directory (a file such as its metrics.json, or a cell directory, names the
            run directory to give), or a damaged metrics.json (file and field named).
    """
    from .results import open_run

    run = open_run(run_dir)
    return Run(run.path, run.metrics)


def run_grid(
    config: str | os.PathLike | dict | RunConfig | None = None,
    *,
    overrides: list | tuple = (),
    output_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    wait: bool = False,
    skip_invalid: bool = False,
) -> Run:
    """Run a grid as ``w2s-shift run`` does, with the same validation, and return its results.

    Args:
        config: a YAML file, a preset name (``quickstart``, ...), a config dict (not changed; ``pathlib.Path``
            values are taken as their strings), a :class:`RunConfig`, or None (the ``quickstart`` preset).
        overrides: ``--set`` strings, e.g. ``["student.epochs=2"]``.
        output_dir: the run directory (overrides ``output_dir``; a str or ``pathlib.Path``, taken as it is).
        overwrite, wait, skip_invalid: as ``--overwrite``, ``--wait``, ``--skip-invalid``.

    Raises:
        ConfigError: an invalid config (every problem listed), ANCHOR layers past the student's depth.
        DataError: a bad data row (file, row and field named), RunDirError, ModelError: as the CLI's exit-2 errors.
    """
    from pydantic import ValidationError

    from .config import ConfigError
    from .config_io import apply_overrides, check_anchor_layers_offline, format_errors, read_yaml
    from .pipeline import run

    extra = list(overrides)
    if skip_invalid:
        extra.append("data.skip_invalid=true")
    if isinstance(config, RunConfig):
        config = config.model_dump(mode="json")
    if isinstance(config, dict):  # a copy: the caller's dict (nested sections too) is never changed
        data, origin = _plain(config), "the config dict"
    else:
        data, origin = read_yaml(None if config is None else os.fspath(config))
    data = apply_overrides(data, extra)
    if output_dir is not None:  # set as it is, not parsed as YAML (a path may hold ': ' or '[')
        data["output_dir"] = os.fspath(output_dir)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, origin)) from None
    check_anchor_layers_offline(cfg)
    return Run(Path(cfg.output_dir), run(cfg, overwrite=overwrite, wait=wait))

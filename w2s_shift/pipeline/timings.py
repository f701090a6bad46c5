"""A run directory's time over every run of it: ``RUN/timings.json`` holds the wall time and each cell's stage times
summed over the runs that worked in the directory (a killed run included, up to its last finished stage), so a
rerun that reuses finished stages reports what the results cost, not its own near-zero times."""

from __future__ import annotations

import time
from pathlib import Path

from ..io import read_json
from .rundir import log, write_json_on_main

TIMINGS = "timings.json"


def _earlier(run_dir: Path) -> dict:
    """The directory's times so far: timings.json, else those of a metrics.json written before it existed."""
    try:
        old = read_json(run_dir / TIMINGS)
        if isinstance(old, dict) and isinstance(old.get("cells"), dict):
            return old
    except (OSError, ValueError):
        pass
    try:
        m = read_json(run_dir / "metrics.json")
        cells = {
            c["dir"]: {k: float(v) for k, v in (c.get("timings_seconds") or {}).items()}
            for c in m.get("cells") or []
            if isinstance(c, dict) and isinstance(c.get("dir"), str)
        }
        return {"runs": 1, "wall_seconds": float(m.get("wall_seconds") or 0.0), "cells": cells}
    except (OSError, ValueError, TypeError, AttributeError):
        return {"runs": 0, "wall_seconds": 0.0, "cells": {}}


def finished_stages(run_dir: Path) -> list:
    """The stage markers of the run directory's cells (``<source>/seed<k>/stages/*.json``)."""
    return sorted(Path(run_dir).glob("*/seed*/stages/*.json"))


class RunTimes:
    """The run directory's accumulated times, saved after every stage time added (on the main process)."""

    def __init__(self, run_dir: Path, t0: float | None = None):
        self.run_dir = Path(run_dir)
        self.t0 = time.time() if t0 is None else t0
        old = _earlier(self.run_dir)
        self.runs = int(old.get("runs") or 0)
        self.base_wall = float(old.get("wall_seconds") or 0.0)
        self.cells: dict = {k: dict(v) for k, v in old["cells"].items() if isinstance(v, dict)}
        self.stages_before = finished_stages(self.run_dir)
        if self.stages_before:
            log(
                f"resuming: {len(self.stages_before)} finished stage(s) of {max(self.runs, 1)} earlier run(s) in "
                f"{self.run_dir} ({self.base_wall:.0f} s); each whose inputs and code are unchanged is reused"
            )

    def wall(self) -> float:
        """The wall time of every run so far, this one up to now (s)."""
        return self.base_wall + time.time() - self.t0

    def cell(self, key: str) -> CellTimes:
        """The stage times of one cell (``<source>/seed<k>``), this run's added to the earlier runs' as set."""
        return CellTimes(self, key, dict(self.cells.get(key) or {}))

    def save(self) -> None:
        write_json_on_main(
            self.run_dir / TIMINGS,
            {"runs": self.runs + 1, "wall_seconds": round(self.wall(), 1), "cells": self.cells},
        )

    def log_reuse(self) -> None:
        """After the grid: how many stages this run reused from earlier runs (their markers left untouched)."""
        if not self.stages_before:
            return
        now = finished_stages(self.run_dir)
        reused = sum(1 for p in now if p in self.stages_before and p.stat().st_mtime < self.t0)
        log(f"resumed: {reused} of {len(now)} stage(s) reused from earlier runs; times in the report sum every run")


class CellTimes(dict):
    """A cell's stage times set by this run: ``times[stage] = seconds`` holds this run's seconds plus the earlier
    runs' for that stage, and saves them."""

    def __init__(self, owner: RunTimes, key: str, earlier: dict):
        super().__init__()
        self.owner, self.key, self.earlier = owner, key, earlier

    def __setitem__(self, stage: str, seconds: float) -> None:
        total = float(self.earlier.get(stage, 0.0)) + float(seconds)
        super().__setitem__(stage, total)
        self.owner.cells.setdefault(self.key, {})[stage] = round(total, 2)
        self.owner.save()

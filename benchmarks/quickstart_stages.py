"""Benchmark 3: wall time of the CPU quickstart, stage by stage.

Runs `w2s-shift run` on the quickstart preset into a fresh run directory (or reads a finished one with
--from RUN_DIR) and prints one table: seconds per stage from the run's own stage markers, split into the
training loop (``train_runtime`` of the stage's Trainer log, logs/<stage>.jsonl) and the rest of the stage
(tokenizing, the frozen trunk's forward over every sequence, ANCHOR reference states, scoring the test sets),
with optimizer steps and seconds per step.

    python benchmarks/quickstart_stages.py                      # runs the quickstart (about 10 minutes on 2 cores)
    python benchmarks/quickstart_stages.py --from runs/quickstart
    python benchmarks/quickstart_stages.py --set teacher.bf16=false   # a variant, for comparison
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _train_log(cell_dir: Path, stage: str) -> dict:
    """The Trainer's closing log row (train_runtime, step) of a stage, or {} when there is none."""
    name = "teacher" if stage == "teacher" else stage.removeprefix("student-")
    path = cell_dir / "logs" / f"{name}.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    done = [r for r in rows if "train_runtime" in r]
    return done[-1] if done else {}


def _cell_rows(cell_dir: Path, stages: dict, labels: list, prefix: str) -> list:
    """Rows of one cell: the teacher, then students in method order, then any other stage (SEAM labels...)."""

    def key(name):
        if name == "teacher":
            return (0, 0)
        label = name.removeprefix("student-")
        return (1, labels.index(label)) if name.startswith("student-") and label in labels else (2, 0)

    rows = []
    for name in sorted(stages, key=key):
        log = _train_log(cell_dir, name)
        rows.append((prefix + name, stages[name].get("seconds", 0.0), log.get("train_runtime"), log.get("step")))
    return rows


def stage_rows(run_dir: Path) -> list:
    """Per stage: (name, seconds, training-loop seconds or None, optimizer steps or None), in run order.

    Reads either layout: one cell in the run directory (``metrics.json`` with ``stages``) or a grid of cells
    (``metrics.json`` with ``cells``, each in ``<source>/seed<k>/`` with its ``stages/*.json`` markers).
    """
    m = json.loads((run_dir / "metrics.json").read_text())
    methods = m.get("config", {}).get("methods", [])
    labels = [mm.get("label") or mm.get("name") for mm in methods]
    if "cells" not in m:
        rows = [("data (load, split)", m.get("timings_seconds", {}).get("data", 0.0), None, None)]
        rows += _cell_rows(run_dir, m.get("stages", {}), labels, "")
    else:
        cells = m["cells"]
        first = cells[0] if cells else {}
        rows = [
            (
                "data (load, split)",
                (first.get("timings_seconds") or first.get("timings") or {}).get("data", 0.0),
                None,
                None,
            )
        ]
        for cell in cells:
            cell_dir = run_dir / cell.get("dir", "")
            stages = {p.stem: json.loads(p.read_text()) for p in sorted((cell_dir / "stages").glob("*.json"))}
            cell_labels = [mm.get("label") or mm.get("name") for mm in cell.get("methods", [])] or labels
            prefix = f"{cell.get('dir')}: " if len(cells) > 1 else ""
            rows += _cell_rows(cell_dir, stages, cell_labels, prefix)
    rows.append(("total (wall, in-process)", m.get("wall_seconds", 0.0), None, None))
    return rows


def stage_table(run_dir: Path) -> str:
    """The markdown table of :func:`stage_rows`."""
    import _common as C

    out = []
    for name, s, train, steps in stage_rows(run_dir):
        if train is None:
            out.append([name, f"{s:.1f}", "", "", "", ""])
        else:
            out.append(
                [
                    name,
                    f"{s:.1f}",
                    f"{train:.1f}",
                    f"{s - train:.1f}",
                    str(steps),
                    f"{train / steps:.2f}" if steps else "",
                ]
            )
    return C.markdown_table(["stage", "seconds", "training loop", "rest (features, scoring)", "steps", "s/step"], out)


def main(argv: list | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="run_dir", help="a finished run directory to read instead of running")
    ap.add_argument(
        "--set", action="append", default=[], help="config overrides, KEY=VALUE (a variant, or a smoke run)"
    )
    ap.add_argument("--preset", default="quickstart", help="config preset or YAML file")
    a = ap.parse_args(argv)
    if a.run_dir:
        run_dir = Path(a.run_dir)
    else:
        from w2s_shift.config_io import load_config
        from w2s_shift.pipeline import run

        run_dir = Path(tempfile.mkdtemp(prefix="w2s-quickstart-"))
        cfg = load_config(a.preset, [f"output_dir={run_dir}", *a.set])
        t = time.time()
        run(cfg)
        print(f"process wall time: {time.time() - t:.1f} s; run directory {run_dir}")
    table = stage_table(run_dir)
    print(table)
    return table


if __name__ == "__main__":
    main()

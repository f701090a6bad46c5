"""Wall time of the CPU quickstart, stage by stage (issue: performance, benchmark 3).

Runs `w2s-shift run` on the quickstart preset into a fresh run directory (or reads a finished one with
--from RUN_DIR) and prints one table: seconds per stage, from the run's own stage markers.

    python benchmarks/quickstart_stages.py                 # runs the quickstart (about 11 minutes on 2 cores)
    python benchmarks/quickstart_stages.py --from runs/quickstart
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def stage_table(run_dir: Path) -> str:
    m = json.loads((run_dir / "metrics.json").read_text())
    rows = [("data (load, split)", m["timings_seconds"].get("data", 0.0))]
    for name, info in m.get("stages", {}).items():
        rows.append((name, info.get("seconds", 0.0)))
    rows.append(("total (wall, in-process)", m.get("wall_seconds", 0.0)))
    out = ["| stage | seconds |", "|---|---|"] + [f"| {n} | {s:.1f} |" for n, s in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="run_dir", help="a finished run directory to read instead of running")
    ap.add_argument("--set", action="append", default=[], help="config overrides (for a smoke run)")
    a = ap.parse_args()
    if a.run_dir:
        run_dir = Path(a.run_dir)
    else:
        from w2s_shift.config import load_config
        from w2s_shift.pipeline import run

        run_dir = Path(tempfile.mkdtemp(prefix="w2s-quickstart-"))
        cfg = load_config("quickstart", [f"output_dir={run_dir}", *a.set])
        t = time.time()
        run(cfg)
        print(f"process wall time: {time.time() - t:.1f} s")
    print(stage_table(run_dir))


if __name__ == "__main__":
    main()

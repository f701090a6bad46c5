"""How often a 2-process gloo run aborts at exit: the interpreter's normal exit against
:func:`w2s_shift.distributed.end_process` (tests/exit_race_worker.py says how the race is provoked). Printed per
mode: launches that ended with a nonzero status, and those whose output says "terminate called" (the abort).

    .venv/bin/python benchmarks/exit_race.py                  # 20 launches per mode, about 3.5 min on 2 cores
    .venv/bin/python benchmarks/exit_race.py --smoke          # 1 launch per mode
    .venv/bin/python benchmarks/exit_race.py --json benchmarks/results/exit_race-DATE.json
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("plain", "end_process")


def launch(mode: str) -> tuple:
    """(exit status, output) of one 2-process launch of tests/exit_race_worker.py in ``mode``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    cmd += [str(ROOT / "tests" / "exit_race_worker.py"), mode]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=20, help="launches per mode (default 20)")
    ap.add_argument("--smoke", action="store_true", help="one launch per mode: tests the script, measures nothing")
    ap.add_argument("--json", default=None, help="also write the counts as JSON here")
    a = ap.parse_args(argv)
    n = 1 if a.smoke else a.launches
    rows, out = [], []
    for mode in MODES:
        runs = [launch(mode) for _ in range(n)]
        failed = sum(rc != 0 for rc, _ in runs)
        aborted = sum("terminate called" in text for _, text in runs)
        out.append({"mode": mode, "launches": n, "failed": failed, "aborted": aborted})
        rows.append([mode, n, failed, aborted])
        print(rows[-1], file=sys.stderr, flush=True)
    print(markdown_table(["exit", "launches", "nonzero status", "'terminate called'"], rows))
    if a.json:
        write_json(a.json, {"rows": out, "environment": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

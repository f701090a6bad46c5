"""Does a refactor change any result? Run the same tiny grid (the golden test's methods and ANCHOR's competitors,
drift, the mechanism; gpu_evidence.py's tiny random-init models, built in code, no downloads) with the code of a
base commit and with the working tree, and compare: every rewards file bit for bit, every number of metrics.json
(after mapping the base's layout onto this one's) and the report's main and claims tables.

    python benchmarks/behaviour_unchanged.py --base fdbd9a5 [--out /tmp/unchanged]

Prints one line per difference (none: "unchanged") and writes ``summary.json`` in ``--out``; exit 0 when nothing
differs, 1 otherwise. The base runs from a ``git worktree`` of ``--base`` under ``--out``. Both runs use this
process's Python environment, on this CPU (bit equality is a same-machine claim).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests")]
from gpu_evidence import smoke_models  # noqa: E402
from test_methods_unchanged import METHODS as GOLDEN_METHODS  # noqa: E402

# the golden test's methods (tests/test_methods_unchanged.py) and ANCHOR's competitors, ceiling and zero-shot last
METHODS = [*GOLDEN_METHODS[:-2], {"name": "l2sp", "l2sp_lambda": 0.01}, {"name": "wise_ft"}, *GOLDEN_METHODS[-2:]]
# the two code trees (base, head), for file names in messages
TREES = ["", str(REPO)]
# the report's tables compared: the main table and the claims table
TABLES = {
    "main table": r"## Source [^\n]*\n\n((?:\|[^\n]*\n)+)",
    "claims table": r"### The paper's claims\n\n[^\n]*\n\n((?:\|[^\n]*\n)+)",
}
# keys whose values are measurements of time or of the machine, not results
VOLATILE = {
    "timings_seconds",
    "wall_seconds",
    "wall_seconds_this_run",
    "environment",
    "seconds",
    "timings",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
}

RUN = r"""
import json, sys
sys.path.insert(0, {tests!r})
from conftest import tiny_grid_dict
from w2s_shift.config import RunConfig
from w2s_shift.pipeline import run
d = tiny_grid_dict({teacher!r}, {student!r}, {out!r}, ["hh-helpful-base", "pandalm"], {methods!r},
                   drift_interval=2, checkpoint_fraction=0.5)
run(RunConfig.model_validate(d))
"""


def run_grid(tree: Path, models: dict, out: Path) -> None:
    code = RUN.format(
        tests=str(REPO / "tests"), teacher=models["teacher"], student=models["student"], out=str(out), methods=METHODS
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "W2S_SHIFT_PROGRESS": "0"}
    subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True, capture_output=True)


def normalized(cell: dict) -> dict:
    """A cell of metrics.json in this code's layout: per-model metrics under "model_metrics", the labels a method
    built under "label_effect" (without the report text), label stages as "label_stage"."""
    c = dict(cell)
    if "calibration" in c and "model_metrics" not in c:
        c["model_metrics"] = {
            "ece": {m: {d: v["ece"] for d, v in per.items()} for m, per in c.pop("calibration").items()},
            "agreement_with_teacher": c.pop("agreement_with_teacher", {}),
        }
    if "model_metrics" in c:  # the teacher's agreement with itself: absent before, None now
        agree = c["model_metrics"].get("agreement_with_teacher", {})
        c["model_metrics"]["agreement_with_teacher"] = {
            m: per for m, per in agree.items() if any(v is not None for v in per.values())
        }
    if "seam_effect" in c:
        c["label_effect"] = c.pop("seam_effect")
    for e in (c.get("label_effect") or {}).values():
        e.pop("text", None)
    c["methods"] = [
        {("label_stage" if k == "seam_stage" else k): v for k, v in m.items() if k != "label_file"}
        for m in c.get("methods", [])
    ]
    return c


def differences(a, b, where: str = "") -> list:
    """Paths where two JSON trees differ (numbers compared exactly; volatile keys skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k in VOLATILE:
                continue
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'head' if k in b else 'base'}")
            else:
                out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    if isinstance(a, str) and isinstance(b, str):  # file names in messages: the same file in the other tree
        a, b = (x.replace(root, "<tree>") if root else x for x, root in ((a, TREES[0]), (b, TREES[1])))
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare against")
    p.add_argument("--out", default="/tmp/w2s-unchanged", help="work folder (replaced)")
    a = p.parse_args(argv)
    out = Path(a.out)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    base_tree = out / "base-tree"
    TREES[0] = str(base_tree)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), a.base], check=True,
                   capture_output=True)  # fmt: skip
    try:
        models = smoke_models(out / "models", None)  # gpu_evidence.py's tiny Llama student and BERT teacher
        run_grid(base_tree, models, out / "base")
        run_grid(REPO, models, out / "head")
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    diffs = []
    files = sorted(p.relative_to(out / "base") for p in (out / "base").glob("*/seed*/rewards/*.jsonl"))
    for rel in files:
        if (out / "base" / rel).read_bytes() != (out / "head" / rel).read_bytes():
            diffs.append(f"{rel}: rewards differ")
    mb, mh = (json.loads((out / r / "metrics.json").read_text()) for r in ("base", "head"))
    diffs += differences([normalized(c) for c in mb["cells"]], [normalized(c) for c in mh["cells"]], "cells")
    for name, pattern in TABLES.items():
        found = [re.search(pattern, (out / r / "report.md").read_text()) for r in ("base", "head")]
        if not all(found) or found[0].group(1) != found[1].group(1):
            diffs.append(f"report.md: the {name} differs")
    summary = {"base": a.base, "rewards_files": len(files), "differences": diffs}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        "\n".join(diffs)
        if diffs
        else f"unchanged: {len(files)} rewards files, metrics.json, the main and claims tables"
    )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

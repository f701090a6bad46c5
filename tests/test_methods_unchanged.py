"""Every method's behaviour pinned on a tiny grid: the rewards each trained model gives, against a golden file
written once by the code before the methods moved into method objects (``tests/golden/tiny_grid_rewards.json``).

The golden file was written by ``W2S_WRITE_GOLDEN=1 pytest tests/test_methods_unchanged.py`` on commit a5f3460
(before the refactor) and matched bit for bit by the refactored code on the same machine (a 2-core AMD EPYC,
float32). Here the comparison allows float32 noise of other CPU kernels (relative 1e-4): a changed loss, label,
lambda or reference moves rewards by far more.
"""

import json
import math
import os
from pathlib import Path

from conftest import tiny_grid_dict

GOLDEN = Path(__file__).parent / "golden" / "tiny_grid_rewards.json"

METHODS = [
    {"name": "naive"},
    {"name": "confidence"},
    {"name": "seam", "seam_nodes": 2},
    {"name": "anchor", "anchor_lambda": 1.0, "label": "anchor-rel"},
    {"name": "anchor", "anchor_lambda": "auto", "anchor_target_drift": 0.001, "label": "anchor-auto"},
    {"name": "anchor", "anchor_lambda": 0.5, "anchor_normalize": False, "label": "anchor-raw"},
    {"name": "anchor", "anchor_lambda": 1.0, "anchor_layers": [3], "reference": "frozen_copy", "label": "anchor-l3"},
    {"name": "ceiling"},
    {"name": "zero_shot"},
]


def _rewards(run_dir: Path) -> dict:
    out = {}
    for f in sorted(run_dir.glob("*/seed0/rewards/*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out[f.stem] = [[r["reward_chosen"], r["reward_rejected"]] for r in rows]
    return out


def test_every_method_gives_the_rewards_it_gave_before_the_refactor(tiny_model_dirs, lm_student_dir, tmp_path):
    from w2s_shift.config import RunConfig
    from w2s_shift.pipeline import run

    cfg = RunConfig.model_validate(
        tiny_grid_dict(
            tiny_model_dirs["teacher"],
            lm_student_dir,
            tmp_path / "run",
            ["hh-helpful-base"],
            METHODS,
            drift_interval=2,
            checkpoint_fraction=0.5,
        )
    )
    run(cfg)
    got = _rewards(tmp_path / "run")
    assert len(got) == 2 * (1 + len(METHODS)) + 1  # teacher and each model on ID and OOD, teacher on student_train
    if os.environ.get("W2S_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=0) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for name, rows in want.items():
        assert len(got[name]) == len(rows), name
        for (gc, gr), (wc, wr) in zip(got[name], rows):
            for g, w in ((gc, wc), (gr, wr)):
                assert math.isclose(g, w, rel_tol=1e-4, abs_tol=1e-5), (name, g, w)

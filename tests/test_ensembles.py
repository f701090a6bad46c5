"""Seed ensembles as models (w2s_shift/results/ensembles.py) on hand-made rewards of three seeds, where each seed's
rewards are already standardized (mean 0, SD 1 over a set's 8 responses): the mean and min ensembles' accuracy, WRG
against the teachers' mean ensemble, the disagreement AUROC, and the report's section."""

import json

import pytest

from w2s_shift.results import aggregate, build_cell_metrics
from w2s_shift.results.ensembles import disagreement_auroc, source_ensembles

# (chosen, rejected) per pair; each seed: four +1 and four -1 over its 8 responses
NAIVE = {
    0: [(1, -1), (1, -1), (-1, 1), (-1, 1)],  # right on pairs 0, 1
    1: [(1, -1), (-1, 1), (1, -1), (-1, 1)],  # right on pairs 0, 2
    2: [(1, -1), (1, -1), (1, -1), (-1, 1)],  # right on pairs 0, 1, 2
}
TEACHER = [(1, -1), (-1, 1), (1, -1), (-1, 1)]  # every seed: right on pairs 0, 2
METHODS = [{"label": "naive", "name": "naive", "finetune": "top_layers"}]


def _cell(root, seed, ids=("p0", "p1", "p2", "p3")):
    d = root / "uf" / f"seed{seed}"
    for model, rows in (("teacher", TEACHER), ("naive", NAIVE[seed])):
        for ds in ("uf", "hh"):
            f = d / "rewards" / f"{model}__{ds}.jsonl"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(
                "".join(
                    json.dumps({"index": i, "id": ids[i], "reward_chosen": c, "reward_rejected": r}) + "\n"
                    for i, (c, r) in enumerate(rows)
                )
            )
    cell = {"source": "uf", "seed": seed, "dir": f"uf/seed{seed}", "id": "uf", "ood": ["hh"]}
    return d, {**cell, "models": ["teacher", "naive"], "methods": METHODS}


def test_mean_and_min_ensembles_and_the_disagreement_auroc(tmp_path):
    cells = [build_cell_metrics(*_cell(tmp_path, s), bootstrap=200, seed=0) for s in range(3)]
    assert [c["accuracy"]["naive"]["uf"] for c in cells] == [50.0, 50.0, 75.0]
    e = source_ensembles(tmp_path, cells, n_boot=200)
    assert e["members"] == ["teacher", "naive"] and e["seeds"] == [0, 1, 2]
    # mean over seeds: margins 2, 2/3, 2/3, -2 -> 3 of 4 right; min over seeds: chosen and rejected minima tie on
    # pairs 1 and 2 (a tie is wrong) -> 1 of 4
    assert e["accuracy"]["naive/mean"]["uf"][0] == 75.0 and e["accuracy"]["naive/min"]["uf"][0] == 25.0
    assert e["accuracy"]["teacher/mean"]["uf"][0] == 50.0
    wrg, lo, hi = e["metrics"]["naive/mean"]["WRG"]
    assert wrg == pytest.approx(25.0) and lo <= wrg <= hi
    assert e["metrics"]["naive/min"]["WRG"][0] == pytest.approx(-25.0)
    # disagreement (SD over seeds of the margin): 0, s, s, 0; the mean ensemble's one wrong pair (3) disagrees 0:
    # against the right ones 0 (tie, half), s, s -> AUROC 0.5 / 3
    assert e["disagreement_auroc"]["naive"]["uf"] == pytest.approx(1 / 6)
    assert e["disagreement_auroc"]["teacher"]["hh"] == pytest.approx(0.5)  # every seed alike: no signal
    from w2s_shift.report import write_report

    write_report(tmp_path, {"cells": cells, "aggregate": aggregate(cells)})
    md = (tmp_path / "report.md").read_text()
    assert "### Seed ensembles (3 seeds)" in md
    assert "| naive/mean | 75.00 [" in md and "| naive/min | 25.00 [" in md
    assert "| naive | 0.17 | 0.17 |" in md


def test_no_ensemble_without_shared_pairs_or_with_one_seed(tmp_path):
    cells = [build_cell_metrics(*_cell(tmp_path, 0), bootstrap=50, seed=0)]
    assert source_ensembles(tmp_path, cells) is None
    cells.append(build_cell_metrics(*_cell(tmp_path, 1, ids=("q0", "q1", "q2", "q3")), bootstrap=50, seed=0))
    assert "pairs differ" in source_ensembles(tmp_path, cells)["skipped"]


def test_disagreement_auroc_hand_computed():
    assert disagreement_auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert disagreement_auroc([0.1, 0.9], [True, False]) == 0.0
    assert disagreement_auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5
    assert disagreement_auroc([0.5, 0.4], [False, False]) is None

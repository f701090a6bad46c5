"""The drift-vs-AOG mechanism measure: Spearman's rho by hand, its bootstrap interval, the points taken from cells,
and the report's paragraph and plot."""

import math

import pytest

from w2s_shift.metrics.mechanism import (
    average_ranks,
    drift_aog_correlation,
    drift_aog_points,
    spearman,
    spearman_interval,
)


def test_ranks_and_spearman_by_hand():
    assert average_ranks([10, 30, 20, 20]).tolist() == [1.0, 4.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [2, 4, 6, 80]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties: ranks x (1, 2.5, 2.5, 4), y (1, 2, 3, 4); centred (-1.5, 0, 0, 1.5) and (-1.5, -.5, .5, 1.5):
    # 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1, 2], [2, 1]) is None
    with pytest.raises(ValueError, match="3 x values but 2 y values"):
        spearman([1, 2, 3], [1, 2])


def test_interval_brackets_rho_and_is_reproducible():
    x = [0.1, 0.4, 0.2, 0.9, 0.5, 0.7, 0.3, 0.8]
    y = [5.0, 1.0, 4.0, -3.0, 0.5, -1.0, 2.0, -2.5]  # perfectly decreasing in x
    r = spearman_interval(x, y, n_boot=300, seed=1)
    assert r["rho"] == pytest.approx(-1.0) and r["n"] == 8 and r["ci"][1] == pytest.approx(-1.0)
    assert r == spearman_interval(x, y, n_boot=300, seed=1)
    noisy = spearman_interval(x, [1, -2, 3, 0, -1, 2, 1, -3], n_boot=300, seed=1)
    assert noisy["ci"][0] < noisy["rho"] < noisy["ci"][1]


def _cell(seed, drift_by_label, aog_by_label):
    return {
        "seed": seed,
        "metrics": {lab: {"AOG": aog} for lab, aog in aog_by_label.items()},
        "drift": {
            lab: {
                "layers": [3, 4],
                "final": {t: {"3": {"rel_sq_err": 9.9}, "4": {"rel_sq_err": e}} for t, e in d.items()},
            }
            for lab, d in drift_by_label.items()
        },
    }


def test_points_come_from_the_last_layer_of_every_student_seed_and_target():
    drift0 = {"naive": {"a": 0.2, "b": 0.3}, "anchor": {"a": 0.05}}
    aog0 = {"naive": {"a": -2.0, "b": 1.0}, "anchor": {"a": 1.5, "b": 2.0}}
    cells = [_cell(0, drift0, aog0), _cell(1, {"naive": {"a": 0.25}}, {"naive": {"a": -3.0}, "anchor": {"a": 0.0}})]
    pts = drift_aog_points(cells)
    assert [(p["label"], p["seed"], p["target"], p["drift"], p["aog"]) for p in pts] == [
        ("naive", 0, "a", 0.2, -2.0),
        ("naive", 0, "b", 0.3, 1.0),
        ("anchor", 0, "a", 0.05, 1.5),
        ("naive", 1, "a", 0.25, -3.0),
    ]  # anchor has no drift on b, nor any in seed 1: left out, never guessed
    corr = drift_aog_correlation(cells, n_boot=200)
    assert corr["overall"]["n"] == 4 and corr["overall"]["rho"] == pytest.approx(
        spearman([0.2, 0.3, 0.05, 0.25], [-2, 1, 1.5, -3])
    )
    assert corr["per_target"]["b"] is None  # one point
    assert drift_aog_correlation(cells[1:]) is None  # fewer than 4 points


def test_the_report_states_the_correlation(tmp_path):
    from w2s_shift.report.page import mechanism_text

    cells = [
        _cell(
            s,
            {"naive": {"a": 0.1 * (s + 1)}, "anchor": {"a": 0.01 * (s + 1)}},
            {"naive": {"a": -s}, "anchor": {"a": 3 - s}},
        )
        for s in range(3)
    ]
    txt = mechanism_text(drift_aog_correlation(cells, n_boot=200))
    assert "Spearman rank correlation" in txt and "Per target: a " in txt
    # 6 points: no interval (their few distinct resamples collapse it onto the estimate), and no verdict
    assert "(n = 6, too few points for an interval)" in txt and "the mechanism is not tested here" in txt


def test_drift_blocks_span_every_trainable_block_or_every_third():
    from w2s_shift.pipeline.featurizer import drift_blocks

    assert drift_blocks(29, 30) == [29, 30]  # top 2 of 30: every trainable block
    assert drift_blocks(23, 30, [23]) == [23, 24, 25, 26, 27, 28, 29, 30]
    # top 16 of 30 (blocks 15..30): every third from 15, the 50%/75% blocks (15, 23) and the last
    assert drift_blocks(15, 30) == [15, 18, 21, 23, 24, 27, 30]
    assert drift_blocks(15, 30, [20]) == [15, 18, 20, 21, 23, 24, 27, 30]
    # LoRA on all 30 blocks
    assert drift_blocks(1, 30) == [1, 4, 7, 10, 13, 15, 16, 19, 22, 23, 25, 28, 30]

"""Diagnostics on known inputs: bootstrap intervals (values and coverage), ECE, agreement, drift, CKA."""

import numpy as np
import pytest

from w2s_shift.metrics.drift import linear_cka, relative_squared_error
from w2s_shift.metrics.stats import (
    agreement_rate,
    bootstrap_accuracies,
    expected_calibration_error,
    joint_bootstrap,
    paired_bootstrap_diff,
    pgr,
    shift_metrics,
    sigmoid,
)


def test_paired_diff_point_value_and_identical_methods():
    a = np.array([1, 1, 1, 1, 0, 0, 1, 1, 0, 1])  # 70%
    b = np.array([1, 0, 1, 0, 0, 0, 1, 1, 0, 1])  # 50%
    d, lo, hi = paired_bootstrap_diff(a, b, n_boot=500, seed=1)
    assert d == pytest.approx(20.0)
    assert lo <= 20.0 <= hi and lo >= 0.0  # a is never worse than b on any pair: no replicate below 0
    assert paired_bootstrap_diff(a, a, n_boot=200, seed=0) == (0.0, 0.0, 0.0)


def test_paired_diff_is_narrower_than_unpaired_when_methods_agree():
    rng = np.random.default_rng(0)
    base = rng.random(400) < 0.7
    a = base.copy()
    b = base.copy()
    b[:20] = ~b[:20]  # b differs from a on 20 pairs only
    _, lo, hi = paired_bootstrap_diff(a, b, n_boot=1000, seed=3)
    assert hi - lo < 6.0  # an unpaired interval of two ~70% accuracies on 400 pairs spans about 12.6 pp


def test_paired_diff_errors():
    with pytest.raises(ValueError, match="same pairs"):
        paired_bootstrap_diff([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap_diff([], [])
    with pytest.raises(ValueError, match="n_boot"):
        paired_bootstrap_diff([1, 0], [0, 1], n_boot=0)


def test_paired_diff_coverage():
    """Two methods with true accuracies 75% and 65% (difference 10 pp, correlated errors) on 150 pairs: over
    300 simulated test sets the 95% interval covers 10 pp about 95% of the time."""
    rng = np.random.default_rng(123)
    hits = 0
    sims = 300
    for s in range(sims):
        u = rng.random(150)
        a = u < 0.75
        b = np.where(rng.random(150) < 0.5, u < 0.65, rng.random(150) < 0.65)  # half the pairs share a's draw
        _, lo, hi = paired_bootstrap_diff(a, b, n_boot=400, seed=s)
        hits += lo <= 10.0 <= hi
    assert 0.90 <= hits / sims <= 0.99


def test_shift_metrics_hand_computed():
    t = {"id": 60.0, "o1": 55.0, "o2": 70.0}
    s = {"id": 56.0, "o1": 61.0, "o2": 72.0}
    m = shift_metrics(s, t, "id", ["o1", "o2"])
    assert m["WRG"] == pytest.approx(-4.0)
    assert m["AOG"] == {"o1": pytest.approx(6.0), "o2": pytest.approx(2.0)}
    assert m["AOG_mean"] == pytest.approx(4.0)
    assert m["NTS"] == pytest.approx(0.0)  # 4 - max(0, 60 - 56)
    s["id"] = 65.0
    assert shift_metrics(s, t, "id", ["o1", "o2"])["NTS"] == pytest.approx(4.0)  # no ID loss: NTS = AOG
    assert pgr(70.0, 60.0, 80.0) == pytest.approx(0.5)
    assert pgr(70.0, 60.0, 60.0) is None
    assert np.isnan(pgr(np.array([70.0]), np.array([60.0]), np.array([59.0]))[0])


def test_bootstrap_accuracies_paired_and_checked():
    c = {"t": {"id": [1, 0, 1, 0]}, "s": {"id": [1, 0, 1, 0]}}
    r = bootstrap_accuracies(c, n_boot=50, seed=0)
    np.testing.assert_array_equal(r["t"]["id"], r["s"]["id"])  # same resampled pairs for every model
    with pytest.raises(ValueError, match="different pair counts"):
        bootstrap_accuracies({"t": {"id": [1, 0]}, "s": {"id": [1, 0, 1]}})
    with pytest.raises(ValueError, match="datasets"):
        bootstrap_accuracies({"t": {"id": [1, 0]}, "s": {"x": [1, 0]}})


def test_joint_bootstrap_values_and_differences():
    # 10 ID pairs: teacher 6 right, naive 8, anchor 7, ceiling 9; 10 OOD pairs: teacher 5, naive 4, anchor 7, ceiling 8
    def v(k, n=10):
        return [1] * k + [0] * (n - k)

    c = {
        "teacher": {"id": v(6), "ood": v(5)},
        "naive": {"id": v(8), "ood": v(4)},
        "anchor": {"id": v(7), "ood": v(7)},
        "ceiling": {"id": v(9), "ood": v(8)},
    }
    r = joint_bootstrap(c, "id", ["ood"], ["naive", "anchor"], ceiling="ceiling", baseline="naive", n_boot=300, seed=0)
    n, a = r["metrics"]["naive"], r["metrics"]["anchor"]
    assert n["WRG"]["value"] == pytest.approx(20.0) and n["AOG_mean"]["value"] == pytest.approx(-10.0)
    assert n["NTS"]["value"] == pytest.approx(-10.0)
    assert a["WRG"]["value"] == pytest.approx(10.0) and a["NTS"]["value"] == pytest.approx(20.0)
    assert n["PGR"]["id"]["value"] == pytest.approx(2 / 3) and a["PGR"]["ood"]["value"] == pytest.approx(2 / 3)
    lo, hi = n["WRG"]["ci"]
    assert lo <= 20.0 <= hi and lo >= 0.0  # the teacher's right pairs are a subset of naive's
    d = r["differences"]["anchor"]
    assert "naive" not in r["differences"]
    assert d["accuracy"]["id"]["value"] == pytest.approx(-10.0)
    assert d["NTS"]["value"] == pytest.approx(30.0)
    assert d["AOG"]["ood"]["value"] == pytest.approx(30.0)
    assert r["accuracy"]["teacher"]["id"]["value"] == pytest.approx(60.0)
    with pytest.raises(ValueError, match="no correctness"):
        joint_bootstrap(c, "id", ["ood"], ["seam"])


def test_joint_bootstrap_aog_coverage():
    """AOG mean over two independent OOD targets, true value (+5 + -3) / 2 = +1 pp; ~95% coverage."""
    rng = np.random.default_rng(7)
    hits, sims = 0, 300
    for s in range(sims):
        c = {
            "teacher": {"id": rng.random(120) < 0.6, "a": rng.random(100) < 0.6, "b": rng.random(100) < 0.7},
            "s": {"id": rng.random(120) < 0.7, "a": rng.random(100) < 0.65, "b": rng.random(100) < 0.67},
        }
        ci = joint_bootstrap(c, "id", ["a", "b"], ["s"], n_boot=300, seed=s)["metrics"]["s"]["AOG_mean"]["ci"]
        hits += ci[0] <= 1.0 <= ci[1]
    assert 0.90 <= hits / sims <= 0.99


def test_ece_hand_computed():
    # p: 0.9 (right, conf .9), 0.8 (right, .8), 0.3 (wrong, conf .7), 0.6 (right, .6), 0.95 (right, .95)
    p = np.array([0.9, 0.8, 0.3, 0.6, 0.95])
    ece, rows = expected_calibration_error(p, n_bins=5)  # bins [.5,.6) [.6,.7) [.7,.8) [.8,.9) [.9,1]
    # bin .6-.7: {0.6}: acc 1 conf .6 -> .4; bin .7-.8: {0.7}: acc 0 -> .7; bin .8-.9: {.8}: .2;
    # bin .9-1: {.9,.95}: acc 1, conf .925 -> .075; ECE = (.4 + .7 + .2 + 2 * .075) / 5 = 0.29
    assert ece == pytest.approx(29.0)
    assert [r["count"] for r in rows] == [0, 1, 1, 1, 2]
    assert rows[0]["accuracy"] is None and rows[4]["confidence"] == pytest.approx(92.5)
    assert rows[2]["accuracy"] == 0.0 and rows[4]["hi"] == 1.0
    # a perfectly calibrated bin: 8 of 10 pairs right at confidence 0.8
    ece2, _ = expected_calibration_error(np.array([0.8] * 8 + [0.2] * 2), n_bins=10)
    assert ece2 == pytest.approx(0.0, abs=1e-9)  # the 0.2s fold to confidence 0.8 and are wrong: bin acc 0.8 = conf
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.2])


def test_sigmoid_and_agreement():
    assert sigmoid(0.0) == 0.5 and sigmoid(800.0) == 1.0 and sigmoid(-800.0) == 0.0
    a = np.array([1.0, -2.0, 0.0, 3.0])
    b = np.array([2.0, 1.0, -1.0, 0.5])
    assert agreement_rate(a, b) == pytest.approx(75.0)  # pairs 0, 2 (tie = rejected, agrees with -1), 3
    with pytest.raises(ValueError):
        agreement_rate(a, b[:3])


def test_relative_squared_error_hand_computed():
    ref = np.array([[3.0, 4.0], [0.0, 0.0]])
    h = np.array([[3.0, 5.0], [1.0, 1.0]])
    assert relative_squared_error(h, ref) == pytest.approx(3.0 / 25.0)  # (1 + 2) / 25
    assert relative_squared_error(ref, ref) == 0.0
    with pytest.raises(ValueError, match="all zero"):
        relative_squared_error(h, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="shapes"):
        relative_squared_error(h, ref[:1])


@pytest.mark.parametrize("n,d", [(200, 16), (12, 40)])  # feature-space and Gram-matrix branches
def test_linear_cka_invariances(n, d):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 3.0 * x) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, x + 5.0) == pytest.approx(1.0, abs=1e-10)  # centring removes offsets


def test_linear_cka_low_for_noise_and_hand_value():
    rng = np.random.default_rng(1)
    assert linear_cka(rng.normal(size=(2000, 8)), rng.normal(size=(2000, 8))) < 0.02
    # 1-D features: CKA is the squared Pearson correlation
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    y = np.array([[1.0], [3.0], [2.0], [4.0]])
    assert linear_cka(x, y) == pytest.approx(np.corrcoef(x[:, 0], y[:, 0])[0, 1] ** 2)
    with pytest.raises(ValueError, match="no variance"):
        linear_cka(np.ones((4, 2)), x)

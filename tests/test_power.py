"""Seeds and test pairs a run needs to decide a claim at the margin (w2s_shift.power): the MDE of the claims' interval
by hand, Holm, the data's limit, and the simulated 80%-power effect the MDE must match."""

import math

import numpy as np
import pytest
from scipy import stats as st

from w2s_shift.power import data_limit, mde, requirements


def test_mde_by_hand():
    # pairs only, all shared by the seeds (one split): the seed mean's variance is c = 1 whatever k, and the interval
    # is the normal one: 1.960 + 0.842
    assert mde(0.0, 0.0, 1.0, k=2, r=1.0) == pytest.approx(2.8016, rel=1e-4)
    # four times the pairs halves the pair SD
    assert mde(0.0, 0.0, 1.0, k=2, r=4.0) == pytest.approx(2.8016 / 2, rel=1e-4)
    # seed variance 4, own pair variance 1, nothing shared, k = 4: the exact t test on 3 df with SE sqrt(5 / 4); its
    # 80%-power effect from the noncentral t, 4.76 pp (Bloom's (t_0.975 + t_0.8) SE = 4.65 pp is 2% short of it)
    m = mde(4.0, 1.0, 0.0, k=4, r=1.0)
    q, nc = st.t.ppf(0.975, 3), m / 1.25**0.5
    assert st.nct.sf(q, 3, nc) + st.nct.cdf(-q, 3, nc) == pytest.approx(0.8, abs=2e-3)
    assert m == pytest.approx(4.758, abs=2e-3) and m > (st.t.ppf(0.975, 3) + st.t.ppf(0.8, 3)) * 1.25**0.5
    # Holm's first step in a family of 3 tests at 0.05 / 3: a larger effect; unlimited pairs leave the seeds' part
    assert mde(0.0, 0.0, 1.0, k=2, r=1.0, alpha=0.05 / 3) == pytest.approx(st.norm.isf(0.05 / 6) + st.norm.ppf(0.8))
    assert mde(4.0, 1.0, 3.0, k=4, r=math.inf) == pytest.approx(mde(4.0, 0.0, 0.0, k=4, r=1.0))


def test_the_mde_is_the_simulated_80_percent_power_effect():
    # the benchmark's world at 3 seeds, 250 pairs, seed SD 2 pp: the effect that 3,000 simulated runs detect 80% of
    # the time (the null replicates shifted by delta) against the MDE from the simulation's variance components
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("bench_interval_coverage_power", bench / "interval_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    comp = mod.components(*mod.simulate(np.random.default_rng(11), 3000, 250, 3, 2.0))
    measured = mod.effect_at(comp["d"].mean(axis=1), mod.half_widths(comp, 3)["generalized"])
    v_own = float(np.mean(np.maximum(comp["v"] - comp["c"], 0)))
    formula = mde(float(comp["s2"].mean()) - v_own, v_own, float(comp["c"].mean()), k=3, r=1.0)
    assert formula == pytest.approx(measured, rel=0.1)


def test_requirements_pick_the_smallest_pair_count_and_say_when_the_data_is_short():
    # a 1-seed pilot on 250 ID pairs with a test-pair variance of 16 pp^2 (SD 4): with no seed spread assumed,
    # MDE = 2.8016 x 4 / sqrt(r) <= 3.8 needs r >= 8.69, i.e. 2,173 ID pairs: the grid's 4,000
    stat = {"var_pairs": 16.0, "cov_shared": 16.0, "var_own": 0.0, "s2": 0.0, "n_seeds": 1, "mde": 11.2}
    claims = [{"claim": "b", "rows": [{"what": "NTS anchor - naive", "primary": True, "stat": stat}]}]
    got = requirements(claims, n_id=250, margin=3.8, seed_sd=0.0, max_seeds=3)["b"]
    assert got["by_seeds"] == {2: 4000, 3: 4000} and got["assumed_seed_sd"] is True and got["family"] == 1
    # the datasets hold 1,000 test pairs (x4): 4,000 are beyond them
    got = requirements(claims, n_id=250, margin=3.8, seed_sd=0.0, max_seeds=3, max_scale=4.0)["b"]
    assert got["by_seeds"] == {2: None, 3: None} and got["beyond_data"] == {2: 4000, 3: 4000}
    # a seed SD of 4 pp: with 3 seeds the training noise alone has an MDE above 3.8 pp at any pair count
    got = requirements(claims, n_id=250, margin=3.8, seed_sd=4.0, max_seeds=3)["b"]
    assert got["by_seeds"] == {2: None, 3: None} and got["unlimited"][3] > 3.8
    # a family of 3 (Holm): every row at 0.05 / 3, so more pairs than alone
    fam = [{"claim": "b", "rows": [{"what": w, "primary": True, "stat": stat} for w in "xyz"]}]
    got = requirements(fam, n_id=250, margin=3.8, seed_sd=0.0, max_seeds=2)["b"]
    assert got["alpha"] == pytest.approx(0.05 / 3) and got["by_seeds"] == {2: 4000}
    assert mde(0.0, 0.0, 16.0, 2, 4000 / 250, 0.05 / 3) <= 3.8 < mde(0.0, 0.0, 16.0, 2, 2000 / 250, 0.05 / 3)


def test_data_limit_reads_the_cells_data_summary():
    cell = {
        "data": {
            "source": {"pairs": 2354},
            "splits": {"teacher_train": 300, "student_train": 500, "test": 500},
            "ood": {"ultrafeedback": {"pairs": 1000, "prompt_overlap_removed": 40, "used": 150}},
        }
    }
    scale, text = data_limit(cell, 500, {"ultrafeedback": 150})
    # ID: 2,354 - 800 = 1,554 pairs (x3.1); OOD: 960 (x6.4): the ID split binds
    assert scale == pytest.approx(1554 / 500) and text == "ID 1,554, OOD ultrafeedback 960"
    assert data_limit({}, 500, {}) == (math.inf, "")


@pytest.mark.parametrize(
    "content, args, msg",
    [
        ('{"metrics_format": 99}', [], "metrics_format 99 was written by a newer w2s-shift"),
        ("{trunc", [], "not JSON"),
        (None, [], "not a directory"),
        ("{}", ["--margin", "nan"], "--margin must be a number of percentage points above 0"),
        ("{}", ["--margin", "0"], "--margin must be a number of percentage points above 0"),
        ("{}", ["--seed-sd", "-1"], "--seed-sd must be a number of percentage points >= 0"),
        ("{}", ["--max-seeds", "1"], "--max-seeds must be at least 2"),
    ],
)
def test_python_m_power_refuses_bad_input_with_one_line(tmp_path, capsys, content, args, msg):
    """python -m w2s_shift.power gave tracebacks (a newer or truncated metrics.json, a NaN margin); now exit 2 and one
    line naming the file or the flag, as plan --power."""
    from w2s_shift.power import main

    run = tmp_path / "run"
    if content is not None:
        run.mkdir()
        (run / "metrics.json").write_text(content)
    assert main([str(run), *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and err.count("\n") == 1

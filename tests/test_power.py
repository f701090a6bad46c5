"""Seeds and test pairs a run needs to decide a claim at the margin (w2s_shift.power): the MDE of the claims' interval
by hand, Holm, the data's limit, and the simulated 80%-power effect the MDE must match."""

import math

import numpy as np
import pytest
from scipy import stats as st

from w2s_shift.metrics.stats import gap_check
from w2s_shift.power import data_limit, gap_pass_chance, mde, requirements, teacher_outlook


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
    # two primary rows of a 3-seed pilot, the first with no training variance (S^2 below its own pair variance: its
    # unlimited-pairs MDE is 0, not NaN), the second with a seed SD near 10 pp: the claim is out of reach at any
    # pair count, whichever row comes first
    calm = {"n_seeds": 3, "s2": 1.0, "var_own": 4.0, "cov_shared": 0.0, "mde": 5.0}
    noisy = {"n_seeds": 3, "s2": 100.0, "var_own": 4.0, "cov_shared": 0.0, "mde": 30.0}
    for pair in ((calm, noisy), (noisy, calm)):
        rows = [{"what": w, "primary": True, "stat": s} for w, s in zip("xy", pair)]
        got = requirements([{"claim": "s", "rows": rows}], n_id=250, margin=3.8, seed_sd=0.0, max_seeds=3)["s"]
        assert got["unlimited"][3] == pytest.approx(mde(96.0, 0.0, 0.0, 3, math.inf, 0.05 / 2))
        assert got["unlimited"][3] > 3.8 and got["by_seeds"] == {2: None, 3: None}


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


def test_gap_pass_chance_by_hand():
    # nothing shared by the seeds: each passes on its own, P = Phi((gap - need) / sd)^k; pair variance 5 pp^2 gives an
    # interval half-width 1.96 x 2.236 = 4.38 < 5, so the 5 pp floor binds; sd = sqrt(4 + 5) = 3
    one = st.norm.cdf((8 - 5) / 3)
    assert gap_pass_chance(8.0, 4.0, 5.0, 0.0, k=1) == pytest.approx(one)
    assert gap_pass_chance(8.0, 4.0, 5.0, 0.0, k=3) == pytest.approx(one**3)
    # all noise is the one split's pairs, shared: the seeds pass or fail together, whatever k; need = 1.96 x 3 = 5.88
    together = st.norm.cdf((8 - 1.959964 * 3) / 3)
    assert gap_pass_chance(8.0, 0.0, 0.0, 9.0, k=1) == pytest.approx(together, rel=1e-5)
    assert gap_pass_chance(8.0, 0.0, 0.0, 9.0, k=5) == pytest.approx(together, rel=1e-5)
    # partly shared: between the two extremes; four times the pairs quarter the pair variance
    mixed = gap_pass_chance(8.0, 4.0, 2.5, 2.5, k=3)
    assert one**3 < mixed < one
    assert gap_pass_chance(8.0, 4.0, 2.5, 2.5, k=3, r=4.0) == pytest.approx(
        gap_pass_chance(8.0, 4.0, 2.5 / 4, 2.5 / 4, k=3)
    )
    # no noise at all: the check is deterministic
    assert gap_pass_chance(6.0, 0.0, 0.0, 0.0, k=3) == 1.0 and gap_pass_chance(4.0, 0.0, 0.0, 0.0, k=3) == 0.0


def test_gap_pass_chance_matches_the_real_check_on_simulated_binary_pairs():
    # a world as hard as real data: every run draws one test split of 400 pairs that its 3 seeds share, each pair has
    # its own difficulty (a logit shared by teacher and ceiling, so most pairs agree) and its own ceiling advantage (a
    # minority of pairs the ceiling wins in every seed, a few it loses), each seed trains its own teacher and ceiling
    # (logit shifts), and correctness is a coin per model, seed and pair. The rate at which all 3 seeds pass the real
    # gap check (percentile bootstrap, >= 5 pp) against gap_pass_chance on the world's variance components, measured
    # over the same runs.
    rng = np.random.default_rng(5)
    runs, n, k = 500, 400, 3
    passed, gaps, own_var = np.zeros(runs, bool), np.zeros((runs, k)), np.zeros((runs, k))
    for j in range(runs):
        z, adv = rng.normal(0.45, 3.0, n), rng.normal(1.2, 4.0, n)
        ok = []
        for s in range(k):
            t = rng.random(n) < 1 / (1 + np.exp(-(z + rng.normal(0, 0.08))))
            c = rng.random(n) < 1 / (1 + np.exp(-(z + adv + rng.normal(0, 0.3))))
            ok.append(gap_check(c.astype(float), t.astype(float), n_boot=400, seed=j * k + s)["passed"])
            d = (c.astype(float) - t) * 100
            gaps[j, s], own_var[j, s] = d.mean(), d.var(ddof=1) / n
        passed[j] = all(ok)
    within = float(np.mean(np.var(gaps, axis=1, ddof=1)))  # E[sample variance over a run's seeds] = Var - Cov
    cov = float(np.var(gaps.mean(axis=1), ddof=1)) - within / k  # Var(seed mean) = Var / k + (k - 1) Cov / k
    total = within + cov  # Var(X_s)
    pair = float(own_var.mean())
    # a real pilot (evidence-w2s, 2 seeds) shares 61% of its gap's pair variance between seeds; this world 40%
    assert 0.3 < cov / pair < 0.7 and pair < total
    want = gap_pass_chance(float(gaps.mean()), total - pair, pair - cov, cov, k=k)
    assert 0.15 < passed.mean() < 0.85  # a world where the check can go either way
    assert want == pytest.approx(passed.mean(), abs=0.04)
    # the seeds' shared pairs matter: treating the seeds as independent (p^k) would be wrong by more than that
    assert abs(gap_pass_chance(float(gaps.mean()), total - pair, pair, 0.0, k=k) - passed.mean()) > 0.05


def test_teacher_outlook_reads_each_seeds_accuracy_on_the_pairs_the_seeds_share():
    # two seeds on the same 400 pairs, 20 answers apart: the mean accuracy minus 50, one seed's pair SE the binomial
    # sqrt(p (1 - p) / n) (2.4 pp at p = 0.62), and most of it shared by the seeds (the same pairs)
    rng = np.random.default_rng(3)
    n = 400
    x0 = rng.random(n) < 0.62
    x1 = x0.copy()
    flip = rng.choice(n, 20, replace=False)
    x1[flip] = ~x1[flip]
    ids = [f"p{i}" for i in range(n)]
    cells = [{"id": "src", "ids": {"src": ids}, "correct": {"teacher": {"src": x}}} for x in (x0, x1)]
    got = teacher_outlook(cells, 2.0, (2, 5), (1.0, 4.0), n_boot=2000)
    assert got["value"] == pytest.approx(100 * (x0.mean() + x1.mean()) / 2 - 50)
    p = (x0.mean() + x1.mean()) / 2
    assert got["pair_se"] == pytest.approx(100 * (p * (1 - p) / n) ** 0.5, rel=0.1) and got["assumed"] is False
    c = got["chance"]
    assert 0 < c[(5, 1.0)] <= c[(2, 1.0)] < 1 and c[(5, 1.0)] < c[(5, 4.0)]  # more seeds, less; more pairs, more
    # one seed: the training spread is the assumed seed SD, all its pair noise shared
    one = teacher_outlook(cells[:1], 2.0, (2,), (1.0,), n_boot=2000)
    assert one["assumed"] is True and one["seed_sd"] == 2.0
    # a teacher at chance passes rarely, whatever the seeds
    coin = [{"id": "src", "ids": {"src": ids}, "correct": {"teacher": {"src": rng.random(n) < 0.5}}} for _ in (0, 1)]
    assert teacher_outlook(coin, 2.0, (2,), (1.0,))["chance"][(2, 1.0)] < 0.1


def test_gap_lines_without_a_ceiling_still_read_the_teacher_and_say_the_gap_is_not_checked():
    from w2s_shift.power import gap_lines

    rng = np.random.default_rng(4)
    ids = [f"p{i}" for i in range(200)]
    ccells = [{"id": "src", "ids": {"src": ids}, "correct": {"teacher": {"src": rng.random(200) < 0.7}}} for _ in "ab"]
    cells = [
        {
            "seed": s,
            "id": "src",
            "accuracy": {"teacher": {"src": 100 * float(c["correct"]["teacher"]["src"].mean())}},
            "teacher_beats_chance_id": True,
            "gap_check": None,
        }
        for s, c in enumerate(ccells)
    ]
    text = "\n".join(gap_lines(cells, ccells, n_id=200, max_scale=2.0, seed_sd=2.0, max_seeds=5))
    acc = cells[0]["accuracy"]["teacher"]["src"]
    assert f"seed 0 {acc:.1f}% passed" in text and "200 ID pairs: 2 seeds" in text and "400 ID pairs (the most" in text
    # as the claims do (metrics.claims: a cell without a gap check withholds nothing)
    assert "gap check: no ceiling in the grid, so the gap is not checked and the claims are decided without it" in text
    assert text.count("chance that every seed") == 1

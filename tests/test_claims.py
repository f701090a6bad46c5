"""The paper's four claims on a grid: pooled paired metrics by hand, the verdict rule, and the report section."""

import functools
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from w2s_shift.metrics.claims import (
    NO_INFORMATION,
    NONINFERIOR,
    NOT_DECIDED_1SEED,
    NOT_REPRODUCED,
    NOT_TESTED,
    REPRODUCED,
    WITHHELD,
    direction,
    four_claims,
    pooled_metric,
)


def ones(n, k):
    """(n,) correctness with the first k pairs right."""
    return np.array([1] * k + [0] * (n - k), dtype=bool)


def cell(correct, n=4, ids=None):
    ids = ids or list(range(n))
    return {"id": "id", "ood": ["o"], "ids": {"id": ids, "o": ids}, "correct": correct}


def test_pooled_metric_by_hand():
    # teacher 50% ID / 25% OOD; a 75% / 50%: WRG +25, AOG +25, NTS = 25 - max(0, 50 - 75) = +25
    # b 25% / 75%: NTS = 50 - max(0, 50 - 25) = +25, so NTS(a) - NTS(b) = 0 while WRG(a) - WRG(b) = +50
    c = cell(
        {
            "teacher": {"id": ones(4, 2), "o": ones(4, 1)},
            "a": {"id": ones(4, 3), "o": ones(4, 2)},
            "b": {"id": ones(4, 1), "o": ones(4, 3)},
        }
    )
    assert pooled_metric([c], "a", None, "WRG", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", None, "AOG_mean", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", None, "NTS", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", "b", "NTS", n_boot=50)["value"] == pytest.approx(0.0)
    assert pooled_metric([c], "a", "b", "WRG", n_boot=50)["value"] == pytest.approx(50.0)
    assert pooled_metric([c], "a", "missing", "NTS") is None
    with pytest.raises(ValueError, match="metric must be one of"):
        pooled_metric([c], "a", None, "PGR")


def test_pooled_metric_means_over_the_seeds_that_hold_both_models():
    t = {"id": ones(4, 2), "o": ones(4, 2)}
    s0 = cell({"teacher": t, "a": {"id": ones(4, 4), "o": ones(4, 2)}, "b": {"id": ones(4, 2), "o": ones(4, 2)}})
    s1 = cell({"teacher": t, "a": {"id": ones(4, 3), "o": ones(4, 2)}, "b": {"id": ones(4, 2), "o": ones(4, 2)}})
    s2 = cell({"teacher": t, "a": {"id": ones(4, 1), "o": ones(4, 2)}})  # b not trained in this seed
    r = pooled_metric([s0, s1, s2], "a", "b", "WRG", n_boot=50)
    assert r["per_seed"] == [50.0, 25.0] and r["value"] == pytest.approx(37.5) and r["n_seeds"] == 2


def test_seeds_on_the_same_pairs_share_their_resampling():
    rng = np.random.default_rng(0)
    corr = {m: {d: rng.random(60) < p for d in ("id", "o")} for m, p in (("teacher", 0.5), ("a", 0.6), ("b", 0.55))}
    one = pooled_metric([cell(corr, 60)], "a", "b", n_boot=400)
    same = pooled_metric([cell(corr, 60), cell(corr, 60)], "a", "b", n_boot=400)
    # the same models on the same pairs twice: no seed spread (S = 0), the shared covariance is the one seed's
    # variance, so the interval is the one seed's (normal, from the bootstrap variance)
    assert same["seed_sd"] == 0.0 and same["ci"] == pytest.approx(one["ci"]) and one["test"] == "normal"
    assert one["ci_pairs"][0] < one["value"] < one["ci_pairs"][1]


@functools.cache
def _coverage_bench():
    """benchmarks/interval_coverage.py, whose simulator of true nulls the coverage test shares."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("bench_interval_coverage", bench / "interval_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("k", "n", "seed_sd"), [(2, 250, 4), (3, 250, 2), (2, 2000, 2)])
def test_the_interval_holds_its_level_on_simulated_nulls(k, n, seed_sd):
    # the benchmark's world (one shared split, pair effects shared by the seeds, contested pairs, a training effect
    # per seed), 2,500 nulls: Monte Carlo SE of a 5% share 0.44 points. benchmarks/results/interval_coverage-2026-12-07
    # measured 0.2-4.5% for the interval in use over 18 settings (4,000 nulls each) and 6.8-13.1% for the earlier
    # Satterthwaite rule, so the band is [0.1%, 5% + 2 SE] and the earlier rule must leave it (this test can fail)
    bench = _coverage_bench()
    rng = np.random.default_rng(7 + k + n + seed_sd)
    comp = bench.components(*bench.simulate(rng, 2500, n, k, seed_sd))
    mean, hw = comp["d"].mean(axis=1), bench.half_widths(comp, k)
    limit = 0.05 + 2 * (0.05 * 0.95 / 2500) ** 0.5
    now, before = bench.rejection(mean, hw["generalized"])[0], bench.rejection(mean, hw["satterthwaite"])[0]
    assert 0.001 <= now <= limit, (now, before)
    assert before > limit, (now, before)


def test_pooled_metric_is_the_interval_the_benchmark_checks():
    # the library path (its own bootstrap, 2,000 replicates) gives the half-width the benchmark computes from the
    # pairs (the bootstrap's n_boot -> infinity limit), within bootstrap noise, on simulated nulls of 2 and 3 seeds
    bench = _coverage_bench()
    rng = np.random.default_rng(3)
    for k in (2, 3, 2, 3):
        cells = bench.null_cells(rng, 250, 2.0, k)
        a = np.stack([c["correct"]["a"]["id"] for c in cells])[None]
        b = np.stack([c["correct"]["b"]["id"] for c in cells])[None]
        want = bench.half_widths(bench.components(a, b), k)["generalized"][0]
        got = pooled_metric(cells, "a", "b", "WRG", n_boot=2000, seed=k)
        assert got["value"] == pytest.approx(bench.components(a, b)["d"].mean())
        assert (got["ci"][1] - got["ci"][0]) / 2 == pytest.approx(want, rel=0.1)


def test_interval_and_mde_by_hand():
    from scipy import stats as st

    from w2s_shift.metrics.significance import design_mde, seed_pair_interval

    # three seeds 1, 2, 3 pp with no pair noise (v_own = c = 0): the generalized interval is the exact t interval
    # over seeds, 2 +- t_0.975,2 sqrt(S^2 / 3) = 2 +- 4.3027 / sqrt(3), p = 2 P(T_2 > 2 sqrt(3))
    s = seed_pair_interval([1.0, 2.0, 3.0], np.tile([1.0, 2.0, 3.0], (10, 1)))
    assert s["se"] == pytest.approx(3**-0.5) and s["s2"] == pytest.approx(1.0)
    assert s["ci"] == pytest.approx((2 - 4.3027 / 3**0.5, 2 + 4.3027 / 3**0.5), abs=1e-3)
    assert s["p"] == pytest.approx(2 * st.t.sf(2 * 3**0.5, 2), rel=1e-4)
    # its MDE is the t test's 80%-power effect: the noncentral t (df 2, noncentrality delta sqrt(3)) exceeds 4.303
    # in absolute value with probability 0.8 (3.26 pp); Bloom's (t_0.975 + t_0.8) / sqrt(3) = 3.10 is below it
    q = st.t.ppf(0.975, 2)
    power = st.nct.sf(q, 2, s["mde"] * 3**0.5) + st.nct.cdf(-q, 2, s["mde"] * 3**0.5)
    assert power == pytest.approx(0.8, abs=2e-3) and s["mde"] > 1.04 * (q + st.t.ppf(0.8, 2)) / 3**0.5
    # at Holm's first step in a family of 3 the same test runs at 0.05 / 3: a larger effect
    q3 = st.t.ppf(1 - 0.05 / 6, 2)
    m3 = design_mde(1.0, 0.0, 0.0, 3, 0.05 / 3)
    assert st.nct.sf(q3, 2, m3 * 3**0.5) + st.nct.cdf(-q3, 2, m3 * 3**0.5) == pytest.approx(0.8, abs=2e-3)
    # one seed: pairs only, normal; MDE = (1.960 + 0.842) x the bootstrap SD
    one = seed_pair_interval([0.5], np.array([[-1.0], [1.0], [-1.0], [1.0]]))
    assert one["seed_noise"] is False and one["se"] == pytest.approx((4 / 3) ** 0.5)
    assert one["mde"] == pytest.approx(2.8016 * (4 / 3) ** 0.5, rel=1e-4)
    # nothing varies (the models agree everywhere): a zero-width interval and no MDE at all, never 0.0
    none = seed_pair_interval([0.0, 0.0], np.zeros((10, 2)))
    assert none["ci"] == (0.0, 0.0) and none["p"] == 1.0 and np.isnan(none["mde"])
    # the first look of a 40-seed sequential plan: alpha 1.9e-18, whose level 1 - alpha rounds to 1.0 (alpha 0):
    # the critical value is infinite, so no effect is detectable (inf), never a solver's crash
    assert design_mde(1012.5, 1003.35, 0.0, 2, 0.0) == np.inf
    assert np.isfinite(design_mde(1012.5, 1003.35, 0.0, 2, 1e-8))


def test_tied_seeds_get_a_continuous_interval():
    from scipy import stats as st

    from w2s_shift.metrics.significance import seed_pair_interval

    # two seeds on different pairs (nothing shared, c = 0), each with bootstrap variance 4/3: tied differences have
    # S^2 = 0, so the spread is its known floor v_own = 4/3 and the interval the normal one on the pairs-only
    # variance of the seed mean, 0.75 +- 1.96 sqrt(2/3)
    r = np.array([[-1.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]]) + 0.75
    tie = seed_pair_interval([0.75, 0.75], r, groups=[0, 1])
    assert tie["se"] == pytest.approx((2 / 3) ** 0.5) and tie["var_own"] == pytest.approx(4 / 3)
    assert tie["ci"] == pytest.approx((0.75 - 1.95996 * (2 / 3) ** 0.5, 0.75 + 1.95996 * (2 / 3) ** 0.5), rel=1e-4)
    assert tie["p"] == pytest.approx(2 * st.norm.sf(0.75 / (2 / 3) ** 0.5), rel=1e-4)
    # two seeds on one split of 250 pairs (bootstrap variance 10 pp^2 each, 2 shared): tied, then one pair apart
    # (0.4 pp), then further. The earlier rule gave +-26.5 at the tie and +-4.1 one pair away; the interval in use
    # moves continuously from the tie and widens with the spread (about t_1 = 12.7 x |d_1 - d_2| / 2 far out)
    reps = np.random.default_rng(0).multivariate_normal([0, 0], [[10, 2], [2, 10]], size=20000)
    half = []
    for x in (0.0, 1e-6, 0.4, 2.0, 8.0):
        lo, hi = seed_pair_interval([1.0, 1.0 + x], reps + [1.0, 1.0 + x])["ci"]
        half.append((hi - lo) / 2)
    assert half[1] == pytest.approx(half[0], rel=1e-5) and half[2] == pytest.approx(half[0], rel=0.15)
    assert half[0] < half[2] < half[3] < half[4] and half[4] == pytest.approx(12.706 * 8 / 2, rel=0.02)


def test_few_discordant_pairs_take_the_exact_test():
    from scipy.stats import binomtest

    # 4 of 150 pairs differ, all won by a: +2.67 pp; the bootstrap interval excludes 0 but McNemar's exact p = 0.125
    base = ones(150, 90)
    a = base.copy()
    a[100:104] = True
    c = cell(
        {"teacher": {"id": base, "o": ones(150, 75)}, "a": {"id": a, "o": base}, "b": {"id": base, "o": base}}, 150
    )
    s = pooled_metric([c], "a", "b", "WRG", n_boot=500)
    assert s["value"] == pytest.approx(400 / 150) and s["discordant"] == 4 and s["test"] == "exact"
    assert s["ci"][0] > 0  # the normal interval alone would call it
    assert s["p"] == pytest.approx(binomtest(4, 4).pvalue) == pytest.approx(0.125)
    # the same by exact permutation of WRG - AOG mean (a composite metric): 2^4 flips, two of them as extreme
    assert pooled_metric([c], "a", "b", "WRG-AOG_mean", n_boot=100)["p"] == pytest.approx(0.125)
    # NTS does not count an ID gain over the teacher, so here it does not differ at all
    assert pooled_metric([c], "a", "b", "NTS", n_boot=100)["p"] == 1.0


def test_holm_by_hand():
    from w2s_shift.metrics.significance import holm

    # sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max so far 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_direction():
    assert [direction({"ci": c}) for c in ((0.1, 2), (-2, -0.1), (-1, 1), None)] == [1, -1, 0, 0]
    assert direction(None) == 0


def _grid(n=200, naive_ood=60, anchor_ood=120, sweep_ood=80, mid_ood=100, seeds=3):
    """Teacher 50% on ID and OOD; naive 70% ID and naive_ood/n OOD; ANCHOR (last, lambda 1) 70% ID, anchor_ood
    OOD; lambda 0.1 and 10 at the last layer sweep_ood; the 50% + 75% middle at lambda 1 mid_ood; ANCHOR at lambda 0
    (Naive under another name) and at custom block 15 as decoys. Cumulative correctness (the first k pairs right),
    so differences between models are one-signed pair by pair. ``seeds`` copies of the cell (one correctness dict:
    no training noise, the pairs' noise shared)."""
    acc = {
        "teacher": (100, 100),
        "naive": (140, naive_ood),
        "anchor": (140, anchor_ood),
        "anchor_l0.1": (140, sweep_ood),
        "anchor_l10": (140, sweep_ood),
        "anchor_mid": (140, mid_ood),
        "anchor_l0": (140, naive_ood),
        "anchor_b15": (140, 200),
    }
    correct = {m: {"id": ones(n, i), "o": ones(n, o)} for m, (i, o) in acc.items()}

    def anchor(label, lam, spec="last"):
        return {
            "label": label,
            "name": "anchor",
            "anchor_lambda": lam,
            "anchor_lambda_mode": "fixed",
            "layer_spec": spec,
        }

    methods = [
        {"label": "naive", "name": "naive"},
        anchor("anchor_l0", 0.0),  # first in the grid, and still never the primary ANCHOR
        anchor("anchor", 1.0),
        anchor("anchor_mid", 1.0, "middle"),
        anchor("anchor_b15", 1.0, "custom"),
        anchor("anchor_l0.1", 0.1),
        anchor("anchor_l10", 10.0),
        {"label": "ceiling", "name": "ceiling"},
    ]
    return [cell(correct, n) for _ in range(seeds)], methods


def test_the_claims_reproduced_on_a_grid_built_to_show_them():
    cells, methods = _grid()
    got = {c["claim"]: c for c in four_claims(cells, methods, n_boot=500)}
    assert [got[k]["verdict"] for k in "abcd"] == [REPRODUCED] * 4
    assert got["s"]["verdict"] == NOT_TESTED and "SEAM" in got["s"]["why"]
    # (a): naive's WRG +20 and AOG -20, so WRG - AOG = +40 on the mean and on the one target
    assert [r["stat"]["value"] for r in got["a"]["rows"]] == pytest.approx([40.0, 40.0])
    assert [r["primary"] for r in got["a"]["rows"]] == [True, False]
    # (b): NTS anchor - naive = (+10) - (-20) = +30; never ANCHOR at lambda 0 (which is naive)
    assert [r["what"] for r in got["b"]["rows"]] == ["NTS anchor - naive"]
    assert got["b"]["rows"][0]["stat"]["value"] == pytest.approx(30.0)
    # (c): within the last layer, lambda 1 minus 0.1 and minus 10 (lambda 0 is not an end of the sweep): +20 each
    assert [r["what"] for r in got["c"]["rows"]] == [
        "NTS anchor - anchor_l0.1 (layers last)",
        "NTS anchor - anchor_l10 (layers last)",
    ]
    assert [r["stat"]["value"] for r in got["c"]["rows"]] == pytest.approx([20.0, 20.0])
    # (d): last minus the 50% + 75% middle (never custom block 15, though it scores higher), non-inferiority
    assert [r["what"] for r in got["d"]["rows"]] == ["NTS anchor - anchor_mid"]
    assert got["d"]["rows"][0]["stat"]["value"] == pytest.approx(10.0) and got["d"]["rows"][0]["want"] == NONINFERIOR
    assert all(c["margin"] == 3.8 and c["family"] for c in got.values())
    # Holm within a family: (a)'s two rows, each p doubled (capped at 1), never below the raw p
    assert all(r["p_holm"] >= r["p"] for c in got.values() for r in c["rows"])


def test_the_claims_against_ruled_out_and_untested():
    # naive gains more OOD than ID, ANCHOR below naive, the ends of the sweep above lambda 1, the middle 10 pp above
    cells, methods = _grid(naive_ood=180, anchor_ood=100, sweep_ood=130, mid_ood=120)
    got = {c["claim"]: c["verdict"] for c in four_claims(cells, methods, n_boot=500)}
    assert got == {"a": NOT_REPRODUCED, "s": NOT_TESTED, "b": NOT_REPRODUCED, "c": NOT_REPRODUCED, "d": NOT_REPRODUCED}
    # models that agree on every pair (3 seeds): +0.00 [+0.00, +0.00] on 0 differing pairs is no evidence, not
    # "ruled out" or "reproduced", and has no MDE (never 0.0); (b)'s NTS difference does not move under resampling
    # either (naive = teacher on ID, ANCHOR above both: NTS 0 for both in every replicate)
    cells, methods = _grid(naive_ood=100, anchor_ood=100, sweep_ood=100, mid_ood=100)
    cells[0]["correct"]["naive"]["id"] = cells[0]["correct"]["teacher"]["id"]
    claims = {c["claim"]: c for c in four_claims(cells, methods, n_boot=200)}
    got = {k: c["verdict"] for k, c in claims.items()}
    assert got == {"a": NO_INFORMATION, "s": NOT_TESTED, "b": NO_INFORMATION, "c": NO_INFORMATION, "d": NO_INFORMATION}
    assert claims["b"]["rows"][0]["stat"]["ci"] == (0.0, 0.0) and np.isnan(claims["b"]["rows"][0]["stat"]["mde"])
    c0 = claims["c"]["rows"][0]["stat"]
    assert c0["ci"] == (0.0, 0.0) and c0["test"] == "exact" and c0["discordant"] == 0 and c0["p"] == 1.0
    assert "agree on every test pair" in claims["c"]["why"] and "MDE" not in claims["c"]["why"]
    assert all(r["status"] == NO_INFORMATION for c in claims.values() for r in c["rows"])
    # a grid with Naive and the ceiling only tests (a); custom single blocks are not the paper's middle
    claims = {c["claim"]: c for c in four_claims(cells, methods[:1], n_boot=200)}
    assert claims["b"]["verdict"] == claims["c"]["verdict"] == claims["d"]["verdict"] == NOT_TESTED
    no_mid = [m for m in methods if m["label"] != "anchor_mid"]
    d = next(c for c in four_claims(cells, no_mid, n_boot=200) if c["claim"] == "d")
    assert d["verdict"] == NOT_TESTED and "anchor_b15 anchor single blocks" in d["why"]


def test_verdicts_withheld_without_a_gap_and_small_samples_say_nothing():
    cells, methods = _grid()
    cells[0].update(gap_passed=False, seed=3)
    got = {c["claim"]: c for c in four_claims(cells, methods, n_boot=200)}
    assert {k: c["verdict"] for k, c in got.items()} == {
        "a": WITHHELD,
        "s": NOT_TESTED,
        "b": WITHHELD,
        "c": WITHHELD,
        "d": WITHHELD,
    }
    assert got["b"]["why"].startswith("no weak-to-strong gap in seed 3")
    # 20 pairs, naive and ANCHOR 50/50 on different pairs: an interval far wider than 2m says nothing; the MDE is given
    t = {"id": ones(20, 10), "o": ones(20, 10)}
    c = cell({"teacher": t, "naive": t, "anchor": {"id": ones(20, 10), "o": ~ones(20, 10)}}, 20)
    b = next(x for x in four_claims([c, c], methods[:3], n_boot=300) if x["claim"] == "b")
    assert b["verdict"] == NO_INFORMATION and b["rows"][0]["stat"]["mde"] > 2 * 3.8
    assert f"{b['rows'][0]['stat']['mde']:.1f} pp" in b["why"]


def test_seam_trade_off():
    # SEAM 10 pp below naive on ID, 1 pp below on OOD, 2,000 pairs: lower WRG, AOG non-inferior at 3.8 pp
    n = 2000
    t = {"id": ones(n, 1000), "o": ones(n, 1000)}
    c = cell(
        {
            "teacher": t,
            "naive": {"id": ones(n, 1400), "o": ones(n, 1200)},
            "seam": {"id": ones(n, 1200), "o": ones(n, 1180)},
        },
        n,
    )
    methods = [{"label": "naive", "name": "naive"}, {"label": "seam", "name": "seam"}]
    s = next(x for x in four_claims([c, c], methods, n_boot=300) if x["claim"] == "s")
    assert [r["stat"]["value"] for r in s["rows"]] == pytest.approx([-10.0, -1.0])
    assert [r["status"] for r in s["rows"]] == ["for", "for"] and s["verdict"] == REPRODUCED
    # what is tested is in the claim's name: SEAM worse on both WRG and AOG still "keeps OOD" within m
    assert s["text"].startswith("SEAM loses ID and keeps OOD") and "no OOD gain is tested" in s["text"]


def test_the_report_section_reads_the_rewards_files(tmp_path):
    from w2s_shift.report.sections import claims_blocks
    from w2s_shift.results.verdicts import claim_cells

    cells, methods = _grid()
    for seed in (0, 1):
        cell_dir = tmp_path / "src" / f"seed{seed}"
        (cell_dir / "rewards").mkdir(parents=True)
        for m, per in cells[0]["correct"].items():
            for d, c in per.items():
                rows = [
                    {"id": i, "reward_chosen": 1.0 if ok else -1.0, "reward_rejected": 0.0} for i, ok in enumerate(c)
                ]
                (cell_dir / "rewards" / f"{m}__{d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {
        "dir": "src/seed0",
        "id": "id",
        "ood": ["o"],
        "models": list(cells[0]["correct"])[1:],
        "bootstrap": {"n": 300},
    }
    back = claim_cells(tmp_path, [meta])[0]
    assert back["ids"]["o"] == list(range(200))
    assert all((back["correct"][m][d] == cells[0]["correct"][m][d]).all() for m in back["correct"] for d in ("id", "o"))
    blocks = claims_blocks(tmp_path, [meta, {**meta, "dir": "src/seed1"}], methods)
    assert blocks[0] == ("h3", "The paper's claims")
    table = blocks[2]
    first_b = next(r for r in table[2] if r[0].startswith("(b)"))
    assert first_b[1] == "NTS anchor - naive, > 0" and first_b[2].startswith("+30.00 [") and first_b[-1] == REPRODUCED
    assert first_b[5] == "2 (+30.00, +30.00)" and first_b[6] == "for" and float(first_b[3]) > 0
    notes = blocks[3][1]
    assert any(n.startswith("(b) **reproduced**") and "margin m = 3.8 pp" in n and "Family:" in n for n in notes)
    # the same models from one seed: no statement about methods
    one = claims_blocks(tmp_path, [meta], methods)
    first_b = next(r for r in one[2][2] if r[0].startswith("(b)"))
    assert first_b[-1] == first_b[6] == NOT_DECIDED_1SEED
    assert any(n.startswith("(b) **not decided (1 seed)**: one seed holds test-pair noise only") for n in one[3][1])
    one_summary = []
    claims_blocks(tmp_path, [{**meta, "source": "src", "seed": 3}], methods, summary=one_summary)
    assert one_summary[1] == (
        "src: claims not decided from 1 seed, whose intervals leave out training noise: (a), (b), (c), (d) can be "
        'tested on this grid ((s) cannot) with 2 or more seeds (`--set "seeds=[0,1,2]"`, or `run --until-decided '
        "--max-seeds 5`)"
    )
    gap = {"passed": False, "gap_pp": 1.6, "ci": [-6.0, 9.2]}
    summary = []
    notes = claims_blocks(tmp_path, [{**meta, "source": "src", "seed": 3, "gap_check": gap}], methods, summary=summary)
    assert notes[3][1][0].startswith("(a) **withheld**: no weak-to-strong gap in seed 3")
    # "what this run shows": the gap, the verdicts, the smallest effect the primary comparisons see
    assert len(summary) == 3
    assert (
        summary[0]
        == "src: ceiling - teacher on ID +1.6 pp [-6.0, +9.2]: **no weak-to-strong gap in seed 3**, verdicts withheld"
    )
    assert summary[1] == "src: claims (a) withheld; (s) not tested; (b) withheld; (c) withheld; (d) withheld"
    assert summary[2].startswith("src: the claims' primary comparisons detect (80% power) effects of ")
    assert summary[2].endswith("against the paper's 3.8 pp; 1 seed: training noise not in the intervals")

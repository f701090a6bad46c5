"""The best-of-n estimator (w2s_shift/metrics/bon.py) against brute-force enumeration of every subset, and its two
anchors: a proxy equal to the gold judge gives the gold's own best-of-n curve; a proxy that knows nothing gives a
flat one."""

import itertools
import math

import numpy as np
import pytest

from w2s_shift.metrics.bon import best_of_n_curve, best_of_n_gold, kl_bon, selection_probabilities


def brute_force(proxy, gold, n) -> float:
    """Mean over all C(N, n) subsets of the gold reward of the proxy's pick, a tie among the subset's best shared
    equally (a uniformly random tie-break)."""
    vals = []
    for sub in itertools.combinations(range(len(proxy)), n):
        best = max(proxy[i] for i in sub)
        winners = [i for i in sub if proxy[i] == best]
        vals.append(np.mean([gold[i] for i in winners]))
    return float(np.mean(vals))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_estimator_equals_enumerating_every_subset_ties_included(seed):
    rng = np.random.default_rng(seed)
    proxy = rng.integers(0, 4, size=7).astype(float)  # few values: ties in most draws
    gold = rng.normal(size=7)
    for n in range(1, 8):
        probs = selection_probabilities(proxy, n)
        assert probs.sum() == pytest.approx(1.0, abs=1e-12)
        assert probs @ gold == pytest.approx(brute_force(proxy, gold, n), abs=1e-12), n


def test_hand_computed_case():
    # N = 3, proxy ranks 0 < 1 < 2; best-of-2 keeps the top of each of the 3 pairs: (0,1)->1, (0,2)->2, (1,2)->2
    probs = selection_probabilities([0.1, 0.5, 0.9], 2)
    assert probs == pytest.approx([0.0, 1 / 3, 2 / 3])
    assert selection_probabilities([0.1, 0.5, 0.9], 1) == pytest.approx([1 / 3] * 3)  # n = 1: any sample
    assert selection_probabilities([0.1, 0.5, 0.9], 3) == pytest.approx([0, 0, 1])  # n = N: the proxy's best


def test_a_proxy_equal_to_gold_gives_golds_own_curve_and_a_blind_proxy_a_flat_one():
    rng = np.random.default_rng(0)
    gold = rng.normal(size=(200, 16))
    ns = [1, 2, 4, 8, 16]
    own = best_of_n_curve(gold, gold, ns, n_boot=200)
    assert all(b > a for a, b in zip(own["gold"], own["gold"][1:]))  # strictly better with n when proxy = gold
    assert own["gold"][-1] == pytest.approx(gold.max(axis=1).mean()) and own["gold"][0] == pytest.approx(gold.mean())
    flat = best_of_n_curve(np.zeros_like(gold), gold, ns, n_boot=200)  # every sample tied: a uniform pick
    assert flat["gold"] == pytest.approx([gold.mean()] * len(ns), abs=1e-12)
    blind = best_of_n_gold(rng.normal(size=gold.shape), gold, ns)  # independent of gold: flat up to noise
    se = blind[:, -1].std(ddof=1) / math.sqrt(len(gold))
    assert abs(blind[:, -1].mean() - blind[:, 0].mean()) < 3 * se
    assert own["kl"] == pytest.approx([math.log(n) - (n - 1) / n for n in ns]) and own["kl"][0] == 0.0
    assert best_of_n_curve(gold[:3, :12], gold[:3, :12], n_boot=50)["n"] == [1, 2, 4, 8, 12]  # default n values
    lo, hi = own["ci"][-1]
    assert lo < own["gold"][-1] < hi and own["prompts"] == 200 and own["samples"] == 16


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="1 <= n <= N = 3"):
        selection_probabilities([1.0, 2.0, 3.0], 4)
    with pytest.raises(ValueError, match="finite"):
        selection_probabilities([1.0, float("nan")], 1)
    with pytest.raises(ValueError, match="one shape"):
        best_of_n_gold(np.zeros((2, 3)), np.zeros((2, 4)), [1])
    with pytest.raises(ValueError, match="n >= 1"):
        kl_bon(0)


def _curve(seed, model, per_prompt):
    from w2s_shift.results.bon import BonCurve

    p = len(per_prompt)
    return BonCurve(
        seed=seed,
        model=model,
        set="s",
        n=[1, 2],
        kl=[0.0, 0.19],
        gold=[0.0, 0.0],
        ci=[None, None],
        gain=[0.0, 0.0],
        gain_ci=[None, None],
        per_prompt=[[0.0, x] for x in per_prompt],
        prompts=p,
        samples=2,
    )


def test_versus_the_teacher_uses_the_claims_interval_over_seeds_and_prompts():
    """Hand-computed: the paired difference at the largest n per seed, then seed_pair_interval."""
    from scipy import stats

    from w2s_shift.results.bon import versus

    # one seed, a constant difference of 1 over prompts: no prompt noise, a zero-width interval, not seed noise
    one = versus([_curve(0, "naive", [1.0, 2.0, 3.0]), _curve(0, "teacher", [0.0, 1.0, 2.0])], "naive", "teacher")
    assert one["value"] == 1.0 and one["ci"] == (1.0, 1.0) and not one["seed_noise"]
    # two seeds, constant differences 1 and 3: V = S^2 / k = 2 / 2, df = 1 (the t interval over seeds)
    cs = [
        _curve(0, "naive", [1.0, 1.0]),
        _curve(0, "teacher", [0.0, 0.0]),
        _curve(1, "naive", [3.0, 3.0]),
        _curve(1, "teacher", [0.0, 0.0]),
    ]
    two = versus(cs, "naive", "teacher")
    q = stats.t.ppf(0.975, 1)
    assert two["value"] == 2.0 and two["seed_noise"]
    assert two["ci"] == pytest.approx((2.0 - q, 2.0 + q))
    # its MDE: the t test's 80%-power effect (noncentral t, df 1, noncentrality MDE / SE with SE = 1)
    mde = two["mde"]
    assert stats.nct.sf(q, 1, mde) + stats.nct.cdf(-q, 1, mde) == pytest.approx(0.8, abs=2e-3)
    assert versus(cs, "anchor", "teacher") is None  # a model missing

"""Method differences measured over seeds (trained models) and test pairs: an interval that covers both, the
minimum detectable effect at 80% power, a non-inferiority p, an exact test where few pairs disagree, and Holm's
correction within a declared family. Units: percentage points (pp); variances in pp^2. scipy gives the t and normal
quantiles, statsmodels Holm. Used by :mod:`w2s_shift.metrics.claims`; the rules are docs/protocol.md.
"""

from __future__ import annotations

import numpy as np

#: power at which a minimum detectable effect is quoted
POWER = 0.80
#: below this many disagreeing pairs a difference is tested exactly (permutation of the disagreeing pairs)
EXACT_BELOW = 20


def seed_pair_interval(points, replicates, groups=None, level: float = 0.95, power: float = POWER) -> dict:
    """Interval, p-value and minimum detectable effect of a method difference measured on k seeds (trained models)
    and n test pairs, covering the training noise between seeds as well as the test-pair noise.

    Model (a two-way crossed random-effects model, seeds x pairs: Searle, Casella & McCulloch 1992, "Variance
    Components", Ch. 4): seed s's difference is d_s = delta + u_s + e_s, u_s the seed (training) effect with
    variance s_u^2 and e_s the test-pair error; seeds that share their test pairs share part of that error (a pair
    that favours one method in every seed), with covariance c. The seed mean's variance is
    s_u^2 / k + Var(mean e) and is estimated without bias (ANOVA / moment estimator) by

        V = S^2 / k + c_hat,     S^2 = sample variance of d_s over seeds (ddof 1),
        c_hat = mean over ordered seed pairs s != t of Cov(rep_s, rep_t) (0 for seeds with different test pairs;
                a negative mean is taken as 0),

    where rep_s are the test-pair bootstrap replicates of d_s (one resampling shared by seeds that share pairs).
    S^2 already holds every seed's own pair noise; c_hat adds the shared part it cannot see. Degrees of freedom by
    Satterthwaite (1946): df = V^2 / ((S^2/k)^2 / (k - 1)) (c_hat rests on n pairs and is taken as known), so with
    independent pair errors the interval is the exact t interval over seeds. With one seed the training noise
    cannot be estimated: V is the bootstrap variance (pairs only), df infinite, and ``seed_noise`` is False. Seeds
    whose differences tie (S^2 = 0 while each holds pair noise) take V = the pairs-only bootstrap variance of the
    seed mean with df = k - 1, never a zero-width interval. Coverage on simulated nulls:
    benchmarks/interval_coverage.py.

    Args:
        points: (k,) the per-seed differences, pp.
        replicates: (n_boot, k) test-pair bootstrap replicates of each seed's difference, pp.
        groups: (k,) labels, equal for seeds that share their test pairs (same pair ids) and their resampling;
            None: all seeds share them.
        level: coverage; power: for the minimum detectable effect.

    Returns:
        {"value": seed mean (pp), "se": sqrt(V) (pp), "df": float (inf: normal), "ci": (lo, hi) (pp),
         "p": two-sided p of value = 0, "mde": minimum detectable effect at ``power`` and two-sided 1 - level,
         (t_{1-a/2} + t_{power}) * se (Bloom 1995, "Minimum detectable effects", Eval. Rev. 19(5)), pp,
         "seed_sd": S (pp, None with one seed), "seed_noise": whether V covers training noise,
         "var_pairs": one seed's test-pair variance (mean over seeds, pp^2), "cov_shared": c_hat (pp^2)}.
    """
    from scipy import stats as st

    d = np.asarray(points, dtype=np.float64)
    r = np.asarray(replicates, dtype=np.float64).reshape(-1, d.size)
    k = d.size
    g = list(groups) if groups is not None else [0] * k
    value = float(d.mean())
    var_pairs = float(np.mean(np.var(r, axis=0, ddof=1))) if r.shape[0] > 1 else 0.0
    c_hat = 0.0
    if k == 1:
        var, df, seed_sd = var_pairs, np.inf, None
    else:
        s2 = float(np.var(d, ddof=1))
        cov = np.cov(r, rowvar=False) if r.shape[0] > 1 else np.zeros((k, k))
        same = np.array([[g[i] == g[j] and i != j for j in range(k)] for i in range(k)])
        # the shared pair error's variance cannot be negative: a negative estimate is noise, taken as 0 (this also
        # keeps V >= S^2 / k, so df >= k - 1)
        c_hat = max(0.0, float(cov[same].sum()) / (k * (k - 1)))
        var, seed_sd = s2 / k + c_hat, s2**0.5
        df = var**2 / ((s2 / k) ** 2 / (k - 1)) if s2 > 0 and var > 0 else np.inf
        # seeds whose differences tie (common: accuracies move in steps of 100 / n pp) make S^2 zero and the t
        # interval zero-width, though each seed's difference carries pair noise: then V is the pairs-only variance
        # of the seed mean, with t's fewest degrees of freedom, k - 1 (wider than the plain t interval; ties are
        # rare enough that coverage stays at the t interval's, benchmarks/interval_coverage.py)
        v_pairs = float(np.var(r.mean(axis=1), ddof=1)) if r.shape[0] > 1 else 0.0
        if s2 <= 1e-9 * v_pairs and c_hat < (1 - 1e-6) * v_pairs:  # (not when shared pairs already give it all)
            var, df = v_pairs, float(k - 1)
        if var <= 0:  # identical models: no spread anywhere
            var, df = 0.0, np.inf
    se = max(var, 0.0) ** 0.5
    q = st.t.ppf(0.5 + level / 2, df) if np.isfinite(df) else st.norm.ppf(0.5 + level / 2)
    qp = st.t.ppf(power, df) if np.isfinite(df) else st.norm.ppf(power)
    if se > 0:
        tail = st.t.sf(abs(value) / se, df) if np.isfinite(df) else st.norm.sf(abs(value) / se)
        p = float(min(1.0, 2 * tail))
    else:
        p = 1.0 if value == 0 else 0.0
    return {
        "value": value,
        "se": se,
        "df": float(df),
        "ci": (float(value - q * se), float(value + q * se)),
        "p": p,
        "mde": float((q + qp) * se),
        "seed_sd": seed_sd,
        "seed_noise": k > 1,
        "var_pairs": var_pairs,
        "cov_shared": c_hat,
    }


def noninferiority_p(value: float, se: float, df: float, margin: float) -> float:
    """p of H0: difference <= -margin (pp) against difference > -margin, doubled so that p < 1 - level matches the
    two-sided interval's lower end above -margin (the usual confidence-interval reading of a non-inferiority test,
    Piaggio et al. 2012, CONSORT extension, Fig. 1)."""
    from scipy import stats as st

    if se <= 0:
        return 0.0 if value > -margin else 1.0
    z = (value + margin) / se
    tail = st.t.sf(z, df) if np.isfinite(df) else st.norm.sf(z)
    return float(min(1.0, 2 * tail))


def exact_permutation_p(stat_fn, observed: float, contributions) -> float:
    """Exact two-sided p of a paired difference from few disagreeing pairs: every assignment of which model won each
    disagreeing pair is equally likely under H0 (the methods are exchangeable pair by pair), so the 2^D sign flips
    are enumerated. For one accuracy difference this is McNemar's exact (binomial) test (McNemar 1947; scipy's
    ``binomtest`` gives the same p); for WRG / AOG / NTS differences the statistic is recomputed under each flip.

    Args:
        stat_fn: (F, D) 0/1 flip matrix -> (F,) statistic (pp), flip 1 exchanges the two models on that pair.
        observed: the statistic without flips (pp).
        contributions: (D,) anything with a length D < 31: the disagreeing pairs.

    Returns:
        share of flips whose |statistic| >= |observed| (1e-9 pp tolerance), in (0, 1].
    """
    n = len(contributions)
    if n == 0:
        return 1.0
    hits, total, block = 0, 2**n, 1 << 16
    bits = np.arange(n, dtype=np.int64)
    for start in range(0, total, block):
        codes = np.arange(start, min(total, start + block), dtype=np.int64)
        flips = ((codes[:, None] >> bits) & 1).astype(np.float64)
        hits += int(np.sum(np.abs(stat_fn(flips)) >= abs(observed) - 1e-9))
    return hits / total


def holm(pvalues) -> list:
    """Holm's (1979) step-down adjusted p-values of one declared family (statsmodels ``multipletests``), in order."""
    from statsmodels.stats.multitest import multipletests

    p = [float(x) for x in pvalues]
    if not p:
        return []
    return [float(x) for x in multipletests(p, method="holm")[1]]

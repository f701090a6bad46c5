"""Method differences measured over seeds (trained models) and test pairs: an interval that covers both, the
minimum detectable effect of that interval at 80% power (Holm-aware), a non-inferiority p, an exact test where few
pairs disagree, and Holm's correction within a declared family. Units: percentage points (pp); variances in pp^2.
scipy gives the chi-square, t and normal distributions and the quadrature nodes, statsmodels Holm. Used by
:mod:`w2s_shift.metrics.claims`; the rules are docs/protocol.md.

The interval is a generalized confidence interval (Weerahandi 1993, "Generalized confidence intervals", JASA 88(423):
899-905; generalized p-values: Tsui & Weerahandi 1989, JASA 84(406): 602-607) for the seed mean of a two-way crossed
random-effects model, seeds x test pairs (Searle, Casella & McCulloch 1992, "Variance Components", Ch. 4):

    d_s = delta + a + u_s + e_s,   s = 1..k,

with a the test-pair error that every seed on the same pairs shares (variance c), u_s the seed's training effect
(variance s_u^2) and e_s the seed's own test-pair error (variance v_own). The seed mean's variance is
theta / k + c with theta = s_u^2 + v_own, the spread of d_s over seeds. The bootstrap over test pairs gives v_own and c
to within their n-pair precision (taken as known); only theta is estimated from k seeds, by S^2 ~ theta chi2_{k-1} /
(k - 1). Its generalized pivotal quantity is theta* = max(S^2 (k - 1) / X, v_own), X ~ chi2_{k-1} (theta >= v_own is
known), and the interval is the set of delta not rejected by the pivot

    delta* = mean - Z sqrt(theta* / k + c),   Z ~ N(0, 1) independent of X.

Unlike a t interval with Satterthwaite (1946) degrees of freedom computed from the same S^2 (which narrows when S^2
is small by chance and rejected 7-13% of true nulls at 2 seeds), it carries the chi-square uncertainty of S^2 into the
critical value; it is the exact t interval over seeds when c = v_own = 0, the normal interval on the pairs-only
variance when S^2 = 0, and continuous in the data between. Null rejection and power on simulated data as hard as real
(one shared test split, pair effects shared by the seeds, contested pairs, a training effect per seed):
benchmarks/interval_coverage.py, table in docs/protocol.md.
"""

from __future__ import annotations

import functools

import numpy as np

#: power at which a minimum detectable effect is quoted
POWER = 0.80
#: below this many disagreeing pairs a difference is tested exactly (permutation of the disagreeing pairs)
EXACT_BELOW = 20
#: Gauss-Legendre nodes of the chi-square integrals (the pivot's draws below the floor; the design's S^2)
NODES = 96


@functools.lru_cache(maxsize=8)
def _legendre(m: int) -> tuple:
    """(nodes, weights) of m-point Gauss-Legendre quadrature on (0, 1)."""
    x, w = np.polynomial.legendre.leggauss(m)
    return (x + 1) / 2, w / 2


def pivot_draws(s2, v_own, k: int, m: int = NODES) -> tuple:
    """Quadrature of the generalized pivot of theta (the seed spread), theta* = max(S^2 (k - 1) / X, v_own),
    X ~ chi2_{k-1}: the draws with theta* above the floor (X < x0 = S^2 (k - 1) / v_own) at m Gauss-Legendre nodes
    in the chi-square's probability scale, plus one node at the floor carrying P(X >= x0) (exact, chi2.sf).

    Args:
        s2: (N,) sample variances of the per-seed differences over seeds (pp^2, ddof 1); v_own: (N,) or scalar, one
            seed's own test-pair variance (pp^2); k >= 2 seeds.

    Returns:
        (theta, weight), each (N, m + 1); weights sum to 1 per row.
    """
    from scipy import stats as st

    s2 = np.atleast_1d(np.asarray(s2, np.float64))
    floor = np.broadcast_to(np.asarray(v_own, np.float64), s2.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        x0 = np.where(floor > 0, s2 * (k - 1) / floor, np.inf)
    p0 = st.chi2.cdf(x0, k - 1)  # P(theta* above the floor)
    u, w = _legendre(m)
    x = st.chi2.ppf(np.clip(p0[:, None] * u, 1e-300, None), k - 1)
    top = np.broadcast_to(s2[:, None] * (k - 1), x.shape)
    ratio = np.divide(top, x, out=np.where(top > 0, np.inf, 0.0), where=x > 0)  # X -> 0 draws carry no weight
    theta = np.maximum(ratio, floor[:, None])
    theta = np.concatenate([theta, floor[:, None]], axis=1)
    weight = np.concatenate([p0[:, None] * w, (1 - p0)[:, None]], axis=1)
    return theta, weight


def _two_sided(x, sd):
    """2 P(Z > x / sd), elementwise, with sd = 0 read as a point mass at 0."""
    from scipy import stats as st

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > 0, 2 * st.norm.sf(x / np.where(sd > 0, sd, 1.0)), np.where(x > 0, 0.0, 1.0))


def gpq_tail(x, s2, v_own, c, k: int) -> np.ndarray:
    """Generalized two-sided p of |mean - delta0| = x: E over the pivot of 2 P(Z > x / sqrt(theta* / k + c)).

    Args:
        x: (N,) distances |mean - delta0| >= 0 (pp); s2, v_own, c: (N,) or scalars (pp^2); k >= 2.

    Returns:
        (N,) p in [0, 1].
    """
    theta, w = pivot_draws(s2, v_own, k)
    sd = np.sqrt(theta / k + np.asarray(c, np.float64).reshape(-1, 1))
    return np.clip((w * _two_sided(np.asarray(x, np.float64).reshape(-1, 1), sd)).sum(axis=1), 0.0, 1.0)


def gpq_critical(s2, v_own, c, k: int, alpha: float = 0.05) -> np.ndarray:
    """Half-width of the generalized interval: q with E over the pivot of 2 P(Z > q / sqrt(theta* / k + c)) = alpha,
    by Newton's method from below (the tail is convex and decreasing in q > 0, so the iterates rise to the root).

    Args:
        s2, v_own, c: (N,) or scalars (pp^2); k >= 2; alpha: two-sided level (Holm / Bonferroni: alpha / m).

    Returns:
        (N,) half-widths (pp); 0 where every variance is 0.
    """
    from scipy import stats as st

    s2 = np.atleast_1d(np.asarray(s2, np.float64))
    theta, w = pivot_draws(s2, v_own, k)
    sd = np.sqrt(theta / k + np.broadcast_to(np.asarray(c, np.float64), s2.shape)[:, None])
    pos = sd > 0
    if not pos.any():
        return np.zeros(s2.size)
    lo_sd = np.where(pos, sd, np.inf).min(axis=1)
    q = np.where(np.isfinite(lo_sd), 0.5 * st.norm.isf(alpha / 2) * np.where(np.isfinite(lo_sd), lo_sd, 0), 0.0)
    safe = np.where(pos, sd, 1.0)
    for _ in range(100):
        z = q[:, None] / safe
        g = (w * np.where(pos, 2 * st.norm.sf(z), 0.0)).sum(axis=1) - alpha
        dg = -(w * np.where(pos, 2 * st.norm.pdf(z) / safe, 0.0)).sum(axis=1)
        step = np.where(dg < 0, g / np.where(dg < 0, dg, -1.0), 0.0)
        q = q - step
        if np.all(np.abs(step) <= 1e-10 * np.maximum(q, 1e-12)):
            break
    return np.where(np.isfinite(lo_sd), q, 0.0)


def _design_tests(theta: float, v_own: float, c: float, k: int, alpha: float) -> tuple:
    """(q (M,), weights (M,), sd): the interval's half-widths at quadrature nodes of S^2 ~ theta chi2_{k-1} / (k - 1)
    (Gauss-Legendre in the chi-square's probability scale), their weights, and the true SD of the seed mean,
    sqrt(theta / k + c); k = 1: the normal test on the pairs-only variance v_own + c."""
    from scipy import stats as st

    if k == 1:
        sd = float(np.sqrt(v_own + c))
        return np.array([st.norm.isf(alpha / 2) * sd]), np.array([1.0]), sd
    u, w = _legendre(NODES)
    s2 = theta * st.chi2.ppf(u, k - 1) / (k - 1)
    return gpq_critical(s2, v_own, c, k, alpha), w, float(np.sqrt(theta / k + c))


def _power(delta, q, w, sd) -> np.ndarray:
    from scipy import stats as st

    delta = np.atleast_1d(np.asarray(delta, np.float64))
    if sd <= 0:
        return np.where(delta != 0, 1.0, 0.0)
    hit = st.norm.sf((q[None, :] - delta[:, None]) / sd) + st.norm.cdf((-q[None, :] - delta[:, None]) / sd)
    return hit @ w


def design_power(delta, theta: float, v_own: float, c: float, k: int, alpha: float = 0.05) -> np.ndarray:
    """Power of the seeds x pairs interval (:func:`seed_pair_interval`) to exclude 0 when the true difference is
    delta: E over S^2 ~ theta chi2_{k-1} / (k - 1) of P(|N(delta, theta / k + c)| > q(S^2)), q from
    :func:`gpq_critical` (the seed mean independent of S^2, as under normal errors); k = 1: the normal test on the
    pairs-only variance v_own + c.

    Args:
        delta: (D,) true differences (pp); theta: the per-seed spread s_u^2 + v_own; v_own, c: pp^2; alpha: two-sided
            level of the test (alpha / m for the first step of Holm in a family of m).

    Returns:
        (D,) power in [0, 1].
    """
    return _power(delta, *_design_tests(theta, v_own, c, k, alpha))


def design_mde(theta: float, v_own: float, c: float, k: int, alpha: float = 0.05, power: float = POWER) -> float:
    """Minimum detectable effect of the interval in use: the true difference (pp) that :func:`design_power` finds
    with ``power`` at two-sided ``alpha`` (pass alpha / m for a Holm family of m: Holm rejects whatever Bonferroni
    rejects, so this effect is found with at least ``power`` under Holm). Replaces Bloom's (1995) (t_{1-a/2} +
    t_{power}) SE, which the seed spread's chi-square noise makes 1.2-2.5x too small at 2-3 seeds. NaN when every
    variance is 0 (nothing varies: no effect size can be read); inf when no effect reaches ``power`` (a level so
    small that the critical value is infinite at most seed spreads).

    Raises:
        ValueError: k < 1 or a negative variance.
    """
    from scipy.optimize import brentq

    if k < 1 or min(theta, v_own, c) < 0:
        raise ValueError(f"design_mde: k >= 1 and variances >= 0, got k={k}, theta={theta}, v_own={v_own}, c={c}")
    q, w, sd = _design_tests(theta, v_own, c, k, alpha)
    if sd <= 0:
        return float("nan")
    hi = 4 * sd
    for _ in range(64):  # a level so small (alpha ~1e-18, an early sequential look) that its critical value is inf
        if _power(hi, q, w, sd)[0] >= power:
            break
        hi *= 2
    else:
        return float("inf")
    return float(brentq(lambda x: _power(x, q, w, sd)[0] - power, 0.0, hi, xtol=1e-6 * sd))


def seed_pair_interval(points, replicates, groups=None, level: float = 0.95, power: float = POWER) -> dict:
    """Interval, p-value and minimum detectable effect of a method difference measured on k seeds (trained models)
    and n test pairs, covering the training noise between seeds as well as the test-pair noise (the module
    docstring gives the model and the generalized interval).

    Estimates: S^2 = sample variance of d_s over seeds (ddof 1); v = mean over seeds of the bootstrap variance of
    d_s; c = mean over ordered seed pairs s != t that share their test pairs of Cov(rep_s, rep_t) (a negative mean
    taken as 0: a variance cannot be negative); v_own = max(v - c, 0). The interval is mean +- q with q from
    :func:`gpq_critical`, p the generalized p of 0 (:func:`gpq_tail`), so p < 1 - level exactly when the interval
    excludes 0. With one seed the training noise cannot be estimated: the normal interval on the bootstrap variance
    (pairs only) and ``seed_noise`` False.

    Args:
        points: (k,) the per-seed differences, pp.
        replicates: (n_boot, k) test-pair bootstrap replicates of each seed's difference, pp.
        groups: (k,) labels, equal for seeds that share their test pairs (same pair ids) and their resampling;
            None: all seeds share them.
        level: coverage; power: for the minimum detectable effect.

    Returns:
        {"value": seed mean (pp), "ci": (lo, hi) (pp), "p": two-sided p of value = 0, "se": sqrt(spread / k + c)
         (pp; one seed: the bootstrap SD), "mde": :func:`design_mde` at the estimates and 1 - level (pp; NaN when
         nothing varies), "seed_sd": S (pp, None with one seed), "seed_noise": whether the interval covers training
         noise, "n_seeds": k, "s2": S^2, "var_pairs": v, "var_own": v_own, "cov_shared": c,
         "spread": max(S^2, v_own) (pp^2), "level": level, "power": power}.
    """
    from scipy import stats as st

    d = np.asarray(points, dtype=np.float64)
    r = np.asarray(replicates, dtype=np.float64).reshape(-1, d.size)
    k = d.size
    g = list(groups) if groups is not None else [0] * k
    value = float(d.mean())
    var_pairs = float(np.mean(np.var(r, axis=0, ddof=1))) if r.shape[0] > 1 else 0.0
    out = {"value": value, "seed_sd": None, "seed_noise": k > 1, "n_seeds": k, "var_pairs": var_pairs}
    out.update(level=level, power=power, s2=0.0, cov_shared=0.0, var_own=var_pairs, spread=var_pairs)
    if k == 1:
        se = var_pairs**0.5
        q = float(st.norm.isf((1 - level) / 2)) * se
        p = float(_two_sided(abs(value), se)) if se > 0 else (1.0 if value == 0 else 0.0)
    else:
        s2 = float(np.var(d, ddof=1))
        cov = np.cov(r, rowvar=False) if r.shape[0] > 1 else np.zeros((k, k))
        same = np.array([[g[i] == g[j] and i != j for j in range(k)] for i in range(k)])
        c = max(0.0, float(cov[same].sum()) / (k * (k - 1)))
        v_own = max(var_pairs - c, 0.0)
        out.update(seed_sd=s2**0.5, s2=s2, cov_shared=c, var_own=v_own, spread=max(s2, v_own))
        se = (out["spread"] / k + c) ** 0.5
        q = float(gpq_critical(s2, v_own, c, k, 1 - level)[0])
        p = float(gpq_tail(abs(value), s2, v_own, c, k)[0]) if q > 0 else (1.0 if value == 0 else 0.0)
    out.update(se=se, ci=(value - q, value + q), p=p, mde=mde_of(out, 1, level, power))
    return out


def mde_of(stat: dict, family: int = 1, level: float | None = None, power: float | None = None) -> float:
    """:func:`design_mde` of a :func:`seed_pair_interval` result at its estimated components (spread, v_own, c), at
    two-sided (1 - level) / family (the stat's own "alpha" where it has one: a sequential look's, exact where its
    level rounds to 1): the effect found with ``power`` once Holm corrects a family of ``family`` comparisons. NaN
    when nothing varies."""
    base = stat.get("alpha", 1 - stat["level"]) if level is None else 1 - level
    power = stat["power"] if power is None else power
    alpha = base / max(int(family), 1)
    if stat["n_seeds"] == 1:
        return design_mde(0.0, stat["var_pairs"], 0.0, 1, alpha, power)
    return design_mde(stat["spread"], stat["var_own"], stat["cov_shared"], stat["n_seeds"], alpha, power)


def noninferiority_p(stat: dict, margin: float) -> float:
    """p of H0: difference <= -margin (pp) against difference > -margin, doubled so that p < 1 - level matches the
    two-sided interval's lower end above -margin (the usual confidence-interval reading of a non-inferiority test,
    Piaggio et al. 2012, CONSORT extension, Fig. 1); the generalized p of :func:`gpq_tail` with several seeds, the
    normal one with one.

    Args:
        stat: a :func:`seed_pair_interval` result; margin: m (pp) > 0.
    """
    x = stat["value"] + margin
    if x <= 0:
        return 1.0
    if stat["n_seeds"] == 1:
        return float(_two_sided(x, stat["se"]))
    return float(gpq_tail(x, stat["s2"], stat["var_own"], stat["cov_shared"], stat["n_seeds"])[0])


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

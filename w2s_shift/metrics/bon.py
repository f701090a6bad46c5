"""Best-of-n against a gold judge: the expected gold reward of the response a proxy reward model picks among n
samples, estimated without bias from N >= n samples per prompt, and its over-optimization curve against
KL_bon(n) = log n - (n - 1) / n (Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization", Sec. 2 and
App. on the best-of-n estimator; Stiennon et al. 2020; Nakano et al. 2021, WebGPT App. on best-of-n).

The estimator: for one prompt with N samples, proxy scores p (N,) and gold scores g (N,), best-of-n draws a uniformly
random subset of n samples and keeps the one the proxy scores highest. Sample i, with r_i samples scored lower than
it by the proxy, is kept exactly when it is in the subset and the other n - 1 come from those r_i:
P(i kept) = C(r_i, n - 1) / C(N, n). So E[g of the kept sample] = sum_i g_i C(r_i, n - 1) / C(N, n), the average
over all C(N, n) subsets, not one draw. Ties of the proxy are broken uniformly at random: the members of a tie group
occupying sorted positions a..b - 1 each get the mean of C(r, n - 1) / C(N, n) over r in a..b - 1.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln
from scipy.stats import bootstrap


def kl_bon(n) -> np.ndarray | float:
    """KL divergence (nats) of the best-of-n policy from the sampling policy as the field plots it: log n - (n - 1) / n
    (Gao et al. 2022; Beirami et al. 2024 show it bounds the true KL from above). ``n`` >= 1, scalar or array.

    Raises:
        ValueError: an n below 1."""
    n = np.asarray(n, dtype=np.float64)
    if np.any(n < 1):
        raise ValueError(f"best-of-n needs n >= 1, got {n.min():g}")
    out = np.log(n) - (n - 1.0) / n
    return float(out) if out.ndim == 0 else out


def _log_comb(a: np.ndarray, b: int) -> np.ndarray:
    """log C(a, b) elementwise, -inf where a < b (no such subset)."""
    a = np.asarray(a, dtype=np.float64)
    out = np.full(a.shape, -np.inf)
    ok = a >= b
    out[ok] = gammaln(a[ok] + 1) - gammaln(b + 1) - gammaln(a[ok] - b + 1)
    return out


def selection_probabilities(proxy, n: int) -> np.ndarray:
    """P(sample i is the one best-of-n keeps) for one prompt's N samples, over all subsets of size n (ties of the
    proxy broken uniformly at random).

    Args:
        proxy: (N,) proxy reward of each sample (finite). n: 1 <= n <= N.

    Returns:
        (N,) probabilities summing to 1.

    Raises:
        ValueError: n outside 1..N, or a non-finite score.
    """
    p = np.asarray(proxy, dtype=np.float64)
    big_n = p.size
    if not 1 <= n <= big_n:
        raise ValueError(f"best-of-{n} needs 1 <= n <= N = {big_n} samples")
    if not np.all(np.isfinite(p)):
        raise ValueError("proxy scores must be finite")
    order = np.argsort(p, kind="stable")
    ranks = np.arange(big_n)
    w = np.exp(_log_comb(ranks, n - 1) - _log_comb(np.array([big_n]), n)[0])  # by sorted position
    sorted_p = p[order]
    probs_sorted = np.empty(big_n)
    start = 0
    while start < big_n:  # tie groups: the mean weight of the positions they occupy
        end = start + 1
        while end < big_n and sorted_p[end] == sorted_p[start]:
            end += 1
        probs_sorted[start:end] = w[start:end].mean()
        start = end
    out = np.empty(big_n)
    out[order] = probs_sorted
    return out


def best_of_n_gold(proxy, gold, ns) -> np.ndarray:
    """Expected gold reward of best-of-n, per prompt and n.

    Args:
        proxy, gold: (P, N) scores of each prompt's N samples by the proxy and the gold judge (finite).
        ns: the n values (each 1..N).

    Returns:
        (P, len(ns)) expected gold reward of the kept sample (the gold judge's units).

    Raises:
        ValueError: shapes that differ or are not 2-D, non-finite scores, n outside 1..N.
    """
    p, g = np.asarray(proxy, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if p.ndim != 2 or p.shape != g.shape:
        raise ValueError(f"proxy and gold must be (prompts, samples) of one shape, got {p.shape} and {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("gold scores must be finite")
    return np.array([[selection_probabilities(p[i], int(n)) @ g[i] for n in ns] for i in range(p.shape[0])])


def best_of_n_curve(proxy, gold, ns=None, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """The over-optimization curve of one proxy: mean over prompts of the expected gold reward of best-of-n,
    with a percentile bootstrap interval over prompts (scipy.stats.bootstrap), against KL_bon(n).

    Args:
        proxy, gold: (P, N) scores. ns: n values (default 1, 2, 4, ..., up to N, and N).
        n_boot, seed, level: bootstrap replicates, seed, coverage.

    Returns:
        {"n": [...], "kl": [nats], "gold": [mean over prompts], "ci": [[lo, hi] or None with one prompt],
         "gain": [mean over prompts of gold(n) - gold(1)], "gain_ci": [...], "per_prompt": (P, len(ns)) expected
         gold of each prompt (for paired comparisons of two proxies on the same candidates), "prompts": P,
         "samples": N}.
    """
    p = np.asarray(proxy, dtype=np.float64)
    big_n = p.shape[-1]
    if ns is None:
        ns = sorted({*(2**k for k in range(int(np.log2(big_n)) + 1)), big_n})
    g = np.asarray(gold, dtype=np.float64)
    per = best_of_n_gold(p, g, ns)
    gain = per - g.mean(
        axis=1, keepdims=True
    )  # gold(1) of a prompt is the mean gold of its samples, whatever the proxy
    ci, gain_ci = [None] * len(ns), [None] * len(ns)
    if per.shape[0] > 1:
        ci, gain_ci = (_percentile_ci(x, n_boot, seed, level) for x in (per, gain))  # the same resamples
    return {
        "n": [int(n) for n in ns],
        "kl": [float(k) for k in kl_bon(np.array(ns))],
        "gold": [float(v) for v in per.mean(axis=0)],
        "ci": ci,
        "gain": [float(v) for v in gain.mean(axis=0)],
        "gain_ci": gain_ci,
        "per_prompt": per.tolist(),
        "prompts": int(per.shape[0]),
        "samples": int(big_n),
    }


def _percentile_ci(per: np.ndarray, n_boot: int, seed: int, level: float) -> list:
    """[[lo, hi]] per column of ``per`` (P, K): percentile bootstrap of the column means over prompts."""
    res = bootstrap(
        (per,),
        lambda x, axis: np.mean(x, axis=axis),
        n_resamples=n_boot,
        confidence_level=level,
        method="percentile",
        random_state=np.random.default_rng(seed),
        axis=0,
        vectorized=True,
    )
    return [[float(lo), float(hi)] for lo, hi in zip(res.confidence_interval.low, res.confidence_interval.high)]

"""The paper's mechanism, measured on a grid: does a student that drifted more from its pretrained representations
lose more out of distribution? (Le et al. 2026, arXiv 2605.25629, explain OOD loss as representational drift.)

Each point is one W2S student of one cell (method x lambda x layers x seed) on one OOD target: x its final
drift there (relative squared error of the last layer, the output the reward head reads; :mod:`.drift`), y its
AOG there (percentage points). The relation is the Spearman rank correlation (Spearman 1904) with a percentile
bootstrap interval over the points (Efron 1979). The mechanism predicts a negative correlation; a correlation
whose interval holds 0 does not show it.
"""

from __future__ import annotations

import numpy as np

LEVEL = 0.95
MIN_POINTS = 4
#: fewer points give no interval: n = 4 points have 35 distinct resamples, most with ties, and the percentile
#: interval collapses onto the estimate (+0.77 [+0.77, +1.00]); n = 8 have 6,435
MIN_INTERVAL_POINTS = 8


def average_ranks(x) -> np.ndarray:
    """1-based ranks of ``x`` (n,), ties given the mean of their ranks (as Spearman's coefficient uses;
    scipy.stats.rankdata, method "average")."""
    from scipy.stats import rankdata

    return rankdata(np.asarray(x, dtype=np.float64), method="average").astype(np.float64)


def spearman(x, y) -> float | None:
    """Spearman's rank correlation of two (n,) samples (scipy.stats.spearmanr: the Pearson correlation of their
    average ranks), in [-1, 1]; None for n < 3 or a constant sample (no ranking).

    Raises:
        ValueError: samples of different lengths.
    """
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} x values but {len(y)} y values")
    if len(x) < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return None
    return float(spearmanr(x, y).statistic)


def spearman_interval(x, y, n_boot: int = 2000, seed: int = 0, level: float = LEVEL) -> dict | None:
    """Spearman's rho of (x, y) with a percentile bootstrap interval: ``n_boot`` resamples of the n points with
    replacement (a resample with a constant side has no rho and is left out; their count is returned).

    Returns:
        {"rho", "ci": [lo, hi] (None below :data:`MIN_INTERVAL_POINTS` points), "n", "n_boot" (resamples used),
        "level"}; None when rho itself is undefined.
    """
    rho = spearman(x, y)
    if rho is None:
        return None
    if len(x) < MIN_INTERVAL_POINTS:
        return {"rho": rho, "ci": None, "n": int(len(x)), "n_boot": 0, "level": level}
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        i = rng.integers(0, len(x), len(x))
        r = spearman(x[i], y[i])
        if r is not None:
            reps.append(r)
    a = (1 - level) / 2
    ci = [float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))] if reps else None
    return {"rho": rho, "ci": ci, "n": int(len(x)), "n_boot": len(reps), "level": level}


def drift_aog_points(cells: list, students: set | None = None) -> list:
    """The (drift, AOG) points of a source's cells (each a cell dict of metrics.json, with "drift" and
    "metrics"): one per W2S student (``students``: their labels; default every label with W2S metrics) with a
    drift file, seed and OOD target where both are known.

    Returns:
        [{"label", "seed", "target", "drift" (relative squared error, last layer), "aog" (pp)}].
    """
    out = []
    for c in cells:
        for lab, m in (c.get("metrics") or {}).items():
            if students is not None and lab not in students:
                continue
            d = (c.get("drift") or {}).get(lab)
            if not d or not d.get("layers"):
                continue
            last = str(d["layers"][-1])
            for t, aog in (m.get("AOG") or {}).items():
                e = (d.get("final", {}).get(t) or {}).get(last, {}).get("rel_sq_err")
                if e is not None and aog is not None:
                    out.append({"label": lab, "seed": c["seed"], "target": t, "drift": float(e), "aog": float(aog)})
    return out


def drift_aog_correlation(cells: list, n_boot: int = 2000, seed: int = 0, students: set | None = None) -> dict | None:
    """:func:`drift_aog_points` and their Spearman rho with its bootstrap interval (:func:`spearman_interval`),
    overall and per OOD target. None with fewer than :data:`MIN_POINTS` points.

    Returns:
        {"points": [...], "layer": "last", "overall": interval dict or None, "per_target": {t: interval or None}}.
    """
    pts = drift_aog_points(cells, students)
    if len(pts) < MIN_POINTS:
        return None

    def corr(ps):
        return spearman_interval([p["drift"] for p in ps], [p["aog"] for p in ps], n_boot, seed)

    targets = list(dict.fromkeys(p["target"] for p in pts))
    per = {t: corr([p for p in pts if p["target"] == t]) for t in targets}
    return {"points": pts, "layer": "last", "overall": corr(pts), "per_target": per}

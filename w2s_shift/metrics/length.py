"""The "longer response wins" baseline and how much of a reward model's accuracy, or of a difference between two
models, it explains. Pure numpy, float64 inside.

Conventions as in :mod:`w2s_shift.metrics.stats`: a pair's reward margin is r(chosen) - r(rejected), gold always
prefers the chosen response, accuracies and differences are in percentage points (pp). Lengths are whatever unit
the caller stores (the pipeline stores characters of the response text).
"""

from __future__ import annotations

import numpy as np

from .stats import finite_vector

LENGTH_DRIVEN_PP = 90.0  # a model agreeing with "longer wins" on >= 90% of a set's pairs is flagged length-driven


def _length_diff(len_chosen, len_rejected) -> np.ndarray:
    lc, lr = finite_vector(len_chosen, "len_chosen"), finite_vector(len_rejected, "len_rejected")
    if lc.shape != lr.shape:
        raise ValueError(f"length baseline needs one length per response: {lc.size} chosen vs {lr.size} rejected")
    return lc - lr


def longer_wins_accuracy(len_chosen, len_rejected) -> float:
    """Pairwise accuracy (pp) of the "longer response wins" baseline: 1 for a pair whose chosen response is
    longer, 0 when the rejected one is longer, 1/2 for equal lengths (the baseline has no preference there; a
    coin flip is right half the time; model accuracies instead count a reward tie as wrong).

    Args:
        len_chosen, len_rejected: (n,) response lengths (the pipeline stores characters of the response text).
    """
    dl = _length_diff(len_chosen, len_rejected)
    return float(100.0 * np.mean(np.where(dl > 0, 1.0, np.where(dl < 0, 0.0, 0.5))))


def length_agreement(margin, len_chosen, len_rejected) -> float:
    """Share of pairs (pp) on which a reward model prefers the same response as "longer wins".

    The model prefers chosen when its margin r(chosen) - r(rejected) > 0, else rejected (as in
    :func:`agreement_rate`); "longer wins" prefers the longer response. A pair of equal lengths counts 1/2
    (the baseline's choice there is a coin flip), so a model with no relation to length scores about 50.
    """
    m = finite_vector(margin, "margin")
    dl = _length_diff(len_chosen, len_rejected)
    if m.shape != dl.shape:
        raise ValueError(f"length_agreement needs the same pairs: {m.size} margins vs {dl.size} lengths")
    agree = np.where(dl == 0, 0.5, ((m > 0) == (dl > 0)).astype(np.float64))
    return float(100.0 * agree.mean())


def margin_length_correlation(margin, len_chosen, len_rejected) -> float | None:
    """Pearson correlation of the reward margin r(chosen) - r(rejected) with the length difference
    len(chosen) - len(rejected) over pairs; None when either is constant (the correlation is undefined)."""
    m = finite_vector(margin, "margin")
    dl = _length_diff(len_chosen, len_rejected)
    if m.shape != dl.shape:
        raise ValueError(f"margin_length_correlation needs the same pairs: {m.size} margins vs {dl.size} lengths")
    if m.size < 2 or np.ptp(m) == 0.0 or np.ptp(dl) == 0.0:
        return None
    return float(np.corrcoef(m, dl)[0, 1])


def length_explained_difference(correct_a, correct_b, len_chosen, len_rejected) -> dict:
    """Does "longer wins" explain an accuracy difference Acc_a - Acc_b on one set (a gap, a WRG, an AOG)?

    The pairs are split by what length says: L+ = pairs whose chosen response is longer ("longer wins" right),
    L- = pairs whose rejected response is longer (it is wrong), equal lengths apart. With n pairs,
        Acc_a - Acc_b = (n+ * d+ + n- * d- + n0 * d0) / n,   d+- = the difference on L+- alone (pp).
    A model that only leans more on length than the other gains on L+ and loses on L-. Definition used here:
    the difference is EXPLAINED BY LENGTH when it is positive and a does not beat b on the pairs where length
    misleads (d- <= 0), or it is negative and a does not lose to b on the pairs where length is right (d+ >= 0).
    An empty stratum counts as no difference there. A skill gain shows on both strata and is not flagged.

    Args:
        correct_a, correct_b: (n,) 0/1 correctness of models a and b on the same pairs.
        len_chosen, len_rejected: (n,) response lengths.

    Returns:
        {"delta": pp, "delta_longer_right": d+ or None, "delta_longer_wrong": d- or None, "n_longer_right",
         "n_longer_wrong", "n_equal": counts, "explained_by_length": bool}.
    """
    a, b = finite_vector(correct_a, "correct_a"), finite_vector(correct_b, "correct_b")
    dl = _length_diff(len_chosen, len_rejected)
    if not a.shape == b.shape == dl.shape:
        raise ValueError(f"length_explained_difference needs the same pairs: {a.size}, {b.size}, {dl.size}")
    d = a - b
    plus, minus = dl > 0, dl < 0
    dp = float(100.0 * d[plus].mean()) if plus.any() else None
    dm = float(100.0 * d[minus].mean()) if minus.any() else None
    delta = float(100.0 * d.mean())
    explained = bool((delta > 0 and (dm or 0.0) <= 0.0) or (delta < 0 and (dp or 0.0) >= 0.0))
    return {
        "delta": delta,
        "delta_longer_right": dp,
        "delta_longer_wrong": dm,
        "n_longer_right": int(plus.sum()),
        "n_longer_wrong": int(minus.sum()),
        "n_equal": int((dl == 0).sum()),
        "explained_by_length": explained,
    }


__all__ = [
    "LENGTH_DRIVEN_PP",
    "length_agreement",
    "length_explained_difference",
    "longer_wins_accuracy",
    "margin_length_correlation",
]

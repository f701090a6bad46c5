"""The paper's mechanism tested by intervention: is a student's OOD loss carried by its representation (the
features its head reads drifted away from the pretrained ones) or by its head? (Le et al. 2026, arXiv 2605.25629,
explain OOD loss as representational drift; ANCHOR is built on that explanation.) Two interventions, both on the
states the reward head reads (the final normalized output at each sequence's last token, where r = w . h):

* **Interpolation.** Hold the student's head w and move its features back toward the pretrained model's:
  h(a) = h_ref + a (h_student - h_ref). The reward is linear in h, so the pair margin is
  d(a) = (1 - a) w . (h_ref,c - h_ref,r) + a d_student, and accuracy(a) = mean(d(a) > 0) over the pairs, for a in
  [0, 1] (a = 1 is the student; a = 0 its head on the pretrained features). A representational failure shows as
  accuracy rising as a goes to 0 on OOD pairs; a head-only failure as a flat curve.
* **Probe transfer** (a linear probe, in the manner of Kumar et al. 2022, "Fine-tuning can distort pretrained
  features and underperform out-of-distribution"): a fresh Bradley-Terry head fitted on gold source pairs over
  frozen features (pretrained, or a student's), scored on OOD pairs. Representational failure predicts the student's
  features transfer worse than the pretrained ones (probe accuracy student - pretrained < 0 OOD); a head-only failure
  predicts no difference.

Intervals: percentile bootstrap over pairs (Efron 1979) within a seed; over seeds, the seed means' mean with an
interval that resamples seeds, then pairs within each (a two-stage bootstrap, Davison and Hinkley 1997, sec. 3.8), so
training noise is in it. Validated on synthetic features with a planted representational failure (positive control)
and a head-only failure (negative control): tests/test_intervention.py.
"""

from __future__ import annotations

import numpy as np
import torch

LEVEL = 0.95
ALPHAS = tuple(round(0.1 * k, 1) for k in range(11))  # a = 0, 0.1, ..., 1


def interpolation_margins(ref_diff: np.ndarray, w: np.ndarray, student_margin: np.ndarray, a: float) -> np.ndarray:
    """Pair margins of the student's head on h_ref + a (h_student - h_ref): (1 - a) w . ref_diff + a d_student.

    Args:
        ref_diff: (B, H) pretrained features of each pair's chosen minus rejected sequence (the head's input).
        w: (H,) the student's head. student_margin: (B,) the student's own margins (a = 1). a: in [0, 1].

    Returns:
        (B,) margins in reward units.

    Raises:
        ValueError: shapes that do not fit, or a outside [0, 1].
    """
    ref_diff, w, m = np.asarray(ref_diff, np.float64), np.asarray(w, np.float64), np.asarray(student_margin, np.float64)
    if ref_diff.ndim != 2 or ref_diff.shape != (len(m), len(w)):
        raise ValueError(f"interpolation: ref_diff {ref_diff.shape} does not fit {len(m)} pairs x hidden {len(w)}")
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"interpolation: a = {a} outside [0, 1]")
    return (1.0 - a) * (ref_diff @ w) + a * m


def interpolation_curve(ref_diff, w, student_margin, alphas=ALPHAS) -> list:
    """Pairwise accuracy (%) of the interpolated student at each a of ``alphas`` (ties count half, as in
    :func:`w2s_shift.metrics.stats`' accuracy: a tie is no preference)."""
    return [pairwise_accuracy(interpolation_margins(ref_diff, w, student_margin, a)) for a in alphas]


def pairwise_accuracy(margins: np.ndarray) -> float:
    """Percent of pairs with margin > 0, ties counting half."""
    m = np.asarray(margins, np.float64)
    return float(100.0 * ((m > 0).mean() + 0.5 * (m == 0).mean()))


def fit_probe(diff: np.ndarray, l2: float = 1e-3, steps: int = 200) -> np.ndarray:
    """A linear Bradley-Terry probe on frozen features: w minimizing mean_i -log sigmoid(w . diff_i) + l2 ||w||^2 / 2
    over gold pairs (diff_i = features of the chosen minus the rejected sequence), by L-BFGS (torch) in float64 on
    features scaled by their overall standard deviation (so one ``l2`` suits any model's feature scale).

    Args:
        diff: (B, H) chosen - rejected features of gold pairs. l2: ridge weight (on standardized features).

    Returns:
        (H,) weights for the unscaled features: score a pair by w . diff.

    Raises:
        ValueError: no pair, or non-finite features.
    """
    x = torch.as_tensor(np.asarray(diff), dtype=torch.float64)
    if x.ndim != 2 or x.shape[0] == 0 or not bool(torch.isfinite(x).all()):
        raise ValueError(f"fit_probe: expected finite (B, H) pair differences with B > 0, got {tuple(x.shape)}")
    s = float(x.std()) or 1.0
    xs = x / s
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe", tolerance_grad=1e-10)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(xs @ w)).mean() + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return (w.detach() / s).numpy()


def probe_transfer(train_diff: dict, test_diff: dict, l2: float = 1e-3) -> dict:
    """Probe accuracy (%) on held-out pairs for each feature set: {name: accuracy}, each probe fitted on that
    name's ``train_diff`` (gold source pairs) and scored on its ``test_diff`` (B, H) (e.g. an OOD target)."""
    return {k: pairwise_accuracy(test_diff[k] @ fit_probe(train_diff[k], l2)) for k in train_diff}


def _pair_replicates(v: np.ndarray, n: int, rng) -> np.ndarray:
    """(n,) bootstrap replicates of the mean of per-pair values (B,), resampling pairs."""
    return v[rng.integers(0, len(v), (n, len(v)))].mean(1)


def _replicates(per_seed: list, n: int, seed: int) -> np.ndarray:
    """(n,) replicates of the seed mean: pairs only with one seed; else seeds, then pairs within each."""
    arrays = [np.asarray(v, np.float64) for v in per_seed]
    rng = np.random.default_rng(seed)
    if len(arrays) == 1:
        return _pair_replicates(arrays[0], n, rng)
    s = len(arrays)
    stats = np.empty(n)
    for b in range(n):
        picks = rng.integers(0, s, s)
        stats[b] = np.mean([arrays[i][rng.integers(0, len(arrays[i]), len(arrays[i]))].mean() for i in picks])
    return stats


def bootstrap_pairs(values: np.ndarray, n: int = 2000, seed: int = 0, level: float = LEVEL) -> tuple:
    """Percentile interval of the mean of per-pair values (B,) (e.g. 100 x correct-indicator differences), resampling
    pairs (Efron 1979). Returns (mean, low, high)."""
    v = np.asarray(values, np.float64)
    lo, hi = np.quantile(_replicates([v], n, seed), [(1 - level) / 2, (1 + level) / 2])
    return float(v.mean()), float(lo), float(hi)


def bootstrap_seeds_pairs(per_seed: list, n: int = 2000, seed: int = 0, level: float = LEVEL) -> tuple:
    """Mean over seeds of the per-seed mean of per-pair values, with a two-stage percentile interval: resample the
    seeds, then the pairs within each resampled seed (Davison and Hinkley 1997, sec. 3.8), so the interval holds both
    the seed-to-seed (training) noise and the test-pair noise. One seed: :func:`bootstrap_pairs`.

    Args:
        per_seed: S arrays of per-pair values (lengths may differ).

    Returns:
        (mean, low, high).
    """
    e = seeds_pairs_effect(per_seed, n, seed, level)
    return e["value"], e["ci"][0], e["ci"][1]


def seeds_pairs_effect(per_seed: list, n: int = 2000, seed: int = 0, level: float = LEVEL, power: float = 0.8) -> dict:
    """:func:`bootstrap_seeds_pairs` with its spread: {"value", "ci": (low, high), "se": SD of the bootstrap
    replicates, "mde": (z_{(1+level)/2} + z_power) * se, the smallest true effect detected with ``power`` (Bloom
    1995, "Minimum detectable effects", Eval. Rev. 19(5)), normal quantiles}; same units as the values (pp)."""
    from scipy import stats as st

    arrays = [np.asarray(v, np.float64) for v in per_seed]
    reps = _replicates(arrays, n, seed)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    se = float(np.std(reps, ddof=1))
    return {
        "value": float(np.mean([a.mean() for a in arrays])),
        "ci": (float(lo), float(hi)),
        "se": se,
        "mde": float((st.norm.ppf(0.5 + level / 2) + st.norm.ppf(power)) * se),
    }


def correct(margins: np.ndarray) -> np.ndarray:
    """Per-pair correctness in percent (100, 50 for a tie, 0): averages to :func:`pairwise_accuracy`."""
    m = np.asarray(margins, np.float64)
    return 100.0 * ((m > 0) + 0.5 * (m == 0))


__all__ = [
    "ALPHAS",
    "bootstrap_pairs",
    "bootstrap_seeds_pairs",
    "correct",
    "fit_probe",
    "interpolation_curve",
    "interpolation_margins",
    "pairwise_accuracy",
    "probe_transfer",
    "seeds_pairs_effect",
]

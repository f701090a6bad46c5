"""The paper's mechanism tested by intervention: is a weak-to-strong student's OOD loss carried by its representation
(the features its head reads drifted away from the pretrained ones) or by its head? (Le et al. 2026, arXiv
2605.25629, explain OOD loss as representational drift; ANCHOR is built on that explanation.) Two interventions,
both on the states the reward head reads (the final normalized output at each sequence's last token, r = w . h):

* **Interpolation.** Hold the student's head w and move its features back toward the pretrained model's:
  h(a) = h_ref + a (h_student - h_ref). The reward is linear in h, so the pair margin is
  d(a) = (1 - a) w . (h_ref,c - h_ref,r) + a d_student, for a in [0, 1] (a = 1 is the student). The gain is
  accuracy at a = 0 minus at a = 1. The head at a = 0 reads features it was never fitted to, so it is used only when
  it beats chance in distribution, on source pairs the student never saw (:func:`head_check`, an exact binomial
  test); otherwise the head is refit: a linear probe fitted on the pretrained features of those pairs at a = 0, and
  the same fit on the student's features at a = 1, so that both ends have a head fitted to their features and the
  gain compares features alone (it is then minus the probe gain).
* **Probe transfer** (a linear probe, in the manner of Kumar et al. 2022, "Fine-tuning can distort pretrained
  features and underperform out-of-distribution"): a fresh Bradley-Terry head fitted on gold source pairs the
  student never saw, over frozen features (pretrained, or a student's), scored on the evaluation pairs. The gain is
  the student's features minus the pretrained ones; it is invariant to any rotation of the features.

Fine-tuning moves a gold-trained model's features too, so a student's gain alone does not point to weak
supervision: the reading is the W2S student minus the gold-trained ceiling on the same pairs (a difference in
differences, :func:`mechanism_rows`). The representational explanation predicts an interpolation gain above the
ceiling's and a probe gain below it, out of distribution.

Accuracy is the share of pairs with margin > 0; a tie (margin 0) counts as wrong, as in every accuracy of a run.
Intervals: the claims' seeds x pairs interval (:func:`w2s_shift.metrics.significance.seed_pair_interval`, a
generalized interval over seeds with the test-pair bootstrap's variance components), with the exact sign-flip test
where few pairs differ and Holm (1979) over a student's OOD targets. Negative controls (features only rotated; a
head-only failure) and a positive control (features that lost information): tests/test_intervention.py.
"""

from __future__ import annotations

import functools

import numpy as np

from .significance import EXACT_BELOW, exact_permutation_p, holm, seed_pair_interval
from .stats import bootstrap_weights

LEVEL = 0.95
#: layout of a student's ``mechanism/<label>.json`` (per-pair 0/1 outcomes, the head check, pair ids); the report
#: reads this one only
FILE_FORMAT = 2
ALPHAS = tuple(round(0.1 * k, 1) for k in range(11))  # a = 0, 0.1, ..., 1
#: one-sided level of the exact binomial test that the student's head on the pretrained features beats chance
CHANCE_ALPHA = 0.05
#: the mechanism's prediction per test, as the sign of the W2S-minus-ceiling difference out of distribution
PREDICTS = {"interpolation": +1, "probe": -1}
SUPPORTS, AGAINST, INCONCLUSIVE = "supports", "against", "inconclusive"
NO_INFORMATION, ONE_SEED, NO_CEILING = "no information", "not decided (1 seed)", "no ceiling"


def correct(margins: np.ndarray) -> np.ndarray:
    """Per-pair correctness (B,) as 0/1 integers: margin > 0 is correct; a tie (margin 0) is wrong."""
    return (np.asarray(margins, np.float64) > 0).astype(np.int8)


def pairwise_accuracy(margins: np.ndarray) -> float:
    """Percent of pairs (B,) with margin > 0 (a tie counts as wrong)."""
    return float(100.0 * correct(margins).mean())


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
    """Pairwise accuracy (%) of the student's own head on the interpolated features at each a of ``alphas``."""
    return [pairwise_accuracy(interpolation_margins(ref_diff, w, student_margin, a)) for a in alphas]


def fit_probe(diff: np.ndarray, l2: float = 1e-3, steps: int = 1000) -> np.ndarray:
    """A linear Bradley-Terry probe on frozen features: w minimizing mean_i -log sigmoid(w . x_i) + l2 ||w||^2 / 2
    over gold pairs (x_i = features of the chosen minus the rejected sequence, divided by their root mean square
    s = sqrt(mean x^2), so one ``l2`` suits any feature scale); L2-penalized logistic regression without intercept
    (Bradley & Terry 1952), minimized by scipy's L-BFGS-B. The objective and s are invariant to an orthogonal
    rotation of the features, so a rotated copy of them gets the rotated probe and the same pair margins.

    Args:
        diff: (B, H) chosen - rejected features of gold pairs. l2: ridge weight (on the scaled features).

    Returns:
        (H,) weights for the unscaled features: score a pair by w . diff.

    Raises:
        ValueError: no pair, or non-finite features.
    """
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    x = np.asarray(diff, np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or not np.isfinite(x).all():
        raise ValueError(f"fit_probe: expected finite (B, H) pair differences with B > 0, got {x.shape}")
    s = float(np.sqrt(np.mean(x * x))) or 1.0
    xs = x / s

    def loss(w):
        z = xs @ w
        return -log_expit(z).mean() + 0.5 * l2 * w @ w, -(xs.T @ expit(-z)) / len(z) + l2 * w

    opts = {"maxiter": steps, "gtol": 1e-12, "ftol": 1e-15}
    res = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B", options=opts)
    return res.x / s


def head_check(margins: np.ndarray, alpha: float = CHANCE_ALPHA) -> dict:
    """Does a head beat chance on in-distribution pairs? One-sided exact binomial test of P(margin > 0) > 1/2 over
    the pairs (scipy.stats.binomtest; a tie is not a win).

    Args:
        margins: (B,) the student's head on the pretrained features of source pairs it never saw.

    Returns:
        {"accuracy" (%), "pairs", "p" (one-sided), "passed": p < alpha}.

    Raises:
        ValueError: no pair.
    """
    from scipy.stats import binomtest

    c = correct(margins)
    if c.size == 0:
        raise ValueError("head_check: no pairs")
    p = float(binomtest(int(c.sum()), int(c.size), 0.5, alternative="greater").pvalue)
    return {"accuracy": float(100.0 * c.mean()), "pairs": int(c.size), "p": p, "passed": p < alpha}


def fit_heads(fit_ref: np.ndarray, fit_stu: np.ndarray, w: np.ndarray, l2: float = 1e-3) -> dict:
    """What a student's test needs from the source pairs it never saw: the probes on the pretrained and on its own
    features, and whether its head on the pretrained features beats chance there (:func:`head_check`).

    Args:
        fit_ref, fit_stu: (F, H) pretrained and student features (chosen - rejected) of those pairs, gold orientation.
        w: (H,) the student's head.

    Returns:
        {"probe_ref": (H,), "probe_stu": (H,), "check": :func:`head_check`, "head": "own" or "refit"}.
    """
    check = head_check(np.asarray(fit_ref, np.float64) @ np.asarray(w, np.float64))
    return {
        "probe_ref": fit_probe(fit_ref, l2),
        "probe_stu": fit_probe(fit_stu, l2),
        "check": check,
        "head": "own" if check["passed"] else "refit",
    }


def set_outcomes(heads: dict, w: np.ndarray, ref: np.ndarray, stu: np.ndarray) -> dict:
    """Per-pair correctness (0/1 lists, B each) of one student on one evaluation set: "student" (its head on its
    features, a = 1), "own_a0" (its head on the pretrained features), "probe_pretrained", "probe_student"; with
    "interpolation" (:func:`interpolation_curve`, %) and "probe" {"pretrained", "student"} accuracies (%).

    Args:
        heads: :func:`fit_heads`' result; w: (H,) the head; ref, stu: (B, H) pretrained and student features.
    """
    m_stu = np.asarray(stu, np.float64) @ np.asarray(w, np.float64)
    pr, ps = correct(ref @ heads["probe_ref"]), correct(stu @ heads["probe_stu"])
    return {
        "interpolation": interpolation_curve(ref, w, m_stu),
        "probe": {"pretrained": float(100.0 * pr.mean()), "student": float(100.0 * ps.mean())},
        "student": correct(m_stu).tolist(),
        "own_a0": correct(interpolation_margins(ref, w, m_stu, 0.0)).tolist(),
        "probe_pretrained": pr.tolist(),
        "probe_student": ps.tolist(),
    }


def gains(v: dict, head: str) -> dict:
    """Per-pair gains (B,) in pp of one :func:`set_outcomes` entry: "interpolation" (a = 0 minus a = 1: the own
    head's when ``head`` is "own", else the refit heads', probe on pretrained minus probe on student features) and
    "probe" (probe on the student's features minus on the pretrained ones)."""
    pr, ps = np.asarray(v["probe_pretrained"], np.float64), np.asarray(v["probe_student"], np.float64)
    if head == "own":
        interp = np.asarray(v["own_a0"], np.float64) - np.asarray(v["student"], np.float64)
    else:
        interp = pr - ps
    return {"interpolation": 100.0 * interp, "probe": 100.0 * (ps - pr)}


@functools.lru_cache(maxsize=4)
def _weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) resampling counts of :func:`~w2s_shift.metrics.stats.bootstrap_weights`, kept for the rows that
    resample the same pairs (read-only)."""
    w = np.concatenate(list(bootstrap_weights(n, n_boot, seed)))
    w.setflags(write=False)
    return w


def seeds_pairs_effect(per_seed: list, groups=None, n_boot: int = 2000, seed: int = 0, level: float = LEVEL) -> dict:
    """Seed mean of per-pair values with the claims' seeds x pairs interval: each seed's mean, its test-pair
    bootstrap replicates (multinomial resampling counts, :func:`~w2s_shift.metrics.stats.bootstrap_weights`; seeds of
    one group, the same test pairs, share their resampling), combined by
    :func:`~w2s_shift.metrics.significance.seed_pair_interval`. Where fewer than
    :data:`~w2s_shift.metrics.significance.EXACT_BELOW` pairs are non-zero, p is the exact test of their 2^D sign
    flips (:func:`~w2s_shift.metrics.significance.exact_permutation_p`: under no effect each non-zero pair's sign is
    equally likely either way).

    Args:
        per_seed: k arrays (n_s,) of per-pair values, pp (a gain, or a W2S-minus-ceiling difference of gains).
        groups: (k,) labels, equal for seeds on the same test pairs; None: all on the same pairs.

    Returns:
        :func:`~w2s_shift.metrics.significance.seed_pair_interval`'s dict (value, ci, p, se, mde (pp; NaN when nothing
        varies), n_seeds, seed_noise, variance components) with "nonzero" (pairs with a non-zero value, all seeds)
        and "test": "exact", "seeds x pairs" or "normal" (one seed).
    """
    arrays = [np.asarray(v, np.float64) for v in per_seed]
    g = list(groups) if groups is not None else [0] * len(arrays)
    reps = []
    for v, grp in zip(arrays, g):
        reps.append(_weights(v.size, n_boot, seed + 7919 * int(grp)) @ v / v.size)
    out = seed_pair_interval([v.mean() for v in arrays], np.stack(reps, axis=1), g, level)
    nz = [(k, x / (a.size * len(arrays))) for k, a in enumerate(arrays) for x in a[a != 0]]
    out.update(nonzero=len(nz), test="seeds x pairs" if out["seed_noise"] else "normal")
    if 0 < len(nz) < EXACT_BELOW:
        shares = np.array([x for _, x in nz])
        out["p"] = exact_permutation_p(lambda f: (1 - 2 * f) @ shares, out["value"], nz)
        out["test"] = "exact"
    return out


def reading(effect: dict | None, sign: int, p_adj: float | None = None, alpha: float = 1 - LEVEL) -> str:
    """A W2S-minus-ceiling difference read against the mechanism's predicted sign (+1 / -1), the first that
    applies: no ceiling (None); no information (no pair differs, or so few that the most extreme exact result,
    2 / 2^D, is not below ``alpha``); not decided (1 seed: no training noise measured, as for the claims); supports /
    against (p, Holm-adjusted where given, below ``alpha``, on the predicted / the other side); inconclusive."""
    if effect is None:
        return NO_CEILING
    d = effect["nonzero"]
    if d == 0 or (d < EXACT_BELOW and min(1.0, 2.0 ** (1 - d)) >= alpha):
        return NO_INFORMATION
    if effect["n_seeds"] < 2:
        return ONE_SEED
    p = effect["p"] if p_adj is None else p_adj
    if p >= alpha or effect["value"] == 0:
        return INCONCLUSIVE
    return SUPPORTS if np.sign(effect["value"]) == sign else AGAINST


def overall(interp: str, probe: str, refit: bool) -> str:
    """The mechanism's reading of a row: supports only when the probe supports (features that transfer worse than
    the ceiling's; rotation-invariant) and the interpolation does too or is the probe comparison (head refit);
    else "no support"."""
    return SUPPORTS if probe == SUPPORTS and (refit or interp == SUPPORTS) else "no support"


def mechanism_rows(per_seed: list, ceiling: str | None, ood: set, n_boot: int = 2000, seed: int = 0) -> list:
    """The mechanism's effects of one source, per (student, evaluation set), W2S students minus the ceiling.

    Args:
        per_seed: one dict per seed (cell) {label: mechanism file dict}, each {"head": "own" / "refit", "check":
            :func:`head_check`, "sets": {set: :func:`set_outcomes` + "ids": pair ids}} (pipeline/intervene.py).
        ceiling: the gold-trained ceiling's label, or None. ood: the OOD set names.

    Returns:
        Sorted by student (ceiling last), ID before OOD, then set: {"model", "set", "ood", "n_seeds", "refit"
        (seeds whose head was refit), "check_accuracy" (mean %), "acc_student", "acc_a0" (own head, a = 0),
        "probe_student", "probe_pretrained" (mean %), "gain": {"interpolation", "probe": :func:`seeds_pairs_effect`
        of the student alone}, "did": the same of W2S minus ceiling (None for the ceiling or without one),
        "reading": {"interpolation", "probe", "overall"} (OOD rows of W2S students; Holm over a student's OOD sets
        per test)}.

    Raises:
        ValueError: a W2S student and the ceiling scored on different pairs (ids) of one set in one seed.
    """
    data: dict = {}
    for k, files in enumerate(per_seed):
        for label, f in files.items():
            for name, v in f["sets"].items():
                data.setdefault((label, name), []).append((k, f, v))
    rows = []
    order = sorted(data, key=lambda key: (key[0] == ceiling, key[0], key[1] in ood, key[1]))
    for label, name in order:
        vs = data[(label, name)]
        ids = [tuple(v["ids"]) for _, _, v in vs]
        groups = [ids.index(i) for i in ids]
        g = [gains(v, f["head"]) for _, f, v in vs]
        row = {
            "model": label,
            "set": name,
            "ood": name in ood,
            "n_seeds": len(vs),
            "refit": sum(f["head"] != "own" for _, f, _ in vs),
            "check_accuracy": float(np.mean([f["check"]["accuracy"] for _, f, _ in vs])),
            "acc_student": float(np.mean([100.0 * np.mean(v["student"]) for _, _, v in vs])),
            "acc_a0": float(np.mean([100.0 * np.mean(v["own_a0"]) for _, _, v in vs])),
            "probe_student": float(np.mean([v["probe"]["student"] for _, _, v in vs])),
            "probe_pretrained": float(np.mean([v["probe"]["pretrained"] for _, _, v in vs])),
            "gain": {t: seeds_pairs_effect([x[t] for x in g], groups, n_boot, seed) for t in PREDICTS},
            "did": None,
            "reading": None,
        }
        if label != ceiling and ceiling is not None:
            row["did"] = _did(vs, g, data.get((ceiling, name), []), label, name, n_boot, seed)
            row["refit_ceiling"] = sum(f["head"] != "own" for _, f, _ in data.get((ceiling, name), []))
        rows.append(row)
    _read(rows, ceiling)
    return rows


def _did(vs: list, g: list, ceil: list, label: str, name: str, n_boot: int, seed: int) -> dict | None:
    """Per test, :func:`seeds_pairs_effect` of the student's gain minus the ceiling's, pair by pair, over the seeds
    that have both; None when none has."""
    by_seed = {k: (f, v) for k, f, v in ceil}
    diffs: dict = {t: [] for t in PREDICTS}
    ids = []
    for (k, _, v), gs in zip(vs, g):
        if k not in by_seed:
            continue
        fc, vc = by_seed[k]
        if list(vc["ids"]) != list(v["ids"]):
            raise ValueError(
                f"mechanism: {label} and the ceiling are scored on different pairs of {name} in seed index {k}: "
                "a difference in differences needs the same pairs; run the mechanism stages again"
            )
        gc = gains(vc, fc["head"])
        for t in PREDICTS:
            diffs[t].append(gs[t] - gc[t])
        ids.append(tuple(v["ids"]))
    if not ids:
        return None
    groups = [ids.index(i) for i in ids]
    return {t: seeds_pairs_effect(diffs[t], groups, n_boot, seed) for t in PREDICTS}


def _read(rows: list, ceiling: str | None) -> None:
    """Fill each W2S student's OOD rows' "reading", Holm-adjusting p over the student's OOD sets per test."""
    for label in dict.fromkeys(r["model"] for r in rows if r["model"] != ceiling):
        fam = [r for r in rows if r["model"] == label and r["ood"]]
        adj = {}
        for t in PREDICTS:
            have = [r for r in fam if r["did"] is not None]
            ps = holm([r["did"][t]["p"] for r in have])
            adj[t] = {id(r): p for r, p in zip(have, ps)}
        for r in fam:
            rd = {t: reading(r["did"] and r["did"][t], PREDICTS[t], adj[t].get(id(r))) for t in PREDICTS}
            refit = bool(r["refit"] or r.get("refit_ceiling"))
            rd["overall"] = overall(rd["interpolation"], rd["probe"], refit)
            r["reading"] = rd


__all__ = [
    "ALPHAS",
    "correct",
    "fit_heads",
    "fit_probe",
    "gains",
    "head_check",
    "interpolation_curve",
    "interpolation_margins",
    "mechanism_rows",
    "pairwise_accuracy",
    "reading",
    "seeds_pairs_effect",
    "set_outcomes",
]

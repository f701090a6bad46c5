"""Statistics of W2S reward models: pairwise accuracy, the W2S-under-shift metrics, paired bootstrap intervals,
calibration, agreement and the weak-to-strong gap check. Pure numpy, float64 inside (the "longer response wins"
baseline: :mod:`w2s_shift.metrics.length`; representation drift: :mod:`w2s_shift.metrics.drift`; method differences
over seeds and pairs, power, exact tests, Holm: :mod:`w2s_shift.metrics.significance`).

Conventions: a pair's reward margin is d = r(x, y_chosen) - r(x, y_rejected); the gold label always prefers
the chosen response, so a model is correct on a pair when d > 0 (ties count as wrong, as in
:func:`pairwise_accuracy`). Accuracies, their differences and the W2S metrics are in
percentage points (pp).

Sources: WRG, AOG, NTS from Le et al. 2026 (arXiv 2605.25629, Sec. "Evaluation"); PGR from Burns et al. 2023
("Weak-to-strong generalization", Eq. 1); percentile bootstrap from Efron & Tibshirani 1993 (Ch. 13); ECE from
Naeini et al. 2015 / Guo et al. 2017 (Eq. 3).
"""

from __future__ import annotations

import numpy as np

_CHUNK = 256  # bootstrap replicates drawn per block (bounds memory at _CHUNK x n floats)


def finite_vector(x, what: str) -> np.ndarray:
    """``x`` as a float64 vector (n,); ValueError naming ``what`` if it is not 1-D, is empty or has NaN/inf."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{what}: expected a non-empty 1-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what}: {int((~np.isfinite(a)).sum())} non-finite values")
    return a


def _check_boot(n_boot: int, level: float) -> None:
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def pairwise_accuracy(chosen, rejected) -> float:
    """Share of pairs with r(chosen) > r(rejected), in pp; ties count as wrong. Inputs: (B,) rewards each.

    Raises:
        ValueError: the two arrays differ in shape or are empty.
    """
    chosen, rejected = np.asarray(chosen), np.asarray(rejected)
    if chosen.shape != rejected.shape or chosen.size == 0:
        raise ValueError("pairwise_accuracy needs two non-empty arrays of the same shape")
    return float(100.0 * np.mean(chosen > rejected))


MAX_UNDEFINED = 0.05  # an interval whose statistic is undefined on more replicates than this is n/a


def undefined_share(replicates) -> float:
    """Share of bootstrap replicates (n_boot,) where the statistic is undefined (NaN, e.g. PGR on a resample where
    the ceiling does not beat the teacher), in [0, 1]."""
    r = np.asarray(replicates, dtype=np.float64)
    return float((~np.isfinite(r)).mean()) if r.size else 0.0


def percentile_interval(
    replicates: np.ndarray, level: float = 0.95, max_undefined: float = MAX_UNDEFINED
) -> tuple | None:
    """Percentile bootstrap interval (Efron & Tibshirani 1993, Sec. 13.3) of replicates (n_boot,).

    NaN replicates (an undefined statistic, e.g. PGR where the ceiling does not beat the teacher) are left out
    of the percentiles, which is only harmless when they are few: the interval is None (n/a) when more than
    ``max_undefined`` of the replicates are undefined (:func:`undefined_share`; the report shows the share).
    """
    r = np.asarray(replicates, dtype=np.float64)
    ok = r[np.isfinite(r)]
    if ok.size == 0 or undefined_share(r) > max_undefined:
        return None
    lo, hi = np.quantile(ok, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_weights(n: int, n_boot: int, seed: int):
    """Yield blocks of resampling counts (b, n) float64, b <= 256, n_boot rows in all: row k counts how often
    each of the n pairs is drawn in replicate k (multinomial(n, 1/n), the same law as drawing n indices with
    replacement). Using one block for several models makes their replicates paired."""
    rng = np.random.default_rng(seed)
    p = np.full(n, 1.0 / n)
    done = 0
    while done < n_boot:
        b = min(_CHUNK, n_boot - done)
        yield rng.multinomial(n, p, size=b).astype(np.float64)
        done += b


def paired_bootstrap_diff(correct_a, correct_b, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple:
    """Difference of two methods' pairwise accuracy on the SAME test pairs, with a paired percentile interval.

    Args:
        correct_a, correct_b: (n,) 0/1 correctness of methods a and b on the same n pairs, same order.
        n_boot: bootstrap replicates; pairs are resampled jointly (one draw of indices for both methods).
        seed: numpy Generator seed.
        level: coverage of the interval.

    Returns:
        (diff_pp, lo_pp, hi_pp): Acc_a - Acc_b in percentage points and its percentile interval.

    Raises:
        ValueError: empty, non-1-D, non-finite or differently sized inputs; n_boot < 1; level outside (0, 1).
    """
    a, b = finite_vector(correct_a, "correct_a"), finite_vector(correct_b, "correct_b")
    if a.shape != b.shape:
        raise ValueError(f"paired bootstrap needs the same pairs: correct_a has {a.size}, correct_b {b.size}")
    _check_boot(n_boot, level)
    d = a - b
    reps = np.concatenate([w @ d for w in bootstrap_weights(d.size, n_boot, seed)]) * (100.0 / d.size)
    lo, hi = percentile_interval(reps, level)
    return float(100.0 * d.mean()), lo, hi


def accuracy_interval(correct, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple:
    """Percentile bootstrap interval of one model's pairwise accuracy on one dataset, in pp: the same resampling
    (:func:`bootstrap_weights`) and percentiles as :func:`joint_bootstrap`, so ``score`` and the report agree (for a
    report's first dataset, with the same seed, the interval is identical).

    Args:
        correct: (n,) 0/1 correctness per pair. n_boot, seed, level: as :func:`paired_bootstrap_diff`.

    Returns:
        (lo, hi) in pp.

    Raises:
        ValueError: empty, non-1-D or non-finite input; n_boot < 1; level outside (0, 1).
    """
    _check_boot(n_boot, level)
    return percentile_interval(bootstrap_accuracies({"m": {"d": correct}}, n_boot, seed)["m"]["d"], level)


# ---- W2S-under-shift metrics and their joint bootstrap ---------------------------------------------------------


def shift_metrics(acc_student: dict, acc_teacher: dict, id_name: str, ood_names: list) -> dict:
    """WRG, AOG (per target and mean) and NTS of a student against the teacher (Le et al. 2026):

        WRG = Acc_s(ID) - Acc_t(ID)
        AOG_t = Acc_s(t) - Acc_t(t) for each OOD target t;  AOG = mean over targets
        NTS = AOG - max(0, Acc_t(ID) - Acc_s(ID))

    Args:
        acc_student, acc_teacher: {dataset: accuracy in pp}; values may be floats or equal-shape arrays
            (bootstrap replicates), the formulas apply elementwise.
        id_name: the ID test set; ood_names: the OOD targets (at least one).

    Returns:
        {"WRG", "AOG": {target: ...}, "AOG_mean", "NTS"} in pp (floats, or arrays for array input).
    """
    if not ood_names:
        raise ValueError("shift_metrics needs at least one OOD target")
    s, t = acc_student, acc_teacher
    wrg = s[id_name] - t[id_name]
    aog = {d: s[d] - t[d] for d in ood_names}
    aog_mean = sum(aog.values()) / len(aog)
    nts = aog_mean - np.maximum(0.0, t[id_name] - s[id_name])
    if np.ndim(nts) == 0:
        wrg, aog_mean, nts = float(wrg), float(aog_mean), float(nts)
        aog = {d: float(v) for d, v in aog.items()}
    return {"WRG": wrg, "AOG": aog, "AOG_mean": aog_mean, "NTS": nts}


def pgr(acc_student, acc_teacher, acc_ceiling):
    """Performance gap recovered (Burns et al. 2023, Eq. 1): (s - t) / (ceiling - t), a ratio (1 = ceiling).

    Undefined where the ceiling does not beat the teacher: None for scalars, NaN in arrays of replicates."""
    s, t, c = (np.asarray(v, dtype=np.float64) for v in (acc_student, acc_teacher, acc_ceiling))
    gap = c - t
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap > 0, (s - t) / np.where(gap > 0, gap, 1.0), np.nan)
    if out.ndim == 0:
        return None if np.isnan(out) else float(out)
    return out


def bootstrap_accuracies(correct: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """Bootstrap replicates of every model's pairwise accuracy, paired across models.

    Args:
        correct: {model: {dataset: (n_d,) 0/1 correctness}}; every model must cover the same datasets, and for
            one dataset every model's vector refers to the same n_d pairs in the same order.
        n_boot: replicates; seed: numpy seed. Datasets are resampled independently of each other (ID and each
            OOD target are separate samples), but within a dataset one set of resampling counts serves every
            model, so differences between models are paired.

    Returns:
        {model: {dataset: (n_boot,) accuracy replicates in pp}}.

    Raises:
        ValueError: models with different datasets, or different pair counts for the same dataset.
    """
    models = list(correct)
    if not models:
        raise ValueError("bootstrap_accuracies: no models")
    datasets = list(correct[models[0]])
    for m in models:
        if set(correct[m]) != set(datasets):
            raise ValueError(
                f"bootstrap_accuracies: model {m!r} has datasets {sorted(correct[m])}, "
                f"{models[0]!r} has {sorted(datasets)}"
            )
    out: dict = {m: {} for m in models}
    for k, d in enumerate(datasets):
        cols = [finite_vector(correct[m][d], f"correctness of {m} on {d}") for m in models]
        sizes = {c.size for c in cols}
        if len(sizes) != 1:
            raise ValueError(
                f"bootstrap_accuracies: dataset {d!r} has different pair counts across models "
                f"{dict(zip(models, (c.size for c in cols)))}"
            )
        mat = np.stack(cols, axis=1)  # (n_d, models)
        n = mat.shape[0]
        reps = np.concatenate([w @ mat for w in bootstrap_weights(n, n_boot, seed + 1000 * k)]) * (100.0 / n)
        for j, m in enumerate(models):
            out[m][d] = reps[:, j]
    return out


def _with_interval(value, replicates, level: float) -> dict:
    return {"value": value, "ci": percentile_interval(replicates, level) if value is not None else None}


def joint_bootstrap(
    correct: dict,
    id_name: str,
    ood_names: list,
    students: list,
    teacher: str = "teacher",
    ceiling: str | None = None,
    baseline: str | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """WRG / AOG / NTS / PGR of students against the teacher, and their differences against a baseline
    method, with joint percentile bootstrap intervals.

    One set of resampled pairs per dataset serves every model (:func:`bootstrap_accuracies`), so each replicate
    recomputes all accuracies on the same resampled pairs and then the metrics from them; intervals of a
    metric, and of the difference of a metric between two methods, are percentiles over those replicates.

    Args:
        correct: {model: {dataset: (n_d,) 0/1}} covering teacher, students, ceiling and baseline (other
            models get accuracies only), each on id_name and every OOD target.
        id_name, ood_names: ID test set and OOD targets (at least one).
        students: labels of the W2S students to score; teacher: the weak teacher's label.
        ceiling: the strong ceiling's label (adds PGR per dataset), or None.
        baseline: a method to difference against (e.g. naive), or None.

    Returns:
        {"accuracy": {model: {dataset: {"value": pp, "ci": (lo, hi)}}} for every model in ``correct``,
         "accuracy_ood_mean": {model: {"value", "ci"}} (mean accuracy over the OOD targets),
         "metrics": {student: {"WRG": {"value", "ci"}, "AOG": {t: {...}}, "AOG_mean": {...}, "NTS": {...},
                               "PGR": {dataset: {"value": ratio or None, "ci": (lo, hi) or None}},
                               "PGR_undefined_share": {dataset: share of replicates where PGR is undefined,
                               in [0, 1]; the PGR interval is None above MAX_UNDEFINED}}},
         "differences": {student: {"accuracy": {dataset: {...}}, "WRG", "AOG": {t: ...}, "AOG_mean", "NTS"}}}
        (differences are student minus baseline, in pp; the baseline itself is left out).
    """
    _check_boot(n_boot, level)
    needed = [teacher, *students, *([ceiling] if ceiling else []), *([baseline] if baseline else [])]
    missing = [m for m in dict.fromkeys(needed) if m not in correct]
    if missing:
        raise ValueError(f"joint_bootstrap: no correctness vectors for {missing}")
    datasets = [id_name, *ood_names]
    for m, per in correct.items():
        lacking = [d for d in datasets if d not in per]
        if lacking:
            raise ValueError(f"joint_bootstrap: model {m!r} has no correctness vector for {lacking}")
    sub = {m: {d: correct[m][d] for d in datasets} for m in correct}
    reps = bootstrap_accuracies(sub, n_boot, seed)
    point = {m: {d: float(100.0 * np.mean(np.asarray(sub[m][d], dtype=np.float64))) for d in datasets} for m in sub}

    out = {
        "accuracy": {m: {d: _with_interval(point[m][d], reps[m][d], level) for d in datasets} for m in sub},
        "accuracy_ood_mean": {
            m: _with_interval(
                sum(point[m][d] for d in ood_names) / len(ood_names),
                sum(reps[m][d] for d in ood_names) / len(ood_names),
                level,
            )
            for m in sub
        },
        "metrics": {},
        "differences": {},
    }
    shift_pt = {m: shift_metrics(point[m], point[teacher], id_name, ood_names) for m in sub}
    shift_rep = {m: shift_metrics(reps[m], reps[teacher], id_name, ood_names) for m in sub}
    for s in students:
        p, r = shift_pt[s], shift_rep[s]
        res = {
            "WRG": _with_interval(p["WRG"], r["WRG"], level),
            "AOG": {d: _with_interval(p["AOG"][d], r["AOG"][d], level) for d in ood_names},
            "AOG_mean": _with_interval(p["AOG_mean"], r["AOG_mean"], level),
            "NTS": _with_interval(p["NTS"], r["NTS"], level),
        }
        if ceiling:
            pgr_reps = {d: pgr(reps[s][d], reps[teacher][d], reps[ceiling][d]) for d in datasets}
            res["PGR"] = {
                d: _with_interval(pgr(point[s][d], point[teacher][d], point[ceiling][d]), pgr_reps[d], level)
                for d in datasets
            }
            res["PGR_undefined_share"] = {d: undefined_share(pgr_reps[d]) for d in datasets}
        out["metrics"][s] = res
        if baseline and s != baseline:
            pb, rb = shift_pt[baseline], shift_rep[baseline]
            out["differences"][s] = {
                "accuracy": {
                    d: _with_interval(point[s][d] - point[baseline][d], reps[s][d] - reps[baseline][d], level)
                    for d in datasets
                },
                "WRG": _with_interval(p["WRG"] - pb["WRG"], r["WRG"] - rb["WRG"], level),
                "AOG": {
                    d: _with_interval(p["AOG"][d] - pb["AOG"][d], r["AOG"][d] - rb["AOG"][d], level) for d in ood_names
                },
                "AOG_mean": _with_interval(p["AOG_mean"] - pb["AOG_mean"], r["AOG_mean"] - rb["AOG_mean"], level),
                "NTS": _with_interval(p["NTS"] - pb["NTS"], r["NTS"] - rb["NTS"], level),
            }
    return out


# ---- calibration and agreement ---------------------------------------------------------------------------


def sigmoid(x) -> np.ndarray:
    """Logistic function, float64, without overflow: 0.5 * (1 + tanh(x / 2))."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def expected_calibration_error(prob_chosen, n_bins: int = 10) -> tuple:
    """Expected calibration error of Bradley-Terry preference probabilities against gold.

    Convention (the usual top-label ECE of Guo et al. 2017, Eq. 3, for a two-way choice): each pair is folded
    to the side the model predicts, confidence = max(p, 1 - p) and correct = p > 0.5 (gold always prefers the
    chosen response; p = 0.5 is a tie and counts as wrong, as in pairwise accuracy). Confidences fall in
    n_bins equal-width bins over [0.5, 1] (each bin [lo, hi) except the last, which includes 1; a value
    within 1e-9 below an edge counts as on it);
    ECE = sum_b n_b / n * |acc_b - conf_b|.

    Args:
        prob_chosen: (n,) p = sigmoid(reward margin), the model's probability that chosen is preferred.
        n_bins: number of bins (>= 1).

    Returns:
        (ece_pp, rows): ECE in pp, and one reliability row per bin {"lo", "hi" (bin edges, probabilities),
        "count" (pairs), "confidence", "accuracy" (means over the bin in pp, None for an empty bin)}.

    Raises:
        ValueError: empty or non-1-D input, values outside [0, 1], n_bins < 1.
    """
    p = finite_vector(prob_chosen, "prob_chosen")
    if p.min() < 0.0 or p.max() > 1.0:
        raise ValueError(f"prob_chosen must lie in [0, 1], got range [{p.min()}, {p.max()}]")
    if int(n_bins) < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    conf = np.maximum(p, 1.0 - p)
    correct = (p > 0.5).astype(np.float64)
    edges = np.linspace(0.5, 1.0, n_bins + 1)
    # a confidence on an edge goes to the upper bin; the 1e-9 absorbs rounding (1 - 0.3 is not exactly 0.7)
    idx = np.minimum(np.floor((conf - 0.5) * 2 * n_bins + 1e-9).astype(int), n_bins - 1)
    ece, rows = 0.0, []
    for b in range(n_bins):
        m = idx == b
        k = int(m.sum())
        row = {"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": k, "confidence": None, "accuracy": None}
        if k:
            cb, ab = float(conf[m].mean()), float(correct[m].mean())
            ece += k / p.size * abs(ab - cb)
            row["confidence"], row["accuracy"] = 100.0 * cb, 100.0 * ab
        rows.append(row)
    return 100.0 * ece, rows


def agreement_rate(margin_a, margin_b) -> float:
    """Share of pairs on which two reward models prefer the same response, in pp.

    A model prefers the chosen response when its margin r(chosen) - r(rejected) > 0 and the rejected one
    otherwise: a tie (margin 0) counts as preferring rejected, the rule that counts ties as wrong in pairwise
    accuracy, so agreement bounds the accuracy gap (|Acc_a - Acc_b| <= 100 - agreement).

    Args:
        margin_a, margin_b: (n,) reward margins of the two models on the same pairs.
    """
    a, b = finite_vector(margin_a, "margin_a"), finite_vector(margin_b, "margin_b")
    if a.shape != b.shape:
        raise ValueError(f"agreement_rate needs the same pairs: {a.size} vs {b.size} margins")
    return float(100.0 * np.mean((a > 0) == (b > 0)))


# ---- weak-to-strong gap check -------------------------------------------------------------------------------

MIN_GAP_PP = 5.0  # the strong ceiling must beat the weak teacher on the ID test split by >= 5 pp


def paired_accuracy_diff(correct_a, correct_b, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple:
    """The one entry point the gap check uses for a paired bootstrap of an accuracy difference (so that a change of
    the project's bootstrap helper touches one line): (Acc_a - Acc_b in pp, lo, hi), see
    :func:`paired_bootstrap_diff`."""
    return paired_bootstrap_diff(correct_a, correct_b, n_boot=n_boot, seed=seed, level=level)


def gap_check(
    correct_ceiling,
    correct_teacher,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    min_gap_pp: float = MIN_GAP_PP,
) -> dict:
    """Is there a weak-to-strong setting at all? The strong ceiling's ID test accuracy minus the weak teacher's,
    with a paired percentile bootstrap interval over test pairs (both models resampled on the same pairs).

    Without such a gap PGR = (s - t) / (ceiling - t) (Burns et al. 2023, Eq. 1) divides by noise, and WRG / AOG /
    NTS (Le et al. 2026) compare a student with a teacher that the strong model cannot beat even on gold labels.

    Args:
        correct_ceiling, correct_teacher: (n,) 0/1 correctness of the ceiling and the teacher on the same n ID
            test pairs, same order (a model is right when r(chosen) > r(rejected); ties are wrong).
        n_boot, seed, level: bootstrap replicates, numpy seed, coverage.
        min_gap_pp: the smallest gap in pp that counts (5).

    Returns:
        {"gap_pp": Acc_ceiling - Acc_teacher in pp, "ci": [lo, hi] in pp, "n": pairs, "level": coverage,
         "min_gap_pp": threshold, "passed": gap_pp >= min_gap_pp and lo > 0}.

    Raises:
        ValueError: as :func:`paired_bootstrap_diff` (different pair counts, empty or non-finite input).
    """
    gap, lo, hi = paired_accuracy_diff(correct_ceiling, correct_teacher, n_boot=n_boot, seed=seed, level=level)
    return {
        "gap_pp": gap,
        "ci": [lo, hi],
        "n": int(np.asarray(correct_ceiling).size),
        "level": float(level),
        "min_gap_pp": float(min_gap_pp),
        "passed": bool(gap >= min_gap_pp and lo > 0.0),
    }


__all__ = [
    "accuracy_interval",
    "agreement_rate",
    "bootstrap_accuracies",
    "bootstrap_weights",
    "expected_calibration_error",
    "finite_vector",
    "gap_check",
    "paired_accuracy_diff",
    "joint_bootstrap",
    "paired_bootstrap_diff",
    "percentile_interval",
    "pairwise_accuracy",
    "pgr",
    "shift_metrics",
    "sigmoid",
    "undefined_share",
]

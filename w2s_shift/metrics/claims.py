"""The paper's four claims, decided on a grid with paired intervals pooled over seeds (Le et al. 2026, arXiv
2605.25629; the shape to reproduce is in docs/protocol.md):

  (a) Naive and Confidence W2S gain in distribution but lose out of distribution: WRG > 0 and AOG < 0;
  (b) ANCHOR has the highest NTS: NTS(anchor) - NTS(m) > 0 for Naive, Confidence and SEAM;
  (c) a moderate lambda is best: an interior lambda of a sweep beats both its smallest and its largest;
  (d) anchoring the last layer is at least as good as a middle layer: NTS(last) - NTS(middle) at the same lambda.

Every quantity is a mean over the seeds (grid cells of one source) in which the compared models were all
trained, with a percentile bootstrap interval over test pairs (Efron & Tibshirani 1993, Ch. 13): each replicate
resamples every dataset's pairs once and recomputes all accuracies, then the metrics (WRG, AOG, NTS as in
:func:`~w2s_shift.metrics.stats.shift_metrics`), then their seed mean. Seeds that share their test pairs (the
same pair ids) share their resampling, so the interval stays paired across seeds; seeds with their own splits
are resampled independently. The interval covers test-pair sampling only, not the training noise between
seeds: the per-seed values are listed beside it.

A verdict is "reproduced" when every interval the claim needs excludes 0 in the claimed direction, "not
reproduced" when one excludes 0 against it, and "inconclusive" otherwise (also when the grid lacks what the
claim compares: then "not tested").
"""

from __future__ import annotations

import numpy as np

from .stats import bootstrap_accuracies, percentile_interval, shift_metrics

LEVEL = 0.95
#: the paper's methods by their registered names; the claims are about these methods and no others
PAPER_ROLES = {"naive": "naive", "confidence": "confidence", "seam": "seam", "anchor": "anchor"}
#: claim (a) is about these baselines; claim (b) compares ANCHOR with these
GAIN_ID_LOSE_OOD = ("naive", "confidence")
NTS_RIVALS = ("naive", "confidence", "seam")
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTED = "reproduced", "not reproduced", "inconclusive", "not tested"


def pooled_metric(
    cells: list,
    a: str,
    b: str | None = None,
    metric: str = "NTS",
    teacher: str = "teacher",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = LEVEL,
) -> dict | None:
    """Seed mean of ``metric``(a) - ``metric``(b) (or of ``metric``(a) alone), with a percentile bootstrap interval.

    Args:
        cells: one dict per seed: {"id": ID set name, "ood": [OOD targets], "ids": {dataset: pair ids},
            "correct": {model: {dataset: (n_d,) 0/1 correctness}}} (the teacher among the models).
        a, b: model labels; b None gives metric(a) itself (WRG, AOG and NTS are already against the teacher).
        metric: "WRG", "AOG_mean" or "NTS" (pp).
        n_boot, seed, level: bootstrap replicates, numpy seed, coverage.

    Returns:
        {"value": pp, "ci": (lo, hi), "per_seed": [pp per used cell], "n_seeds": k} over the cells holding a (and
        b), or None when no cell holds them.

    Raises:
        ValueError: an unknown metric; correctness vectors of different lengths within a dataset.
    """
    if metric not in ("WRG", "AOG_mean", "NTS"):
        raise ValueError(f"pooled_metric: metric must be WRG, AOG_mean or NTS, got {metric!r}")
    models = [teacher, a] + ([b] if b else [])
    used = [c for c in cells if all(m in c["correct"] for m in models)]
    if not used:
        return None
    points, reps, first_ids = [], [], None
    for k, c in enumerate(used):
        datasets = [c["id"], *c["ood"]]
        ids = tuple(tuple(c["ids"][d]) for d in datasets)
        first_ids = ids if first_ids is None else first_ids
        cell_seed = seed if ids == first_ids else seed + 7919 * k  # the same pairs: the same resampling
        sub = {m: {d: c["correct"][m][d] for d in datasets} for m in dict.fromkeys(models)}
        rep = bootstrap_accuracies(sub, n_boot, cell_seed)
        pt = {m: {d: 100.0 * float(np.mean(np.asarray(sub[m][d], dtype=np.float64))) for d in datasets} for m in sub}

        def value(acc, m, c=c):
            return shift_metrics(acc[m], acc[teacher], c["id"], c["ood"])[metric]

        points.append(value(pt, a) - (value(pt, b) if b else 0.0))
        reps.append(value(rep, a) - (value(rep, b) if b else 0.0))
    mean_reps = np.mean(np.stack(reps), axis=0)
    return {
        "value": float(np.mean(points)),
        "ci": percentile_interval(mean_reps, level),
        "per_seed": [float(p) for p in points],
        "n_seeds": len(used),
    }


def direction(stat: dict | None) -> int:
    """+1 when the interval lies above 0, -1 below, 0 when it holds 0 (or is missing)."""
    ci = (stat or {}).get("ci")
    if not ci:
        return 0
    return 1 if ci[0] > 0 else (-1 if ci[1] < 0 else 0)


def _verdict(dirs: list, want: list) -> str:
    """Every direction as wanted: reproduced; any against: not reproduced; else inconclusive."""
    if not dirs:
        return NOT_TESTED
    if any(d == -w for d, w in zip(dirs, want)):
        return NOT_REPRODUCED
    if all(d == w for d, w in zip(dirs, want)):
        return REPRODUCED
    return INCONCLUSIVE


def _roles(methods: list) -> dict:
    """{role: [method entries]} of a grid's methods (dicts from metrics.json's cells[].methods) by paper role."""
    out: dict = {}
    for m in methods:
        role = PAPER_ROLES.get(m.get("name"))
        if role:
            out.setdefault(role, []).append(m)
    return out


def _fixed_lambda(m: dict):
    return m.get("anchor_lambda") if m.get("anchor_lambda_mode", "fixed") != "auto" else None


def primary_anchor(anchors: list) -> dict | None:
    """The ANCHOR student a claim is decided on, fixed before looking at results: the first ANCHOR entry of the
    grid at the last layer with a fixed lambda (the paper's recommended setting), else the first ANCHOR entry."""
    last = [m for m in anchors if m.get("layer_spec") == "last" and _fixed_lambda(m) is not None]
    return (last or anchors or [None])[0]


def nts_claim(claim: str, text: str, pairs: list, stat) -> dict:
    """A claim that the first method of each (a, b) pair has the higher NTS: one row per pair that some seed holds;
    reproduced when every difference's interval lies above 0 (the rule of :func:`_verdict`)."""
    rows = []
    for a, b in pairs:
        s = stat(a["label"], b["label"])
        if s:
            rows.append({"what": f"NTS {a['label']} - {b['label']}", "stat": s})
    dirs = [direction(r["stat"]) for r in rows]
    return {"claim": claim, "text": text, "rows": rows, "verdict": _verdict(dirs, [1] * len(dirs))}


def four_claims(cells: list, methods: list, n_boot: int = 2000, seed: int = 0) -> list:
    """The four claims of one source's grid, each with its comparisons and a verdict.

    Args:
        cells: as :func:`pooled_metric`, one per seed.
        methods: the grid's method entries (metrics.json ``cells[].methods``: name, label, anchor_lambda,
            anchor_lambda_mode, layer_spec), in grid order.

    Returns:
        [{"claim": "a".."d", "text": the claim, "rows": [{"what": comparison, "stat": pooled_metric(...)}],
          "verdict": one of reproduced / not reproduced / inconclusive / not tested}].
    """
    roles = _roles(methods)
    stat = lambda a, b=None, metric="NTS": pooled_metric(cells, a, b, metric, n_boot=n_boot, seed=seed)  # noqa: E731
    out = []

    rows, dirs, want = [], [], []
    for role in GAIN_ID_LOSE_OOD:
        for m in roles.get(role, []):
            for metric, sign in (("WRG", 1), ("AOG_mean", -1)):
                s = stat(m["label"], None, metric)
                if s:
                    rows.append({"what": f"{metric} of {m['label']}", "stat": s})
                    dirs.append(direction(s))
                    want.append(sign)
    out.append(
        {
            "claim": "a",
            "text": "Naive and Confidence W2S gain ID but lose OOD (WRG > 0, AOG mean < 0)",
            "rows": rows,
            "verdict": _verdict(dirs, want),
        }
    )

    anchor = primary_anchor(roles.get("anchor", []))
    rivals = [m for role in NTS_RIVALS for m in roles.get(role, [])] if anchor else []
    out.append(
        nts_claim("b", "ANCHOR has the highest NTS (vs Naive, Confidence, SEAM)", [(anchor, m) for m in rivals], stat)
    )

    rows, groups = [], []
    by_layers: dict = {}
    for m in roles.get("anchor", []):
        if _fixed_lambda(m) is not None:
            by_layers.setdefault(m.get("layer_spec"), {}).setdefault(float(_fixed_lambda(m)), m)
    for spec, lams in by_layers.items():
        if len(lams) < 3:
            continue
        order = sorted(lams)
        lo_m, hi_m = lams[order[0]], lams[order[-1]]
        interior = []
        for lam in order[1:-1]:
            m = lams[lam]
            pair = [stat(m["label"], lo_m["label"]), stat(m["label"], hi_m["label"])]
            rows += [
                {"what": f"NTS {m['label']} - {e['label']} (layers {spec})", "stat": s}
                for e, s in zip((lo_m, hi_m), pair)
                if s
            ]
            interior.append([direction(s) for s in pair if s])
        groups.append(interior)
    if not groups:
        verdict_c = NOT_TESTED
    elif any(any(all(d == 1 for d in ds) and ds for ds in g) for g in groups):
        verdict_c = REPRODUCED  # an interior lambda beats both ends
    elif all(all(any(d == -1 for d in ds) for ds in g) for g in groups):
        verdict_c = NOT_REPRODUCED  # every interior lambda is beaten by an end
    else:
        verdict_c = INCONCLUSIVE
    out.append(
        {
            "claim": "c",
            "text": "A moderate lambda is best (an interior lambda beats the smallest and the largest)",
            "rows": rows,
            "verdict": verdict_c,
        }
    )

    anchors = roles.get("anchor", [])
    last_anchors = [m for m in anchors if m.get("layer_spec") == "last"]
    same_lambda = [
        (last, mid)
        for last in last_anchors
        for mid in anchors
        if mid.get("layer_spec") != "last"
        and (_fixed_lambda(mid), mid.get("anchor_lambda_mode")) == (_fixed_lambda(last), last.get("anchor_lambda_mode"))
    ]
    out.append(nts_claim("d", "Last-layer ANCHOR is at least as good as middle-layer (same lambda)", same_lambda, stat))
    return out


#: The metrics of the "ANCHOR vs its competitors" comparison, each ANCHOR's minus the competitor's.
COMPETITOR_METRICS = ("NTS", "AOG_mean", "WRG")


def anchor_vs(cells: list, methods: list, competitors: list, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """ANCHOR against each competitor (method entries of the grid, e.g. L2-SP, WiSE-FT, GRM): for every metric of
    :data:`COMPETITOR_METRICS`, metric(ANCHOR) - metric(competitor) pooled over the seeds holding both, with its paired
    bootstrap interval (:func:`pooled_metric`). ANCHOR is the entry claims (b)-(d) use (:func:`primary_anchor`).

    Returns:
        {"anchor": its entry, "rows": [{"competitor": entry, "stats": {metric: pooled_metric(...) or None}}]}, or None
        when the grid has no ANCHOR entry."""
    anchor = primary_anchor(_roles(methods).get("anchor", []))
    if anchor is None:
        return None
    rows = []
    for m in competitors:
        stats = {
            k: pooled_metric(cells, anchor["label"], m["label"], k, n_boot=n_boot, seed=seed)
            for k in COMPETITOR_METRICS
        }
        if any(stats.values()):
            rows.append({"competitor": m, "stats": stats})
    return {"anchor": anchor, "rows": rows}

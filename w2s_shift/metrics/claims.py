"""The paper's claims as the paper states them, decided on a grid (Le et al. 2026, arXiv 2605.25629; the rules are
docs/protocol.md, "How each claim is decided"):

  (a) ID success hides OOD failure: for Naive and Confidence W2S, WRG - AOG > 0 (the ID gain exceeds the OOD
      gain), on the mean over OOD targets (primary) and per target;
  (s) SEAM loses ID and keeps OOD: WRG(SEAM) - WRG(Naive) < 0 with AOG(SEAM) - AOG(Naive) > -m (non-inferiority at
      margin m; an OOD gain is not what is tested);
  (b) ANCHOR has the highest NTS: NTS(ANCHOR) - NTS(X) > 0 for X = Naive, Confidence, SEAM, with ANCHOR the grid's
      first last-layer entry at a fixed lambda > 0 (never lambda = 0: that is Naive);
  (c) a moderate lambda beats both ends: within one layer group declared from the grid (the primary ANCHOR's),
      the declared middle lambda minus the smallest and minus the largest lambda > 0 of the sweep;
  (d) last layer at least as good as the middle: NTS(last) - NTS(middle) > -m at the same lambda, "middle" being
      the paper's 50% + 75% blocks together (layer spec ``middle``), never single custom blocks.

Every comparison is a seed mean of a per-seed difference (pp), with an interval that covers training noise
between seeds and test-pair noise (:func:`~w2s_shift.metrics.significance.seed_pair_interval`), its minimum detectable
effect at 80% power, and, where fewer than 20 test pairs disagree between the two models, an exact permutation
test (:func:`~w2s_shift.metrics.significance.exact_permutation_p`, McNemar's exact test for one accuracy difference).
Each claim is one declared family of comparisons, Holm-corrected (:func:`~w2s_shift.metrics.significance.holm`);
each row's status is :func:`row_status`'s, the claim's verdict :func:`decide`'s (the precedence of both:
docs/protocol.md, "How the code decides").
"""

from __future__ import annotations

import numpy as np

from .significance import EXACT_BELOW, exact_permutation_p, holm, mde_of, noninferiority_p, seed_pair_interval
from .stats import bootstrap_accuracies, percentile_interval, shift_metrics

LEVEL = 0.95
ALPHA = 1 - LEVEL
#: the margin m (pp): the paper's ANCHOR effect, AOG on Anthropic Helpful 0.60 -> 4.41 (Le et al. 2026)
MARGIN_PP = 3.8
#: the paper's methods by their registered names; the claims are about these methods and no others
PAPER_ROLES = {"naive": "naive", "confidence": "confidence", "seam": "seam", "anchor": "anchor"}
#: claim (a) is about these baselines; claim (b) compares ANCHOR with these
GAIN_ID_LOSE_OOD = ("naive", "confidence")
NTS_RIVALS = ("naive", "confidence", "seam")
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTED = "reproduced", "not reproduced", "inconclusive", "not tested"
RULED_OUT, NO_INFORMATION, WITHHELD = "ruled out", "no information", "withheld"
#: a row or verdict from one seed: training noise unmeasured, so no statement about methods
NOT_DECIDED_1SEED = "not decided (1 seed)"
#: row statuses
FOR, AGAINST, UNDECIDED = "for", "against", "undecided"
#: a row's wanted direction: +1 / -1 (superiority), or non-inferiority at -m
NONINFERIOR = "non-inferior"
METRICS = ("WRG", "AOG_mean", "NTS", "WRG-AOG_mean")


def _metric_fn(metric: str, id_name: str, ood: list):
    """(metric function of (acc_x, acc_teacher) -> pp, the datasets it reads) for a metric name: WRG, AOG_mean,
    NTS, AOG:<target>, WRG-AOG_mean (ID gain minus mean OOD gain) or WRG-AOG:<target>."""
    if metric in ("WRG", "AOG_mean", "NTS"):
        used = {"WRG": [id_name], "AOG_mean": list(ood), "NTS": [id_name, *ood]}[metric]
        return (lambda x, t: shift_metrics(x, t, id_name, ood)[metric]), used
    if metric == "WRG-AOG_mean":
        return (lambda x, t: (x[id_name] - t[id_name]) - sum(x[d] - t[d] for d in ood) / len(ood)), [id_name, *ood]
    for prefix, with_id in (("AOG:", False), ("WRG-AOG:", True)):
        if metric.startswith(prefix) and metric[len(prefix) :] in ood:
            d = metric[len(prefix) :]
            if with_id:
                return (lambda x, t, d=d: (x[id_name] - t[id_name]) - (x[d] - t[d])), [id_name, d]
            return (lambda x, t, d=d: x[d] - t[d]), [d]
    raise ValueError(
        f"pooled_metric: metric must be one of {', '.join(METRICS)}, AOG:<target> or WRG-AOG:<target> (a target of "
        f"the cell), got {metric!r}"
    )


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
    """Seed mean of ``metric``(a) - ``metric``(b) (or of ``metric``(a) alone, i.e. against the teacher), with an
    interval over seeds and test pairs, its p-value and minimum detectable effect.

    Each seed's test-pair bootstrap resamples every dataset's pairs once and recomputes all accuracies, then the
    metric (WRG, AOG, NTS as in :func:`~w2s_shift.metrics.stats.shift_metrics`); seeds with the same pair ids
    share their resampling. :func:`~w2s_shift.metrics.significance.seed_pair_interval` combines the per-seed values
    and these replicates. When fewer than :data:`~w2s_shift.metrics.significance.EXACT_BELOW` pairs (over seeds and
    the datasets the metric reads) disagree between the two models, p is exact
    (:func:`~w2s_shift.metrics.significance.exact_permutation_p`).

    Args:
        cells: one dict per seed: {"id": ID set name, "ood": [OOD targets], "ids": {dataset: pair ids},
            "correct": {model: {dataset: (n_d,) 0/1 correctness}}} (the teacher among the models).
        a, b: model labels; b None gives metric(a) itself (WRG, AOG and NTS are already against the teacher).
        metric: "WRG", "AOG_mean", "NTS", "WRG-AOG_mean", "AOG:<target>" or "WRG-AOG:<target>" (pp).
        n_boot, seed, level: bootstrap replicates, numpy seed, coverage.

    Returns:
        None when no cell holds a (and b), else {"value": pp, "ci": (lo, hi) seeds and pairs, "ci_pairs": (lo, hi)
        the percentile interval over test pairs only, "se", "p", "mde" (pp, 80% power, one comparison), "seed_sd",
        "seed_noise" (False with one seed), "per_seed": [pp per used cell], "n_seeds": k, "discordant": pairs on
        which the two models disagree (summed over seeds and the metric's datasets), "test": "exact" / "seeds x
        pairs" / "normal", and the variance components of :func:`~w2s_shift.metrics.significance.seed_pair_interval`}.

    Raises:
        ValueError: an unknown metric; correctness vectors of different lengths within a dataset.
    """
    models = [teacher, a] + ([b] if b else [])
    used = [c for c in cells if all(m in c["correct"] for m in models)]
    if not used:
        _metric_fn(metric, "id", [])  # still refuse an unknown metric name
        return None
    points, reps, groups, seen = [], [], [], []
    flips = []  # (seed index, dataset, change of acc_a in pp when the pair's winner is exchanged)
    for k, c in enumerate(used):
        datasets = [c["id"], *c["ood"]]
        fn, reads = _metric_fn(metric, c["id"], c["ood"])
        ids = tuple(tuple(c["ids"][d]) for d in datasets)
        if ids not in seen:
            seen.append(ids)
        groups.append(seen.index(ids))
        sub = {m: {d: c["correct"][m][d] for d in datasets} for m in dict.fromkeys(models)}
        rep = bootstrap_accuracies(sub, n_boot, seed + 7919 * groups[-1])  # the same pairs: the same resampling
        pt = {m: {d: 100.0 * float(np.mean(np.asarray(sub[m][d], dtype=np.float64))) for d in datasets} for m in sub}
        other = b or teacher
        points.append(fn(pt[a], pt[teacher]) - (fn(pt[b], pt[teacher]) if b else 0.0))
        reps.append(fn(rep[a], rep[teacher]) - (fn(rep[b], rep[teacher]) if b else 0.0))
        for d in reads:
            x = np.asarray(sub[a][d], dtype=np.float64)
            y = np.asarray(sub[other][d], dtype=np.float64)
            flips += [(k, d, (y[i] - x[i]) * 100.0 / x.size) for i in np.flatnonzero(x != y)]
    rep_mat = np.stack(reps, axis=1)
    out = seed_pair_interval(points, rep_mat, groups, level)
    out.update(
        ci_pairs=percentile_interval(rep_mat.mean(axis=1), level),
        per_seed=[float(p) for p in points],
        n_seeds=len(used),
        discordant=len(flips),
        test="seeds x pairs" if out["seed_noise"] else "normal",
    )
    if len(flips) < EXACT_BELOW:
        out["p"] = exact_permutation_p(_flip_stat(used, a, b, teacher, metric, flips), out["value"], flips)
        out["test"] = "exact"
    return out


def _flip_stat(used: list, a: str, b: str | None, teacher: str, metric: str, flips: list):
    """The seed mean of the difference when the disagreeing pairs marked 1 in a (F, D) flip matrix change winner
    (with b None the teacher is the other model, so it changes too)."""

    def stat(f):
        vals = []
        for k, c in enumerate(used):
            fn, _ = _metric_fn(metric, c["id"], c["ood"])
            acc = {m: {} for m in (a, b or teacher, teacher)}
            for d in [c["id"], *c["ood"]]:
                cols = [j for j, (kk, dd, _) in enumerate(flips) if kk == k and dd == d]
                shift = f[:, cols] @ np.array([flips[j][2] for j in cols]) if cols else np.zeros(f.shape[0])
                for m in acc:
                    acc[m][d] = 100.0 * float(np.mean(np.asarray(c["correct"][m][d], dtype=np.float64)))
                acc[a][d] = acc[a][d] + shift
                acc[b or teacher][d] = acc[b or teacher][d] - shift
            t = acc[teacher]
            vals.append(fn(acc[a], t) - (fn(acc[b], t) if b else 0.0))
        return np.mean(np.stack(vals), axis=0)

    return stat


def direction(stat: dict | None) -> int:
    """+1 when the interval lies above 0, -1 below, 0 when it holds 0 (or is missing)."""
    ci = (stat or {}).get("ci")
    if not ci:
        return 0
    return 1 if ci[0] > 0 else (-1 if ci[1] < 0 else 0)


def exact_floor(discordant: int) -> float:
    """The smallest two-sided p an exact permutation test over ``discordant`` disagreeing pairs can give, 2 / 2^D
    (the observed assignment and its mirror image are always as extreme); 1 with none."""
    return 1.0 if discordant <= 0 else min(1.0, 2.0 ** (1 - discordant))


def no_evidence(stat: dict, family: int = 1, alpha: float = ALPHA) -> str | None:
    """Why a comparison holds no evidence at all, or None: the two models agree on every test pair (nothing varies,
    so no interval and no effect size can be read), or so few pairs disagree that even the most extreme exact
    result could not pass Holm's first step (:func:`exact_floor` >= alpha / family)."""
    d = stat.get("discordant")
    if d == 0 or np.isnan(stat.get("mde", np.nan)):  # NaN: nothing varies (inf: varies, but no effect detectable)
        return "the two models agree on every test pair"
    if d is not None and d < EXACT_BELOW and exact_floor(d) >= alpha / max(family, 1):
        return f"{d} test pairs differ: an exact test cannot reach p < {alpha / max(family, 1):.3g}"
    return None


def row_status(stat: dict, want, p_adj: float, margin: float = MARGIN_PP, alpha: float = ALPHA, family: int = 1) -> str:
    """A comparison's status against its claim, the first that applies (docs/protocol.md, "Row states"):

    1. no information: no evidence at all (:func:`no_evidence`);
    2. not decided (1 seed): one seed holds no training noise, so no method-level statement;
    3. ruled out (superiority rows): the interval lies inside (-m, +m), significant or not (an effect smaller than
       m is not the paper's effect);
    4. for / against: the Holm-adjusted p < alpha (superiority: by the sign; non-inferiority: the adjusted
       non-inferiority p for, the interval's upper end below -m against);
    5. no information: the interval is wider than 2m (the MDE is the answer);
    6. undecided.

    ``want``: +1 or -1 (superiority) or :data:`NONINFERIOR`; ``family``: the size of the Holm family.
    """
    if no_evidence(stat, family, alpha):
        return NO_INFORMATION
    if stat["n_seeds"] == 1:
        return NOT_DECIDED_1SEED
    lo, hi = stat["ci"]
    if want == NONINFERIOR:
        if p_adj < alpha:
            return FOR
        if hi < -margin:
            return AGAINST
    else:
        if -margin < lo and hi < margin:
            return RULED_OUT
        if p_adj < alpha:
            return FOR if np.sign(stat["value"]) == want else AGAINST
    return NO_INFORMATION if hi - lo > 2 * margin else UNDECIDED


def decide(claim: dict, margin: float = MARGIN_PP, withheld: str | None = None, alpha: float = ALPHA) -> dict:
    """Holm over the claim's family (its rows), each row's MDE at Holm's first step (alpha / family size) and its
    status (:func:`row_status`), and the verdict from the primary rows, the first that applies: withheld, not tested,
    not decided (1 seed), not reproduced (a primary row against), reproduced (all for), ruled out (all ruled out),
    no information (a primary row says nothing), inconclusive. ``alpha``: the family's level (0.05; a sequential
    look passes the alpha it spends, :mod:`w2s_shift.metrics.sequential`, with the rows' intervals at 1 - alpha)."""
    rows = claim["rows"]
    raw = [noninferiority_p(r["stat"], margin) if r["want"] == NONINFERIOR else r["stat"]["p"] for r in rows]
    m = len(rows)
    for r, p, pa in zip(rows, raw, holm(raw)):
        r["p"], r["p_holm"] = p, pa
        r["stat"]["mde_single"] = r["stat"]["mde"]
        r["stat"]["mde"] = mde_of(r["stat"], m) if m > 1 and np.isfinite(r["stat"]["mde"]) else r["stat"]["mde"]
        r["status"] = row_status(r["stat"], r["want"], pa, margin, alpha=alpha, family=m)
    prim_rows = [r for r in rows if r["primary"]]
    prim = [r["status"] for r in prim_rows]
    k = max((r["stat"]["n_seeds"] for r in rows), default=0)
    mdes = [r["stat"]["mde"] for r in prim_rows if np.isfinite(r["stat"]["mde"])]
    if withheld:
        verdict, why = WITHHELD, withheld
    elif not prim:
        verdict, why = NOT_TESTED, claim.get("why") or "the grid lacks what the claim compares"
    elif k == 1:
        verdict = NOT_DECIDED_1SEED
        why = "one seed holds test-pair noise only, not the training noise a method comparison needs"
        if mdes:
            why += f" (MDE now {max(mdes):.1f} pp; `w2s-shift plan --power` gives the seeds and pairs needed)"
    elif AGAINST in prim:
        verdict, why = NOT_REPRODUCED, "a primary comparison is significant against the claim (Holm)"
    elif all(s == FOR for s in prim):
        verdict, why = REPRODUCED, "every primary comparison is significant for the claim (Holm)"
    elif all(s == RULED_OUT for s in prim):
        verdict, why = RULED_OUT, f"every primary interval lies inside ±{margin:g} pp"
    elif NO_INFORMATION in prim:
        verdict = NO_INFORMATION
        why = "; ".join(dict.fromkeys(w for r in prim_rows if (w := no_evidence(r["stat"], m)))) or (
            "an interval is wider than 2m"
        )
        if mdes:
            why += f"; detectable at 80% power (Holm): {max(mdes):.1f} pp"
    else:
        verdict, why = INCONCLUSIVE, "not every primary comparison is decided for the claim"
    if prim and verdict not in (WITHHELD, REPRODUCED, NOT_DECIDED_1SEED):
        counts = {s: prim.count(s) for s in dict.fromkeys(prim)}
        why += " (primary: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
    claim.update(verdict=verdict, why=why, margin=margin)
    return claim


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


def _anchoring(m: dict) -> bool:
    """An ANCHOR entry that anchors at all: a fixed lambda > 0 (lambda 0 is Naive)."""
    lam = _fixed_lambda(m)
    return lam is not None and float(lam) > 0


def primary_anchor(anchors: list) -> dict | None:
    """The ANCHOR student a claim is decided on, fixed before looking at results: the first ANCHOR entry of the
    grid at the last layer with a fixed lambda > 0 (the paper's recommended setting); None when there is none
    (an entry with lambda 0 is Naive, and a middle-layer or auto-lambda entry is not the paper's ANCHOR)."""
    last = [m for m in anchors if m.get("layer_spec", "last") == "last" and _anchoring(m)]
    return (last or [None])[0]


def _n(rows: list) -> str:
    return f"{len(rows)} comparison{'' if len(rows) == 1 else 's'}"


def _claim(key: str, text: str, family: str, primary: str, rows: list, why: str | None = None) -> dict:
    return {"claim": key, "text": text, "family": family, "primary": primary, "rows": rows, "why": why}


def _row(what, s, want, primary=True) -> list:
    return [{"what": what, "stat": s, "want": want, "primary": primary}] if s else []


def _claim_a(roles: dict, ood: list, stat) -> dict:
    """(a) WRG - AOG > 0 for Naive and Confidence: the mean over targets decides, each target is shown."""
    rows = []
    for role in GAIN_ID_LOSE_OOD:
        for m in roles.get(role, []):
            rows += _row(f"WRG - AOG mean of {m['label']}", stat(m["label"], None, "WRG-AOG_mean"), 1)
            for t in ood:
                rows += _row(f"WRG - AOG {t} of {m['label']}", stat(m["label"], None, f"WRG-AOG:{t}"), 1, False)
    return _claim(
        "a",
        "ID gains overstate OOD gains for Naive and Confidence (WRG - AOG > 0)",
        f"WRG - AOG of Naive and Confidence, mean and per target ({_n(rows)})",
        "WRG - AOG mean of each",
        rows,
        None if rows else "the grid lacks Naive and Confidence",
    )


def _claim_s(roles: dict, stat) -> dict:
    """(s) SEAM's WRG below Naive's and its AOG mean non-inferior to Naive's."""
    naive, seam = (roles.get("naive") or [None])[0], (roles.get("seam") or [None])[0]
    rows = []
    if naive and seam:
        rows += _row(f"WRG {seam['label']} - {naive['label']}", stat(seam["label"], naive["label"], "WRG"), -1)
        rows += _row(
            f"AOG mean {seam['label']} - {naive['label']}", stat(seam["label"], naive["label"], "AOG_mean"), NONINFERIOR
        )
    return _claim(
        "s",
        "SEAM loses ID and keeps OOD: WRG below Naive's, AOG within m of Naive's (non-inferior; no OOD gain is tested)",
        "WRG and AOG mean of SEAM - Naive (2 comparisons)",
        "both",
        rows,
        None if rows else "the grid lacks SEAM or Naive",
    )


def _claim_b(roles: dict, anchor: dict | None, stat) -> dict:
    """(b) the primary ANCHOR's NTS above each of Naive's, Confidence's and SEAM's."""
    rows = []
    if anchor:
        for role in NTS_RIVALS:
            for m in roles.get(role, []):
                rows += _row(f"NTS {anchor['label']} - {m['label']}", stat(anchor["label"], m["label"]), 1)
    return _claim(
        "b",
        "ANCHOR has the highest NTS (vs Naive, Confidence, SEAM)",
        f"NTS of {anchor['label'] if anchor else 'ANCHOR'} minus each baseline ({_n(rows)})",
        "all",
        rows,
        None if anchor else "no last-layer ANCHOR entry with a fixed lambda > 0",
    )


def _claim_c(roles: dict, anchor: dict | None, stat) -> dict:
    """(c) in the first layer group with 3+ fixed lambdas (the primary ANCHOR's first): an interior lambda (the
    primary's own when interior) against both ends of the sweep."""
    by_layers: dict = {}
    for m in roles.get("anchor", []):
        if _anchoring(m):
            by_layers.setdefault(m.get("layer_spec", "last"), {}).setdefault(float(_fixed_lambda(m)), m)
    order_specs = ([anchor.get("layer_spec", "last")] if anchor else []) + list(by_layers)
    spec = next((s for s in dict.fromkeys(order_specs) if len(by_layers.get(s, {})) >= 3), None)
    rows, family = [], "no layer group with 3 or more lambdas > 0"
    if spec is not None:
        lams = by_layers[spec]
        order = sorted(lams)
        interior = order[1:-1]
        own = float(_fixed_lambda(anchor)) if anchor and anchor.get("layer_spec", "last") == spec else None
        mid = own if own in interior else interior[(len(interior) - 1) // 2]
        mm = lams[mid]
        for end in (order[0], order[-1]):
            rows += _row(
                f"NTS {mm['label']} - {lams[end]['label']} (layers {spec})", stat(mm["label"], lams[end]["label"]), 1
            )
        family = f"layers {spec}: lambda {mid:g} against {order[0]:g} and {order[-1]:g} (2 comparisons)"
    return _claim(
        "c",
        "A moderate lambda beats both ends of the sweep (one layer group)",
        family,
        "both",
        rows,
        None if rows else "no layer group with 3 or more lambdas > 0",
    )


def _claim_d(roles: dict, stat) -> dict:
    """(d) last-layer ANCHOR's NTS non-inferior to the 50% + 75% middle's at the same lambda."""
    anchors = roles.get("anchor", [])
    pairs = [
        (last, mid)
        for last in anchors
        if last.get("layer_spec", "last") == "last" and _anchoring(last)
        for mid in anchors
        if mid.get("layer_spec") == "middle" and _fixed_lambda(mid) == _fixed_lambda(last)
    ]
    rows = []
    for last, mid in pairs:
        rows += _row(f"NTS {last['label']} - {mid['label']}", stat(last["label"], mid["label"]), NONINFERIOR)
    custom = [m["label"] for m in anchors if m.get("layer_spec") not in ("last", "middle", None)]
    return _claim(
        "d",
        "Last-layer ANCHOR is at least as good as the 50% + 75% middle (NTS non-inferior at m)",
        f"NTS last - middle at the same lambda ({_n(rows)})",
        "all",
        rows,
        None
        if rows
        else "no 'middle' (50% + 75% blocks) ANCHOR entry at a last-layer entry's lambda"
        + (f"; {', '.join(custom)} anchor single blocks, not the paper's middle" if custom else ""),
    )


def paper_claims(cells: list, methods: list, n_boot: int = 2000, seed: int = 0, margin: float = MARGIN_PP) -> list:
    """The paper's claims on one source's grid, each a declared Holm family of comparisons with a verdict.

    Args:
        cells: as :func:`pooled_metric`, one per seed; a cell may carry "gap_passed" (False: its weak-to-strong
            gap check failed, and every verdict is withheld) and "seed".
        methods: the grid's method entries (metrics.json ``cells[].methods``: name, label, anchor_lambda,
            anchor_lambda_mode, layer_spec, anchor_layers), in grid order.
        margin: m in pp (the paper's ANCHOR effect, 3.8).

    Returns:
        [{"claim": "a" / "s" / "b" / "c" / "d", "text", "family" (what the family holds), "primary" (the deciding
          comparisons), "margin", "rows": [{"what", "stat": pooled_metric(...), "primary": bool, "want": +1 / -1 /
          "non-inferior", "p" (raw), "p_holm", "status"}], "verdict", "why"}].
    """
    roles = _roles(methods)
    stat = lambda a, b=None, metric="NTS": pooled_metric(cells, a, b, metric, n_boot=n_boot, seed=seed)  # noqa: E731
    no_gap = [str(c.get("seed", i)) for i, c in enumerate(cells) if c.get("gap_passed") is False]
    withheld = (
        f"no weak-to-strong gap in seed{'s' if len(no_gap) > 1 else ''} {', '.join(no_gap)} (the ceiling does not "
        "clear the teacher): W2S comparisons there are not meaningful"
        if no_gap
        else None
    )
    ood = [t for t in dict.fromkeys(t for c in cells for t in c["ood"]) if all(t in c["ood"] for c in cells)]
    anchor = primary_anchor(roles.get("anchor", []))
    out = [
        _claim_a(roles, ood, stat),
        _claim_s(roles, stat),
        _claim_b(roles, anchor, stat),
        _claim_c(roles, anchor, stat),
        _claim_d(roles, stat),
    ]
    return [decide(c, margin, withheld if c["rows"] else None) for c in out]


def four_claims(cells: list, methods: list, n_boot: int = 2000, seed: int = 0, margin: float = MARGIN_PP) -> list:
    """The name the report and the GPU evidence script call: :func:`paper_claims`."""
    return paper_claims(cells, methods, n_boot=n_boot, seed=seed, margin=margin)


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

"""The report's sections on what a run concludes: the paper's claims, ANCHOR against its competitors and the
mechanism by intervention; the tables of what :mod:`w2s_shift.results.verdicts` computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import read_json
from ..methods import method_of, table_text
from ..metrics.claims import MARGIN_PP, NOT_DECIDED_1SEED, NOT_TESTED
from ..results.ensembles import source_ensembles
from ..results.verdicts import intervention_effects, source_claims, source_competitors


def _fmt(stat: dict) -> tuple:
    ci = stat.get("ci")
    interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " [n/a]"
    seeds = ", ".join(f"{v:+.2f}" for v in stat["per_seed"])
    return f"{stat['value']:+.2f}{interval}", f"{stat['n_seeds']} ({seeds})"


def _mde_text(stat: dict) -> str:
    """The minimum detectable effect (pp, one decimal); a dash where nothing varies (no effect size can be read)."""
    return f"{stat['mde']:.1f}" if np.isfinite(stat["mde"]) else "–"


def _fmt_mde(stat: dict | None) -> tuple:
    """:func:`_fmt` with the minimum detectable effect after the interval; dashes for a missing comparison."""
    if not stat:
        return "–", "–"
    value, seeds = _fmt(stat)
    return f"{value}, MDE {_mde_text(stat)}", seeds


def _p(r: dict) -> str:
    test = r["stat"]["test"]
    note = f"exact, {r['stat']['discordant']} pairs differ" if test == "exact" else test
    return f"{r['p']:.3f} / {r['p_holm']:.3f} ({note})"


def claims_table(claims: list) -> tuple:
    """(head, rows, notes) of the claims table: one row per comparison, one note per claim (verdict, family,
    primary comparisons, margin, why)."""
    head = [
        "claim",
        "comparison",
        "Δ (pp) [95% interval]",
        "MDE 80% (pp)",
        "p / Holm p (test)",
        "seeds (per seed)",
        "row",
        "verdict",
    ]
    rows, notes = [], []
    for c in claims:
        label = f"({c['claim']}) {c['text']}"
        if not c["rows"]:
            rows.append([label, "–", "–", "–", "–", "–", "–", c["verdict"]])
        for i, r in enumerate(c["rows"]):
            value, seeds = _fmt(r["stat"])
            what = r["what"] + ("" if r["primary"] else " (secondary)")
            want = "> -m" if r["want"] == "non-inferior" else ("> 0" if r["want"] == 1 else "< 0")
            rows.append(
                [
                    label if i == 0 else "",
                    f"{what}, {want}",
                    value,
                    _mde_text(r["stat"]),
                    _p(r),
                    seeds,
                    r["status"],
                    c["verdict"] if i == 0 else "",
                ]
            )
        notes.append(
            f"({c['claim']}) **{c['verdict']}**: {c['why']}. Family: {c['family']}; primary: {c['primary']}; "
            f"margin m = {c['margin']:g} pp."
        )
    return head, rows, notes


def run_summary(source: str, cells: list, claims: list | None, margin: float = MARGIN_PP) -> list:
    """The three lines of "what this run shows" for one source: the weak-to-strong gap, the claims' verdicts, and
    the smallest effect the claims' comparisons can see (median minimum detectable effect against the margin)."""
    gaps = [(c.get("seed"), c.get("gap_check")) for c in cells]
    fail = [str(k) for k, g in gaps if g and g.get("passed") is False]
    shown = [f"{g['gap_pp']:+.1f} pp [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}]" for _, g in gaps if g and g.get("ci")]
    gap = (
        f"{source}: ceiling - teacher on ID {', '.join(shown)}: "
        + (
            f"**no weak-to-strong gap in seed{'s' if len(fail) > 1 else ''} {', '.join(fail)}**, verdicts withheld"
            if fail
            else "a weak-to-strong setting"
        )
        if shown
        else f"{source}: no gap check (no ceiling)"
    )
    if not claims:
        return [gap, f"{source}: no claim of the paper can be decided on this grid", f"{source}: –"]
    verdicts = "; ".join(f"({c['claim']}) {c['verdict']}" for c in claims)
    testable = [f"({c['claim']})" for c in claims if c["verdict"] == NOT_DECIDED_1SEED]
    if testable and all(c["verdict"] in (NOT_DECIDED_1SEED, NOT_TESTED) for c in claims):  # one seed, plainly
        untested = [f"({c['claim']})" for c in claims if c["verdict"] == NOT_TESTED]
        verdicts = (
            f"not decided from 1 seed, whose intervals leave out training noise: {', '.join(testable)} can be "
            "tested on this grid"
            + (f" ({', '.join(untested)} cannot)" if untested else "")
            + ' with 2 or more seeds (`--set "seeds=[0,1,2]"`, or `run --until-decided --max-seeds 5`)'
        )
    mdes = sorted(r["stat"]["mde"] for c in claims for r in c["rows"] if r["primary"] and np.isfinite(r["stat"]["mde"]))
    seeds = max((r["stat"]["n_seeds"] for c in claims for r in c["rows"]), default=0)
    power = (
        f"{source}: the claims' primary comparisons detect (80% power) effects of {np.median(mdes):.1f} pp "
        f"(median; {mdes[0]:.1f} to {mdes[-1]:.1f}) against the paper's {margin:g} pp"
        + ("; 1 seed: training noise not in the intervals" if seeds == 1 else f"; {seeds} seeds")
        if mdes
        else f"{source}: –"
    )
    return [gap, f"{source}: claims {verdicts}", power]


def claims_blocks(
    run_dir: Path, cells: list, methods: list, margin: float = MARGIN_PP, summary: list | None = None
) -> list:
    """Report blocks (heading, paragraph, table, verdict notes) for one source; [] when the grid has no W2S method
    of the paper; a heading and one line naming the file when a rewards file cannot be read.

    Args:
        run_dir: the run directory; cells: the source's cells from metrics.json; methods: the grid's method
            entries (the source's aggregate ``methods``); margin: m in pp.
        summary: a list to which the source's three :func:`run_summary` lines are appended, or None.
    """
    try:
        claims = source_claims(run_dir, cells, methods, margin)
    except ValueError as e:  # a rewards file missing or damaged: the rest of the report stands, this says why
        if summary is not None:
            summary += run_summary(cells[0].get("source", "?"), cells, None, margin)
        return [("h3", "The paper's claims"), ("p", f"Not computed: {e}.")]
    if summary is not None:
        summary += run_summary(cells[0].get("source", "?"), cells, claims, margin)
    if claims is None:
        return []
    head, rows, notes = claims_table(claims)
    text = (
        "Le et al. 2026's claims as the paper states them, decided on this grid (rules: docs/protocol.md). Each "
        "comparison is the mean over the seeds in which both models were trained; its 95% interval covers training "
        "noise between seeds and test-pair noise (seeds x pairs random-effects model, a generalized interval that "
        "carries the seed variance's chi-square uncertainty; with one seed, test pairs only). MDE: the smallest true "
        "difference this interval detects with 80% power at Holm's first step (– where nothing varies). p: "
        "two-sided (non-inferiority rows: against -m), exact where fewer than 20 test "
        "pairs differ between the two models; Holm p: corrected within the claim's declared family. Row: for / "
        f"against the claim (Holm p < 0.05), ruled out (interval inside ±{margin:g} pp, before for / against), no "
        f"information (no pair differs, too few for an exact test, or interval wider than {2 * margin:g} pp), not "
        "decided (1 seed), undecided. The verdict comes from the primary rows; it is withheld where "
        "the weak-to-strong gap check failed. ANCHOR's claims use the first last-layer ANCHOR entry with a fixed "
        "lambda > 0 (chosen before the results)."
    )
    return [("h3", "The paper's claims"), ("p", text), ("table", head, rows), ("ul", notes)]


COMPETITORS_TITLE = "ANCHOR vs its competitors"


def competitor_blocks(run_dir: Path, cells: list, methods: list) -> list:
    """Report blocks (heading, paragraph, table) comparing ANCHOR with the grid's competitors (methods whose
    registered :class:`~w2s_shift.methods.Method` has ``competitor``: L2-SP, WiSE-FT, GRM): NTS, AOG mean and WRG of
    ANCHOR minus each, with paired 95% intervals; [] when the grid has no competitor or no ANCHOR entry."""
    if not any(getattr(method_of(m), "competitor", False) for m in methods):
        return []
    try:
        res = source_competitors(run_dir, cells, methods)
    except ValueError as e:
        return [("h3", COMPETITORS_TITLE), ("p", f"Not computed: {e}.")]
    if res is None:
        return []
    head = [
        "competitor",
        "method",
        "NTS: ANCHOR − it (pp) [95%], MDE",
        "AOG mean: ANCHOR − it, MDE",
        "WRG: ANCHOR − it, MDE",
        "seeds",
    ]
    rows = []
    for r in res["rows"]:
        cols = [_fmt_mde(r["stats"][k]) for k in ("NTS", "AOG_mean", "WRG")]
        rows.append([r["competitor"]["label"], table_text(r["competitor"]), *[c[0] for c in cols], cols[0][1]])
    text = (
        f"ANCHOR ({res['anchor']['label']}, the entry claims (b)-(d) use) minus each competitor, each at the one "
        "setting its entry declares: positive means ANCHOR is higher. Mean over the seeds in which both were trained, "
        "with the claims' 95% interval (training noise between seeds and test-pair noise; with one seed, test pairs "
        "only; per-seed NTS listed); MDE: the smallest true difference each detects with 80% power. WiSE-FT's "
        "models keep the fine-tuned student's reward head; GRM's language-model head is not part of its reward model."
    )
    return [("h3", COMPETITORS_TITLE), ("p", text), ("table", head, rows)]


def _effect(e: dict | None) -> str:
    """An effect of :func:`w2s_shift.metrics.intervention.seeds_pairs_effect`: value [95%], MDE (a dash where
    nothing varies), marked "pairs only" with one seed."""
    if e is None:
        return "–"
    mde = "–" if not np.isfinite(e["mde"]) else f"{e['mde']:.1f}"
    one = "" if e["seed_noise"] else ", pairs only"
    return f"{e['value']:+.2f} [{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}], MDE {mde}{one}"


def _head(r: dict) -> str:
    """Which head the a = 0 point uses, with the check's mean accuracy on the fit pairs."""
    how = "own" if not r["refit"] else f"refit ({r['refit']} of {r['n_seeds']} seeds)"
    return f"{how}; check {r['check_accuracy']:.1f}%"


def intervention_blocks(run_dir: Path, cells: list) -> list:
    """Report blocks of one source's mechanism by intervention
    (:func:`w2s_shift.results.verdicts.intervention_effects`): a table per trained student and evaluation set (which
    head the a = 0 point uses, accuracies, the interpolation and probe gains with the seeds x pairs interval), then the
    reading, W2S student minus ceiling (difference in differences) per student and set; [] without files."""
    eff = intervention_effects(run_dir, cells)
    rows = eff["rows"]
    if not rows:
        if not eff["stale"]:
            return []
        why = (
            f"{len(eff['stale'])} mechanism file(s) of older code (probes fitted on the student-train pairs, ties "
            "counted half), not read: run the run again to redo them."
        )
        return [("h3", "The mechanism by intervention"), ("p", why)]
    head = ["model", "set", "head at a = 0", "acc a = 1 / a = 0 (own head)", "interpolation gain (pp) [95%], MDE",
            "probe: student / pretrained", "probe gain (pp) [95%], MDE"]  # fmt: skip
    table = [
        [
            r["model"],
            r["set"] + (" (OOD)" if r["ood"] else " (ID)"),
            _head(r),
            f"{r['acc_student']:.2f} / {r['acc_a0']:.2f}",
            _effect(r["gain"]["interpolation"]),
            f"{r['probe_student']:.2f} / {r['probe_pretrained']:.2f}",
            _effect(r["gain"]["probe"]),
        ]
        for r in rows
    ]
    did_head = ["W2S student", "set", "interpolation: W2S − ceiling [95%], MDE", "probe: W2S − ceiling [95%], MDE",
                "reading (interpolation / probe)", "mechanism"]  # fmt: skip
    did = []
    for r in rows:
        if r["did"] is None:
            continue
        rd = r["reading"] or {}
        did.append(
            [
                r["model"],
                r["set"] + (" (OOD)" if r["ood"] else " (ID)"),
                _effect(r["did"]["interpolation"]),
                _effect(r["did"]["probe"]),
                f"{rd['interpolation']} / {rd['probe']}" if rd else "(ID: no prediction)",
                rd.get("overall", "–"),
            ]
        )
    n_seeds = len({c["seed"] for c in cells})
    fit = f"{eff['fit_set'].replace('_', '-')} pairs ({eff['fit_pairs']:.0f}, gold orientation)"
    text = (
        "Does a weak-to-strong student's OOD loss sit in its representation? Interpolation: its own head on features "
        "moved back to the pretrained ones (a = 0) against itself (a = 1). Its head never saw the pretrained "
        f"features, so it is used only when it beats chance on the source's {fit}, which no student trained on "
        "(one-sided exact binomial test, p < 0.05); otherwise the head is refit, a linear probe on the pretrained "
        "features at a = 0 and on the student's at a = 1, and the gain compares features alone (minus the probe "
        "gain). Probe transfer: a fresh linear Bradley-Terry probe fitted on the same pairs over the student's "
        "frozen features against one over the pretrained features. A tie counts as wrong. Fine-tuning on gold moves "
        "features too, so the reading is each W2S student minus the gold-trained ceiling on the same pairs: the "
        "mechanism predicts a larger interpolation gain and a smaller probe gain than the ceiling's OOD, and is "
        "supported only when the probe says so (it is invariant to a rotation of the features) and the "
        f"interpolation agrees or is the probe comparison. {n_seeds} seed(s); intervals: the claims' seeds x pairs "
        "interval (with one seed, pairs only: not decided), the exact sign-flip test where under 20 pairs differ, "
        "Holm over a student's OOD sets; MDE: the smallest true effect each row detects with 80% power. Negative "
        "controls (features only rotated; a head-only failure) give no support and a positive control (features "
        "that lost information) support on synthetic features (tests/test_intervention.py)."
    )
    blocks = [("h3", "The mechanism by intervention"), ("p", text), ("table", head, table)]
    if did:
        blocks.append(("table", did_head, did))
    return blocks


def _iv(x) -> str:
    v, lo, hi = x
    if v is None:
        return "n/a"
    return f"{v:.2f}" + ("" if lo is None else f" [{lo:.1f}, {hi:.1f}]")


def _mde(x) -> str:
    """The smallest true difference a 95% interval [lo, hi] detects with 80% power: (1.96 + 0.84) x its SE, the SE
    read from the interval's width (normal approximation)."""
    _, lo, hi = x
    return "n/a" if lo is None else f"{(1.96 + 0.84) * (hi - lo) / (2 * 1.96):.1f}"


def ensemble_blocks(run_dir: Path, cells: list) -> list:
    """Report blocks of one source's seed ensembles (:func:`w2s_shift.results.ensembles.source_ensembles`): each
    trained model's mean and min ensemble over seeds with accuracy and W2S metrics, and the seeds' disagreement as a
    detector of wrong pairs (AUROC per set); [] with one seed; one line when the seeds' test pairs differ or a rewards
    file cannot be read."""
    try:
        e = source_ensembles(run_dir, cells)
    except ValueError as err:
        return [("h3", "Seed ensembles"), ("p", f"Not computed: {err}.")]
    if e is None:
        return []
    if "skipped" in e:
        return [("h3", "Seed ensembles"), ("p", f"None: {e['skipped']}.")]
    sets = e["datasets"]
    head = [
        "ensemble",
        *[f"{d} (ID) acc" if d == e["id"] else f"{d} acc" for d in sets],
        "WRG",
        "AOG mean",
        "NTS",
        "MDE of NTS",
    ]
    rows = []
    for name, acc in e["accuracy"].items():
        w = e["metrics"].get(name)
        cols = [_iv(w[k]) for k in ("WRG", "AOG_mean", "NTS")] + [_mde(w["NTS"])] if w else ["–"] * 4
        rows.append([name, *[_iv(acc[d]) for d in sets], *cols])
    auroc = [
        [m, *["n/a" if v is None else f"{v:.2f}" for v in (per[d] for d in sets)]]
        for m, per in e["disagreement_auroc"].items()
    ]
    text = (
        f"Each trained model's {len(e['seeds'])} seeds combined without retraining: rewards standardized per seed and "
        "set, then per response the mean over seeds (`/mean`) or the worst case (`/min`, Coste et al. 2024). "
        "Accuracy in % [95% bootstrap interval over pairs]; WRG, AOG mean and NTS (pp) against the teachers' mean "
        "ensemble, paired. An ensemble holds every seed, so its interval resamples test pairs only: it describes "
        "these ensembles and tests nothing between methods (the claims table does, with seed noise); MDE: the "
        "smallest true NTS the interval detects with 80% power. Evaluation only."
    )
    note = (
        "Does the seeds' disagreement flag the errors? AUROC of the per-pair SD over seeds of the standardized margin "
        "for the pairs the mean ensemble gets wrong (0.5: no signal; above: wrong pairs disagree more), ID and each "
        "OOD target."
    )
    return [
        ("h3", f"Seed ensembles ({len(e['seeds'])} seeds)"),
        ("p", text),
        ("table", head, rows),
        ("p", note),
        ("table", ["model", *sets], auroc),
    ]


def rewardbench_blocks(metrics: dict) -> list:
    """A table of the RewardBench scores of sets added with ``evaluate`` (``evaluated_targets[*].rewardbench``):
    per target, cell and model the benchmark's score and its subsets' (RewardBench 2) or sections' (RewardBench 1),
    in pp; nothing when no such set was added."""
    rows = []
    for e in metrics.get("evaluated_targets") or []:
        for cell, models in (e.get("rewardbench") or {}).items():
            for label, r in models.items():
                parts = r.get("sections") or {k: v.get("score") for k, v in (r.get("subsets") or {}).items()}
                pp = lambda x: "n/a" if x is None else f"{100 * x:.1f}"  # noqa: E731
                rows.append(
                    [
                        e["name"],
                        cell,
                        label,
                        pp(r.get("score")),
                        ", ".join(f"{k} {pp(v)}" for k, v in parts.items()),
                        str(r.get("rows_incomplete", 0)),
                    ]
                )
    if not rows:
        return []
    head = ["set", "cell", "model", "score (pp)", "sections / subsets (pp)", "rows incomplete"]
    note = (
        "Sets read as RewardBench 2 rows (best-of-4: the chosen must score above all three rejected, a tie at the top "
        "earns 1/k; Ties by its official rule; score = mean over subsets) or RewardBench rows (pairwise accuracy per "
        "subset, sections weighted by the reference's example counts, score = mean over sections), by the rules of "
        "allenai/reward-bench (w2s_shift/metrics/rewardbench.py). Rows with a pair left out (--n-pairs, the prompt "
        "overlap removal) are not scored."
    )
    return [("h3", "RewardBench scores"), ("p", note), ("table", head, rows)]


def sequential_blocks(run_dir: Path, seeds: list) -> list:
    """The claims as ``run --until-decided`` decided them, from ``RUN/sequential.json``: the plan (each look's seeds
    and alpha, and the spending function), each claim's frozen verdict with the look that gave it, and why the loop
    stopped. Nothing when the run was not grown until decided (no file); a file that is not a sequential record,
    or whose last look had other seeds than the report's ``seeds`` (a later run replaced the grid), is named, not
    shown.

    These verdicts, not the claims tables below (each row at the fixed 95% level of the last look), are the run's
    answers: a claim decided at an earlier look stays decided, and each look passes only the alpha it spent."""
    f = Path(run_dir) / "sequential.json"
    if not f.is_file():
        return []
    try:
        rec = read_json(f)
        plan, verdicts = rec["plan"], rec["verdicts"]
        looks = ", ".join(f"{x['seeds']} seeds at alpha {x['alpha']:.4g}" for x in plan["looks"])
        rows = [[k, v["verdict"], str(v["seeds"]), "yes" if v["open"] else "no"] for k, v in verdicts.items()]
        last = sorted(rec["looks"][-1]["seed_list"]) if rec["looks"] else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return [("h2", "Seeds added until decided"), ("p", f"{f} is not a w2s-shift sequential record: not shown.")]
    if last != sorted(seeds):
        why = f"its last look had seeds {last}, this report's grid has {sorted(seeds)}"
        return [("h2", "Seeds added until decided"), ("p", f"{f} is of another grid ({why}): not shown.")]
    note = (
        f"`run --until-decided --max-seeds {plan['max_seeds']}`: the looks planned were {looks} ({plan['spending']} "
        f'spending of alpha {plan["alpha"]:g}, margin {plan["margin"]:g} pp; docs/protocol.md, "Adding seeds until '
        f"decided\"). A claim keeps the first look's verdict that decides it; these verdicts supersede the claims "
        f"tables below, which give the last look's rows at the fixed 95% level. Seeds used: {rec.get('seeds_used')}; "
        f"stopped: {rec.get('stopped') or 'not yet (a look is still to come)'}."
    )
    table = ("table", ["claim", "verdict", "decided at (seeds)", "still open"], rows) if rows else ("p", "No claim.")
    return [("h2", "Seeds added until decided"), ("p", note), table]

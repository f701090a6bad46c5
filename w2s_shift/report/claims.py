"""The report's section on the paper's four claims: each cell's per-pair correctness from its rewards files, the
verdicts of :func:`w2s_shift.metrics.claims.four_claims`, and their table."""

from __future__ import annotations

from pathlib import Path

from ..methods import method_of, table_text
from ..metrics.claims import anchor_vs, four_claims
from .files import reward_rows


def claim_cells(run_dir: Path, cells: list) -> list:
    """One source's cells in the form :func:`~w2s_shift.metrics.claims.pooled_metric` takes: correctness of every
    model on the ID set and each OOD target, with the pair ids (reward margin > 0 counts as correct)."""
    out = []
    for c in cells:
        cell_dir = Path(run_dir) / c["dir"]
        datasets = [c["id"], *c["ood"]]
        correct, ids = {}, {}
        for m in dict.fromkeys(["teacher", *c["models"]]):
            correct[m] = {}
            for d in datasets:
                pair_ids, ch, rj = reward_rows(cell_dir, m, d)
                correct[m][d] = ch - rj > 0
                ids.setdefault(d, pair_ids)
        out.append({"id": c["id"], "ood": list(c["ood"]), "ids": ids, "correct": correct})
    return out


def _fmt(stat: dict) -> str:
    ci = stat.get("ci")
    interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " [n/a]"
    seeds = ", ".join(f"{v:+.2f}" for v in stat["per_seed"])
    return f"{stat['value']:+.2f}{interval}", f"{stat['n_seeds']} ({seeds})"


def claims_blocks(run_dir: Path, cells: list, methods: list) -> list:
    """Report blocks (heading, paragraph, table) for one source; [] when the grid has no W2S method of the paper;
    a heading and one line naming the file when a rewards file cannot be read.

    Args:
        run_dir: the run directory; cells: the source's cells from metrics.json; methods: the grid's method
            entries (the source's aggregate ``methods``).
    """
    boot = cells[0].get("bootstrap") or {}
    try:
        per_pair = claim_cells(run_dir, cells)
    except ValueError as e:  # a rewards file missing or damaged: the rest of the report stands, this says why
        return [("h3", "The paper's four claims"), ("p", f"Not computed: {e}.")]
    claims = four_claims(per_pair, methods, n_boot=int(boot.get("n", 2000)), seed=0)
    if all(not c["rows"] for c in claims):
        return []
    head = ["claim", "comparison", "Δ (pp) [95% interval]", "seeds (per seed)", "verdict"]
    rows = []
    for c in claims:
        if not c["rows"]:
            rows.append([f"({c['claim']}) {c['text']}", "–", "–", "–", c["verdict"]])
        for i, r in enumerate(c["rows"]):
            value, seeds = _fmt(r["stat"])
            rows.append([f"({c['claim']}) {c['text']}" if i == 0 else "", r["what"], value, seeds, c["verdict"]])
    text = (
        "Le et al. 2026's four claims decided on this grid. Each comparison is the mean over the seeds in which "
        "both models were trained, with a 95% percentile bootstrap interval over test pairs (seeds sharing their "
        "test pairs are resampled together); it does not cover training noise between seeds, so the per-seed "
        "values are listed. Reproduced: every interval excludes 0 in the claimed direction; not reproduced: one "
        "excludes 0 against it; inconclusive otherwise. ANCHOR's claims use the first last-layer, fixed-lambda "
        "ANCHOR entry of the grid (chosen before the results)."
    )
    no_gap = [str(c.get("seed")) for c in cells if (c.get("gap_check") or {}).get("passed") is False]
    if no_gap:
        text = (
            f"**No weak-to-strong gap in seed{'s' if len(no_gap) > 1 else ''} {', '.join(no_gap)}** (the ceiling "
            "does not clear the teacher; see the gap check): the W2S comparisons there are not meaningful, and "
            "neither are verdicts that rest on them. " + text
        )
    return [("h3", "The paper's four claims"), ("p", text), ("table", head, rows)]


COMPETITORS_TITLE = "ANCHOR vs its competitors"


def competitor_blocks(run_dir: Path, cells: list, methods: list) -> list:
    """Report blocks (heading, paragraph, table) comparing ANCHOR with the grid's competitors (methods whose
    registered :class:`~w2s_shift.methods.Method` has ``competitor``: L2-SP, WiSE-FT, GRM): NTS, AOG mean and WRG of
    ANCHOR minus each, with paired 95% intervals; [] when the grid has no competitor or no ANCHOR entry."""
    comps = [m for m in methods if getattr(method_of(m), "competitor", False)]
    if not comps:
        return []
    boot = cells[0].get("bootstrap") or {}
    try:
        per_pair = claim_cells(run_dir, cells)
    except ValueError as e:
        return [("h3", COMPETITORS_TITLE), ("p", f"Not computed: {e}.")]
    res = anchor_vs(per_pair, methods, comps, n_boot=int(boot.get("n", 2000)), seed=0)
    if res is None or not res["rows"]:
        return []
    head = ["competitor", "method", "NTS: ANCHOR − it (pp) [95%]", "AOG mean: ANCHOR − it", "WRG: ANCHOR − it", "seeds"]
    rows = []
    for r in res["rows"]:
        cols = [_fmt(r["stats"][k]) if r["stats"][k] else ("–", "–") for k in ("NTS", "AOG_mean", "WRG")]
        rows.append([r["competitor"]["label"], table_text(r["competitor"]), *[c[0] for c in cols], cols[0][1]])
    text = (
        f"ANCHOR ({res['anchor']['label']}, the entry claims (b)-(d) use) minus each competitor, each at the one "
        "setting its entry declares: positive means ANCHOR is higher. Mean over the seeds in which both were trained, "
        "with a paired 95% percentile bootstrap interval over test pairs (both models scored on the same resampled "
        "pairs); it covers test-pair sampling, not training noise between seeds (per-seed NTS listed). WiSE-FT's "
        "models keep the fine-tuned student's reward head; GRM's language-model head is not part of its reward model."
    )
    return [("h3", COMPETITORS_TITLE), ("p", text), ("table", head, rows)]

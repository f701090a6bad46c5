"""The report's section on the paper's four claims: each cell's per-pair correctness from its rewards files, the
verdicts of :func:`w2s_shift.metrics.claims.four_claims`, and their table."""

from __future__ import annotations

from pathlib import Path

from ..metrics.claims import four_claims
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

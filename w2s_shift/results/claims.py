"""The paper's claims and ANCHOR's competitors of one source, computed from its cells' rewards files (the rules and
estimators: :mod:`w2s_shift.metrics.claims`); :mod:`w2s_shift.report.claims` renders them."""

from __future__ import annotations

from pathlib import Path

from ..methods import method_of
from ..metrics.claims import MARGIN_PP, anchor_vs, four_claims
from .files import reward_rows


def claim_cells(run_dir: Path, cells: list) -> list:
    """One source's cells in the form :func:`~w2s_shift.metrics.claims.pooled_metric` takes: correctness of every
    model on the ID set and each OOD target, with the pair ids (reward margin > 0 counts as correct), the seed and
    whether the cell's weak-to-strong gap check passed ("gap_passed": None when it was not run)."""
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
        out.append(
            {
                "id": c["id"],
                "ood": list(c["ood"]),
                "ids": ids,
                "correct": correct,
                "seed": c.get("seed"),
                "gap_passed": (c.get("gap_check") or {}).get("passed"),
            }
        )
    return out


def source_claims(run_dir: Path, cells: list, methods: list, margin: float = MARGIN_PP) -> list | None:
    """The claims of one source (:func:`w2s_shift.metrics.claims.four_claims` on :func:`claim_cells`), with the
    cells' bootstrap size and seed 0; None when the grid has no W2S method of the paper.

    Raises:
        ValueError: a rewards file missing or damaged (named).
    """
    boot = cells[0].get("bootstrap") or {}
    claims = four_claims(claim_cells(run_dir, cells), methods, n_boot=int(boot.get("n", 2000)), seed=0, margin=margin)
    return None if all(not c["rows"] for c in claims) else claims


def source_competitors(run_dir: Path, cells: list, methods: list) -> dict | None:
    """ANCHOR minus each competitor of the grid (methods whose :class:`~w2s_shift.methods.Method` has
    ``competitor``) on NTS, AOG mean and WRG (:func:`w2s_shift.metrics.claims.anchor_vs`); None without a competitor,
    an ANCHOR entry or a row.

    Raises:
        ValueError: a rewards file missing or damaged (named).
    """
    comps = [m for m in methods if getattr(method_of(m), "competitor", False)]
    if not comps:
        return None
    boot = cells[0].get("bootstrap") or {}
    res = anchor_vs(claim_cells(run_dir, cells), methods, comps, n_boot=int(boot.get("n", 2000)), seed=0)
    return res if res and res["rows"] else None

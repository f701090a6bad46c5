"""What a run concludes, per source: the paper's claims and ANCHOR against its competitors, computed from its cells'
rewards files (rules and estimators: :mod:`w2s_shift.metrics.claims`), and the mechanism by intervention, from each
cell's ``mechanism/<label>.json`` (written by :mod:`w2s_shift.pipeline.intervene`; estimators:
:mod:`w2s_shift.metrics.intervention`). :mod:`w2s_shift.report.sections` renders them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import read_json
from ..methods import method_of
from ..metrics.claims import MARGIN_PP, anchor_vs, four_claims
from ..metrics.intervention import FILE_FORMAT, mechanism_rows
from .files import reward_rows


def claim_cells(run_dir: Path, cells: list) -> list:
    """One source's cells in the form :func:`~w2s_shift.metrics.claims.pooled_metric` takes: correctness of every
    model on the ID set and each OOD target, with the pair ids (reward margin > 0 counts as correct; a tie, margin
    0, counts as wrong as in every accuracy of the run), the seed and whether the cell's weak-to-strong gap check
    passed ("gap_passed": None when it was not run).

    Raises:
        ValueError: a rewards file missing or damaged, or one whose pair ids are not those (in the same order) of the
            teacher's file for the same set, so that paired differences would compare different pairs (named).
    """
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
                if ids.setdefault(d, pair_ids) != pair_ids:
                    raise ValueError(
                        f"{cell_dir / 'rewards' / f'{m}__{d}.jsonl'}: its pair ids are not the teacher's on {d} "
                        f"({len(pair_ids)} rows against {len(ids[d])}, or in another order): paired differences need "
                        "the same pairs; score it again"
                    )
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


def intervention_effects(run_dir: Path, cells: list) -> dict:
    """The mechanism by intervention of one source's cells: each cell's ``mechanism/<label>.json`` (of the current
    format, sets of this report only) read and handed to :func:`w2s_shift.metrics.intervention.mechanism_rows`
    (W2S students minus the cell's ceiling, the claims' seeds x pairs interval).

    Returns:
        {"rows": mechanism_rows' list ([] without files), "fit_set": the split the probes were fitted on (None
        without files), "fit_pairs": its pairs (mean over cells), "stale": files of an older format, skipped}.

    Raises:
        ValueError: a damaged file (named), or a student and the ceiling scored on different pairs.
    """
    per_seed, stale, fit = [], [], []
    for c in cells:
        sets = {c["id"], *c.get("ood", [])}  # the sets of this report (a file may keep a target removed since)
        files = {}
        for f in sorted((Path(run_dir) / c["dir"] / "mechanism").glob("*.json")):
            d = read_json(f)
            if d.get("format") != FILE_FORMAT:
                stale.append(str(f))
                continue
            try:
                files[f.stem] = {"head": d["head"], "check": d["check"], "sets": {}}
                files[f.stem]["sets"] = {n: v for n, v in d["sets"].items() if n in sets}
                fit.append((d["fit_set"], int(d["fit_pairs"])))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{f}: a damaged mechanism file ({e!r}); run the mechanism stages again") from None
        per_seed.append(files)
    ood = {n for c in cells for n in c.get("ood", [])}
    ceiling = next((c.get("ceiling") for c in cells if c.get("ceiling")), None)
    boot = (cells[0].get("bootstrap") or {}) if cells else {}
    rows = mechanism_rows(per_seed, ceiling, ood, n_boot=int(boot.get("n", 2000)), seed=0)
    return {
        "rows": rows,
        "fit_set": fit[0][0] if fit else None,
        "fit_pairs": float(np.mean([n for _, n in fit])) if fit else None,
        "stale": stale,
    }

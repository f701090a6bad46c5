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
from ..metrics.intervention import seeds_pairs_effect
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


def intervention_effects(run_dir: Path, cells: list) -> list:
    """Per (student, set) of the source's cells, sorted by student, ID before OOD, then set:
    {"model", "set", "ood" (bool), "acc_student" (its head on its features, a = 1), "acc_pretrained_features" (its
    head on the pretrained features, a = 0), "probe_student", "probe_pretrained" (accuracy of a fresh probe on each,
    pp), "interpolation_gain", "probe_gain" (:func:`w2s_shift.metrics.intervention.seeds_pairs_effect` over seeds,
    then pairs: mean, 95% interval, MDE, in pp)}; means over the seeds that have the file. [] without files."""
    data: dict = {}
    for c in cells:
        sets = {c["id"], *c.get("ood", [])}  # the sets of this report (a file may keep a target removed since)
        for f in sorted((Path(run_dir) / c["dir"] / "mechanism").glob("*.json")):
            d = read_json(f)
            for name, v in d["sets"].items():
                if name in sets:
                    data.setdefault((f.stem, name), []).append(v)
    ood = {n for c in cells for n in c.get("ood", [])}
    out = []
    for (label, name), vs in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][1] in ood, kv[0][1])):
        out.append(
            {
                "model": label,
                "set": name,
                "ood": name in ood,
                "acc_student": float(np.mean([v["interpolation"][-1] for v in vs])),
                "acc_pretrained_features": float(np.mean([v["interpolation"][0] for v in vs])),
                "probe_student": float(np.mean([v["probe"]["student"] for v in vs])),
                "probe_pretrained": float(np.mean([v["probe"]["pretrained"] for v in vs])),
                "interpolation_gain": seeds_pairs_effect([np.asarray(v["interpolation_gain"]) for v in vs], n=1000),
                "probe_gain": seeds_pairs_effect([np.asarray(v["probe_gain"]) for v in vs], n=1000),
            }
        )
    return out

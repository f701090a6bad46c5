"""Per-cell cuts: the response-length baseline, truncation shares and what the methods that build their own labels
say of them (SEAM: the effect of its principles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import read_json
from ..methods import method_of
from ..metrics.length import (
    LENGTH_DRIVEN_PP,
    length_agreement,
    length_explained_difference,
    longer_wins_accuracy,
    margin_length_correlation,
)
from ..metrics.stats import paired_accuracy_diff
from .files import read_cell_jsonl


def _response_lengths(cell_dir: Path, models: list, dataset: str, n: int) -> tuple | None:
    """(len_chosen (n,), len_rejected (n,)) from the first of ``models``' rewards files on ``dataset`` whose rows
    carry ``len_chosen`` / ``len_rejected`` (characters of the responses, written by the pipeline); None when no
    file has them (a run of an older version). ValueError naming the file and row for a bad or partial length."""
    for m in models:
        path = Path(cell_dir) / "rewards" / f"{m}__{dataset}.jsonl"
        rows = read_cell_jsonl(path)
        if not rows or "len_chosen" not in rows[0]:
            continue
        lc, lr = [], []
        for i, r in enumerate(rows, 1):
            for k, out in (("len_chosen", lc), ("len_rejected", lr)):
                v = r.get(k)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise ValueError(f"{path}: row {i}: field {k!r} must be a length >= 0, got {v!r}")
                out.append(float(v))
        if len(lc) != n:
            raise ValueError(f"{path}: {len(lc)} rows, expected {n}")
        return np.array(lc), np.array(lr)
    return None


def cell_length_baseline(
    cell_dir: Path,
    models: list,
    datasets: list,
    margins: dict,
    id_name: str,
    oods: list,
    students: list,
    ceiling: str | None,
) -> dict | None:
    """The "longer response wins" baseline on every evaluation set of a cell, and what it explains.

    Length is the response text in characters (``len_chosen`` / ``len_rejected`` of the rewards files). Per set:
    the baseline's accuracy (equal lengths count 1/2), each model's agreement with it (pairs where the model
    prefers the longer response; equal lengths count 1/2), the Pearson correlation of each model's reward margin
    with len(chosen) - len(rejected) (:mod:`w2s_shift.metrics.length`), and the models flagged LENGTH-DRIVEN there:
    agreement >= ``LENGTH_DRIVEN_PP`` (90%).

    A difference is flagged EXPLAINED BY LENGTH by :func:`w2s_shift.metrics.length.length_explained_difference`
    (positive, with no gain on the pairs whose rejected response is longer; or negative, with no loss on the
    pairs whose chosen response is longer), and only where it clears test-pair noise: its paired 95% bootstrap
    interval (:func:`w2s_shift.metrics.stats.paired_accuracy_diff`, 1,000 resamples) excludes 0 (each result
    carries "ci" and "clears_noise"). It is checked for the ceiling - teacher gap and each student's WRG on
    the ID set, and each student's AOG on every OOD target.

    Returns:
        None when the rewards files carry no lengths; else {"unit": "characters", "length_driven_pp": 90.0,
        "datasets": {d: {"n", "n_equal", "longer_wins_accuracy": pp, "agreement": {model: pp},
                         "margin_length_corr": {model: r or None}, "length_driven": [models]}},
         "gap": {...} or None (ceiling vs teacher, ID), "WRG": {student: {...}}, "AOG": {student: {t: {...}}},
         "flags": [sentences]}, each {...} as returned by length_explained_difference.
    """
    lengths = {}
    for d in datasets:
        got = _response_lengths(cell_dir, models, d, margins["teacher"][d].size)
        if got is None:
            return None
        lengths[d] = got
    per, flags = {}, []
    for d in datasets:
        lc, lr = lengths[d]
        agree = {m: length_agreement(margins[m][d], lc, lr) for m in models}
        driven = [m for m in models if agree[m] >= LENGTH_DRIVEN_PP]
        per[d] = {
            "n": int(lc.size),
            "n_equal": int(np.sum(lc == lr)),
            "longer_wins_accuracy": longer_wins_accuracy(lc, lr),
            "agreement": agree,
            "margin_length_corr": {m: margin_length_correlation(margins[m][d], lc, lr) for m in models},
            "length_driven": driven,
        }
        flags += [
            f"{m} is length-driven on {d}: it agrees with longer-wins on {agree[m]:.1f}% of pairs" for m in driven
        ]

    def diff(a: str, d: str) -> dict:
        res = length_explained_difference(margins[a][d] > 0, margins["teacher"][d] > 0, *lengths[d])
        _, lo, hi = paired_accuracy_diff(margins[a][d] > 0, margins["teacher"][d] > 0, n_boot=1000, seed=0)
        return res | {"ci": [lo, hi], "clears_noise": bool(lo > 0 or hi < 0)}

    def note(res: dict, what: str) -> None:
        if res["explained_by_length"] and res["clears_noise"]:
            flags.append(
                f"{what} ({res['delta']:+.1f} pp [{res['ci'][0]:+.1f}, {res['ci'][1]:+.1f}]) is explained by length: "
                f"{_pp(res['delta_longer_right'])} on pairs whose chosen response is longer, "
                f"{_pp(res['delta_longer_wrong'])} on pairs whose rejected response is longer"
            )

    gap = None
    if ceiling and ceiling in margins:
        gap = diff(ceiling, id_name)
        note(gap, f"the ceiling - teacher gap on {id_name} (ID)")
    wrg, aog = {}, {}
    for s_ in students:
        wrg[s_] = diff(s_, id_name)
        note(wrg[s_], f"WRG of {s_} on {id_name}")
        aog[s_] = {}
        for t in oods:
            aog[s_][t] = diff(s_, t)
            note(aog[s_][t], f"AOG of {s_} on {t}")
    return {
        "unit": "characters",
        "length_driven_pp": LENGTH_DRIVEN_PP,
        "datasets": per,
        "gap": gap,
        "WRG": wrg,
        "AOG": aog,
        "flags": flags,
    }


def _stage_markers(cell_dir: Path, cell: dict) -> dict:
    """The cell's stage markers {stage name: marker dict}: ``cell["stages"]`` (the pipeline reads them into the
    cell) or else ``cell_dir/stages/*.json``. A marker that is not a JSON object raises ValueError naming it."""
    stages = cell.get("stages")
    if stages is None:
        stages = {}
        d = Path(cell_dir) / "stages"
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                stages[p.stem] = read_json(p)
            except (OSError, ValueError) as e:
                raise ValueError(f"{p}: not a readable stage marker: {e}") from None
    for name, info in stages.items():
        if not isinstance(info, dict):
            raise ValueError(f"{Path(cell_dir) / 'stages' / f'{name}.json'}: a stage marker must be a JSON object")
    return stages


def cell_truncation(cell_dir: Path, cell: dict, datasets: list) -> dict | None:
    """What truncation did to each model role's inputs, per split, from the stage markers' ``cut_counts``
    (:func:`w2s_shift.data.render.cut_counts`, written by the training and scoring stages).

    Args:
        cell_dir: ``RUN/<source>/seed<k>/``.
        cell: the cell dict (its "stages", else the marker files are read).
        datasets: the evaluation sets, listed first (then the training splits in marker order); a scoring
            marker of another set is left out.

    Returns:
        {"teacher"|"student": {split: {"pairs": n, "truncated": pairs with any token dropped, "prompt_cut_share",
        "response_cut_share" (shares of the n pairs, 0-1)}}}; the student role takes each split from the first
        student stage marker (sorted by name) that has it (every student of a cell shares tokenizer and
        max_length). None when no marker has cut counts (a run of an older version).

    Raises:
        ValueError: a marker that is not an object, or cut counts without an integer "pairs" (file and split named).
    """
    stages = _stage_markers(cell_dir, cell)
    # training stages hold their training splits' counts, scoring stages (score-<model>__<set>) their set's
    roles = {
        "teacher": [(k, v) for k, v in sorted(stages.items()) if k == "teacher" or k.startswith("score-teacher__")],
        "student": [
            (k, v)
            for k, v in sorted(stages.items())
            if k.startswith(("student-", "mechanism-"))
            or (k.startswith("score-") and not k.startswith("score-teacher__"))
        ],
    }
    out = {}
    for role, markers in roles.items():
        per = {}
        for key, mk in markers:
            for split, cc in (mk.get("cut_counts") or {}).items():
                if split in per or (key.startswith("score-") and split not in datasets):
                    continue  # a set scored once but no longer evaluated (taken out with evaluate --remove)
                n = cc.get("pairs") if isinstance(cc, dict) else None
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ValueError(
                        f"{Path(cell_dir) / 'stages'}: {role} cut_counts[{split!r}]: 'pairs' must be a "
                        f"count >= 0, got {n!r}"
                    )
                per[split] = {
                    "pairs": n,
                    "truncated": int(cc.get("truncated", 0)),
                    "prompt_cut_share": cc.get("prompt_cut", 0) / n if n else 0.0,
                    "response_cut_share": float(cc.get("response_cut_share", 0.0)),
                }
        if per:
            out[role] = {
                k: per[k] for k in [*(d for d in datasets if d in per), *(k for k in per if k not in datasets)]
            }
    return out or None


def cell_label_effect(cell_dir: Path, cell: dict, methods: list) -> dict | None:
    """What each method that built its own labels says of them (:meth:`w2s_shift.methods.Method.label_cut`; SEAM:
    how much its principles changed the labels), per entry of the cell.

    The summary of a label stage is the stage marker's recorded fields (the method's ``marker_fields``) over its
    ``.info.json`` (:meth:`~w2s_shift.methods.Method.label_info_file`). A method dict names its stage in
    "label_stage" ("seam_stage" in older files); without it, the cell's only stage of that method is used.

    Returns:
        {label: {"stage", "text", "warn", and the method's numbers}}; None when no entry has anything to say.

    Raises:
        ValueError: a summary the method cannot read, naming the stage marker.
    """
    stages = _stage_markers(cell_dir, cell)
    out = {}
    for m in methods:
        meth = method_of(m)
        if not getattr(meth, "builds_labels", False):
            continue
        st = m.get("label_stage") or m.get("seam_stage")
        if st is None:
            own = [k for k in stages if meth.owns_stage(k)]
            st = own[0] if len(own) == 1 else None
        if st is None:
            continue
        f = Path(cell_dir) / meth.label_info_file(st)
        summary = {**(read_json(f) if f.is_file() else {}), **(stages.get(st) or {})}
        try:
            cut = meth.label_cut(m, summary)
        except ValueError as e:
            raise ValueError(f"{Path(cell_dir) / 'stages' / f'{st}.json'}: {e}") from None
        if cut:
            out[m["label"]] = {"stage": st, **cut}
    return out or None


def _pp(x) -> str:
    return "n/a" if x is None else f"{x:+.1f} pp"

"""Metrics of a grid run and its report: per-cell metrics with paired bootstrap intervals, aggregation over
seeds, ``report.md`` + a self-contained ``report.html`` + ``plots/*.png``, and a side-by-side comparison of runs.

A run directory holds one cell per (source dataset, seed): ``RUN/<source>/seed<k>/`` with ``rewards/``,
``teacher_labels.jsonl``, ``logs/`` and ``drift/`` (see :func:`build_cell_metrics`). Metrics follow Le et al.
2026 (arXiv 2605.25629): WRG, AOG, NTS in percentage points (pp); PGR from Burns et al. 2023 (a ratio).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path

import numpy as np

from .data.render import TRUNCATION_RULE
from .diagnostics import (
    LENGTH_DRIVEN_PP,
    MAX_UNDEFINED,
    agreement_rate,
    expected_calibration_error,
    gap_check,
    joint_bootstrap,
    length_agreement,
    length_explained_difference,
    longer_wins_accuracy,
    margin_length_correlation,
    sigmoid,
)
from .io import read_json, read_jsonl, write_bytes_atomic, write_text_atomic

NOT_W2S = ("ceiling", "zero_shot")  # method names reported for reference, not scored as W2S students
LEVEL = 0.95


# ---- reading a cell ----------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list:
    """Rows of a JSON-lines file; ValueError naming the file and line for a missing or broken one."""
    try:
        return read_jsonl(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: not JSON ({e.msg})") from None


def _reward_rows(cell_dir: Path, model: str, dataset: str) -> tuple:
    """(ids list, chosen (B,), rejected (B,)) of ``model`` on ``dataset``; ValueError naming the file and field."""
    path = Path(cell_dir) / "rewards" / f"{model}__{dataset}.jsonl"
    rows = _read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    try:
        ids = [r.get("id", r.get("index")) for r in rows]
        c = np.array([r["reward_chosen"] for r in rows], dtype=np.float64)
        r_ = np.array([r["reward_rejected"] for r in rows], dtype=np.float64)
    except KeyError as e:
        raise ValueError(f"{path}: a row lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"{path}: reward_chosen/reward_rejected must be numbers") from None
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r_))):
        raise ValueError(f"{path}: non-finite rewards")
    return ids, c, r_


def load_rewards(cell_dir: Path, model: str, dataset: str) -> tuple:
    """(chosen rewards (B,), rejected rewards (B,)) of ``model`` on ``dataset`` from
    ``cell_dir/rewards/<model>__<dataset>.jsonl``.

    Raises:
        ValueError: the file is missing, empty, not JSON lines, or a row lacks a reward or has a non-number.
    """
    _, c, r = _reward_rows(cell_dir, model, dataset)
    return c, r


def _training_curves(path: Path) -> dict | None:
    """Loss curves from a Trainer log history: {"step": [...], "loss": [...], and "loss_w2s", "loss_anchor",
    "anchor_lambda", "anchor_drift", "anchor_ratio" (lambda x L_anchor / L_w2s), "learning_rate", "grad_norm"
    aligned with step (None where a row lacks it), "summary": last row's train_* entries}; with an anchor term
    also "anchor_ratio_mean"/"anchor_ratio_last" and "anchor_lambda_mean"/"anchor_lambda_last" (means of the
    logged values, each itself a mean over its logging interval; last = the last interval). None when the file
    is missing."""
    if not path.is_file():
        return None
    rows = _read_jsonl(path)
    logged = [r for r in rows if isinstance(r, dict) and "loss" in r and "step" in r]
    out: dict = {"step": [int(r["step"]) for r in logged], "loss": [float(r["loss"]) for r in logged]}
    for k in ("loss_w2s", "loss_anchor", "anchor_lambda", "anchor_drift", "anchor_ratio", "learning_rate", "grad_norm"):
        if any(k in r for r in logged):
            out[k] = [None if r.get(k) is None else float(r[k]) for r in logged]
    for k in ("anchor_ratio", "anchor_lambda", "anchor_drift"):
        vals = [x for x in out.get(k, []) if x is not None]
        if vals:
            out[f"{k}_mean"], out[f"{k}_last"] = float(np.mean(vals)), vals[-1]
    summary = {}
    for r in rows:
        if isinstance(r, dict) and any(k.startswith("train_") for k in r):
            summary = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out["summary"] = summary
    return out


def _drift(path: Path) -> dict:
    """A drift file {"layers": [...], "final": {dataset: {layer: {"rel_sq_err", "cka"}}}, "during": [...]}."""
    try:
        d = read_json(path)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(d, dict) or not isinstance(d.get("layers"), list) or not isinstance(d.get("final"), dict):
        raise ValueError(f"{path}: a drift file needs 'layers' (list) and 'final' (dict)")  # noqa: TRY004 (bad file)
    d.setdefault("during", [])
    return d


def _ci(x) -> list | None:
    return None if x is None else [float(x[0]), float(x[1])]


def _values_and_ci(tree):
    """Split joint_bootstrap's {"value", "ci"} leaves into a values tree and a ci95 tree."""
    if isinstance(tree, dict) and set(tree) == {"value", "ci"}:
        return tree["value"], _ci(tree["ci"])
    vals, cis = {}, {}
    for k, v in tree.items():
        vals[k], cis[k] = _values_and_ci(v)
    return vals, cis


# ---- gap check and length baseline of a cell (issue 15) -------------------------------------------------------

NO_GAP = "no weak-to-strong gap: PGR undefined, W2S metrics not meaningful"


def cell_gap_check(correct: dict, id_name: str, ceiling: str | None, n_boot: int, seed: int) -> dict | None:
    """The cell's weak-to-strong gap check (:func:`w2s_shift.diagnostics.gap_check`): ceiling minus teacher on the
    ID test pairs, paired bootstrap interval; None when the cell has no ceiling. Adds "ceiling": its label."""
    if not ceiling or ceiling not in correct:
        return None
    out = gap_check(correct[ceiling][id_name], correct["teacher"][id_name], n_boot=n_boot, seed=seed, level=LEVEL)
    return {"ceiling": ceiling, **out}


def _undefine_pgr(metrics: dict) -> None:
    """PGR of every student set to None (value and interval) in a cell that fails the gap check."""
    for m in metrics.values():
        m["PGR"] = {d: None for d in m.get("PGR", {})}
        m.setdefault("ci95", {})["PGR"] = {d: None for d in m["ci95"].get("PGR", {})}


def _response_lengths(cell_dir: Path, models: list, dataset: str, n: int) -> tuple | None:
    """(len_chosen (n,), len_rejected (n,)) from the first of ``models``' rewards files on ``dataset`` whose rows
    carry ``len_chosen`` / ``len_rejected`` (characters of the responses, written by the pipeline); None when no
    file has them (a run of an older version). ValueError naming the file and row for a bad or partial length."""
    for m in models:
        path = Path(cell_dir) / "rewards" / f"{m}__{dataset}.jsonl"
        rows = _read_jsonl(path)
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
    with len(chosen) - len(rejected) (:mod:`w2s_shift.diagnostics`), and the models flagged LENGTH-DRIVEN there:
    agreement >= ``LENGTH_DRIVEN_PP`` (90%).

    A difference is flagged EXPLAINED BY LENGTH by :func:`w2s_shift.diagnostics.length_explained_difference`
    (positive, with no gain on the pairs whose rejected response is longer; or negative, with no loss on the
    pairs whose chosen response is longer). It is checked for the ceiling - teacher gap and each student's WRG on
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
        return length_explained_difference(margins[a][d] > 0, margins["teacher"][d] > 0, *lengths[d])

    def note(res: dict, what: str) -> None:
        if res["explained_by_length"]:
            flags.append(
                f"{what} ({res['delta']:+.1f} pp) is explained by length: "
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
    (:func:`w2s_shift.data.render.cut_counts`, written by the teacher and student stages).

    Args:
        cell_dir: ``RUN/<source>/seed<k>/``.
        cell: the cell dict (its "stages", else the marker files are read).
        datasets: the evaluation sets, listed first (then the training splits in marker order).

    Returns:
        {"teacher"|"student": {split: {"pairs": n, "truncated": pairs with any token dropped, "prompt_cut_share",
        "response_cut_share" (shares of the n pairs, 0-1)}}}; the student role takes each split from the first
        student stage marker (sorted by name) that has it (every student of a cell shares tokenizer and
        max_length). None when no marker has cut counts (a run of an older version).

    Raises:
        ValueError: a marker that is not an object, or cut counts without an integer "pairs" (file and split named).
    """
    stages = _stage_markers(cell_dir, cell)
    roles = {
        "teacher": [v for k, v in stages.items() if k == "teacher"],
        "student": [v for k, v in sorted(stages.items()) if k.startswith("student-")],
    }
    out = {}
    for role, markers in roles.items():
        per = {}
        for mk in markers:
            for split, cc in (mk.get("cut_counts") or {}).items():
                if split in per:
                    continue
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


def cell_seam_effect(cell_dir: Path, cell: dict, methods: list) -> dict | None:
    """How much SEAM's principles changed its labels (issue 14 item 1), per SEAM method of the cell.

    Read from the SEAM stage marker's ``effect`` (:func:`w2s_shift.methods.seam.principle_effect`), else from
    ``seam_labels__<setting>.info.json``. A method dict names its stage in "seam_stage"; without it (an older
    metrics layout) the cell's only SEAM stage is used.

    Returns:
        {label: {"stage", "pairs", "principle_margin_differs_share" (pairs with a principle margin that differs
        from the plain margin), "label_differs_from_naive_share" (|q - q_naive| > 0.01), shares 0-1,
        "warn": either share below :data:`w2s_shift.methods.seam.EFFECT_WARN_SHARE` (0.5)}}; None when the cell
        has no SEAM method or no recorded effect.
    """
    from .methods.seam import EFFECT_WARN_SHARE

    stages = _stage_markers(cell_dir, cell)
    seam_stages = [k for k, v in stages.items() if k.startswith("seam-")]
    out = {}
    for m in methods:
        if m.get("name") != "seam":
            continue
        st = m.get("seam_stage") or (seam_stages[0] if len(seam_stages) == 1 else None)
        if st is None:
            continue
        eff = (stages.get(st) or {}).get("effect")
        f = Path(cell_dir) / f"seam_labels__{st[len('seam-') :]}.info.json"
        if eff is None and f.is_file():
            eff = read_json(f).get("effect")
        if not isinstance(eff, dict):
            continue
        try:
            pm, lb = float(eff["principle_margin_differs_share"]), float(eff["label_differs_from_naive_share"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{Path(cell_dir) / 'stages' / f'{st}.json'}: 'effect' needs the numbers "
                "'principle_margin_differs_share' and 'label_differs_from_naive_share'"
            ) from None
        out[m["label"]] = {
            "stage": st,
            "pairs": eff.get("pairs"),
            "principle_margin_differs_share": pm,
            "label_differs_from_naive_share": lb,
            "warn": bool(min(pm, lb) < EFFECT_WARN_SHARE),
        }
    return out or None


def _pp(x) -> str:
    return "n/a" if x is None else f"{x:+.1f} pp"


def build_cell_metrics(cell_dir: Path, cell: dict, bootstrap: int, seed: int) -> dict:
    """All metrics of one (source, seed) cell from its saved rewards, labels, logs and drift files.

    Args:
        cell_dir: ``RUN/<source>/seed<k>/``.
        cell: {"source", "seed", "dir", "id", "ood": [targets], "models": ["teacher", label, ...],
            "methods": [{"label", "name", "anchor_lambda", "anchor_layers", "layer_spec", "finetune"}],
            "ceiling": label or None, "zero_shot": label or None, "data": data summary, "timings": {stage: s}};
            other keys are copied into the result.
        bootstrap: bootstrap replicates (pairs resampled; ID and each OOD target independently, paired across
            models); seed: the bootstrap's seed.

    Returns:
        {"source", "seed", "dir", "id", "ood", "datasets", "models", "methods", "ceiling", "zero_shot",
         "n_pairs": {dataset: pairs},
         "accuracy": {model: {dataset: pp}}, "accuracy_ci95": {model: {dataset: [lo, hi]}},
         "accuracy_ood_mean": {model: pp}, "accuracy_ood_mean_ci95": {model: [lo, hi]},
         "metrics": {W2S label: {"WRG", "AOG": {t}, "AOG_mean", "NTS" (pp), "PGR": {dataset: ratio or None},
                                 "ci95": the same layout with [lo, hi] or None}},
         "differences": {W2S label: {"vs": naive label, "accuracy": {dataset}, "WRG", "AOG": {t}, "AOG_mean",
                                     "NTS", "ci95": {...}}} (label minus the naive student, paired),
         "calibration": {model: {dataset: {"ece": pp, "bins": reliability rows}}},
         "agreement_with_teacher": {model: {dataset: pp}},
         "drift": {label: drift file}, "teacher_labels": {"n", "mean_q", "agree_with_gold", "ece"} or None,
         "teacher_beats_chance_id": bool (the lower 95% bound of the teacher's ID accuracy is above 50),
         "gap_check": {"ceiling", "gap_pp", "ci", "n", "level", "min_gap_pp", "passed"} or None without a ceiling
             (:func:`cell_gap_check`; when it fails every student's PGR and its interval are None),
         "length_baseline": :func:`cell_length_baseline` or None (rewards files without response lengths),
         "truncation": :func:`cell_truncation`, "seam_effect": :func:`cell_seam_effect` (None when not recorded),
         "training": {model: curves}, "bootstrap": {"n", "seed", "level"}, "data", "timings_seconds", ...}.
        W2S students are the methods whose name is not ceiling or zero_shot.

    Raises:
        ValueError: a missing cell field, a missing/broken rewards file, or rewards files of one dataset that
            list different pairs for different models (the file is named).
    """
    cell_dir = Path(cell_dir)
    for k in ("source", "seed", "id", "ood", "models", "methods"):
        if k not in cell:
            raise ValueError(f"cell {cell_dir}: field {k!r} is missing")
    id_name, oods = cell["id"], list(cell["ood"])
    datasets = [id_name, *oods]
    models = list(dict.fromkeys(["teacher", *cell["models"]]))
    methods = list(cell["methods"])
    w2s = [m["label"] for m in methods if m.get("name") not in NOT_W2S and m["label"] in models]
    ceiling = cell.get("ceiling")
    baseline = next((m["label"] for m in methods if m.get("name") == "naive" and m["label"] in models), None)

    margins: dict = {m: {} for m in models}
    n_pairs: dict = {}
    for d in datasets:
        ref_ids = None
        for m in models:
            ids, c, r = _reward_rows(cell_dir, m, d)
            if ref_ids is None:
                ref_ids = ids
            elif ids != ref_ids:
                raise ValueError(
                    f"{cell_dir / 'rewards' / f'{m}__{d}.jsonl'}: its pairs (ids/order) differ from "
                    f"those of {models[0]} on {d}; paired metrics need the same pairs"
                )
            margins[m][d] = c - r
        n_pairs[d] = len(ref_ids)
    correct = {m: {d: margins[m][d] > 0 for d in datasets} for m in models}
    boot = joint_bootstrap(
        correct,
        id_name,
        oods,
        w2s,
        teacher="teacher",
        ceiling=ceiling,
        baseline=baseline,
        n_boot=bootstrap,
        seed=seed,
        level=LEVEL,
    )
    accuracy, accuracy_ci = _values_and_ci(boot["accuracy"])
    ood_mean, ood_mean_ci = _values_and_ci(boot["accuracy_ood_mean"])
    metrics = {}
    for s, tree in boot["metrics"].items():
        undefined = tree.pop("PGR_undefined_share", {})
        vals, cis = _values_and_ci(tree)
        vals.setdefault("PGR", {})
        cis.setdefault("PGR", {})
        metrics[s] = {**vals, "ci95": cis, "PGR_undefined_share": undefined}
    gap = cell_gap_check(correct, id_name, ceiling, bootstrap, seed)
    if gap is not None and not gap["passed"]:
        _undefine_pgr(metrics)
    length = cell_length_baseline(cell_dir, models, datasets, margins, id_name, oods, w2s, ceiling)
    differences = {}
    for s, tree in boot["differences"].items():
        vals, cis = _values_and_ci(tree)
        differences[s] = {"vs": baseline, **vals, "ci95": cis}

    calibration = {}
    for m in models:
        calibration[m] = {}
        for d in datasets:
            ece, rows = expected_calibration_error(sigmoid(margins[m][d]))
            calibration[m][d] = {"ece": ece, "bins": rows}
    agreement = {
        m: {d: agreement_rate(margins[m][d], margins["teacher"][d]) for d in datasets} for m in models if m != "teacher"
    }

    drift = {}
    for m in models:
        f = cell_dir / "drift" / f"{m}.json"
        if f.is_file():
            drift[m] = _drift(f)
    tl = None
    f = cell_dir / "teacher_labels.jsonl"
    if f.is_file():
        rows = _read_jsonl(f)
        try:
            q = np.array([r["q"] for r in rows], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{f}: every row needs a number 'q'") from None
        if q.size:
            agree = [bool(r.get("gold_agrees", qi > 0.5)) for r, qi in zip(rows, q)]
            tl = {
                "n": int(q.size),
                "mean_q": float(q.mean()),
                "agree_with_gold": float(100.0 * np.mean(agree)),
                "ece": expected_calibration_error(np.clip(q, 0.0, 1.0))[0],
            }
    training = {}
    for m in models:
        curves = _training_curves(cell_dir / "logs" / f"{m}.jsonl")
        if curves is not None:
            training[m] = curves

    t_lo = accuracy_ci["teacher"][id_name][0]
    consumed = {"timings"}
    extra = {k: v for k, v in cell.items() if k not in consumed}
    return {
        **extra,
        "source": cell["source"],
        "seed": cell["seed"],
        "dir": cell.get("dir", str(cell_dir)),
        "id": id_name,
        "ood": oods,
        "datasets": datasets,
        "models": models,
        "methods": methods,
        "ceiling": ceiling,
        "zero_shot": cell.get("zero_shot"),
        "n_pairs": n_pairs,
        "accuracy": accuracy,
        "accuracy_ci95": accuracy_ci,
        "accuracy_ood_mean": ood_mean,
        "accuracy_ood_mean_ci95": ood_mean_ci,
        "metrics": metrics,
        "differences": differences,
        "calibration": calibration,
        "agreement_with_teacher": agreement,
        "drift": drift,
        "teacher_labels": tl,
        "teacher_beats_chance_id": bool(t_lo > 50.0),
        "gap_check": gap,
        "length_baseline": length,
        "truncation": cell_truncation(cell_dir, cell, datasets),
        "seam_effect": cell_seam_effect(cell_dir, cell, methods),
        "training": training,
        "bootstrap": {"n": int(bootstrap), "seed": int(seed), "level": LEVEL},
        "data": cell.get("data", {}),
        "timings_seconds": {k: round(float(v), 1) for k, v in (cell.get("timings") or {}).items()},
    }


# ---- aggregation over seeds --------------------------------------------------------------------------------

_SKIP = ("ci95", "bins", "vs")


def _stat(values: list) -> dict:
    ok = [float(v) for v in values if v is not None]
    return {
        "mean": float(np.mean(ok)) if ok else None,
        "std": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
        "values": [None if v is None else float(v) for v in values],
    }


def _stats(trees: list):
    """Mean / std / per-seed values at every numeric leaf of equally shaped trees (None where one lacks it)."""
    present = [t for t in trees if t is not None]
    if not present:
        return None
    if all(isinstance(t, dict) for t in present):
        keys = list(dict.fromkeys(k for t in present for k in t if k not in _SKIP))
        out = {}
        for k in keys:
            sub = _stats([t.get(k) if isinstance(t, dict) else None for t in trees])
            if sub is not None:
                out[k] = sub
        return out
    if all(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool)) for t in trees):
        return _stat(trees)
    return None  # strings, lists: not aggregated


def aggregate(cells: list) -> dict:
    """Per source, over its seeds: mean, standard deviation (ddof=1; None for one seed) and per-seed values
    (ordered as "seeds") of every accuracy and metric.

    Returns:
        {source: {"seeds": [...], "id", "ood", "datasets", "models", "methods", "ceiling", "zero_shot",
                  "accuracy": {model: {dataset: stat}}, "accuracy_ood_mean": {model: stat},
                  "metrics": {label: {"WRG": stat, "AOG": {t: stat}, "AOG_mean", "NTS", "PGR": {d: stat}}},
                  "differences": {label: {...}}, "calibration_ece": {model: {dataset: stat}},
                  "agreement_with_teacher": {model: {dataset: stat}},
                  "drift_final": {label: {dataset: {layer: {"rel_sq_err": stat, "cka": stat}}}},
                  "teacher_labels": {"n", "mean_q", "agree_with_gold", "ece": stat},
                  "teacher_beats_chance_id": [bool per seed]}}
        with stat = {"mean", "std", "values"}; a mean over seeds where the value is defined (PGR may be None).
    """
    by_source: dict = {}
    for c in cells:
        by_source.setdefault(c["source"], []).append(c)
    out = {}
    for src, cs in by_source.items():
        cs = sorted(cs, key=lambda c: c["seed"])
        methods = list({m["label"]: m for c in cs for m in c["methods"]}.values())
        out[src] = {
            "seeds": [c["seed"] for c in cs],
            "id": cs[0]["id"],
            "ood": list(dict.fromkeys(d for c in cs for d in c["ood"])),
            "datasets": list(dict.fromkeys(d for c in cs for d in c["datasets"])),
            "models": list(dict.fromkeys(m for c in cs for m in c["models"])),
            "methods": methods,
            "ceiling": next((c["ceiling"] for c in cs if c.get("ceiling")), None),
            "zero_shot": next((c["zero_shot"] for c in cs if c.get("zero_shot")), None),
            "accuracy": _stats([c["accuracy"] for c in cs]),
            "accuracy_ood_mean": _stats([c.get("accuracy_ood_mean") for c in cs]),
            "metrics": _stats([c["metrics"] for c in cs]),
            "differences": _stats([c.get("differences") for c in cs]) or {},
            "calibration_ece": _stats(
                [{m: {d: v["ece"] for d, v in per.items()} for m, per in c["calibration"].items()} for c in cs]
            ),
            "agreement_with_teacher": _stats([c["agreement_with_teacher"] for c in cs]),
            "drift_final": _stats([{lab: v["final"] for lab, v in c.get("drift", {}).items()} for c in cs]) or {},
            "teacher_labels": _stats([c.get("teacher_labels") for c in cs]) or {},
            "teacher_beats_chance_id": [c["teacher_beats_chance_id"] for c in cs],
        }
    return out


# ---- views of one source: single seed (value + 95% CI) or several (mean ± std) -------------------------------


def _get(tree, *keys):
    for k in keys:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


class _Source:
    """One source's cells and aggregate; ``get`` returns (value, (lo, hi) or None, kind) with kind "ci"
    (one seed: the 95% bootstrap interval) or "std" (several seeds: mean and mean ± std)."""

    def __init__(self, name: str, cells: list, agg: dict):
        self.name, self.cells, self.agg = name, sorted(cells, key=lambda c: c["seed"]), agg
        self.multi = len(self.cells) > 1
        self.id = agg["id"]
        self.ood = agg["ood"]
        self.datasets = [self.id, *self.ood]
        self.methods = {m["label"]: m for m in agg["methods"]}
        self.ceiling, self.zero_shot = agg.get("ceiling"), agg.get("zero_shot")
        self.w2s = [lab for lab, m in self.methods.items() if m.get("name") not in NOT_W2S and lab in agg["models"]]
        rest = [m for m in agg["models"] if m not in ("teacher", *self.w2s, self.ceiling, self.zero_shot)]
        self.rows = ["teacher", *self.w2s, *[x for x in (self.ceiling, self.zero_shot) if x in agg["models"]], *rest]

    def get(self, section: str, *keys) -> tuple:
        if self.multi:
            sec = {"calibration": "calibration_ece"}.get(section, section)
            st = _get(self.agg, sec, *keys)
            if not isinstance(st, dict) or st.get("mean") is None:
                return None, None, "std"
            sd = st["std"] or 0.0
            return st["mean"], (st["mean"] - sd, st["mean"] + sd), "std"
        c = self.cells[0]
        if section == "accuracy":
            return _get(c, "accuracy", *keys), _get(c, "accuracy_ci95", *keys), "ci"
        if section == "accuracy_ood_mean":
            return _get(c, "accuracy_ood_mean", *keys), _get(c, "accuracy_ood_mean_ci95", *keys), "ci"
        if section in ("metrics", "differences"):
            return _get(c, section, keys[0], *keys[1:]), _get(c, section, keys[0], "ci95", *keys[1:]), "ci"
        if section == "calibration":
            return _get(c, "calibration", *keys, "ece"), None, "ci"
        if section == "drift_final":
            return _get(c, "drift", keys[0], "final", *keys[1:]), None, "ci"
        return _get(c, section, *keys), None, "ci"

    def fmt(self, section: str, *keys, signed: bool = False, digits: int = 2, star: bool = False) -> str:
        v, iv, kind = self.get(section, *keys)
        if v is None:
            return "n/a"
        f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
        if kind == "std":
            st = _get(self.agg, {"calibration": "calibration_ece"}.get(section, section), *keys)
            return f.format(v) + (f" ± {st['std']:.{digits}f}" if st.get("std") is not None else "")
        if iv is None:
            return f.format(v)
        g = f"{{:+.{max(digits - 1, 1)}f}}" if signed else f"{{:.{max(digits - 1, 1)}f}}"
        mark = "*" if star and (iv[0] > 0 or iv[1] < 0) else ""
        return f"{f.format(v)}{mark} [{g.format(iv[0])}, {g.format(iv[1])}]"


def _describe(m: dict | None) -> str:
    """Short description of a method dict: name, lambda and anchored layers for ANCHOR, fine-tuning mode."""
    if m is None:
        return "weak teacher"
    parts = [str(m.get("name", "?"))]
    if m.get("name") == "anchor":
        lam = m.get("anchor_lambda")
        if m.get("anchor_lambda_mode") == "auto":
            parts.append(f"λ=auto (target drift {m.get('anchor_target_drift')})")
        elif lam is not None:
            parts.append(f"λ={lam:g}" + (" (relative error)" if m.get("anchor_normalize") else ""))
        spec = m.get("layer_spec") or ("last" if m.get("anchor_layers") in (None, "last") else "custom")
        parts.append(f"layers {spec}" + (f" {m.get('anchor_layers')}" if spec == "custom" else ""))
    if m.get("finetune"):
        parts.append(str(m["finetune"]))
    return ", ".join(parts)


def _main_table(s: _Source) -> tuple:
    """(header, rows) of the paper's table: accuracy per test set, WRG, AOG per target and mean, NTS, PGR (ID)."""
    head = (
        ["model", "method"]
        + [f"{d} (ID) acc" if d == s.id else f"{d} acc" for d in s.datasets]
        + ["WRG"]
        + [f"AOG {d}" for d in s.ood]
        + ["AOG mean", "NTS", "PGR (ID)"]
    )
    best = {}
    for key in ("AOG_mean", "NTS"):
        vals = [(s.get("metrics", lab, key)[0], lab) for lab in s.w2s]
        vals = [x for x in vals if x[0] is not None]
        top = max(vals)[0] if vals else None
        if len(vals) > 1 and sum(v == top for v, _ in vals) == 1:  # bold a unique best only
            best[key] = max(vals)[1]
    rows = []
    for mdl in s.rows:
        cells = [mdl, _describe(s.methods.get(mdl)) if mdl != "teacher" else "weak teacher"]
        cells += [s.fmt("accuracy", mdl, d) for d in s.datasets]
        if mdl in s.w2s:
            cells.append(s.fmt("metrics", mdl, "WRG", signed=True))
            cells += [s.fmt("metrics", mdl, "AOG", d, signed=True) for d in s.ood]
            for key in ("AOG_mean", "NTS"):
                txt = s.fmt("metrics", mdl, key, signed=True)
                cells.append(f"**{txt}**" if best.get(key) == mdl else txt)
            cells.append(_pgr_cell(s, mdl))
        else:
            cells += ["–"] * (len(head) - len(cells))
        rows.append(cells)
    return head, rows


def _pgr_cell(s: _Source, mdl: str) -> str:
    """PGR (ID) of a student; "undefined (no W2S gap)" where the cell fails the gap check (every seed failing),
    else the value with the failing seeds named. One seed: also the share of bootstrap replicates where PGR is
    undefined (the ceiling not above the teacher on the resample) when any is, and the interval n/a above
    ``MAX_UNDEFINED`` (5%) of them."""
    failed = [c["seed"] for c in s.cells if (c.get("gap_check") or {}).get("passed") is False]
    if failed and len(failed) == len(s.cells):
        return "undefined (no W2S gap)"
    txt = s.fmt("metrics", mdl, "PGR", s.id)
    txt += f" (undefined in seed{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))})" if failed else ""
    share = None if s.multi else _get(s.cells[0], "metrics", mdl, "PGR_undefined_share", s.id)
    if not share or _get(s.cells[0], "metrics", mdl, "PGR", s.id) is None:
        return txt
    if share > MAX_UNDEFINED:
        return f"{txt} [n/a: undefined in {100 * share:.0f}% of resamples]"
    return f"{txt} ({100 * share:.1f}% of resamples undefined)"


def _gap_blocks(s: _Source) -> list:
    """Report blocks of the weak-to-strong gap check of every cell of a source (issue 15)."""
    items, failing = [], False
    for c in s.cells:
        g = c.get("gap_check")
        if "gap_check" not in c:
            items.append(f"seed {c['seed']}: not computed (a metrics.json of an older w2s-shift version)")
            continue
        if g is None:
            items.append(f"seed {c['seed']}: no ceiling in this cell, the gap check cannot run")
            continue
        lo, hi = g["ci"]
        what = (
            f"seed {c['seed']}: `{g['ceiling']}` − teacher on {c['id']} (ID) = {g['gap_pp']:+.2f} pp "
            f"[{lo:+.2f}, {hi:+.2f}], {g['n']} pairs"
        )
        if g["passed"]:
            items.append(f"{what}: passes (≥ {g['min_gap_pp']:g} pp, interval above 0)")
        else:
            failing = True
            items.append(f"{what}: **{NO_GAP}**")
    blocks = [("h3", "Weak-to-strong gap check")]
    if failing:
        blocks.append(("p", f"**Warning: {NO_GAP}** (in the seeds marked below)."))
    blocks += [
        (
            "p",
            (
                f"The strong ceiling must beat the weak teacher on the ID test split by at least "
                f"{next((c['gap_check']['min_gap_pp'] for c in s.cells if c.get('gap_check')), 5.0):g} pp "
                "with the lower end of the paired 95% bootstrap interval (test pairs resampled, both models on "
                "the same pairs) above 0; otherwise PGR is undefined in that cell."
            ),
        ),
        ("ul", items),
    ]
    return blocks


def _length_blocks(s: _Source) -> list:
    """Report blocks of the "longer response wins" baseline of every cell of a source (issue 15)."""
    cells = [c for c in s.cells if c.get("length_baseline")]
    if not cells:
        return []
    thr = cells[0]["length_baseline"]["length_driven_pp"]
    blocks = [
        ("h3", 'Length baseline: "longer response wins"'),
        (
            "p",
            (
                "Length = characters of the response text. First row: accuracy (%) of preferring the longer "
                "response (equal lengths count 1/2). Model rows: agreement (%) with longer-wins (pairs on which "
                "the model prefers the longer response; equal lengths count 1/2) and the Pearson correlation r "
                "of the reward margin with len(chosen) − len(rejected). Flags: a model agreeing with "
                f"longer-wins on ≥ {thr:g}% of a set is length-driven; a gap, WRG or AOG (model − teacher) is "
                "explained by length when it is positive with no gain on the pairs whose rejected response is "
                "longer, or negative with no loss on the pairs whose chosen response is longer."
            ),
        ),
    ]
    for c in cells:
        lb = c["length_baseline"]
        ds = list(lb["datasets"])
        head = ["seed " + str(c["seed"])] + [f"{d}{' (ID)' if d == c['id'] else ''}" for d in ds]
        rows = [["longer wins (accuracy)"] + [f"{lb['datasets'][d]['longer_wins_accuracy']:.1f}" for d in ds]]
        for m in c["models"]:
            r = [m]
            for d in ds:
                per = lb["datasets"][d]
                corr = per["margin_length_corr"].get(m)
                r.append(
                    f"{per['agreement'][m]:.1f} / r {'n/a' if corr is None else f'{corr:+.2f}'}"
                    + (" **length-driven**" if m in per["length_driven"] else "")
                )
            rows.append(r)
        blocks.append(("table", head, rows))
        blocks.append(
            (
                "ul",
                [f"**{f}**" for f in lb["flags"]] or ["no gap, WRG or AOG explained by length; no length-driven model"],
            )
        )
    return blocks


def _truncation_blocks(s: _Source) -> list:
    """Report blocks: the share of pairs whose response was cut, per seed, model role and split (issue 15 item 2),
    and SEAM's principle effect shares with their warning (issue 14 item 1)."""
    from .methods.seam import EFFECT_WARN_SHARE

    rows = []
    for c in s.cells:
        for role, per in (c.get("truncation") or {}).items():
            for d, t in per.items():
                name = f"{d} (ID)" if d == c["id"] else d if d in c["datasets"] else f"{d} (training)"
                rows.append(
                    [
                        str(c["seed"]),
                        role,
                        name,
                        str(t["pairs"]),
                        f"{100 * t['truncated'] / t['pairs']:.1f}" if t["pairs"] else "0.0",
                        f"{100 * t['prompt_cut_share']:.1f}",
                        f"{100 * t['response_cut_share']:.1f}",
                    ]
                )
    blocks = []
    if rows:
        blocks += [
            ("h3", "Truncation"),
            (
                "p",
                f"Rendering rule: {TRUNCATION_RULE}. Shares (%) of the pairs of each split whose chosen or "
                "rejected sequence was truncated, lost prompt tokens, or lost response tokens (the response "
                "was cut; its end is always kept), per model role (each role at its own max_length).",
            ),
            ("table", ["seed", "model", "split", "pairs", "truncated %", "prompt cut %", "response cut %"], rows),
        ]
    items, warn = [], False
    for c in s.cells:
        for lab, e in (c.get("seam_effect") or {}).items():
            warn |= e["warn"]
            items.append(
                f"seed {c['seed']}, {lab}: a principle margin differs from the plain margin on "
                f"{100 * e['principle_margin_differs_share']:.1f}% of {e['pairs']} student-train pairs; the "
                f"label differs from Naive's by > 0.01 on {100 * e['label_differs_from_naive_share']:.1f}%"
                + (
                    f" — **warning: below {100 * EFFECT_WARN_SHARE:.0f}%, SEAM's labels are close to Naive's**"
                    if e["warn"]
                    else ""
                )
            )
    if items:
        blocks += [
            ("h3", "SEAM: effect of the principles"),
            *(
                [
                    (
                        "p",
                        f"**Warning:** in the runs marked below, a principle changed the teacher margin or the "
                        f"label on fewer than {100 * EFFECT_WARN_SHARE:.0f}% of pairs: SEAM is nearly Naive "
                        "there.",
                    )
                ]
                if warn
                else []
            ),
            ("ul", items),
        ]
    return blocks


def _diff_table(s: _Source) -> tuple | None:
    base = next((c["differences"][k]["vs"] for c in s.cells for k in c.get("differences", {})), None)
    labs = [lab for lab in s.w2s if lab != base and s.get("differences", lab, "NTS")[0] is not None]
    if base is None or not labs:
        return None
    head = ["model"] + [f"Δ acc {d}" for d in s.datasets] + ["Δ AOG mean", "Δ NTS"]
    rows = []
    for lab in labs:
        rows.append(
            [lab]
            + [s.fmt("differences", lab, "accuracy", d, signed=True, star=True) for d in s.datasets]
            + [s.fmt("differences", lab, k, signed=True, star=True) for k in ("AOG_mean", "NTS")]
        )
    return base, head, rows


def _calib_table(s: _Source) -> tuple:
    head = ["model"] + [f"ECE {d}" for d in s.datasets] + [f"agree w/ teacher {d}" for d in s.datasets]
    rows = []
    for mdl in s.rows:
        r = [mdl] + [s.fmt("calibration", mdl, d) for d in s.datasets]
        r += ["–" if mdl == "teacher" else s.fmt("agreement_with_teacher", mdl, d, digits=1) for d in s.datasets]
        rows.append(r)
    return head, rows


def _drift_table(s: _Source) -> tuple | None:
    labs = list(dict.fromkeys(lab for c in s.cells for lab in c.get("drift", {})))
    if not labs:
        return None
    dsets = list(dict.fromkeys(d for c in s.cells for v in c.get("drift", {}).values() for d in v["final"]))
    head = ["model", "layer"] + [f"{d} rel. sq. err / CKA" for d in dsets]
    rows = []
    for lab in labs:
        layers = next(c["drift"][lab]["layers"] for c in s.cells if lab in c.get("drift", {}))
        for i, layer in enumerate(layers):
            name = f"{layer}" + (" (final output)" if i == len(layers) - 1 else "")
            r = [lab, name]
            for d in dsets:
                e, _, _ = s.get("drift_final", lab, d, str(layer), "rel_sq_err")
                k, _, _ = s.get("drift_final", lab, d, str(layer), "cka")
                r.append("n/a" if e is None else f"{e:.3g} / {k:.4f}" if k is not None else f"{e:.3g} / n/a")
            rows.append(r)
    return head, rows


# ---- plots ----------------------------------------------------------------------------------------------


def _slug(x: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", x)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _fig(ncols: int, width: float = 6.0, height: float = 4.2):
    from matplotlib.figure import (
        Figure,  # object API: no pyplot global state, no GUI backend
    )

    fig = Figure(figsize=(width * ncols, height))
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _err(v, iv) -> list:
    if v is None or iv is None:
        return [[0.0], [0.0]]
    return [[max(v - iv[0], 0.0)], [max(iv[1] - v, 0.0)]]


def _acc_ylim(ax, pts: list) -> None:
    """Accuracy axis from just below chance (or the lowest bound) to above the highest interval bound."""
    pts = [p for p in pts if p[0] is not None]
    if pts:
        lo = min(p[1][0] if p[1] else p[0] for p in pts)
        hi = max(p[1][1] if p[1] else p[0] for p in pts)
        ax.set_ylim(max(0.0, min(lo, 50.0) - 5), min(100.0, hi) + 3)
    ax.axhline(50, color="gray", ls=":", lw=1)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _err_note(s: _Source) -> str:
    return "error bars: ± std over seeds" if s.multi else "error bars: 95% bootstrap interval"


def _plot_accuracy(s: _Source) -> bytes | None:
    rows = [m for m in s.rows if s.get("accuracy", m, s.id)[0] is not None]
    if not rows:
        return None
    fig, (ax,) = _fig(1, width=max(7.0, 0.45 * len(rows) * len(s.datasets) + 2), height=4.5)
    w = 0.8 / len(s.datasets)
    for j, (d, col) in enumerate(zip(s.datasets, _colors(len(s.datasets)))):
        for i, m in enumerate(rows):
            v, iv, _ = s.get("accuracy", m, d)
            if v is None:
                continue
            ax.bar(
                i + (j - (len(s.datasets) - 1) / 2) * w,
                v,
                w,
                color=col,
                yerr=_err(v, iv),
                capsize=2,
                label=(f"{d} (ID)" if d == s.id else d) if i == 0 else None,
            )
    ax.set_xticks(range(len(rows)), rows, rotation=25, ha="right")
    ax.set_ylabel("pairwise accuracy (%)")
    _acc_ylim(ax, [s.get("accuracy", m, d) for m in rows for d in s.datasets])
    ax.set_title(f"{s.name}: ID and OOD accuracy ({_err_note(s)}; dotted: chance)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="test set", title_fontsize=8)
    return _png(fig)


def _anchor_groups(s: _Source) -> dict:
    """ANCHOR students grouped by anchored layers (and fine-tuning mode when several are used)."""
    anchors = [m for lab, m in s.methods.items() if m.get("name") == "anchor" and lab in s.w2s]
    several_ft = len({m.get("finetune") for m in anchors if m.get("finetune")}) > 1
    groups: dict = {}
    for m in anchors:
        spec = m.get("layer_spec") or "last"
        key = (
            spec
            + (f" {m.get('anchor_layers')}" if spec == "custom" else "")
            + (f", {m.get('finetune') or '?'}" if several_ft else "")
        )
        key += ", λ auto" if m.get("anchor_lambda_mode") == "auto" else ""  # no place on a fixed-λ axis
        groups.setdefault(key, []).append(m)
    for ms in groups.values():
        ms.sort(key=lambda m: float(m.get("anchor_lambda") or 0.0))
    return groups


def _naive(s: _Source) -> str | None:
    return next((lab for lab in s.w2s if s.methods[lab].get("name") == "naive"), None)


def _plot_lambda(s: _Source) -> bytes | None:
    groups = {k: ms for k, ms in _anchor_groups(s).items() if not k.endswith("λ auto")}
    lams = sorted({float(m.get("anchor_lambda") or 0.0) for ms in groups.values() for m in ms})
    if len(lams) < 2:
        return None
    fig, (ax1, ax2) = _fig(2)
    naive = _naive(s)
    for (key, ms), col in zip(groups.items(), _colors(len(groups))):
        x = [float(m.get("anchor_lambda") or 0.0) for m in ms]
        for ax, sec, keys, ls, what in (
            (ax1, "accuracy", (s.id,), "-", "ID"),
            (ax1, "accuracy_ood_mean", (), "--", "OOD mean"),
            (ax2, "metrics", ("NTS",), "-", "NTS"),
        ):
            pts = [s.get(sec, m["label"], *keys) for m in ms]
            y = [p[0] for p in pts]
            e = np.array([_err(p[0], p[1]) for p in pts])[:, :, 0].T
            ax.errorbar(
                x,
                y,
                yerr=e,
                color=col,
                ls=ls,
                marker="o",
                ms=4,
                capsize=3,
                elinewidth=0.8,
                alpha=0.9,
                label=f"{key}: {what}",
            )
    if naive:
        for ax, sec, keys, ls, what in (
            (ax1, "accuracy", (s.id,), "-", "ID"),
            (ax1, "accuracy_ood_mean", (), "--", "OOD mean"),
            (ax2, "metrics", ("NTS",), "-", "NTS"),
        ):
            v = s.get(sec, naive, *keys)[0]
            if v is not None:
                ax.axhline(v, color="gray", ls=ls, lw=1, label=f"naive: {what}")
    pos = [v for v in lams if v > 0]
    for ax in (ax1, ax2):
        ax.set_xscale("symlog", linthresh=min(pos) if pos else 1e-6)
        ax.set_xticks(lams, [f"{v:g}" for v in lams], rotation=30)
        ax.set_xlim(
            -0.5 * min(pos) if (0.0 in lams and pos) else min(pos) / 3 if pos else -1.0,
            max(lams) * 3 if max(lams) > 0 else 1.0,
        )
        ax.set_xlabel("ANCHOR λ (symlog; 0 = no anchor)")
        ax.legend(fontsize=7)
    ax2.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("pairwise accuracy (%)")
    ax2.set_ylabel("NTS (pp)")
    ax1.set_title(f"{s.name}: accuracy vs λ ({_err_note(s)})", fontsize=10)
    ax2.set_title(f"{s.name}: net transfer score vs λ", fontsize=10)
    return _png(fig)


def _plot_layers(s: _Source) -> bytes | None:
    groups = _anchor_groups(s)
    if len(groups) < 2:
        return None
    naive = _naive(s)
    bars = ([(naive, "naive")] if naive else []) + [
        (
            m["label"],
            f"{key}\nλ={float(m.get('anchor_lambda') or 0):g}" if m.get("anchor_lambda_mode") != "auto" else key,
        )
        for key, ms in groups.items()
        for m in ms
    ]
    fig, (ax1, ax2) = _fig(2, width=max(6.0, 0.9 * len(bars) + 2))
    x = np.arange(len(bars))
    for off, sec, keys, what, col in (
        (-0.2, "accuracy", (s.id,), "ID", "C0"),
        (0.2, "accuracy_ood_mean", (), "OOD mean", "C1"),
    ):
        for i, (lab, _) in enumerate(bars):
            v, iv, _ = s.get(sec, lab, *keys)
            if v is not None:
                ax1.bar(i + off, v, 0.4, color=col, yerr=_err(v, iv), capsize=2, label=what if i == 0 else None)
    for i, (lab, _) in enumerate(bars):
        v, iv, _ = s.get("metrics", lab, "NTS")
        if v is not None:
            ax2.bar(i, v, 0.6, color="C2" if v >= 0 else "C3", yerr=_err(v, iv), capsize=2)
    _acc_ylim(
        ax1, [s.get(sec, lab, *k) for lab, _ in bars for sec, k in (("accuracy", (s.id,)), ("accuracy_ood_mean", ()))]
    )
    for ax in (ax1, ax2):
        ax.set_xticks(x, [b[1] for b in bars], fontsize=8)
    ax2.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("pairwise accuracy (%)")
    ax2.set_ylabel("NTS (pp)")
    ax1.legend(fontsize=8)
    ax1.set_title(f"{s.name}: anchored layers ({_err_note(s)})", fontsize=10)
    ax2.set_title(f"{s.name}: NTS per anchored layer set", fontsize=10)
    return _png(fig)


def _final_drift_point(c: dict, lab: str) -> tuple:
    """(mean rel. sq. err, mean CKA) of the final output layer over the OOD targets in the drift file (all
    datasets when none is OOD)."""
    d = c["drift"][lab]
    last = str(d["layers"][-1]) if d["layers"] else None
    dsets = [x for x in d["final"] if x in c["ood"]] or list(d["final"])
    e = [d["final"][x].get(last, {}).get("rel_sq_err") for x in dsets]
    k = [d["final"][x].get(last, {}).get("cka") for x in dsets]
    e, k = [v for v in e if v is not None], [v for v in k if v is not None]
    return (float(np.mean(e)) if e else None), (float(np.mean(k)) if k else None)


def _plot_drift(s: _Source) -> bytes | None:
    pts = []
    for c in s.cells:
        for lab in c.get("drift", {}):
            e, k = _final_drift_point(c, lab)
            y = c.get("accuracy_ood_mean", {}).get(lab)
            if y is not None and (e is not None or k is not None):
                pts.append((lab, c["seed"], e, k, y))
    if not pts:
        return None
    names = list(dict.fromkeys(s.methods.get(p[0], {}).get("name", p[0]) for p in pts))
    col = dict(zip(names, _colors(len(names))))
    fig, (ax1, ax2) = _fig(2)
    first_seed = s.cells[0]["seed"]
    for lab, seed, e, k, y in pts:
        name = s.methods.get(lab, {}).get("name", lab)
        for ax, x in ((ax1, e), (ax2, k)):
            if x is None:
                continue
            ax.scatter([x], [y], color=col[name], s=30)
            if seed == first_seed:
                ax.annotate(lab, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if all(p[2] is None or p[2] > 0 for p in pts) and any(p[2] is not None for p in pts):
        ax1.set_xscale("log")
    for ax in (ax1, ax2):
        ax.margins(0.12)
    for n, c_ in col.items():
        ax1.scatter([], [], color=c_, label=n)
    ax1.legend(fontsize=8)
    ax1.set_xlabel("relative squared drift of the final output (OOD mean)")
    ax2.set_xlabel("linear CKA to the reference (OOD mean)")
    for ax in (ax1, ax2):
        ax.set_ylabel("OOD mean pairwise accuracy (%)")
    ax1.set_title(f"{s.name}: representation drift vs OOD accuracy", fontsize=10)
    ax2.set_title(f"{s.name}: similarity to the pretrained reference", fontsize=10)
    return _png(fig)


def _plot_training(s: _Source) -> bytes | None:
    c = s.cells[0]
    curves = {m: v for m, v in c.get("training", {}).items() if v.get("step")}
    if not curves:
        return None
    anchor = {m: v for m, v in curves.items() if any(x for x in v.get("loss_anchor", []) if x)}
    during = {lab: d["during"] for lab, d in c.get("drift", {}).items() if d.get("during")}
    n = 1 + bool(anchor) + bool(during)
    fig, axes = _fig(n)
    names = list(dict.fromkeys([*curves, *during]))
    cols = dict(zip(names, _colors(len(names))))
    for m, v in curves.items():
        axes[0].plot(v["step"], v["loss"], color=cols[m], ls="--" if m == "teacher" else "-", marker=".", label=m)
    axes[0].set_ylabel("training loss")
    axes[0].set_title(f"{s.name} seed {c['seed']}: loss per step", fontsize=10)
    i = 1
    if anchor:
        for m, v in anchor.items():
            pts = [(st, x) for st, x in zip(v["step"], v["loss_anchor"]) if x]
            axes[i].plot([p[0] for p in pts], [p[1] for p in pts], color=cols[m], marker="o", ms=3, label=m)
        axes[i].set_yscale("log")
        axes[i].set_ylabel("ANCHOR term L_anchor (MSE, or relative error when normalized)")
        axes[i].set_title("anchor term per step", fontsize=10)
        i += 1
    if during:
        for lab, rows in during.items():
            layers = c["drift"][lab]["layers"]
            last = str(layers[-1]) if layers else None
            by_step: dict = {}
            for r in rows:
                v = (r.get(last) or {}).get("rel_sq_err") if last else None
                if v is not None:
                    by_step.setdefault(int(r["step"]), []).append(v)
            st = sorted(by_step)
            axes[i].plot(st, [np.mean(by_step[k]) for k in st], color=cols[lab], marker="o", ms=3, label=lab)
        axes[i].set_ylabel("relative squared drift (final output)")
        axes[i].set_title("drift during training (mean over probe sets)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return _png(fig)


PLOTS = (
    ("accuracy", _plot_accuracy, "ID vs OOD pairwise accuracy per model"),
    ("lambda", _plot_lambda, "ANCHOR λ ablation: ID / OOD mean accuracy and NTS"),
    ("layers", _plot_layers, "ANCHOR layer ablation"),
    ("drift", _plot_drift, "Representation drift vs OOD accuracy"),
    ("training", _plot_training, "Training curves"),
)


# ---- document: one block list rendered to Markdown and to HTML ----------------------------------------------


def _md_table(head: list, rows: list) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _inline_html(text: str) -> str:
    t = html.escape(str(text), quote=False)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


_CELL = re.compile(r"^(.*?)\s(\[[^\]]*\])$")


def _html_cell(x, tag: str = "td") -> str:
    t = str(x)
    num = bool(re.match(r"^\**[+\-−]?\d", t))
    m = _CELL.match(t)
    inner = (
        f"{_inline_html(m.group(1))}<br><span class=ci>{_inline_html(m.group(2))}</span>"
        if m and tag == "td"
        else _inline_html(t)
    )
    return f"<{tag}{' class=num' if num and tag == 'td' else ''}>{inner}</{tag}>"


def _html_table(head: list, rows: list) -> str:
    out = ["<div class=tw><table><thead><tr>" + "".join(_html_cell(h, "th") for h in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(_html_cell(x) for x in r) + "</tr>" for r in rows]
    return "\n".join(out) + "</tbody></table></div>"


_CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1500px;
padding:0 16px;color:#1b1b1b;line-height:1.45}
h1{font-size:1.5em;border-bottom:2px solid #ddd;padding-bottom:4px}h2{font-size:1.25em;margin-top:1.8em;
border-bottom:1px solid #e5e5e5}h3{font-size:1.05em;margin-top:1.4em}
.tw{overflow-x:auto;margin:8px 0 14px}table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #d6d6d6;padding:3px 7px;vertical-align:top}th{background:#f1f3f5;text-align:center}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}tbody tr:nth-child(even){background:#fafafa}
.ci{color:#777;font-size:11px}code{background:#f3f3f3;padding:0 3px;border-radius:3px}
figure{margin:10px 0 22px}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:12px;color:#555}
p.note,li{font-size:13.5px}
"""  # noqa: E501 (CSS kept byte-identical: report.html output unchanged)


def _render(blocks: list, title: str) -> tuple:
    """(Markdown text, self-contained HTML text) of the report blocks."""
    md, ht = [], []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            md.append("#" * int(kind[1]) + " " + b[1])
            ht.append(f"<{kind}>{_inline_html(b[1])}</{kind}>")
        elif kind == "p":
            md.append(b[1])
            ht.append(f"<p class=note>{_inline_html(b[1])}</p>")
        elif kind == "ul":
            md.append("\n".join(f"- {x}" for x in b[1]))
            ht.append("<ul>" + "".join(f"<li>{_inline_html(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            md.append(_md_table(b[1], b[2]))
            ht.append(_html_table(b[1], b[2]))
        elif kind == "img":
            _, rel, data, caption = b
            md.append(f"![{caption}]({rel})")
            ht.append(
                f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
                f'{base64.b64encode(data).decode("ascii")}"><figcaption>{_inline_html(caption)}</figcaption></figure>'
            )
        md.append("")
    page = (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(ht) + "\n</body></html>\n"
    )
    return "\n".join(md), page


def _name(v) -> str | None:
    if isinstance(v, dict):
        return v.get("name")
    return v if isinstance(v, str) else None


def _cell_details(c: dict) -> list:
    """Data, teacher labels, rendering and time of one cell, as list items."""
    items = []
    d = c.get("data") or {}
    if d.get("splits"):
        how = (
            f"resplit for this seed (split seed {d.get('split_seed')})"
            if d.get("resplit_per_seed")
            else f"one split for every seed (data.seed {d['split_seed']})"
            if "split_seed" in d
            else None
        )
        items.append(f"splits (by prompt, no prompt in two): {d['splits']}" + (f"; {how}" if how else ""))
    if d.get("shortfalls"):
        items.append(
            "requested sizes not met: "
            + "; ".join(f"{x['split']} {x['available']} of {x['requested']}" for x in d["shortfalls"])
        )
    src = d.get("source") or {}
    sk = src.get("invalid_rows_skipped") or {}
    if src:
        items.append(
            f"source rows skipped as invalid: {sk.get('skipped', 0)} {sk.get('by_reason', {})}; "
            f"duplicate prompts removed: {src.get('duplicate_prompts_removed', 0)}"
        )
    for name, o in (d.get("ood") or {}).items():
        osk = (o.get("invalid_rows_skipped") or {}).get("skipped", 0)
        items.append(
            f"OOD {name}: {o.get('used')} pairs used; invalid rows skipped {osk}; "
            f"prompts overlapping the source removed {o.get('prompt_overlap_removed', 0)}"
        )
    items.append(f"test pairs: {c['n_pairs']}")
    lo, hi = c["accuracy_ci95"]["teacher"][c["id"]]
    items.append(
        f"teacher beats chance on the ID test split with its 95% interval clear of 50%: "
        f"{'yes' if c['teacher_beats_chance_id'] else '**NO**'} ({lo:.1f}–{hi:.1f})"
    )
    tl = c.get("teacher_labels")
    if tl:
        items.append(
            f"teacher soft labels: {tl['n']} on student-train, mean q {tl['mean_q']:.3f}, agreeing with gold on "
            f"{tl['agree_with_gold']:.1f}% of pairs, ECE {tl['ece']:.2f} pp"
        )
    for stage, info in (c.get("stages") or {}).items():
        if isinstance(info, dict) and ("rendering" in info or "truncated_pairs" in info):
            items.append(
                f"{stage}: chat template {info.get('rendering')}; truncated pairs {info.get('truncated_pairs')}"
            )
    if c.get("rendering"):
        items.append(f"rendering: {c['rendering']}")
    if c.get("truncated_pairs"):
        items.append(f"truncated pairs: {c['truncated_pairs']}")
    for m, v in c.get("training", {}).items():  # the anchor term's weight in the loss (issue 15)
        if v.get("anchor_ratio_mean") is not None:
            items.append(
                f"{m}: λ × L_anchor / L_w2s over training mean {v['anchor_ratio_mean']:.3g}, last "
                f"{v['anchor_ratio_last']:.3g}; λ mean {v['anchor_lambda_mean']:.3g}, "
                f"last {v['anchor_lambda_last']:.3g}; "
                f"batch drift (relative squared error) last {v['anchor_drift_last']:.3g}"
            )
    runtime = {
        m: v["summary"].get("train_runtime")
        for m, v in c.get("training", {}).items()
        if v.get("summary", {}).get("train_runtime") is not None
    }
    if runtime:
        items.append("training runtime (s): " + ", ".join(f"{m} {t:.1f}" for m, t in runtime.items()))
    if c.get("timings_seconds"):
        items.append(f"stages (s): {c['timings_seconds']}")
    return items


def write_report(run_dir: Path, metrics: dict) -> str:
    """Write ``report.md``, a self-contained ``report.html`` (inline CSS, PNGs as data: URIs) and
    ``plots/<source>-<kind>.png`` atomically; return the main Markdown table(s).

    Args:
        run_dir: the run directory.
        metrics: {"cells": [build_cell_metrics(...), ...], "aggregate": aggregate(cells) (recomputed when
            absent), and optionally "config" (with "teacher"/"student"), "wall_seconds"}.

    Plots without data are skipped (no λ plot with fewer than two λ values, no layer plot with one anchored
    layer set, no drift plot without drift files); PNGs of this report's kinds left from an earlier report
    and not redrawn are removed.

    Raises:
        ValueError: ``metrics`` lacks "cells" (a metrics.json of an older version) or has no cell.
    """
    run_dir = Path(run_dir)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("cells"), list):
        raise ValueError("metrics has no 'cells' list (a metrics.json from an older w2s-shift version?)")  # noqa: TRY004
    cells = metrics["cells"]
    if not cells:
        raise ValueError("metrics has no cells")
    agg = metrics.get("aggregate") or aggregate(cells)
    cfg = metrics.get("config") or {}
    teacher, student = _name(cfg.get("teacher")), _name(cfg.get("student"))
    title = "W2S reward models under preference shift"
    blocks: list = [("h1", title)]
    intro = (
        (f"Teacher `{teacher}`, student `{student}`. " if teacher and student else "")
        + "Pairwise accuracy in percentage points (ties count as wrong). WRG = Acc_s(ID) − Acc_t(ID), AOG = "
        "Acc_s(OOD) − Acc_t(OOD) per target and averaged, NTS = AOG − max(0, Acc_t(ID) − Acc_s(ID)) (Le et al. "
        "2026), in pp; PGR = (student − teacher) / (ceiling − teacher) on the ID test split (n/a when the ceiling "
        "does not beat the teacher; its interval leaves out the bootstrap resamples where PGR is undefined, shows "
        "their share, and is n/a when they exceed 5%). One seed: value [95% paired bootstrap interval over pairs, "
        "ID and OOD "
        "resampled independently]; several seeds: mean ± standard deviation over seeds. Bold: best AOG mean and "
        "NTS among the W2S students."
    )
    blocks.append(("p", intro))
    by_source: dict = {}
    for c in cells:
        by_source.setdefault(c["source"], []).append(c)
    plots_dir = run_dir / "plots"
    written, tables = set(), []
    for src, cs in by_source.items():
        s = _Source(src, cs, agg[src])
        seeds = ", ".join(str(x) for x in s.agg["seeds"])
        blocks.append(("h2", f"Source {src} (ID), OOD: {', '.join(s.ood)}; seed{'s' if s.multi else ''} {seeds}"))
        head, rows = _main_table(s)
        blocks.append(("table", head, rows))
        tables.append(f"### {src} (seed{'s' if s.multi else ''} {seeds})\n\n" + _md_table(head, rows))
        if not all(s.agg["teacher_beats_chance_id"]):
            blocks.append(
                (
                    "p",
                    (
                        "**Warning:** the teacher does not beat chance on the ID test split in every seed (95% "
                        "interval includes 50%); its labels carry little signal and W2S gains are not "
                        "interpretable."
                    ),
                )
            )
        blocks += _gap_blocks(s) + _length_blocks(s)
        blocks += _truncation_blocks(s)
        dt = _diff_table(s)
        if dt:
            base, h, r = dt
            blocks += [
                ("h3", f"Paired differences against {base}"),
                (
                    "p",
                    f"Student minus `{base}` on the same test pairs, in pp (Δ WRG = Δ acc on the ID set, "
                    f"Δ AOG per target = Δ acc on it). "
                    + (
                        "One seed: value [95% paired bootstrap interval]; * marks an interval that excludes 0."
                        if not s.multi
                        else "Mean ± std over seeds."
                    ),
                ),
                ("table", h, r),
            ]
        h, r = _calib_table(s)
        blocks += [
            ("h3", "Calibration and agreement"),
            (
                "p",
                (
                    "ECE (pp) of sigmoid(reward margin) against gold, each pair folded to its predicted side, 10 "
                    "equal-width confidence bins over [0.5, 1]; agreement (%) = pairs on which the model prefers "
                    "the same response as the teacher (a tie counts as preferring rejected)."
                ),
            ),
            ("table", h, r),
        ]
        dr = _drift_table(s)
        if dr:
            blocks += [
                ("h3", "Representation drift from the pretrained reference (end of training)"),
                (
                    "p",
                    "Response tokens; relative squared error Σ‖h − h_ref‖² / Σ‖h_ref‖² and linear CKA "
                    "(Kornblith et al. 2019) per block (1-based; the last row per model is the final normalized "
                    "output)." + (" Means over seeds." if s.multi else ""),
                ),
                ("table", *dr),
            ]
        figs = []
        for kind, fn, caption in PLOTS:
            data = fn(s)
            if data is None:
                continue
            rel = f"plots/{_slug(src)}-{kind}.png"
            write_bytes_atomic(run_dir / rel, data)
            written.add(rel)
            figs.append(("img", rel, data, f"{src}: {caption}"))
        if figs:
            blocks += [("h3", "Plots"), *figs]
    blocks.append(("h2", "Data, teacher labels, rendering and time per cell"))
    blocks.append(
        (
            "p",
            (
                "Rendering: one rule for teacher and student, the tokenizer's chat template when it has one, "
                "else a plain 'Human: ... Assistant: ...' transcript; " + TRUNCATION_RULE + "."
            ),
        )
    )
    for c in cells:
        blocks += [("h3", f"{c['source']} seed {c['seed']} (`{c.get('dir')}`)"), ("ul", _cell_details(c))]
    blocks.append(("ul", [f"wall time: {metrics.get('wall_seconds')} s"]))
    added = [e for e in metrics.get("evaluated_targets") or [] if isinstance(e, dict)]
    if (
        added
    ):  # OOD targets added to a finished run by `w2s-shift evaluate` (w2s_shift.evaluate_run): scored, not trained
        blocks.append(
            (
                "ul",
                [
                    f"OOD target {e.get('name')} added after the run by `w2s-shift evaluate` from "
                    f"`{e.get('path') or e.get('name')}` (sha256 {str(e.get('sha256'))[:12]}; per source: "
                    + ", ".join(
                        f"{s} {v.get('used')} pairs used, {v.get('prompt_overlap_removed')} removed for a "
                        "prompt in the source"
                        for s, v in (e.get("per_source") or {}).items()
                    )
                    + "); its models were scored, not retrained"
                    for e in added
                ],
            )
        )
    if isinstance(metrics.get("environment"), dict):  # hardware, versions, precisions (w2s_shift.models.precision)
        from .models.precision import environment_lines

        blocks.append(("ul", environment_lines(metrics["environment"])))
    kinds = tuple(k for k, _, _ in PLOTS)
    if plots_dir.is_dir():
        for p in plots_dir.glob("*.png"):
            if f"plots/{p.name}" not in written and p.stem.endswith(tuple("-" + k for k in kinds)):
                p.unlink()
    md, page = _render(blocks, title)
    write_text_atomic(run_dir / "report.md", md)
    write_text_atomic(run_dir / "report.html", page)
    return "\n\n".join(tables)


# ---- comparing runs -------------------------------------------------------------------------------------


def _run_metrics(run_dir: Path) -> dict:
    f = Path(run_dir) / "metrics.json"
    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir}: not a directory")
    if not f.is_file():
        raise ValueError(f"{f}: not found; is {run_dir} a finished w2s-shift run directory?")
    try:
        m = read_json(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f}: not JSON ({e})") from None
    if not isinstance(m, dict) or not isinstance(m.get("cells"), list) or not m["cells"]:
        raise ValueError(f"{f}: not a w2s-shift grid metrics file (no 'cells'; an older version's run?)")
    try:
        return m.get("aggregate") or aggregate(m["cells"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{f}: not a w2s-shift grid metrics file ({type(e).__name__}: {e})") from None


def _ms(st) -> str:
    if not isinstance(st, dict) or st.get("mean") is None:
        return "–"
    return f"{st['mean']:.2f}" + (f" ± {st['std']:.2f}" if st.get("std") is not None else "")


def compare(run_dirs: list) -> str:
    """One Markdown table comparing runs side by side: rows (source, model), for each run the ID accuracy,
    OOD mean accuracy (pp) and NTS (pp); mean ± std over seeds where a run has several.

    Raises:
        ValueError: no run given, or a run directory that is missing or has no readable grid metrics.json.
    """
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    runs = [(Path(r), _run_metrics(Path(r))) for r in run_dirs]
    names = [p.name or str(p) for p, _ in runs]
    if len(set(names)) < len(names):
        names = [str(p) for p, _ in runs]
    head = ["source", "model"]
    for n in names:
        head += [f"{n} ID acc", f"{n} OOD acc", f"{n} NTS"]
    rows, seen = [], []
    for _, agg in runs:
        for src, a in agg.items():
            for mdl in a["models"]:
                if (src, mdl) not in seen:
                    seen.append((src, mdl))
    for src, mdl in seen:
        r = [src, mdl]
        for _, agg in runs:
            a = agg.get(src)
            if a is None or mdl not in a["models"]:
                r += ["–"] * 3
                continue
            r += [
                _ms(_get(a, "accuracy", mdl, a["id"])),
                _ms(_get(a, "accuracy_ood_mean", mdl)),
                _ms(_get(a, "metrics", mdl, "NTS")) if mdl != "teacher" else "–",
            ]
        rows.append(r)
    return _md_table(head, rows)


__all__ = ["aggregate", "build_cell_metrics", "compare", "load_rewards", "write_report"]

"""Reading a run's files: reward rows, Trainer log histories and drift files, and the checks of a metrics file
and of the rewards it was computed from; each error names the file (and the field)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..io import file_sha256, read_json, read_jsonl
from .errors import RunDirError

# ---- reading a cell ----------------------------------------------------------------------------------------


def read_cell_jsonl(path: Path) -> list:
    """Rows of a JSON-lines file; ValueError naming the file and line for a missing or broken one."""
    try:
        return read_jsonl(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: not JSON ({e.msg})") from None


def reward_rows(cell_dir: Path, model: str, dataset: str) -> tuple:
    """(ids list, chosen (B,), rejected (B,)) of ``model`` on ``dataset``; ValueError naming the file and field."""
    path = Path(cell_dir) / "rewards" / f"{model}__{dataset}.jsonl"
    rows = read_cell_jsonl(path)
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
    _, c, r = reward_rows(cell_dir, model, dataset)
    return c, r


def check_cell_rewards(run_dir: Path, metrics: dict) -> None:
    """Before a report is rendered from ``metrics``: every rewards file its cells were computed from is still
    there with the pairs metrics.json counts (``n_pairs``), and gives the accuracy it records; every JSON-lines
    file a stage of the cell recorded a SHA-256 for (rewards of ID, OOD and ``evaluate``'s targets, labels) still
    has it, so an edit that keeps the accuracy (pairs reordered, two flips) is caught too. A cell whose folder
    holds no stages (a metrics.json copied without its run) is not checked.

    Raises:
        ValueError: naming the missing or damaged file, and what to do.
    """
    from ..metrics.stats import pairwise_accuracy

    redo = "delete it and rerun the run (its scoring stage runs again; the other finished stages are reused)"
    for c in metrics.get("cells") or []:
        if not (isinstance(c, dict) and isinstance(c.get("dir"), str) and isinstance(c.get("n_pairs"), dict)):
            continue
        cell_dir = Path(run_dir) / c["dir"]
        if not (cell_dir / "stages").is_dir():
            continue
        for m in dict.fromkeys(["teacher", *(c.get("models") or [])]):
            for d, n in c["n_pairs"].items():
                path = cell_dir / "rewards" / f"{m}__{d}.jsonl"
                if not path.is_file():
                    raise ValueError(
                        f"{path}: missing, but metrics.json was computed from it ({n} pairs of {m} on {d}): the run "
                        "directory is damaged; rerun the run to score it again"
                    )
                try:
                    _, ch, rj = reward_rows(cell_dir, m, d)
                except ValueError as e:
                    raise ValueError(f"{e}: the file is damaged; {redo}") from None
                if len(ch) != n:
                    raise ValueError(
                        f"{path}: {len(ch)} rows, but metrics.json was computed from {n} pairs: the file is damaged "
                        f"(truncated?); {redo}"
                    )
                acc = (c.get("accuracy") or {}).get(m, {}).get(d)
                if isinstance(acc, (int, float)) and abs(pairwise_accuracy(ch, rj) - acc) > 1e-6:
                    raise ValueError(
                        f"{path}: its rewards give accuracy {pairwise_accuracy(ch, rj):.2f}, but metrics.json records "
                        f"{acc:.2f} for {m} on {d}: the file was changed after the run; {redo}"
                    )
        for rel, want in recorded_sha256(cell_dir).items():
            if (cell_dir / rel).is_file() and file_sha256(cell_dir / rel) != want:
                raise ValueError(
                    f"{cell_dir / rel}: not the file its stage wrote (its SHA-256 differs from the one the stage "
                    f"recorded): the file was changed after the run; {redo}"
                )


def recorded_sha256(cell_dir: Path) -> dict:
    """{output path relative to the cell: SHA-256} of every JSON-lines output the cell's stage markers
    (``stages/*.json``) recorded; markers written before the hashes were, or unreadable, add nothing."""
    out = {}
    for f in sorted((Path(cell_dir) / "stages").glob("*.json")):
        try:
            sums = read_json(f).get("sha256")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(sums, dict):
            out.update({k: v for k, v in sums.items() if isinstance(k, str) and isinstance(v, str)})
    return out


def training_curves(path: Path) -> dict | None:
    """Loss curves from a Trainer log history: {"step": [...], "loss": [...], and "loss_w2s", "loss_anchor",
    "anchor_lambda", "anchor_drift", "anchor_ratio" (lambda x L_anchor / L_w2s), "learning_rate", "grad_norm"
    aligned with step (None where a row lacks it), "summary": last row's train_* entries}; with an anchor term
    also "anchor_ratio_mean"/"anchor_ratio_last" and "anchor_lambda_mean"/"anchor_lambda_last" (means of the
    logged values, each itself a mean over its logging interval; last = the last interval). None when the file
    is missing."""
    if not path.is_file():
        return None
    rows = read_cell_jsonl(path)
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


def read_drift(path: Path) -> dict:
    """A drift file {"layers": [...], "final": {dataset: {layer: {"rel_sq_err", "cka"}}}, "during": [...]}."""
    try:
        d = read_json(path)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(d, dict) or not isinstance(d.get("layers"), list) or not isinstance(d.get("final"), dict):
        raise ValueError(f"{path}: a drift file needs 'layers' (list) and 'final' (dict)")  # noqa: TRY004 (bad file)
    d.setdefault("during", [])
    return d


_NUMERIC = (
    "n_pairs",
    "accuracy",
    "accuracy_ci95",
    "accuracy_ood_mean",
    "accuracy_ood_mean_ci95",
    "metrics",
    "differences",
    "model_metrics",
)


def check_metrics(f, metrics) -> None:
    """Refuse a damaged metrics.json before it is rendered: a non-finite number anywhere (w2s-shift never
    writes one), or a value that is not a number (or null) where the report reads numbers.

    Raises:
        RunDirError: naming the file and the field (e.g. ``cells[0].accuracy.naive.ultrafeedback``).
    """
    import math

    def walk(o, where: str, numeric: bool) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{where}.{k}" if where else str(k), numeric and k != "vs")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, f"{where}[{i}]", numeric)
        elif isinstance(o, float) and not math.isfinite(o):
            raise RunDirError(
                f"{f}: field {where} is {o} (not a finite number): the file is damaged; rerun the run "
                "(finished stages are reused) to rewrite it"
            )
        elif numeric and o is not None and (isinstance(o, bool) or not isinstance(o, (int, float))):
            raise RunDirError(
                f"{f}: field {where} is {type(o).__name__} {str(o)[:40]!r}, expected a number: the file "
                "is damaged; rerun the run (finished stages are reused) to rewrite it"
            )

    walk(metrics, "", False)
    cells = metrics.get("cells") if isinstance(metrics, dict) else None
    if cells is not None and not isinstance(cells, list):
        raise RunDirError(
            f"{f}: field cells is {type(cells).__name__} {str(cells)[:40]!r}, expected a list of cells: the file is "
            "damaged; rerun the run (finished stages are reused) to rewrite it"
        )
    for i, c in enumerate(cells or []):
        for k in _NUMERIC:
            if isinstance(c, dict) and k in c:
                walk(c[k], f"cells[{i}].{k}", True)

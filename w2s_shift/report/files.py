"""Reading a cell's files: reward rows, Trainer log histories and drift files, each ValueError naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..io import read_json, read_jsonl

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

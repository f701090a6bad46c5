"""Choosing one hyperparameter of a W2S method (L2-SP's lambda, WiSE-FT's a, GRM's lambda) on gold validation pairs,
once, before a grid runs: ``w2s-shift select-method``, the counterpart of ``w2s-shift select``
(:mod:`w2s_shift.pipeline.select`) for a method's own setting.

On the run's first source and seed, the weak teacher is trained and labels the student-train pairs (as in a grid);
the method is trained on those soft labels at each value of the setting (each a grid student, the same stages, so
WiSE-FT's values share one training) and scored on gold validation pairs carved from the rest of the student-train
pool (:func:`~w2s_shift.pipeline.prepare.gold_validation_pairs`): never the ID test split, never an OOD target.
The value with the highest validation pairwise accuracy (ties: the lower validation Bradley-Terry loss, then the
smaller value) is the declared setting a preset then writes down. The students see weak labels only; the gold
labels of the validation pairs decide the setting and nothing else. Stages are resumable: a rerun reuses every
trained value.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..config import RunConfig
from ..io import read_json, write_json_atomic, write_text_atomic
from ..metrics.stats import accuracy_interval
from .featurizer import SourceContext
from .prepare import gold_validation_pairs
from .rundir import log, use_threads
from .score_stage import score_set
from .select import VALIDATION, bt_loss, lock_select_dir


def method_candidates(name: str, field: str, values: list) -> list:
    """One method entry per value of ``field`` (validated by the method's settings model), labelled
    ``<name>-<field>-<value>``.

    Raises:
        ValueError: no value, a repeated value, a field the method does not have, a value its model refuses."""
    from pydantic import ValidationError

    from ..methods import get_method, method_entry

    meth = get_method(name)
    if not meth.trains or not meth.w2s_student:
        raise ValueError(f"select-method: {name} is not a W2S student that trains on the teacher's labels")
    if not values or len(set(values)) != len(values):
        raise ValueError(f"select-method: give distinct values for {field}, got {values}")
    if field in ("name", "label", "seeds") or field not in meth.config.model_fields:
        own = [f for f in meth.config.model_fields if f not in ("name", "label", "seeds")]
        raise ValueError(f"select-method: method {name} has no setting {field!r} (its settings: {', '.join(own)})")
    out = []
    for v in values:
        try:
            m = method_entry({"name": name, field: v, "label": f"{name}-{field}-{v}"})
        except ValidationError as e:
            raise ValueError(f"select-method: {name}.{field} = {v!r}: {e.errors()[0]['msg']}") from None
        out.append(m)
    return out


def select_method_setting(
    cfg: RunConfig, name: str, field: str, values: list, n_val: int = 250, out: Path | None = None
) -> dict:
    """Train method ``name`` at each value of its setting ``field`` on the teacher's labels and choose one on gold
    validation pairs (module doc).

    Returns:
        ``{"method", "field", "trials": [{"value", "label", "val_accuracy" (pp), "val_interval", "val_bt_loss"}],
        "chosen": {"value"}, "validation", "rule", ...}``, also in ``selection.json`` (and ``selection.md``) in ``out``
        (default ``<output_dir>-select-<name>``).

    Raises:
        ValueError: bad candidates (:func:`method_candidates`); RunDirError: ``out`` cannot be written."""
    from ..models.precision import resolve_precisions
    from .stages import cell_student, cell_teacher, student_digest

    entries = method_candidates(name, field, list(values))
    cfg = resolve_precisions(cfg)
    run_dir = Path(cfg.output_dir)
    out = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}-select-{name}"
    lock = lock_select_dir(out)
    try:
        src, seed = cfg.data.sources[0], cfg.seeds[0]
        val, train = gold_validation_pairs(cfg, n_val, src, seed)
        ctx = SourceContext(cfg, src, out)
        if [p.id for p in ctx.splits["student_train"]] != [p.id for p in train]:  # one carving, one training set
            raise RuntimeError("gold validation: the student-train pairs differ from the run's")
        cell_dir = out / "cell"
        log(
            f"select-method: {name}.{field} in {values} on {ctx.name} seed {seed}: teacher labels on {len(train)} "
            f"student-train pairs, gold validation {len(val)} pairs from the rest of the student-train pool"
        )
        cell_teacher(ctx, cell_dir, seed, need_model=False)
        labels = [r["q"] for r in _jsonl(cell_dir / "teacher_labels.jsonl")]
        trials = []
        for m in entries:
            f = out / "trials" / f"{m.display}.json"
            digest = student_digest(ctx, seed, m)
            t = read_json(f) if f.is_file() else None
            if not (isinstance(t, dict) and t.get("digest") == digest and "val_accuracy" in t):
                model = cell_student(ctx, cell_dir, seed, m, labels)
                if model is None:
                    from .score_stage import load_saved_model

                    model = load_saved_model(ctx.student(), cell_dir, seed, m.display, digest)
                use_threads(cfg.student, cfg)
                r = score_set(ctx.student(), model.eval(), VALIDATION, val, m.display)
                b = len(val)
                correct = (r[:b] > r[b:]).astype(float)
                lo, hi = accuracy_interval(correct, seed=seed)
                value = getattr(m, field)
                t = {
                    "value": value,
                    "label": m.display,
                    "val_accuracy": float(100 * correct.mean()),
                    "val_interval": [lo, hi],
                    "val_bt_loss": bt_loss(r[:b], r[b:]),
                    "digest": digest,
                }
                write_json_atomic(f, t)
            log(f"select-method: {m.display}: validation accuracy {t['val_accuracy']:.2f}")
            trials.append(t)
        best = min(trials, key=lambda t: (-t["val_accuracy"], t["val_bt_loss"], _order(t["value"])))
        result = {
            "method": name,
            "field": field,
            "source": ctx.name,
            "seed": seed,
            "validation": {"pairs": len(val), "from": "student-train pool, pairs not used for training"},
            "training_pairs": len(train),
            "teacher_pairs": len(ctx.splits["teacher_train"]),
            "rule": "highest validation pairwise accuracy; ties: lower validation Bradley-Terry loss, smaller value",
            "trials": trials,
            "chosen": {"value": best["value"]},
        }
        write_json_atomic(out / "selection.json", result)
        write_text_atomic(out / "selection.md", method_selection_markdown(result))
        return result
    finally:
        lock.release()


def _order(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else math.inf


def _jsonl(path: Path) -> list:
    import json

    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def method_selection_markdown(result: dict) -> str:
    """The selection as a Markdown table with the chosen value and the entry that declares it."""
    c = result["chosen"]["value"]
    lines = [
        f"# {result['method']}.{result['field']} chosen on gold validation pairs ({result['source']}, seed "
        f"{result['seed']})",
        "",
        f"{result['method']} trained on the weak teacher's soft labels of {result['training_pairs']} student-train "
        f"pairs at each value; scored on {result['validation']['pairs']} gold validation pairs carved from the rest "
        "of the student-train pool (not the test split). Rule: " + result["rule"] + ".",
        "",
        f"| {result['field']} | validation accuracy % [95% CI] | validation BT loss |",
        "|---|---|---|",
    ]
    for t in result["trials"]:
        lo, hi = t["val_interval"]
        mark = " **(chosen)**" if t["value"] == c else ""
        lines.append(
            f"| {t['value']!r}{mark} | {t['val_accuracy']:.2f} [{lo:.1f}, {hi:.1f}] | {t['val_bt_loss']:.4f} |"
        )
    lines += ["", f"Declare: `- {{name: {result['method']}, {result['field']}: {c!r}}}`", ""]
    return "\n".join(lines)

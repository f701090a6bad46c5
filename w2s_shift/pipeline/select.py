"""Choosing the student's learning rate and epochs on gold validation pairs, once, before a grid runs.

The strong ceiling (gold labels, Bradley-Terry) is trained on the run's own student-train pairs at each
(learning rate, epochs) of a small grid and scored on a validation split of gold pairs carved from the rest of the
student-train pool (:func:`~w2s_shift.pipeline.prepare.gold_validation_pairs`): never the ID test split, never an
OOD target. The setting with the highest validation pairwise accuracy (ties: the lower validation Bradley-Terry
loss) is the one every student of the grid then trains with; the W2S students themselves never see gold labels
and are not early-stopped on them. This makes PGR's denominator (ceiling - teacher) the one the student family
can reach, not whatever one fixed lr gives; the selection sees no pair that any reported figure is computed on.

Each trial is a file ``<out>/trials/<lr>-<epochs>.json`` written atomically with the digest of its inputs, so a
rerun skips finished trials and a killed selection resumes at the unfinished one.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from pathlib import Path

import numpy as np

from ..config import RunConfig
from ..io import read_json, write_json_atomic, write_text_atomic
from ..metrics.stats import accuracy_interval
from ..versions import stage_versions
from .featurizer import SourceContext
from .prepare import gold_validation_pairs
from .rundir import (
    RunDirError,
    log,
    model_identity,
    refuse_file_as_run_dir,
    refuse_links_out_of,
    stage_digest,
    use_threads,
)
from .score_stage import score_set

VALIDATION = "gold-validation"


def bt_loss(chosen, rejected) -> float:
    """Mean gold Bradley-Terry loss of rewards (B,) each: mean_i log(1 + exp(-(r_chosen_i - r_rejected_i))), in nats
    (Bradley & Terry 1952; the reward-model loss of Ouyang et al. 2022, Eq. 1). Computed stably in float64."""
    d = np.asarray(chosen, dtype=np.float64) - np.asarray(rejected, dtype=np.float64)
    return float(np.mean(np.logaddexp(0.0, -d)))


def choose(trials: list) -> dict:
    """The trial with the highest ``val_accuracy`` (pp); ties go to the lower ``val_bt_loss``, then to the lower
    learning rate and fewer epochs (the cheaper, gentler setting). ``trials``: dicts with those four keys; trials
    marked ``diverged`` are left out.

    Raises:
        ValueError: no trial left."""
    trials = [t for t in trials if not t.get("diverged")]
    if not trials:
        raise ValueError("no selection trial to choose from (none ran, or every setting diverged)")
    return min(trials, key=lambda t: (-t["val_accuracy"], t["val_bt_loss"], t["learning_rate"], t["epochs"]))


def _trial_name(lr: float, epochs) -> str:
    return f"lr{float(lr)!r}-ep{epochs!r}"  # repr: two settings never share a file (5e-05, 0.00015, 1, 1.5)


TRIAL_FIELDS = ("learning_rate", "epochs", "val_accuracy", "val_bt_loss", "val_interval", "seconds", "digest")


def reusable_trial(path: Path, digest: str) -> dict | None:
    """The trial saved at ``path`` when it was made from the same inputs (``digest``) and is whole: a JSON object
    with every field, a finite accuracy in 0..100 inside a two-number interval, a finite loss >= 0 (or a recorded
    divergence). None otherwise (missing, damaged, edited or from other inputs: the trial is trained again)."""
    try:
        t = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(t, dict) or t.get("digest") != digest or any(k not in t for k in TRIAL_FIELDS):
        return None
    if t.get("diverged"):
        return t if isinstance(t["diverged"], str) else None
    acc, loss, iv = t["val_accuracy"], t["val_bt_loss"], t["val_interval"]
    num = (int, float)
    if not (isinstance(acc, num) and isinstance(loss, num) and isinstance(iv, list) and len(iv) == 2):
        return None
    if not all(isinstance(x, num) and math.isfinite(x) and 0 <= x <= 100 for x in [acc, *iv]):
        return None
    return t if math.isfinite(loss) and loss >= 0 else None


def select_student_settings(
    cfg: RunConfig, learning_rates: list, epochs: list, n_val: int = 250, out: Path | None = None
) -> dict:
    """Train the ceiling at every (learning rate, epochs) and choose one on gold validation pairs (module doc).

    Args:
        cfg: a run config (its first source and first seed are used; bf16 ``auto`` is resolved here).
        learning_rates: student learning rates to try; epochs: numbers of epochs (> 0) to try (each trial trains from
            the pretrained model with its own schedule, so "1 epoch" is a one-epoch run, not a snapshot).
        n_val: gold validation pairs wanted.
        out: folder for ``selection.json``, ``selection.md`` and the trials (default ``<output_dir>-select``).

    Returns:
        ``{"trials": [...], "chosen": {...}, "validation": {...}, "rule": str}``, also in ``selection.json``; each
        trial has learning_rate, epochs, val_accuracy (pp) with val_interval (95% bootstrap), val_bt_loss (nats),
        train_loss (the last logged), seconds; a setting whose training diverged has ``diverged`` (the message)
        and no validation figures, and is never chosen.

    Raises:
        RunDirError: ``out`` cannot be written (:func:`lock_select_dir`).
        ValueError: an empty grid, a non-positive or duplicate learning rate or epochs, a setting outside the
            config's limits (e.g. epochs > 1000), too few pairs left for validation, every setting diverged.
    """
    if not learning_rates or not epochs:
        raise ValueError("select needs at least one learning rate and one number of epochs")
    if any(not (lr > 0 and math.isfinite(lr)) for lr in [*learning_rates, *epochs]):
        raise ValueError(f"learning rates and epochs must be > 0, got {learning_rates} and {epochs}")
    epochs = [int(e) if float(e).is_integer() else float(e) for e in epochs]
    learning_rates = [float(x) for x in learning_rates]
    for what, xs in (("learning rate", learning_rates), ("number of epochs", epochs)):
        dup = sorted({x for x in xs if xs.count(x) > 1})
        if dup:
            raise ValueError(f"select: duplicate {what} {', '.join(f'{x:g}' for x in dup)}")
    from pydantic import ValidationError

    for lr in learning_rates:  # the config's own limits (epochs <= 1000, ...), as `run` would check them
        for ep in epochs:
            try:
                type(cfg.student).model_validate({**cfg.student.model_dump(), "learning_rate": lr, "epochs": ep})
            except ValidationError as e:
                err = e.errors()[0]
                field = ".".join(str(x) for x in err["loc"])
                raise ValueError(f"select: student.{field} = {err.get('input')!r}: {err['msg']}") from None
    from ..models.precision import resolve_precisions

    cfg = resolve_precisions(cfg)
    run_dir = Path(cfg.output_dir)
    out = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}-select"
    lock = lock_select_dir(out)
    try:
        return _select(cfg, learning_rates, epochs, n_val, out)
    finally:
        lock.release()


def lock_select_dir(out: Path):
    """Check ``select``'s output folder as every writer checks its run directory and take its lock.

    Raises:
        RunDirError: a file, a run directory of ``w2s-shift run`` (run.json or metrics.json in it), a symbolic link
            in it to outside it (:func:`~w2s_shift.pipeline.rundir.refuse_links_out_of`), or another process
            writing there."""
    from ..runlock import acquire_run_dir

    refuse_file_as_run_dir(out)
    found = [n for n in ("run.json", "metrics.json") if (out / n).is_file()]
    if found:
        raise RunDirError(
            f"{out}: the directory of a run ({found[0]}); select writes its trials and selection.json into a folder "
            "of its own: give another --out"
        )
    refuse_links_out_of(out)
    return acquire_run_dir(out, command="select")


def _select(cfg: RunConfig, learning_rates: list, epochs: list, n_val: int, out: Path) -> dict:
    from ..methods import method_entry
    from ..training import train_pairs
    from ..training.trainer import TrainingDiverged
    from .stages import train_args

    src, seed = cfg.data.sources[0], cfg.seeds[0]
    val, train = gold_validation_pairs(cfg, n_val, src, seed)
    ctx = SourceContext(cfg, src, out)
    if [p.id for p in ctx.splits["student_train"]] != [p.id for p in train]:  # one carving, one training set
        raise RuntimeError("gold validation: the student-train pairs differ from the run's")
    val_digest = hashlib.sha256("\n".join(f"{p.prompt_key()}\x00{p.chosen}" for p in val).encode()).hexdigest()
    log(
        f"select: source {ctx.name} seed {seed}: ceiling on {len(train)} student-train pairs, gold validation "
        f"{len(val)} pairs from the rest of the student-train pool; {len(learning_rates)} lr x {len(epochs)} epochs"
    )
    if len(val) < 50:
        log(
            f"WARNING: select: {len(val)} validation pairs give accuracy intervals wider than +-14 points: settings "
            "closer than that cannot be told apart"
        )
    use_threads(cfg.student, cfg)
    sf = ctx.student()
    m = method_entry({"name": "ceiling"})
    trials = []
    for lr in learning_rates:
        for ep in epochs:
            mcfg = cfg.student.model_copy(update={"learning_rate": float(lr), "epochs": ep})
            digest = stage_digest(
                ctx.data_digest,
                model_identity(mcfg),
                seed,
                val_digest,
                stage_versions("student"),
            )
            name = _trial_name(lr, ep)
            f = out / "trials" / f"{name}.json"
            t = reusable_trial(f, digest)
            if t is not None:
                how = "diverged" if t.get("diverged") else f"validation accuracy {t['val_accuracy']:.2f}"
                log(f"select: {name} done earlier: {how}")
                trials.append(t)
                continue
            if f.exists():
                log(f"select: {f} is damaged or from other inputs: training {name} again")
            t0 = time.time()
            model = sf.new_model(seed)
            q = m.method.targets(m, [1.0] * len(train))
            ds = sf.dataset("student_train", train, q)
            ckpt = out / "checkpoints" / f"{name}-{digest[:8]}"
            try:
                hist = train_pairs(
                    model,
                    ds,
                    sf.pad_id,
                    train_args(mcfg, seed, cfg, f"select ceiling {name}", model, logging_dir=str(out / "tensorboard")),
                    str(ckpt),
                    objective=m.method.objective(m),
                )
            except TrainingDiverged as e:  # a setting too large is a result of the selection, not its end
                t = {k: None for k in ("val_accuracy", "val_interval", "val_bt_loss", "train_loss")}
                t |= {"learning_rate": lr, "epochs": ep, "diverged": str(e), "digest": digest}
                t["seconds"] = round(time.time() - t0, 1)
                write_json_atomic(f, t)
                shutil.rmtree(ckpt, ignore_errors=True)
                log(f"select: {name}: training diverged: {e}")
                trials.append(t)
                continue
            model.eval()
            r = score_set(sf, model, VALIDATION, val, f"ceiling {name}")
            b = len(val)
            correct = (r[:b] > r[b:]).astype(float)
            lo, hi = accuracy_interval(correct, seed=seed)
            # the last logged loss; in a run shorter than the logging interval, the trainer's mean over the run
            losses = [h["loss"] for h in hist if "loss" in h] or [h["train_loss"] for h in hist if "train_loss" in h]
            t = {
                "learning_rate": float(lr),
                "epochs": ep,
                "val_accuracy": float(100 * correct.mean()),
                "val_interval": [lo, hi],
                "val_bt_loss": bt_loss(r[:b], r[b:]),
                "train_loss": losses[-1] if losses else None,
                "seconds": round(time.time() - t0, 1),
                "digest": digest,
            }
            write_json_atomic(f, t)
            shutil.rmtree(ckpt, ignore_errors=True)
            log(
                f"select: {name}: validation accuracy {t['val_accuracy']:.2f} [{lo:.1f}, {hi:.1f}], "
                f"Bradley-Terry loss {t['val_bt_loss']:.4f} ({t['seconds']:.0f} s)"
            )
            trials.append(t)
    best = choose(trials)
    result = {
        "source": ctx.name,
        "seed": seed,
        "student": cfg.student.name,
        "trainable_layers": cfg.student.trainable_layers,
        "validation": {"pairs": len(val), "from": "student-train pool, pairs not used for training"},
        "training_pairs": len(train),
        "rule": "highest validation pairwise accuracy; ties: lower validation Bradley-Terry loss, lower lr, "
        "fewer epochs",
        "trials": trials,
        "chosen": {"learning_rate": best["learning_rate"], "epochs": best["epochs"]},
    }
    write_json_atomic(out / "selection.json", result)
    write_text_atomic(out / "selection.md", selection_markdown(result))
    return result


def selection_markdown(result: dict) -> str:
    """The selection as a Markdown table, with the chosen setting and the ``--set`` overrides that apply it."""
    c = result["chosen"]
    lines = [
        f"# Student lr and epochs chosen on gold validation pairs ({result['source']}, seed {result['seed']})",
        "",
        f"Ceiling ({result['student']}, "
        + (f"top {result['trainable_layers']} blocks" if result["trainable_layers"] else "all blocks")
        + f") trained on the run's "
        f"{result['training_pairs']} student-train pairs; scored on {result['validation']['pairs']} gold validation "
        "pairs carved from the rest of the student-train pool (not the test split). Rule: " + result["rule"] + ".",
        "",
        "| lr | epochs | validation accuracy % [95% CI] | validation BT loss | last train loss | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for t in result["trials"]:
        if t.get("diverged"):
            lines.append(f"| {t['learning_rate']!r} | {t['epochs']} | diverged | | | {t['seconds']:.0f} |")
            continue
        mark = " **(chosen)**" if (t["learning_rate"], t["epochs"]) == (c["learning_rate"], c["epochs"]) else ""
        lo, hi = t["val_interval"]
        tl = "" if t["train_loss"] is None else f"{t['train_loss']:.4f}"
        lines.append(
            f"| {t['learning_rate']!r}{mark} | {t['epochs']} | {t['val_accuracy']:.2f} [{lo:.1f}, {hi:.1f}] | "
            f"{t['val_bt_loss']:.4f} | {tl} | {t['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Apply: `--set student.learning_rate={c['learning_rate']!r} --set student.epochs={c['epochs']}`",
        "",
    ]
    return "\n".join(lines)

"""Training stages of one cell (source x seed): the weak teacher and its soft labels, the labels a method builds
itself (SEAM), each student.
Each is keyed on its training inputs only; evaluation is :mod:`w2s_shift.pipeline.score_stage`."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from transformers import TrainerCallback

from ..config import RunConfig
from ..data.render import uses_chat_template
from ..distributed import run_on_main, sharded
from ..io import read_json
from ..methods import LabelTools, method_objective, method_targets
from ..metrics.stats import sigmoid
from ..models.loading import untied_lm_head
from ..models.reward_model import (
    RewardModel,
    can_pack,
)
from ..models.state import load_trained_state, save_state_tensors, saved_weights_problem, trainable_state
from ..results import load_rewards
from ..training import PairTrainingArguments, make_reference, train_pairs
from ..versions import STAGE_FORMATS, label_versions, stage_versions, versions_of
from .featurizer import SourceContext
from .rundir import (
    FaultCallback,
    Stage,
    fault,
    log,
    model_identity,
    stage_digest,
    use_threads,
    write_json_on_main,
    write_jsonl_on_main,
)
from .score_stage import precision_of, save_rewards, score_pairs, score_set


def train_args(m, seed: int, run_cfg: RunConfig, label: str, model: RewardModel, **extra) -> PairTrainingArguments:
    """The training arguments of one model, every value from the run config (packing where the model allows it)."""
    return PairTrainingArguments(
        num_train_epochs=m.epochs,
        batch_size=m.batch_size,
        learning_rate=m.learning_rate,
        gradient_accumulation_steps=m.gradient_accumulation_steps,
        packing=bool(m.packing and can_pack(model.backbone, model.pooling)),
        weight_decay=m.weight_decay,
        warmup_ratio=m.warmup_ratio,
        seed=seed,
        bf16=m.bf16,
        head_lr_multiplier=m.head_lr_multiplier,
        checkpoint_fraction=run_cfg.checkpoint_fraction,
        report_to=list(run_cfg.report_to),
        logging_steps=10,
        label=label,
        **extra,
    )


class DriftCallback(TrainerCallback):
    """Logs drift (relative squared error of the anchored and last layers) on small probe sets every ``interval``
    optimizer steps (Le et al. 2026's explanation of OOD loss)."""

    def __init__(self, probes: dict, interval: int):
        self.probes, self.interval, self.rows = probes, interval, []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # every process measures its share of the probe pairs (DriftProbe.measure_during), on the device
        if self.interval and state.global_step % self.interval == 0 and model is not None:
            for name, probe in self.probes.items():
                self.rows.append({"step": state.global_step, "dataset": name, **probe.measure_during(model)})

    def checkpoint_state(self) -> dict:  # saved in each training checkpoint (PairTrainer._save_resume_state)
        return {"rows": self.rows}

    def restore_checkpoint_state(self, state: dict) -> None:
        self.rows = list(state["rows"])


def trained_or_train(model, state_path: Path, digest: str, train_fn, drift_cb=None) -> list:
    """Load the trained state saved by an earlier (killed) run of this stage, or train and save it.
    Returns the training log history; ``drift_cb``'s rows (drift during training) are saved and restored too."""
    meta = state_path.with_suffix(".json")
    try:
        info = read_json(meta)
        if info.get("digest") == digest and state_path.is_file() and (drift_cb is None or "drift_during" in info):
            try:
                load_trained_state(model, state_path, digest=digest)
            except ValueError as e:  # damaged, or another model's weights (the header digest): train again
                log(f"{state_path.stem}: not reusing the saved weights: {e}; training again")
                raise
            log(f"{state_path.stem}: trained earlier, loading its weights")
            if drift_cb is not None:
                drift_cb.rows = list(info["drift_during"])
            return info["log_history"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    hist = train_fn()
    tensors = trainable_state(model)  # every process: a sharded model's full tensors are gathered collectively
    run_on_main(save_state_tensors, tensors, state_path, {"digest": digest})
    del tensors
    write_json_on_main(
        meta,
        {"digest": digest, "log_history": hist, **({"drift_during": drift_cb.rows} if drift_cb is not None else {})},
    )
    return hist


def whole_model(model, f, seed: int, state_path: Path, digest: str):
    """``model`` ready to score on every process: as it is, or, when FSDP / ZeRO-3 left it sharded across
    processes (each forward a collective that shards of different lengths would hang in), rebuilt whole on every
    process from the weights :func:`trained_or_train` just saved (``f``: its :class:`Featurizer`)."""
    from ..distributed import is_sharded_model

    if not is_sharded_model(model):
        return model
    whole = f.new_model(seed)
    load_trained_state(whole, state_path, digest=digest)
    return whole.eval()


def teacher_digest(ctx: SourceContext, seed: int) -> str:
    return stage_digest(ctx.data_digest, model_identity(ctx.cfg.teacher), seed, stage_versions("teacher"))


def label_stage(ctx: SourceContext, cell_dir: Path, seed: int, m) -> Stage | None:
    """The label-construction stage of a method that builds its own labels (SEAM): keyed on the teacher, the
    pretrained student and the method's settings; None for a method that builds none."""
    name = m.method.label_stage(m)
    if name is None:
        return None
    if not m.method.owns_stage(name):
        raise ValueError(f"method {m.method.name}: its label stage {name!r} must be named {m.method.name}-...")
    return Stage(
        cell_dir,
        name,
        stage_digest(
            teacher_digest(ctx, seed),
            model_identity(ctx.cfg.student),
            *[v for k, v in m.model_dump(mode="json", exclude={"label", "seeds"}).items() if k != "name"],
            versions_of(name),
        ),
    )


def cell_teacher(ctx: SourceContext, cell_dir: Path, seed: int, need_model: bool):
    """Teacher training stage of one cell (``stages/teacher.json``): train on gold, score student-train, write the
    soft labels. Its digest hashes only its training inputs (:func:`teacher_digest`); the evaluation sets are
    scored by :func:`cell_scores`. Returns the trained teacher when ``need_model`` (SEAM, scoring), else None."""
    cfg = ctx.cfg
    use_threads(cfg.teacher, cfg)
    digest = teacher_digest(ctx, seed)
    stage = Stage(cell_dir, "teacher", digest)
    if stage.done() and not need_model:
        log(f"{ctx.name} seed {seed}: teacher done earlier, reusing its labels")
        return None
    tf = ctx.teacher()
    teacher = tf.new_model(seed)
    ds = tf.dataset("teacher_train", ctx.splits["teacher_train"], [1.0] * len(ctx.splits["teacher_train"]))
    ckpt = cell_dir / "checkpoints" / f"teacher-{digest[:8]}"
    if not stage.done():
        log(f"{ctx.name} seed {seed}: teacher {tf.describe()} on {len(ds)} gold pairs")
    hist = trained_or_train(
        teacher,
        cell_dir / "models" / "teacher.safetensors",
        digest,
        lambda: train_pairs(
            teacher,
            ds,
            tf.pad_id,
            train_args(
                cfg.teacher,
                seed,
                cfg,
                f"teacher ({ctx.name}, seed {seed})",
                teacher,
                logging_dir=str(cell_dir / "tensorboard" / "teacher"),
            ),
            str(ckpt),
            callbacks=[FaultCallback("teacher")],
        ),
    )
    teacher = whole_model(teacher, tf, seed, cell_dir / "models" / "teacher.safetensors", digest)
    run_on_main(shutil.rmtree, ckpt, ignore_errors=True)  # after every process has left the Trainer
    if stage.done():
        return teacher
    pairs = ctx.splits["student_train"]
    rewards = score_set(tf, teacher, "student_train", pairs, "teacher")
    save_rewards(cell_dir, "teacher", "student_train", pairs, rewards, precision_of(cfg.teacher))
    fault("teacher:labels")
    rc, rr = load_rewards(cell_dir, "teacher", "student_train")
    q = sigmoid(rc - rr)  # the teacher's soft labels: P(chosen preferred) under Bradley-Terry
    write_jsonl_on_main(
        cell_dir / "teacher_labels.jsonl",
        [{"index": i, "id": p.id, "q": float(q[i]), "gold_agrees": bool(q[i] > 0.5)} for i, p in enumerate(pairs)],
    )
    write_jsonl_on_main(cell_dir / "logs" / "teacher.jsonl", hist)
    stage.finish(
        ["rewards/teacher__student_train.jsonl", "teacher_labels.jsonl", "logs/teacher.jsonl"],
        max_length=tf.max_length,
        truncated_pairs=dict(tf.truncated),
        cut_counts=dict(tf.cut_counts),
        rendering={"teacher_chat_template": uses_chat_template(tf.loaded.tokenizer)},
    )
    return teacher


def cell_labels(ctx: SourceContext, cell_dir: Path, seed: int, m, teacher) -> tuple:
    """The labels a method builds itself (:meth:`w2s_shift.methods.Method.build_labels`) for one cell, with the
    pipeline's tools: the pretrained strong student's yes/no log-odds (asked once per question and source, shared
    by seeds) and the trained weak teacher's margins. Returns (label rows, summary)."""
    from ..models.lm import lm_head_weight, next_token_logprob_diff

    cfg = ctx.cfg
    use_threads(cfg.student, cfg)
    sf, tf = ctx.student(), ctx.teacher()
    head_w = lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))

    def ask(prompts):
        lm, bf16 = sf.on_device("full"), sf.mcfg.bf16
        try:
            return next_token_logprob_diff(lm, head_w, sf.loaded.tokenizer, prompts, bf16=bf16)
        except ValueError as e:  # a tokenizer that splits " Yes" into " " + "Yes": ask without the space
            if "same token" not in str(e):
                raise
            return next_token_logprob_diff(lm, head_w, sf.loaded.tokenizer, prompts, yes="Yes", no="No", bf16=bf16)

    def strong(prompts):
        new = list(dict.fromkeys(p for p in prompts if p not in ctx.seam_relevance))
        if new:  # each process asks a share of the questions (gathered in order)
            ctx.seam_relevance.update(zip(new, (float(x) for x in sharded(ask, new))))
        return np.array([ctx.seam_relevance[p] for p in prompts], dtype=np.float64)

    def weak(pairs):
        r = score_pairs(tf, teacher, pairs, "teacher (SEAM principles)")
        return r[: len(pairs)] - r[len(pairs) :]

    log(f"{ctx.name} seed {seed}: {m.method.target_text(m)} ({m.method.summary(m)})")
    pairs = ctx.splits["student_train"]
    q, extra, summary = m.method.build_labels(m, LabelTools(pairs, strong, weak))
    rows = [
        {"index": i, "id": p.id, "q": float(q[i]), "gold_agrees": bool(q[i] > 0.5), **extra[i]}
        for i, p in enumerate(pairs)
    ]
    warning = (summary.get("effect") or {}).get("warning")
    if warning:
        log(f"{ctx.name} seed {seed}: warning: {warning}")
    return rows, summary


def drift_probe_sets(ctx: SourceContext) -> list:
    """The evaluation sets whose drift is logged during training (every ``drift_interval`` steps): the ID test
    split and the first OOD target. Part of a student's training inputs; the other OOD targets are not."""
    return list(ctx.eval_sets)[:2] if ctx.cfg.drift and ctx.cfg.drift_interval else []


def pretrained_digest(cfg: RunConfig, name: str) -> str:
    """The "training digest" of a method that does not train (zero-shot): the pretrained student's config and the
    method's name; the same for every seed."""
    return stage_digest(model_identity(cfg.student), name)


def student_digest(ctx: SourceContext, seed: int, m) -> str:
    """What a student's training stage depends on: its training data, the teacher (its labels), the student
    config, the seed, the method's settings, the drift probe sets logged during training, and the code."""
    cfg = ctx.cfg
    if not m.method.trains:
        return pretrained_digest(cfg, m.name)
    return stage_digest(
        ctx.data_digest,
        model_identity(cfg.teacher),
        model_identity(cfg.student),
        seed,
        m.training_settings(),
        stage_versions("student"),
        *[ctx.eval_digests[n] for n in drift_probe_sets(ctx)],
        # the version of the labels it learns, when its method builds them (SEAM's is in stage_versions)
        *([label_versions(m.method)] if m.method.builds_labels and m.method.name not in STAGE_FORMATS else []),
    )


def twin_training(ctx: SourceContext, seed: int, train_digest: str) -> str | None:
    """The label of the cell's first grid entry that trains itself (no post-hoc transform) with the training digest
    a post-hoc entry's ``trained_as`` has (WiSE-FT's naive, when naive with the same settings is in the grid), so
    both use one training, ``models/<label>.safetensors``, whichever stage runs first; None when there is none."""
    for x in ctx.cfg.expanded_methods():
        if (x.seeds is None or seed in x.seeds) and x.method.trains and x.method.trained_as(x) is None:
            if student_digest(ctx, seed, x) == train_digest:
                return x.display
    return None


def cell_student(ctx: SourceContext, cell_dir: Path, seed: int, m, labels: list, built: list | None = None):
    """Training stage of one student method in one cell (``stages/student-<label>.json``): its targets
    (:meth:`~w2s_shift.methods.Method.targets` from the teacher's soft ``labels`` or the labels it ``built``), its
    objective, and what its regularizer needs of the pretrained student; save its weights, its training log and
    its drift during training. Returns the trained model when it trained now (for :func:`cell_scores`), else None."""
    cfg = ctx.cfg
    label = m.display
    digest = student_digest(ctx, seed, m)
    stage = Stage(cell_dir, f"student-{label}", digest)
    if stage.done():
        wrong = saved_weights_problem(cell_dir / "models" / f"{label}.safetensors", digest)
        if wrong is None:
            log(f"{ctx.name} seed {seed}: student {label} trained earlier, reusing its weights")
            return None
        log(f"{ctx.name} seed {seed}: student {label}: {wrong}; training it again")
    use_threads(cfg.student, cfg)
    sf = ctx.student()
    model = sf.new_model(seed)
    # a post-hoc method (WiSE-FT) trains the entry of trained_as, saved under that entry's label and digest (shared
    # by every entry trained alike), then transforms it into this entry's model (posthoc)
    post = m.method.trained_as(m)
    tm = post if post is not None else m
    train_label, train_digest = tm.display, student_digest(ctx, seed, tm) if post is not None else digest
    if post is not None:  # an entry of the grid trained alike (naive with the same settings): its weights, one training
        train_label = twin_training(ctx, seed, train_digest) or train_label
    meth = tm.method
    q = method_targets(tm, labels, built)
    need = meth.reference_need(tm, sf.anchor_layers)
    layers = need.layers if need else None
    reference = None
    if need and need.frozen_copy:
        reference = make_reference(sf.base, sf.offset, autocast_bf16=cfg.student.bf16)
    head = {}
    if meth.objective_lm_head:  # an extra head for the objective (GRM): the pretrained LM head, not in the reward model
        from ..models.lm import lm_head_weight

        head["lm_head"] = lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
    objective = method_objective(tm, layers=None if layers == [sf.n_layers] else layers, reference=reference, **head)
    ds = sf.dataset(
        "student_train",
        ctx.splits["student_train"],
        q,
        reference_layers=None if layers in (None, [sf.n_layers]) else layers,
        with_reference=bool(need and need.cached_states),
    )
    callbacks = [FaultCallback(f"student-{label}")]
    drift_cb = None
    anchored = meth.drift_layers(tm, sf.anchor_layers)
    if cfg.drift and cfg.drift_interval:
        dl = sorted(set(anchored) | {sf.n_layers})
        probes = {n: sf.drift_probe(n, ctx.eval_sets[n], 32, dl) for n in drift_probe_sets(ctx)}
        drift_cb = DriftCallback(probes, cfg.drift_interval)
        callbacks.append(drift_cb)
    settings = meth.summary(tm)
    log(
        f"{ctx.name} seed {seed}: student {label}: {len(q)} pairs ({meth.target_text(tm)}"
        + (f", {settings}" if settings else "")
        + (f", layers {layers}" if need else "")
        + (f"; trained as {train_label}, then {m.method.summary(m)}" if post is not None else "")
        + ")"
    )
    ckpt = cell_dir / "checkpoints" / f"{train_label}-{train_digest[:8]}"
    sf.release_device_copies()  # the reference and probe states are computed: the device's memory is the student's
    hist = trained_or_train(
        model,
        cell_dir / "models" / f"{train_label}.safetensors",
        train_digest,
        lambda: train_pairs(
            model,
            ds,
            sf.pad_id,
            train_args(
                cfg.student,
                seed,
                cfg,
                f"student {label} ({ctx.name}, seed {seed})",
                model,
                logging_dir=str(cell_dir / "tensorboard" / label),
            ),
            str(ckpt),
            callbacks=callbacks,
            objective=objective,
        ),
        drift_cb,
    )
    model = whole_model(model, sf, seed, cell_dir / "models" / f"{train_label}.safetensors", train_digest)
    run_on_main(shutil.rmtree, ckpt, ignore_errors=True)  # after every process has left the Trainer
    if post is not None:
        m.method.posthoc(m, model, sf.new_model(seed))
        run_on_main(
            save_state_tensors, trainable_state(model), cell_dir / "models" / f"{label}.safetensors", {"digest": digest}
        )
        write_json_on_main(cell_dir / "models" / f"{label}.json", {"digest": digest, "trained_as": train_label})
    outputs = [f"logs/{label}.jsonl"]
    write_jsonl_on_main(cell_dir / "logs" / f"{label}.jsonl", hist)
    if cfg.drift:  # the final drift on each evaluation set is added by its scoring stage (cell_scores)
        write_json_on_main(
            cell_dir / "drift" / f"{label}.json",
            {
                "layers": sf.drift_layers(anchored or None),
                "final": {},
                # a post-hoc model was not itself trained: the drift during training was its trained_as student's
                "during": drift_cb.rows if drift_cb and post is None else [],
                "probe_pairs": {"final": cfg.drift_pairs, "during": 32},
            },
        )
        outputs.append(f"drift/{label}.json")
    # the split this stage trained on: what else the student's featurizer encoded so far depends on which stages ran
    # in this process (a resumed run reuses some), and each other stage records its own sets
    trained_on = "student_train"
    stage.finish(
        outputs,
        max_length=sf.max_length,
        truncated_pairs={k: v for k, v in sf.truncated.items() if k == trained_on},
        cut_counts={k: v for k, v in sf.cut_counts.items() if k == trained_on},
        rendering={"student_chat_template": uses_chat_template(sf.loaded.tokenizer)},
    )
    return model

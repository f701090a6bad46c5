"""Scoring stages: one per (model, evaluation set), keyed on the model's training digest and the set's identity,
so a new OOD target costs its scoring only; rewards files, zero-shot log-likelihoods and the export."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.render import RENDER_VERSION, encode_pairs
from ..distributed import run_on_main, score_sequences_sharded, sharded, state
from ..inference import finite_or_raise
from ..io import read_json
from ..models.loading import untied_lm_head
from ..models.reward_model import RewardModel
from ..models.state import load_trained_state
from ..versions import stage_versions
from .featurizer import Featurizer, SourceContext, seqs_of, to_run_device
from .rundir import RunDirError, Stage, fault, log, stage_digest, use_threads, write_json_on_main, write_jsonl_on_main


def precision_of(mcfg) -> str:
    """The precision a model of the run computes its rewards in: "bfloat16" (bf16 on: bfloat16 autocast, the frozen
    trunk's weights in bfloat16) or "float32"."""
    return "bfloat16" if mcfg.bf16 is True else "float32"


def save_rewards(
    cell_dir: Path, model_name: str, dataset: str, pairs: list, rewards: np.ndarray, precision: str | None = None
) -> None:
    """Write ``cell_dir/rewards/<model_name>__<dataset>.jsonl`` atomically: one row per pair with its rewards
    (``rewards`` (2B,): chosen_1..chosen_B then rejected_1..rejected_B), response lengths in characters and the
    ``precision`` the rewards were computed in (:func:`precision_of`).

    Raises:
        ValueError: a non-finite reward (:func:`w2s_shift.inference.finite_or_raise`)."""
    b = len(pairs)
    finite_or_raise(rewards, f"{model_name} on {dataset}")
    # len_chosen / len_rejected: characters of the response texts, for the report's "longer wins" baseline
    rows = [
        {
            "index": i,
            "id": p.id,
            "reward_chosen": float(rewards[i]),
            "reward_rejected": float(rewards[i + b]),
            "len_chosen": len(p.chosen),
            "len_rejected": len(p.rejected),
            **({"precision": precision} if precision else {}),
        }
        for i, p in enumerate(pairs)
    ]
    write_jsonl_on_main(cell_dir / "rewards" / f"{model_name}__{dataset}.jsonl", rows)


def score_stage_name(label: str, dataset: str) -> str:
    """Marker name of the scoring stage of one model on one evaluation set: ``score-<label>__<dataset>``."""
    return f"score-{label}__{dataset}"


def cell_scores(
    ctx: SourceContext,
    cell_dir: Path,
    seed: int,
    label: str,
    kind: str,
    model_digest: str,
    model=None,
    sets: list | None = None,
) -> list:
    """Scoring stages of one model of a cell, one per evaluation set (``stages/score-<label>__<set>.json``), each
    keyed on the model's training digest and the set's identity (``ctx.eval_digests``): only unfinished ones run,
    so a new OOD target costs its scoring and nothing else. Writes ``rewards/<label>__<set>.jsonl`` and, for a
    trained student with ``drift`` on, the set's final drift into ``drift/<label>.json``. When the drift probe holds
    the whole set (``drift_pairs`` >= its pairs, one process) one pass gives both: the probe's rewards equal the
    scoring pass's to the bit (:meth:`~w2s_shift.metrics.drift.DriftProbe.measure`). With ``mechanism`` on, a
    trained student's scoring pass also keeps its pooled features for the mechanism stage
    (:meth:`~w2s_shift.pipeline.featurizer.SourceContext.keep_student_pooled`), which then needs no pass of its own.

    Args:
        kind: "teacher", "pretrained" (a method that does not train: zero-shot) or a trained student's method.
        model_digest: the training stage's digest (for zero-shot: the student config's).
        model: the trained model when in memory; else it is loaded from ``models/<label>.safetensors`` if needed.
        sets: the evaluation sets to score (names of ``ctx.eval_sets``); default all.

    Returns:
        the names of the sets scored now (the others were done earlier).

    Raises:
        RunDirError: the saved weights are missing or belong to another training digest.
    """
    cfg = ctx.cfg
    role = cfg.teacher if kind == "teacher" else cfg.student
    fault_point = "teacher:eval" if kind == "teacher" else f"student-{label}:eval"
    scored, loaded = [], False
    for k, name in enumerate(sets if sets is not None else list(ctx.eval_sets)):
        pairs = ctx.eval_sets[name]
        stage = Stage(
            cell_dir,
            score_stage_name(label, name),
            stage_digest(model_digest, ctx.eval_digests[name], stage_versions("score")),
        )
        dfile = cell_dir / "drift" / f"{label}.json"
        with_drift = kind not in ("teacher", "pretrained") and cfg.drift and dfile.is_file()
        if stage.done() and not (with_drift and name not in read_json(dfile).get("final", {})):
            continue  # (a drift file rewritten by its training stage needs this set's final drift again)
        use_threads(role, cfg)
        f = ctx.teacher() if kind == "teacher" else ctx.student()
        if kind != "pretrained" and model is None:  # loaded once, for every set this call scores
            model, loaded = load_saved_model(f, cell_dir, seed, label, model_digest), True
        how = (
            "pretrained model, mean response log-likelihood, no training"
            if kind == "pretrained"
            else "saved weights, no training"
            if loaded
            else "the model just trained"
        )
        log(f"{ctx.name} seed {seed}: scoring {label} on {name} ({len(pairs)} pairs; {how})")
        final = None
        if kind == "pretrained":
            if name not in ctx.zero_shot_rewards:  # the pretrained model: the same rewards for every seed
                ctx.zero_shot_rewards[name] = zero_shot_rewards(f, name, pairs)
            rewards = ctx.zero_shot_rewards[name]
        elif with_drift and cfg.drift_pairs >= len(pairs) and state().num_processes == 1:
            # the drift probe holds the whole set: its forwards give the rewards too, the same to the bit
            d = read_json(dfile)
            probe = f.drift_probe(name, pairs, cfg.drift_pairs, [int(x) for x in d["layers"]])
            final, rewards = probe.measure(model, with_rewards=True)
        elif kind not in ("teacher", "pretrained") and cfg.mechanism:
            # the mechanism stage reads this student's pooled features on the set: from these forwards
            rewards, pooled = score_set(f, model, name, pairs, label, with_pooled=True)
            ctx.keep_student_pooled((seed, label, model_digest, name), pooled)
        else:
            rewards = score_set(f, model, name, pairs, label)
        save_rewards(cell_dir, label, name, pairs, rewards, precision_of(role))
        outputs = [f"rewards/{label}__{name}.jsonl"]
        if k == 0:
            fault(fault_point)
        if with_drift:
            d = read_json(dfile)
            if final is None:
                probe = f.drift_probe(name, pairs, cfg.drift_pairs, [int(x) for x in d["layers"]])
                final = probe.measure(model)
            d["final"][name] = final
            write_json_on_main(dfile, d)
            outputs.append(f"drift/{label}.json")
        stage.finish(
            outputs,
            model=label,
            dataset=name,
            pairs=len(pairs),
            max_length=f.max_length,
            cut_counts={name: f.cut_counts.get(name)},
            precision=precision_of(role),
        )
        scored.append(name)
    return scored


def load_saved_model(f: Featurizer, cell_dir: Path, seed: int, label: str, digest: str) -> RewardModel:
    """The trained model ``label`` of a cell from ``models/<label>.safetensors``, built as its training built it.

    Raises:
        RunDirError: the weights or their ``.json`` are missing, or were saved by another training digest (the
            ``.json``'s or the weights file's own header digest), or do not fit the model."""
    w, meta = cell_dir / "models" / f"{label}.safetensors", cell_dir / "models" / f"{label}.json"
    try:
        saved = read_json(meta)["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        saved = None
    if not w.is_file() or saved != digest:
        raise RunDirError(
            f"{w}: the saved weights of {label} are missing or belong to another training run (digest {saved}, "
            f"expected {digest}); rerun `w2s-shift run` on this directory to train them again"
        )
    model = f.new_model(seed)
    try:
        load_trained_state(model, w, digest=digest)
    except ValueError as e:
        raise RunDirError(f"{e}; rerun `w2s-shift run` on this directory to train {label} again") from None
    model.eval()
    return model


def score_set(f: Featurizer, model, name: str, pairs: list, label: str, with_pooled: bool = False):
    """Rewards (2B,) of a model (moved to the run's device first) on an evaluation set of its featurizer ``f``
    (encodings and trunk states cached there), chosen_1..chosen_B then rejected_1..rejected_B, each process scoring
    its share (:func:`~w2s_shift.distributed.score_sequences_sharded`); with ``with_pooled``, (rewards, (2B, H)
    float32 pooled states from the same forwards)."""
    feats = f.features(name, pairs)
    return score_sequences_sharded(
        to_run_device(model),
        feats["seqs"],
        f.pad_id,
        states=feats["states"],
        max_tokens=f.mcfg.eval_max_tokens,
        desc=f"{label} scores {name}",
        bf16=f.mcfg.bf16,
        with_pooled=with_pooled,
    )


def score_pairs(f: Featurizer, model, pairs: list, label: str) -> np.ndarray:
    """Rewards (2B,) of pairs that are not kept (e.g. SEAM's principle-prefixed variants): encoded, their trunk
    states computed, scored, nothing cached."""
    enc, _ = encode_pairs(pairs, f.loaded.tokenizer, f.max_length)
    seqs, _ = seqs_of(enc)
    return score_sequences_sharded(
        to_run_device(model),
        seqs,
        f.pad_id,
        states=f.trunk_states(seqs, f"{f.role} trunk ({label})"),
        max_tokens=f.mcfg.eval_max_tokens,
        desc=f"{label} scores",
        bf16=f.mcfg.bf16,
    )


def export_students(ctx: SourceContext, cell_dir: Path, seed: int, methods: list, labels: list | None = None) -> None:
    """Export trained students from their saved weights (also for a run finished earlier): those named in
    ``labels``, by default those of the config's ``export``. An export of the same weights and rendering is kept
    while its files are the ones it wrote (:func:`~w2s_shift.models.export.export_intact`); else it is redone."""
    from ..models.export import export_intact, export_reward_model, read_export_info

    export = ctx.cfg.export if labels is None else list(labels)
    wanted = [
        m
        for m in methods
        if m.method.trains and (export == "all" or (isinstance(export, list) and m.display in export))
    ]
    for m in wanted:
        label = m.display
        out = cell_dir / "export" / label
        meta = read_json(cell_dir / "models" / f"{label}.json")
        info = read_export_info(out) if out.is_dir() else None
        if (
            info
            and (info.get("metadata") or {}).get("weights_digest") == meta["digest"]
            and info.get("render_version") == RENDER_VERSION
            and export_intact(out, info)
        ):  # an export from an older rendering, or with a file changed, missing or added, is redone
            continue
        sf = ctx.student()
        model = sf.new_model(seed)
        load_trained_state(model, cell_dir / "models" / f"{label}.safetensors", digest=meta["digest"])
        run_on_main(
            export_reward_model,
            model,
            sf.loaded.tokenizer,
            out,
            base_backbone=sf.loaded.backbone if sf.split_mode else None,
            n_top=sf.mcfg.trainable_layers if sf.split_mode else None,
            max_length=sf.max_length,
            metadata={
                "method": label,
                "source": ctx.name,
                "seed": seed,
                "base_model": sf.mcfg.name,
                "weights_digest": meta["digest"],
                "precision": precision_of(sf.mcfg),  # what the run scored in: `score` defaults to it
            },
        )
        log(f"{ctx.name} seed {seed}: student {label} exported to {out} (AutoModelForSequenceClassification)")


def zero_shot_rewards(sf: Featurizer, name: str, pairs: list) -> np.ndarray:
    """Zero-shot rewards (2B,) of the pretrained strong model on an evaluation set: the mean log-likelihood of
    the response tokens under its LM head (chosen_1..chosen_B then rejected_1..rejected_B)."""
    from ..models.lm import lm_head_weight, sequence_logprobs

    head_w = lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
    f = sf.features(name, pairs)
    # with cached trunk states only the pretrained top layers run (sf.base is never trained: students copy it)
    seqs, masks, states = f["seqs"], f["masks"], f["states"]

    def logprobs(idx: list) -> np.ndarray:
        return sequence_logprobs(
            sf.on_device(),
            head_w,
            [seqs[i] for i in idx],
            [masks[i] for i in idx],
            sf.pad_id,
            max_tokens=sf.mcfg.eval_max_tokens,
            bf16=sf.mcfg.bf16,
            reduce="mean",
            states=None if states is None else [states[i] for i in idx],
        )

    # each process scores a share of the sequences (gathered in input order)
    return np.asarray(sharded(logprobs, list(range(len(seqs)))), dtype=np.float64)

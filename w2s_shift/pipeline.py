"""The main job: weak teacher -> soft labels -> strong students (Naive, ANCHOR, ...) + ceiling -> ID/OOD table.

Protocol (protocol.md; Burns et al. 2023; Le et al. 2026): the source dataset is split by prompt into
teacher-train (gold labels train the weak teacher), student-train (the teacher's soft labels train each
student; gold labels train the strong ceiling) and the ID test split; OOD targets are other datasets never
trained on. Every stage writes its files atomically and a stage marker last; a rerun skips finished stages
whose inputs (config digest) are unchanged, so a killed run resumes at the stage it was in.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from . import __version__
from .config import RunConfig
from .data.adapters import LoadResult, load_file, load_hub, load_named
from .data.render import encode_pairs, uses_chat_template
from .data.splits import prompt_keys, remove_prompt_overlap, split_by_prompt, subsample
from .evaluate import (bootstrap_ci, compute_reference_states, compute_trunk_states, finite_or_raise, pairwise_accuracy,
                       score_sequences, w2s_metrics)
from .io import read_json, read_jsonl, write_json_atomic, write_jsonl_atomic, write_text_atomic
from .models.loading import load_backbone
from .models.reward_model import RewardModel, can_split, split_decoder
from .train import PairDataset, PairTrainerConfig, make_reference, train_pairs


class RunDirError(RuntimeError):
    """The run directory cannot be used (unwritable, or it holds a run of a different config)."""


def load_ref(ref, skip_invalid: bool) -> LoadResult:
    """Load a :class:`~w2s_shift.config.DatasetRef`."""
    if ref.name:
        res = load_named(ref.name, skip_invalid=skip_invalid)
    elif ref.path:
        res = load_file(ref.path, ref.format, source=ref.display, columns=ref.columns, skip_invalid=skip_invalid)
    else:
        res = load_hub(ref.hf, format=ref.format, source=ref.display, split=ref.split, subset=ref.subset,
                       columns=ref.columns, skip_invalid=skip_invalid)
    res.name = ref.display
    return res


@dataclass
class Stage:
    """A cached stage: done when ``stages/<name>.json`` exists with the same digest."""

    run_dir: Path
    name: str
    digest: str
    started: float = field(default_factory=time.time)

    @property
    def marker(self) -> Path:
        return self.run_dir / "stages" / f"{self.name}.json"

    def done(self) -> bool:
        if not self.marker.is_file():
            return False
        try:
            return read_json(self.marker).get("digest") == self.digest
        except (OSError, ValueError):
            return False

    def finish(self, **info) -> None:
        write_json_atomic(self.marker, {"digest": self.digest, "seconds": round(time.time() - self.started, 2), **info})


def prepare_run_dir(cfg: RunConfig, overwrite: bool) -> Path:
    """Create/check the run directory: refuse one that belongs to a different config unless ``overwrite``.

    Raises:
        RunDirError: not writable, or a different config's run without overwrite.
    """
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"{out}: cannot write to the run directory: {e}") from None
    digest = cfg.digest()
    marker = out / "run.json"
    if marker.is_file():
        old = read_json(marker).get("config_digest")
        if old != digest and not overwrite:
            raise RunDirError(f"{out} holds a run of a different config (digest {old}, now {digest}); "
                              "use another output_dir or --overwrite (finished stages whose inputs are unchanged are kept)")
    write_text_atomic(out / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    write_json_atomic(marker, {"config_digest": digest, "w2s_shift_version": __version__})
    return out


def _log(msg: str) -> None:
    print(f"[w2s-shift] {msg}", flush=True)


def _seqs(encoded: list) -> tuple:
    """Flatten encoded pairs to sequences [chosen_1..chosen_B, rejected_1..rejected_B] and response masks."""
    seqs = [e.chosen.input_ids for e in encoded] + [e.rejected.input_ids for e in encoded]
    masks = [e.chosen.response_mask for e in encoded] + [e.rejected.response_mask for e in encoded]
    return seqs, masks


def _pairs_of(flat: list) -> list:
    b = len(flat) // 2
    return [(flat[i], flat[i + b]) for i in range(b)]


def _freeze(model: RewardModel, trainable_layers: int | None, freeze_embeddings: bool) -> None:
    """Freeze the backbone except its top ``trainable_layers`` layers (and final norm); the head trains."""
    bb = model.backbone
    if trainable_layers is not None:
        layers = getattr(bb, "layers", None)
        if layers is None and hasattr(bb, "encoder"):
            layers = getattr(bb.encoder, "layer", None)
        if layers is None:
            raise ValueError(f"{type(bb).__name__}: cannot find its layers to train only the top {trainable_layers}")
        for p in bb.parameters():
            p.requires_grad_(False)
        for layer in list(layers)[-trainable_layers:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        for name in ("norm", "final_layernorm", "ln_f"):
            if isinstance(getattr(bb, name, None), torch.nn.Module):
                for p in getattr(bb, name).parameters():
                    p.requires_grad_(True)
    if freeze_embeddings:
        emb = bb.get_input_embeddings() if hasattr(bb, "get_input_embeddings") else None
        if isinstance(emb, torch.nn.Module):
            for p in emb.parameters():
                p.requires_grad_(False)


def _train_cfg(m, seed: int, **extra) -> PairTrainerConfig:
    return PairTrainerConfig(epochs=m.epochs, batch_size=m.batch_size, learning_rate=m.learning_rate,
                             weight_decay=m.weight_decay, warmup_ratio=m.warmup_ratio, seed=seed, bf16=m.bf16,
                             logging_steps=10, **extra)


def _save_rewards(run_dir: Path, model_name: str, dataset: str, pairs: list, rewards: np.ndarray) -> None:
    b = len(pairs)
    finite_or_raise(rewards, f"{model_name} on {dataset}")
    rows = [{"index": i, "id": p.id, "reward_chosen": float(rewards[i]), "reward_rejected": float(rewards[i + b])}
            for i, p in enumerate(pairs)]
    write_jsonl_atomic(run_dir / "rewards" / f"{model_name}__{dataset}.jsonl", rows)


def _load_rewards(run_dir: Path, model_name: str, dataset: str) -> tuple:
    rows = read_jsonl(run_dir / "rewards" / f"{model_name}__{dataset}.jsonl")
    return np.array([r["reward_chosen"] for r in rows]), np.array([r["reward_rejected"] for r in rows])


def prepare_data(cfg: RunConfig) -> tuple:
    """Load the source and OOD datasets, split the source by prompt, subsample, remove OOD prompt overlap.

    Returns:
        (splits {teacher_train, student_train, test: [pairs]}, ood {name: [pairs]}, summary dict)
    """
    d = cfg.data
    src = load_ref(d.source, d.skip_invalid)
    if not src.pairs:
        raise ValueError(f"source dataset {d.source.display!r} has no valid pairs")
    splits = split_by_prompt(src.pairs, d.split_fractions, d.seed)
    caps = {"teacher_train": d.n_teacher_train, "student_train": d.n_student_train, "test": d.n_test}
    splits = {k: subsample(v, caps[k], d.seed) for k, v in splits.items()}
    summary = {"source": src.summary(), "splits": {k: len(v) for k, v in splits.items()}, "ood": {}}
    src_keys = prompt_keys(src.pairs)
    ood = {}
    for ref in d.ood:
        res = load_ref(ref, d.skip_invalid)
        pairs, overlap = res.pairs, 0
        if d.remove_ood_overlap:
            pairs, overlap = remove_prompt_overlap(pairs, src_keys)
        pairs = subsample(pairs, d.n_ood, d.seed)
        if not pairs:
            raise ValueError(f"OOD target {ref.display!r} has no pairs left after filtering")
        if ref.display in ood or ref.display == "id":
            raise ValueError(f"OOD target name {ref.display!r} is used twice; set label:")
        ood[ref.display] = pairs
        summary["ood"][ref.display] = {**res.summary(), "prompt_overlap_removed": overlap, "used": len(pairs)}
    for name, v in splits.items():
        if not v:
            raise ValueError(f"split {name!r} is empty: the source has too few prompts ({len(src.pairs)} pairs)")
    return splits, ood, summary


def run(cfg: RunConfig, overwrite: bool = False) -> dict:
    """Run the whole protocol for ``cfg``; returns the metrics dict (also written to ``metrics.json``).

    Raises:
        RunDirError, ConfigError, DataError, ModelError, TrainingDiverged: each with a clear message.
    """
    t0 = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_dir = prepare_run_dir(cfg, overwrite)
    timings: dict = {}
    import transformers

    transformers.logging.set_verbosity_error()

    # ---- data -------------------------------------------------------------------------------------------
    ts = time.time()
    splits, ood, data_summary = prepare_data(cfg)
    id_name = "id:" + cfg.data.source.display
    eval_sets = {id_name: splits["test"], **ood}
    _log(f"data: source {cfg.data.source.display}: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items())
         + "; OOD " + ", ".join(f"{k} {len(v)}" for k, v in ood.items()))
    sk = data_summary["source"]["invalid_rows_skipped"]["skipped"]
    if sk:
        _log(f"data: skipped {sk} invalid source rows (skip_invalid is on): {data_summary['source']['invalid_rows_skipped']['by_reason']}")
    timings["data"] = time.time() - ts

    # ---- teacher: train on gold, label student-train, score eval sets --------------------------------------
    ts = time.time()
    tstage = Stage(run_dir, "teacher", cfg.digest("data", "teacher", "seed"))
    tk = load_backbone(cfg.teacher.name, trust_remote_code=cfg.teacher.trust_remote_code, allow_pickle=cfg.teacher.allow_pickle)
    tk.tokenizer.model_max_length = int(1e9)
    t_max = min(cfg.teacher.max_length, tk.max_positions or cfg.teacher.max_length)
    trunc_counts: dict = {}
    if not tstage.done():
        _log(f"teacher: {cfg.teacher.name} on {len(splits['teacher_train'])} gold pairs (max_length {t_max})")
        enc_tt, trunc_counts["teacher/teacher_train"] = encode_pairs(splits["teacher_train"], tk.tokenizer, t_max)
        transformers.set_seed(cfg.seed)
        teacher = RewardModel(tk.backbone, tk.hidden_size, pooling=cfg.teacher.pooling)
        _freeze(teacher, cfg.teacher.trainable_layers, cfg.teacher.freeze_embeddings)
        hist = train_pairs(teacher, PairDataset(enc_tt, [1.0] * len(enc_tt)), tk.tokenizer.pad_token_id,
                           _train_cfg(cfg.teacher, cfg.seed), str(run_dir / "checkpoints" / "teacher"))
        for name, pairs in {"student_train": splits["student_train"], **eval_sets}.items():
            enc, trunc_counts[f"teacher/{name}"] = encode_pairs(pairs, tk.tokenizer, t_max)
            r = score_sequences(teacher, _seqs(enc)[0], tk.tokenizer.pad_token_id, max_tokens=cfg.teacher.eval_max_tokens,
                                desc=f"teacher scores {name}")
            _save_rewards(run_dir, "teacher", name, pairs, r)
        rc, rr = _load_rewards(run_dir, "teacher", "student_train")
        q = 1.0 / (1.0 + np.exp(-(rc - rr)))
        write_jsonl_atomic(run_dir / "teacher_labels.jsonl",
                           [{"index": i, "id": p.id, "q": float(q[i]), "gold_agrees": bool(q[i] > 0.5)}
                            for i, p in enumerate(splits["student_train"])])
        write_jsonl_atomic(run_dir / "logs" / "teacher.jsonl", hist)
        tstage.finish(truncated=trunc_counts)
        del teacher
    else:
        _log("teacher: done earlier, reusing its labels and rewards")
    timings["teacher"] = time.time() - ts
    labels = [r["q"] for r in read_jsonl(run_dir / "teacher_labels.jsonl")]

    # ---- students ---------------------------------------------------------------------------------------
    ts = time.time()
    sk_loaded = None
    feats: dict = {}

    def student_features():
        """Load the student, encode, and (partial fine-tuning) compute trunk states once for all methods."""
        nonlocal sk_loaded
        if sk_loaded is not None:
            return sk_loaded
        sm = cfg.student
        lk = load_backbone(sm.name, trust_remote_code=sm.trust_remote_code, allow_pickle=sm.allow_pickle)
        lk.tokenizer.model_max_length = int(1e9)
        s_max = min(sm.max_length, lk.max_positions or sm.max_length)
        split_mode = bool(sm.trainable_layers and sm.trunk_cache and can_split(lk.backbone))
        trunk = head = None
        if split_mode:
            trunk, head = split_decoder(lk.backbone, sm.trainable_layers)
            if sm.bf16:
                trunk = trunk.to(torch.bfloat16)
        for name, pairs in {"student_train": splits["student_train"], **eval_sets}.items():
            enc, trunc_counts[f"student/{name}"] = encode_pairs(pairs, lk.tokenizer, s_max)
            seqs, masks = _seqs(enc)
            st = None
            if split_mode:
                st = compute_trunk_states(trunk, seqs, lk.tokenizer.pad_token_id, max_tokens=sm.eval_max_tokens,
                                          dtype=torch.bfloat16 if sm.bf16 else torch.float32, desc=f"student trunk {name}")
            feats[name] = {"enc": enc, "seqs": seqs, "masks": masks, "states": st}
        del trunk
        sk_loaded = (lk, head if split_mode else lk.backbone, split_mode, s_max)
        _log(f"student: {sm.name}, {'top ' + str(sm.trainable_layers) + ' layers on cached trunk states' if split_mode else 'full model'}, "
             f"max_length {s_max}; truncated pairs: " + ", ".join(f"{k} {v}" for k, v in trunc_counts.items() if k.startswith('student')))
        return sk_loaded

    ref_cache: dict = {}
    for m in cfg.methods:
        label = m.display
        stage = Stage(run_dir, f"student-{label}", cfg.digest("data", "teacher", "student", "seed") + "-" +
                      RunConfig.model_validate({"methods": [m.model_dump()]}).digest("methods"))
        if stage.done():
            _log(f"student {label}: done earlier, reusing its rewards")
            continue
        lk, base, split_mode, _ = student_features()
        sm = cfg.student
        transformers.set_seed(cfg.seed)  # same head init for every method
        model = RewardModel(copy.deepcopy(base), lk.hidden_size, pooling=sm.pooling)
        if not split_mode:
            _freeze(model, sm.trainable_layers, sm.freeze_embeddings)
        tr = feats["student_train"]
        q = [1.0] * len(labels) if m.name == "ceiling" else labels
        extra = {}
        reference, ref_states = None, None
        if m.name == "anchor":
            extra["anchor_lambda"] = m.anchor_lambda
            if m.reference == "cached":
                if "train" not in ref_cache:
                    ref_cache["train"] = _pairs_of(compute_reference_states(
                        base, tr["seqs"], tr["masks"], lk.tokenizer.pad_token_id, states=tr["states"],
                        max_tokens=sm.eval_max_tokens, dtype=torch.bfloat16 if sm.bf16 else torch.float32))
                ref_states = ref_cache["train"]
            else:
                reference = make_reference(base)
        if m.name == "confidence":
            extra.update(loss="confidence", confidence_alpha_max=m.confidence_alpha_max, confidence_warmup=m.confidence_warmup)
        _log(f"student {label}: training on {len(q)} pairs ({'gold labels' if m.name == 'ceiling' else 'teacher soft labels'}"
             + (f", lambda {m.anchor_lambda:g}, reference {m.reference}" if m.name == "anchor" else "") + ")")
        states = _pairs_of(tr["states"]) if tr["states"] is not None else None
        hist = train_pairs(model, PairDataset(tr["enc"], q, states, ref_states), lk.tokenizer.pad_token_id,
                           _train_cfg(sm, cfg.seed, **extra), str(run_dir / "checkpoints" / label), reference=reference)
        for name, pairs in eval_sets.items():
            f = feats[name]
            r = score_sequences(model, f["seqs"], lk.tokenizer.pad_token_id, states=f["states"],
                                max_tokens=sm.eval_max_tokens, desc=f"{label} scores {name}")
            _save_rewards(run_dir, label, name, pairs, r)
        write_jsonl_atomic(run_dir / "logs" / f"{label}.jsonl", hist)
        stage.finish(truncated={k: v for k, v in trunc_counts.items() if k.startswith("student")})
        del model, reference
    timings["students"] = time.time() - ts

    # ---- metrics ----------------------------------------------------------------------------------------
    from .report import build_metrics, write_report

    metrics = build_metrics(cfg, run_dir, id_name, list(ood), data_summary, timings)
    metrics["wall_seconds"] = round(time.time() - t0, 1)
    metrics["rendering"] = {"teacher_chat_template": uses_chat_template(tk.tokenizer),
                            "student_chat_template": uses_chat_template(sk_loaded[0].tokenizer) if sk_loaded else None}
    write_json_atomic(run_dir / "metrics.json", metrics)
    table = write_report(run_dir, metrics)
    print(table, flush=True)
    _log(f"done in {metrics['wall_seconds']:.0f} s; results in {run_dir}/ (metrics.json, report.md, rewards/, teacher_labels.jsonl)")
    return metrics

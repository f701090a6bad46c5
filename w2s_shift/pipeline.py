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
from .evaluate import (compute_reference_states, compute_trunk_states, finite_or_raise, score_sequences)
from .io import read_json, read_jsonl, write_json_atomic, write_jsonl_atomic, write_text_atomic
from .models.loading import load_backbone
from .report import load_rewards
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
        """True when the marker has this digest and every output it lists is there and parses."""
        try:
            info = read_json(self.marker)
            if not isinstance(info, dict) or info.get("digest") != self.digest:
                return False
            for rel in info.get("outputs", []):
                read_jsonl(self.run_dir / rel)  # a missing or truncated output redoes the stage
            return True
        except (OSError, ValueError):
            return False

    def finish(self, outputs: list, **info) -> None:
        """Write the marker last, listing the stage's output files (relative to the run dir)."""
        write_json_atomic(self.marker, {"digest": self.digest, "seconds": round(time.time() - self.started, 2),
                                        "outputs": [str(p) for p in outputs], **info})


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
    if marker.exists():
        try:
            old = read_json(marker)["config_digest"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RunDirError(f"{marker}: not a w2s-shift run marker; use another output_dir or --overwrite") from None
        if old != digest and not overwrite:
            raise RunDirError(f"{out} holds a run of a different config (digest {old}, now {digest}); "
                              "use another output_dir or --overwrite (finished stages whose inputs are unchanged are kept)")
    return out


def claim_run_dir(cfg: RunConfig, out: Path) -> None:
    """Record the config in the run directory (after the inputs were checked, so a failed start claims nothing)."""
    write_text_atomic(out / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    write_json_atomic(out / "run.json", {"config_digest": cfg.digest(), "w2s_shift_version": __version__})


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
                             head_lr_multiplier=m.head_lr_multiplier,
                             logging_steps=10, **extra)


def _save_rewards(run_dir: Path, model_name: str, dataset: str, pairs: list, rewards: np.ndarray) -> None:
    b = len(pairs)
    finite_or_raise(rewards, f"{model_name} on {dataset}")
    rows = [{"index": i, "id": p.id, "reward_chosen": float(rewards[i]), "reward_rejected": float(rewards[i + b])}
            for i, p in enumerate(pairs)]
    write_jsonl_atomic(run_dir / "rewards" / f"{model_name}__{dataset}.jsonl", rows)


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
            raise ValueError(f"OOD target {ref.display!r} has no pairs left: {len(res.pairs)} valid pairs, "
                             f"{overlap} removed because their prompt is in the source dataset")
        if ref.display in ood or ref.display == "id":
            raise ValueError(f"OOD target name {ref.display!r} is used twice; set label:")
        ood[ref.display] = pairs
        summary["ood"][ref.display] = {**res.summary(), "prompt_overlap_removed": overlap, "used": len(pairs)}
    for name, v in splits.items():
        if not v:
            raise ValueError(f"split {name!r} is empty: the source has too few prompts ({len(src.pairs)} pairs)")
    return splits, ood, summary


class Featurizer:
    """One model config, loaded once: encodes datasets, and in partial fine-tuning with trunk caching runs
    the frozen trunk once per sequence; every model trained from this checkpoint reuses the features."""

    def __init__(self, mcfg, role: str):
        self.mcfg, self.role = mcfg, role
        self.loaded = load_backbone(mcfg.name, trust_remote_code=mcfg.trust_remote_code, allow_pickle=mcfg.allow_pickle)
        tok = self.loaded.tokenizer
        tok.model_max_length = int(1e9)  # truncation is ours (prompt first); silence the tokenizer's warning
        self.pad_id = tok.pad_token_id
        self.max_length = min(mcfg.max_length, self.loaded.max_positions or mcfg.max_length)
        self.split_mode = bool(mcfg.trainable_layers and mcfg.trunk_cache and can_split(self.loaded.backbone))
        self.trunk, self.base = None, self.loaded.backbone
        if self.split_mode:
            self.trunk, self.base = split_decoder(self.loaded.backbone, mcfg.trainable_layers)
            if mcfg.bf16:
                self.trunk = self.trunk.to(torch.bfloat16)
            if torch.cuda.is_available():
                self.trunk = self.trunk.to("cuda")
        self.feats: dict = {}
        self.truncated: dict = {}
        self._ref: dict = {}

    def describe(self) -> str:
        how = (f"top {self.mcfg.trainable_layers} layers on cached trunk states" if self.split_mode
               else f"top {self.mcfg.trainable_layers} layers" if self.mcfg.trainable_layers else "all layers")
        return f"{self.mcfg.name} ({how}, max_length {self.max_length})"

    def features(self, name: str, pairs: list) -> dict:
        if name not in self.feats:
            enc, self.truncated[name] = encode_pairs(pairs, self.loaded.tokenizer, self.max_length)
            seqs, masks = _seqs(enc)
            states = None
            if self.split_mode:
                states = compute_trunk_states(self.trunk, seqs, self.pad_id, max_tokens=self.mcfg.eval_max_tokens,
                                              dtype=torch.bfloat16 if self.mcfg.bf16 else torch.float32,
                                              desc=f"{self.role} trunk {name}")
            self.feats[name] = {"enc": enc, "seqs": seqs, "masks": masks, "states": states}
        return self.feats[name]

    def new_model(self, seed: int) -> RewardModel:
        import transformers

        transformers.set_seed(seed)  # the same head init for every method
        model = RewardModel(copy.deepcopy(self.base), self.loaded.hidden_size, pooling=self.mcfg.pooling)
        if not self.split_mode:
            _freeze(model, self.mcfg.trainable_layers, self.mcfg.freeze_embeddings)
        return model

    def dataset(self, name: str, pairs: list, labels: list, with_reference: bool = False) -> PairDataset:
        f = self.features(name, pairs)
        states = _pairs_of(f["states"]) if f["states"] is not None else None
        ref = None
        if with_reference:
            if name not in self._ref:
                self._ref[name] = _pairs_of(compute_reference_states(
                    self.base, f["seqs"], f["masks"], self.pad_id, states=f["states"], max_tokens=self.mcfg.eval_max_tokens,
                    dtype=torch.bfloat16 if self.mcfg.bf16 else torch.float32, bf16=self.mcfg.bf16))
            ref = self._ref[name]
        return PairDataset(f["enc"], labels, states, ref)

    def score(self, model: RewardModel, name: str, pairs: list, label: str) -> np.ndarray:
        f = self.features(name, pairs)
        return score_sequences(model, f["seqs"], self.pad_id, states=f["states"], max_tokens=self.mcfg.eval_max_tokens,
                               desc=f"{label} scores {name}", bf16=self.mcfg.bf16)


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
    id_name = cfg.data.source.display
    if id_name in ood:
        raise ValueError(f"OOD target {id_name!r} is the source dataset itself")
    eval_sets = {id_name: splits["test"], **ood}
    _log(f"data: source {id_name}: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items())
         + "; OOD " + ", ".join(f"{k} {len(v)}" for k, v in ood.items()))
    for what, summ in [("source " + id_name, data_summary["source"])] + [(f"OOD {k}", v) for k, v in data_summary["ood"].items()]:
        sk = summ["invalid_rows_skipped"]
        if sk["skipped"]:
            _log(f"data: {what}: skipped {sk['skipped']} invalid rows (skip_invalid is on): {sk['by_reason']}")
        if summ.get("prompt_overlap_removed"):
            _log(f"data: {what}: removed {summ['prompt_overlap_removed']} pairs whose prompt is in the source")
    timings["data"] = time.time() - ts

    # ---- teacher: train on gold, label student-train, score eval sets --------------------------------------
    ts = time.time()
    tstage = Stage(run_dir, "teacher", cfg.digest("data", "teacher", "seed"))
    rendering = {}
    if not tstage.done():
        try:
            tf = Featurizer(cfg.teacher, "teacher")
        except ValueError as e:
            raise ValueError(f"teacher {cfg.teacher.name}: {e}") from None
        claim_run_dir(cfg, run_dir)
        rendering["teacher_chat_template"] = uses_chat_template(tf.loaded.tokenizer)
        _log(f"teacher: {tf.describe()} on {len(splits['teacher_train'])} gold pairs")
        teacher = tf.new_model(cfg.seed)
        ds = tf.dataset("teacher_train", splits["teacher_train"], [1.0] * len(splits["teacher_train"]))
        hist = train_pairs(teacher, ds, tf.pad_id, _train_cfg(cfg.teacher, cfg.seed), str(run_dir / "checkpoints" / "teacher"))
        for name, pairs in {"student_train": splits["student_train"], **eval_sets}.items():
            _save_rewards(run_dir, "teacher", name, pairs, tf.score(teacher, name, pairs, "teacher"))
        rc, rr = load_rewards(run_dir, "teacher", "student_train")
        q = 1.0 / (1.0 + np.exp(-(rc - rr)))
        write_jsonl_atomic(run_dir / "teacher_labels.jsonl",
                           [{"index": i, "id": p.id, "q": float(q[i]), "gold_agrees": bool(q[i] > 0.5)}
                            for i, p in enumerate(splits["student_train"])])
        write_jsonl_atomic(run_dir / "logs" / "teacher.jsonl", hist)
        _log("teacher: truncated pairs (prompt cut first) " + ", ".join(f"{k} {v}" for k, v in tf.truncated.items()))
        outputs = [f"rewards/teacher__{n}.jsonl" for n in ["student_train", *eval_sets]] + ["teacher_labels.jsonl", "logs/teacher.jsonl"]
        tstage.finish(outputs, truncated_pairs=tf.truncated, rendering=rendering)
        del teacher, tf
    else:
        _log("teacher: done earlier, reusing its labels and rewards")
        claim_run_dir(cfg, run_dir)
    timings["teacher"] = time.time() - ts
    labels = [r["q"] for r in read_jsonl(run_dir / "teacher_labels.jsonl")]

    # ---- students ---------------------------------------------------------------------------------------
    ts = time.time()
    sf = None
    for m in cfg.methods:
        label = m.display
        stage = Stage(run_dir, f"student-{label}", cfg.digest("data", "teacher", "student", "seed") + "-" +
                      RunConfig.model_validate({"methods": [m.model_dump()]}).digest("methods"))
        if stage.done():
            _log(f"student {label}: done earlier, reusing its rewards")
            continue
        if sf is None:
            try:
                sf = Featurizer(cfg.student, "student")
            except ValueError as e:
                raise ValueError(f"student {cfg.student.name}: {e}") from None
            _log(f"student: {sf.describe()}")
        model = sf.new_model(cfg.seed)
        q = [1.0] * len(labels) if m.name == "ceiling" else labels
        extra, reference = {}, None
        cached_ref = m.name == "anchor" and m.reference == "cached"
        if m.name == "anchor":
            extra["anchor_lambda"] = m.anchor_lambda
            if not cached_ref:
                reference = make_reference(sf.base)
        if m.name == "confidence":
            extra.update(loss="confidence", confidence_alpha_max=m.confidence_alpha_max, confidence_warmup=m.confidence_warmup)
        ds = sf.dataset("student_train", splits["student_train"], q, with_reference=cached_ref)
        _log(f"student {label}: training on {len(q)} pairs ({'gold labels' if m.name == 'ceiling' else 'teacher soft labels'}"
             + (f", lambda {m.anchor_lambda:g}, reference {m.reference}" if m.name == "anchor" else "") + ")")
        hist = train_pairs(model, ds, sf.pad_id, _train_cfg(cfg.student, cfg.seed, **extra),
                           str(run_dir / "checkpoints" / label), reference=reference)
        for name, pairs in eval_sets.items():
            _save_rewards(run_dir, label, name, pairs, sf.score(model, name, pairs, label))
        write_jsonl_atomic(run_dir / "logs" / f"{label}.jsonl", hist)
        _log(f"student {label}: truncated pairs (prompt cut first) " + ", ".join(f"{k} {v}" for k, v in sf.truncated.items()))
        stage.finish([f"rewards/{label}__{n}.jsonl" for n in eval_sets] + [f"logs/{label}.jsonl"],
                     truncated_pairs=sf.truncated, rendering={"student_chat_template": uses_chat_template(sf.loaded.tokenizer)})
        del model, reference
    timings["students"] = time.time() - ts

    # ---- metrics ----------------------------------------------------------------------------------------
    from .report import build_metrics, write_report

    metrics = build_metrics(cfg, run_dir, id_name, list(ood), data_summary, timings)
    metrics["wall_seconds"] = round(time.time() - t0, 1)
    metrics["stages"] = {p.stem: read_json(p) for p in sorted((run_dir / "stages").glob("*.json"))}
    write_json_atomic(run_dir / "metrics.json", metrics)
    table = write_report(run_dir, metrics)
    print(table, flush=True)
    if not metrics["teacher_beats_chance_id"]:
        lo, hi = metrics["accuracy_ci95"]["teacher"][id_name]
        _log(f"WARNING: the teacher does not beat chance on the ID test split (95% interval {lo:.1f}-{hi:.1f} includes 50%): "
             "its labels carry little signal and W2S gains are not interpretable; use more teacher data or epochs")
    _log(f"done in {metrics['wall_seconds']:.0f} s; results in {run_dir}/ (metrics.json, report.md, rewards/, teacher_labels.jsonl)")
    return metrics

"""The main job, a grid: for every source dataset x seed, a weak teacher -> soft labels -> strong students
(Naive, Confidence, SEAM, ANCHOR at each lambda and layer spec) + ceiling (+ zero-shot) -> ID/OOD tables.

Protocol (protocol.md; Burns et al. 2023; Le et al. 2026): each source dataset is split by prompt into
teacher-train (gold labels train the weak teacher), student-train (the teacher's soft labels train each
student; gold labels train the strong ceiling) and the ID test split; OOD targets are the other datasets,
never trained on. A grid row (source) loads each model once and computes the frozen trunk's states and the
ANCHOR reference states once for all seeds and methods. The teacher and its labels are computed once per
(source, teacher, seed) and reused by every student. Each stage writes its files atomically and a marker
holding the hash of what it depends on last; a rerun skips finished stages, and a killed stage resumes from
its last training checkpoint (or from its saved weights when training had finished).

Layout: ``RUN/<source>/seed<k>/`` holds rewards/, teacher_labels.jsonl, logs/, drift/, models/ (trained
weights), stages/ and metrics.json; ``RUN/metrics.json``, ``report.md``, ``report.html``, ``plots/``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import TrainerCallback

from . import __version__
from . import io as _io
from .config import RunConfig
from .data.adapters import LoadResult, load_file, load_hub, load_named
from .data.render import RENDER_VERSION, cut_counts, encode_pairs, uses_chat_template
from .data.splits import prompt_keys, remove_prompt_overlap, split_by_prompt, subsample
from .distributed import run_on_main, score_sequences_sharded
from .evaluate import DriftProbe, compute_reference_states, compute_trunk_states, finite_or_raise
from .io import read_json, read_jsonl
from .models.export import load_trained_state, save_trained_state
from .models.loading import ModelError, load_backbone, untied_lm_head
from .models.reward_model import (
    RewardModel,
    can_pack,
    can_split,
    disable_dropout,
    num_blocks,
    resolve_layer_spec,
    split_decoder,
)
from .report import load_rewards
from .training import PairDataset, PairTrainingArguments, make_reference, train_pairs
from .versions import STAGE_FORMATS, stage_kind, stage_versions


# Under several processes (accelerate launch) every result file is written once, by the main process; the
# others wait for it (run_on_main holds a barrier). In one process these are the plain atomic writers.
def write_json_atomic(path, obj):
    run_on_main(_io.write_json_atomic, path, obj)


def write_jsonl_atomic(path, rows):
    run_on_main(_io.write_jsonl_atomic, path, rows)


def write_text_atomic(path, text):
    run_on_main(_io.write_text_atomic, path, text)


class RunDirError(RuntimeError):
    """The run directory cannot be used (unwritable, or it holds a run of a different config)."""


def load_ref(ref, skip_invalid: bool) -> LoadResult:
    """Load a :class:`~w2s_shift.config.DatasetRef`."""
    if ref.name:
        res = load_named(ref.name, skip_invalid=skip_invalid)
    elif ref.path:
        res = load_file(ref.path, ref.format, source=ref.display, columns=ref.columns, skip_invalid=skip_invalid)
    else:
        res = load_hub(
            ref.hf,
            format=ref.format,
            source=ref.display,
            split=ref.split,
            subset=ref.subset,
            columns=ref.columns,
            skip_invalid=skip_invalid,
        )
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
            for rel in info.get("outputs", []):  # a missing or truncated output redoes the stage
                (read_json if rel.endswith(".json") else read_jsonl)(self.run_dir / rel)
            return True
        except (OSError, ValueError):
            return False

    def finish(self, outputs: list, **info) -> None:
        """Write the marker last, listing the stage's output files (relative to the run dir)."""
        write_json_atomic(
            self.marker,
            {
                "digest": self.digest,
                "seconds": round(time.time() - self.started, 2),
                "outputs": [str(p) for p in outputs],
                "versions": stage_versions(stage_kind(self.name)),
                **info,
            },
        )


def prepare_run_dir(cfg: RunConfig, overwrite: bool) -> Path:
    """Create/check the run directory: refuse one that belongs to a different config unless ``overwrite``.

    Raises:
        RunDirError: not writable, too little free disk space, or without overwrite: a different config's run,
            or results (config.yaml, metrics.json, report.md, a <source>/seed<k> cell) with no run.json.
    """
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"{out}: cannot write to the run directory: {e}") from None
    free = shutil.disk_usage(out).free
    if free < cfg.min_free_disk_mb * 2**20:
        raise RunDirError(
            f"{out}: only {free / 2**20:.0f} MiB free on its disk; the run needs at least "
            f"{cfg.min_free_disk_mb} MiB (min_free_disk_mb) for checkpoints and results"
        )
    digest = cfg.digest()
    marker = out / "run.json"
    if marker.exists():
        try:
            old = read_json(marker)["config_digest"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RunDirError(f"{marker}: not a w2s-shift run marker; use another output_dir or --overwrite") from None
        stale = [] if overwrite else stale_stages(out)
        if (old != digest or stale) and not overwrite:
            why = [f"holds a run of a different config (digest {old}, now {digest})"] if old != digest else []
            if stale:  # code versions (issue 14): say what an upgrade would recompute
                was = read_json(marker)
                why.append(
                    f"was written by w2s-shift {was.get('w2s_shift_version', '?')} (stage formats "
                    f"{was.get('stage_formats', 'not recorded')}; this is {__version__} with {STAGE_FORMATS}): "
                    f"{len(stale)} finished stage(s) computed by other code would be recomputed: {', '.join(stale)}"
                )
            raise RunDirError(
                f"{out} " + "; it ".join(why) + "; use another output_dir or --overwrite (finished "
                "stages whose inputs and code are unchanged are kept)"
            )
    elif not overwrite:  # results without the run.json that says whose they are: never replace them silently
        found = [n for n in ("config.yaml", "metrics.json", "report.md") if (out / n).exists()]
        found += sorted(str(p.relative_to(out)) for p in out.glob("*/seed*") if p.is_dir())
        if found:
            raise RunDirError(
                f"{out} holds results ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}) but no "
                "run.json saying which config made them; use another output_dir or --overwrite"
            )
    return out


def stale_stages(out: Path) -> list:
    """Finished stages of the run directory ``out`` (``<source>/seed<k>/stages/<name>.json``) whose recorded code
    versions differ from this code's (:func:`w2s_shift.versions.stage_versions`; a marker without them was written
    before versions were recorded): these would be recomputed. Returns ``<source>/seed<k>/<stage>`` names, sorted."""
    stale = []
    for m in sorted(Path(out).glob("*/*/stages/*.json")):
        try:
            info = read_json(m)
            kind = stage_kind(m.stem)
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or info.get("versions") != stage_versions(kind):
            stale.append(f"{m.parent.parent.relative_to(out).as_posix()}/{m.stem}")
    return stale


def claim_run_dir(cfg: RunConfig, out: Path) -> None:
    """Record the config in the run directory (after the inputs were checked, so a failed start claims nothing)."""
    write_text_atomic(out / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    from .models.precision import environment

    write_json_atomic(
        out / "run.json",
        {
            "config_digest": cfg.digest(),
            "w2s_shift_version": __version__,
            "stage_formats": dict(STAGE_FORMATS),
            "environment": environment(cfg, _DEFAULT_THREADS),
        },
    )


def _log(msg: str) -> None:
    from .distributed import is_main_process

    if is_main_process():
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


def _train_cfg(m, seed: int, run_cfg: RunConfig, label: str, model: RewardModel, **extra) -> PairTrainingArguments:
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


def save_rewards(cell_dir: Path, model_name: str, dataset: str, pairs: list, rewards: np.ndarray) -> None:
    """Write ``cell_dir/rewards/<model_name>__<dataset>.jsonl`` atomically: one row per pair with its rewards
    (``rewards`` (2B,): chosen_1..chosen_B then rejected_1..rejected_B) and response lengths in characters.

    Raises:
        TrainingDiverged: a non-finite reward (:func:`w2s_shift.evaluate.finite_or_raise`)."""
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
        }
        for i, p in enumerate(pairs)
    ]
    write_jsonl_atomic(cell_dir / "rewards" / f"{model_name}__{dataset}.jsonl", rows)


def _fault(point: str) -> None:
    """Fault injection for the kill-and-resume tests: ``W2S_SHIFT_FAULT=<point>`` SIGKILLs this process at that
    point (e.g. ``teacher:labels``, ``student-naive:eval``; training steps via :class:`_FaultCallback`)."""
    if os.environ.get("W2S_SHIFT_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


class _FaultCallback(TrainerCallback):
    def __init__(self, stage: str):
        self.stage = stage

    def on_step_end(self, args, state, control, **kwargs):
        _fault(f"{self.stage}:step{state.global_step}")


class _DriftCallback(TrainerCallback):
    """Logs drift on small probe sets every ``interval`` optimizer steps (Le et al. 2026's explanation of OOD loss)."""

    def __init__(self, probes: dict, interval: int):
        self.probes, self.interval, self.rows = probes, interval, []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.interval and state.global_step % self.interval == 0 and model is not None:
            for name, probe in self.probes.items():
                self.rows.append({"step": state.global_step, "dataset": name, **probe.measure(model)})

    def checkpoint_state(self) -> dict:  # saved in each training checkpoint (PairTrainer._save_resume_state)
        return {"rows": self.rows}

    def restore_checkpoint_state(self, state: dict) -> None:
        self.rows = list(state["rows"])


def source_digest(cfg: RunConfig, src) -> dict:
    """What a source's data depends on: the data settings, this source and its OOD targets."""
    d = cfg.data.model_dump(mode="json", exclude={"sources", "ood"})
    return {
        **d,
        "source": src.model_dump(mode="json"),
        "ood": [o.model_dump(mode="json") for o in cfg.data.ood_for(src)],
    }


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def split_seed(cfg: RunConfig, seed: int | None) -> int:
    """The seed of the source's split and subsample: data.seed, or with data.resplit_per_seed data.seed x 1000003
    + the training seed (each seed gets its own split)."""
    d = cfg.data
    return d.seed * 1_000_003 + int(seed) if d.resplit_per_seed and seed is not None else d.seed


MIN_SPLIT_PAIRS = 10  # a teacher_train / student_train / test split with fewer pairs than this is refused


def split_shortfalls(source: str, sizes: dict, caps: dict, n_pairs: int, fractions) -> list:
    """Requested split sizes the data cannot meet (issue 17).

    Args:
        source: the source dataset's display name (for the message).
        sizes: split name -> pairs it holds after the cap; caps: split name -> requested cap (None: all).
        n_pairs: valid pairs of the source; fractions: data.split_fractions (for the message).

    Returns:
        ``[{"split", "requested", "available"}]`` for each split with a cap above what it holds, in split order.

    Raises:
        ValueError: a split holds fewer than :data:`MIN_SPLIT_PAIRS` pairs although more were asked for (a cap
            above its size, or no cap); naming the source, split, requested and available numbers. A cap set
            below 10 on purpose is honoured.
    """
    out = []
    for name, n in sizes.items():
        cap = caps.get(name)
        if cap is not None and n < cap:
            out.append({"split": name, "requested": int(cap), "available": int(n)})
        if n < MIN_SPLIT_PAIRS and (cap is None or n < cap):
            asked = "all" if cap is None else str(cap)
            raise ValueError(
                f"source {source!r}: split {name!r} has {n} pairs (requested {asked}; at least "
                f"{MIN_SPLIT_PAIRS} needed): {n_pairs} valid pairs in the source with split_fractions "
                f"{list(fractions)}; use more data or change split_fractions"
            )
    return out


def prepare_data(cfg: RunConfig, source=None, seed: int | None = None) -> tuple:
    """Load one source dataset and its OOD targets, split the source by prompt, subsample, remove OOD prompt
    overlap. ``source``: a DatasetRef of ``cfg.data.sources`` (default: the first); ``seed``: the training seed,
    which sets the split under ``data.resplit_per_seed`` (:func:`split_seed`; OOD subsamples keep data.seed).

    Returns:
        (splits {teacher_train, student_train, test: [pairs]}, ood {name: [pairs]}, summary dict)

    Raises:
        ValueError: an empty source or split, a split short of its request with fewer than 10 pairs
            (:func:`split_shortfalls`), or an OOD target with no pairs left after filtering. Requests met only in
            part are listed in ``summary["shortfalls"]``.
    """
    d = cfg.data
    source = source or d.sources[0]
    src = load_ref(source, d.skip_invalid)
    if not src.pairs:
        raise ValueError(f"source dataset {source.display!r} has no valid pairs")
    sseed = split_seed(cfg, seed)
    splits = split_by_prompt(src.pairs, d.split_fractions, sseed)
    caps = {"teacher_train": d.n_teacher_train, "student_train": d.n_student_train, "test": d.n_test}
    splits = {k: subsample(v, caps[k], sseed) for k, v in splits.items()}
    for name, v in splits.items():
        if not v:
            raise ValueError(
                f"source {source.display!r}: split {name!r} is empty: too few prompts ({len(src.pairs)} pairs) "
                f"for split_fractions {list(d.split_fractions)}"
            )
    shortfalls = split_shortfalls(
        source.display, {k: len(v) for k, v in splits.items()}, caps, len(src.pairs), d.split_fractions
    )
    summary = {
        "source": src.summary(),
        "splits": {k: len(v) for k, v in splits.items()},
        "ood": {},
        "split_seed": sseed,
        "resplit_per_seed": bool(d.resplit_per_seed),
        "shortfalls": shortfalls,
    }
    src_keys = prompt_keys(src.pairs)
    ood = {}
    for ref in d.ood_for(source):
        res = load_ref(ref, d.skip_invalid)
        pairs, overlap = res.pairs, 0
        if d.remove_ood_overlap:
            pairs, overlap = remove_prompt_overlap(pairs, src_keys)
        pairs = subsample(pairs, d.n_ood, d.seed)
        if not pairs:
            raise ValueError(
                f"OOD target {ref.display!r} has no pairs left: {len(res.pairs)} valid pairs, "
                f"{overlap} removed because their prompt is in the source dataset {source.display!r}"
            )
        ood[ref.display] = pairs
        if d.n_ood is not None and len(pairs) < d.n_ood:
            shortfalls.append({"split": f"ood:{ref.display}", "requested": int(d.n_ood), "available": len(pairs)})
        summary["ood"][ref.display] = {**res.summary(), "prompt_overlap_removed": overlap, "used": len(pairs)}
    return splits, ood, summary


class Featurizer:
    """One model config, loaded once: encodes datasets, and in partial fine-tuning with trunk caching runs
    the frozen trunk once per sequence; every model trained from this checkpoint (all seeds, methods, lambdas)
    reuses the features and the ANCHOR reference states."""

    def __init__(self, mcfg, role: str):
        if not isinstance(mcfg.bf16, bool):  # bf16: auto not resolved by run(): resolve it here
            from .models.precision import resolve_model_precision

            mcfg = resolve_model_precision(mcfg)
        self.mcfg, self.role = mcfg, role
        self.loaded = load_backbone(mcfg.name, trust_remote_code=mcfg.trust_remote_code, allow_pickle=mcfg.allow_pickle)
        tok = self.loaded.tokenizer
        tok.model_max_length = int(1e9)  # truncation is ours (data.render); silence the tokenizer's warning
        self.pad_id = tok.pad_token_id
        self.max_length = min(mcfg.max_length, self.loaded.max_positions or mcfg.max_length)
        self.split_mode = bool(mcfg.trainable_layers and mcfg.trunk_cache and can_split(self.loaded.backbone))
        self.trunk, self.base = None, self.loaded.backbone
        self.n_layers = num_blocks(self.loaded.backbone)
        self.offset = 0
        if self.split_mode:
            self.trunk, self.base = split_decoder(self.loaded.backbone, mcfg.trainable_layers)
            self.offset = self.n_layers - mcfg.trainable_layers
            if mcfg.bf16:
                self.trunk = self.trunk.to(torch.bfloat16)
            if torch.cuda.is_available():
                self.trunk = self.trunk.to("cuda")
        self.first_trainable = (
            self.offset + 1
            if self.split_mode
            else (self.n_layers - mcfg.trainable_layers + 1 if mcfg.trainable_layers else 1)
        )
        self.feats: dict = {}
        self.truncated: dict = {}
        self.cut_counts: dict = {}  # split name -> render.cut_counts (share of pairs whose response was cut)
        self._ref: dict = {}
        self._probes: dict = {}

    def describe(self) -> str:
        how = (
            f"top {self.mcfg.trainable_layers} layers on cached trunk states"
            if self.split_mode
            else f"top {self.mcfg.trainable_layers} layers"
            if self.mcfg.trainable_layers
            else "all layers"
        )
        if self.mcfg.lora:
            how += f", LoRA r={self.mcfg.lora.r}"
        packed = self.mcfg.packing and can_pack(self.base, self.mcfg.pooling)
        return f"{self.mcfg.name} ({how}, max_length {self.max_length}, {'packed' if packed else 'padded'} batches)"

    def _dtype(self):
        return torch.bfloat16 if self.mcfg.bf16 else torch.float32

    def _trunk_states(self, seqs: list, desc: str) -> list | None:
        """The frozen trunk's states of each sequence (:func:`compute_trunk_states`), or None without trunk caching."""
        if not self.split_mode:
            return None
        return compute_trunk_states(
            self.trunk, seqs, self.pad_id, max_tokens=self.mcfg.eval_max_tokens, dtype=self._dtype(), desc=desc
        )

    def features(self, name: str, pairs: list) -> dict:
        if name not in self.feats:
            enc, self.truncated[name] = encode_pairs(pairs, self.loaded.tokenizer, self.max_length)
            self.cut_counts[name] = cc = cut_counts(enc)
            if cc["truncated"]:
                _log(
                    f"{self.role} {name}: {cc['truncated']} of {cc['pairs']} pairs truncated "
                    f"at {self.max_length} tokens; "
                    f"share of pairs whose response was cut: {100 * cc['response_cut_share']:.1f}%"
                )
            seqs, masks = _seqs(enc)
            states = self._trunk_states(seqs, f"{self.role} trunk {name}")
            self.feats[name] = {"enc": enc, "seqs": seqs, "masks": masks, "states": states}
        return self.feats[name]

    def anchor_layers(self, spec) -> list:
        """1-based blocks of a layer spec, checked to be trainable.

        Raises:
            ValueError: a layer in the frozen part of the model.
        """
        layers = resolve_layer_spec(spec, self.n_layers)
        frozen = [k for k in layers if k < self.first_trainable]
        if frozen:
            raise ValueError(
                f"anchor layers {frozen} ({spec}) of {self.mcfg.name} are frozen (trainable blocks "
                f"{self.first_trainable}..{self.n_layers}); raise student.trainable_layers to "
                f"{self.n_layers - min(frozen) + 1} or more"
            )
        return layers

    def new_model(self, seed: int) -> RewardModel:
        import transformers

        transformers.set_seed(seed)  # the same head init for every method
        model = RewardModel(
            copy.deepcopy(self.base), self.loaded.hidden_size, pooling=self.mcfg.pooling, layer_offset=self.offset
        )
        if self.mcfg.disable_dropout:
            disable_dropout(model)
        if not self.split_mode:
            _freeze(model, self.mcfg.trainable_layers, self.mcfg.freeze_embeddings)
        if self.mcfg.lora:
            from peft import LoraConfig, get_peft_model

            lc = self.mcfg.lora
            top = None
            if self.mcfg.trainable_layers and not self.split_mode:  # adapters on the top layers only
                top = list(range(self.n_layers - self.mcfg.trainable_layers, self.n_layers))
            # the head is outside the adapter-wrapped backbone: it trains in full and is saved with the adapters
            # (save_trained_state), so the "untrained, unsaved score head" trap of modules_to_save cannot occur
            model.backbone = get_peft_model(
                model.backbone,
                LoraConfig(
                    r=lc.r,
                    lora_alpha=lc.alpha,
                    lora_dropout=lc.dropout,
                    target_modules=list(lc.target_modules),
                    layers_to_transform=top,
                ),
            )
            for p in model.score.parameters():
                p.requires_grad_(True)
        return model

    def dataset(
        self, name: str, pairs: list, labels: list, reference_layers: list | None = None, with_reference: bool = False
    ) -> PairDataset:
        f = self.features(name, pairs)
        states = _pairs_of(f["states"]) if f["states"] is not None else None
        ref = None
        if with_reference:
            key = (name, tuple(reference_layers) if reference_layers else None)
            if key not in self._ref:
                self._ref[key] = _pairs_of(
                    compute_reference_states(
                        self.base,
                        f["seqs"],
                        f["masks"],
                        self.pad_id,
                        states=f["states"],
                        max_tokens=self.mcfg.eval_max_tokens,
                        dtype=self._dtype(),
                        bf16=self.mcfg.bf16,
                        layers=reference_layers,
                        layer_offset=self.offset,
                        desc=f"reference states {name}",
                    )
                )
            ref = self._ref[key]
        return PairDataset(f["enc"], labels, states, ref)

    def drift_probe(self, name: str, pairs: list, n_pairs: int, layers: list) -> DriftProbe:
        """Reference states of the pretrained model on the first ``n_pairs`` pairs of an evaluation set (cached)."""
        key = (name, n_pairs, tuple(layers))
        if key not in self._probes:
            f = self.features(name, pairs)
            b = len(f["seqs"]) // 2
            idx = list(range(min(n_pairs, b)))
            idx = idx + [i + b for i in idx]
            self._probes[key] = DriftProbe(
                self.base,
                [f["seqs"][i] for i in idx],
                [f["masks"][i] for i in idx],
                [f["states"][i] for i in idx] if f["states"] is not None else None,
                self.pad_id,
                layers,
                self.offset,
                self.mcfg.eval_max_tokens,
                self.mcfg.bf16,
            )
        return self._probes[key]

    def drift_layers(self, anchored: list | None) -> list:
        """Layers whose drift is measured: every trainable block when there are at most 8, else the blocks at 50%
        and 75% depth and the last (those that train), plus the anchored ones."""
        trainable = list(range(self.first_trainable, self.n_layers + 1))
        if self.mcfg.lora or len(trainable) > 8:
            chosen = set(resolve_layer_spec("middle", self.n_layers)) | {self.n_layers}
            chosen = {k for k in chosen if k >= self.first_trainable}
        else:
            chosen = set(trainable)
        return sorted(chosen | set(anchored or []))

    def score(self, model: RewardModel, name: str, pairs: list, label: str) -> np.ndarray:
        f = self.features(name, pairs)
        return score_sequences_sharded(
            model,
            f["seqs"],
            self.pad_id,
            states=f["states"],
            max_tokens=self.mcfg.eval_max_tokens,
            desc=f"{label} scores {name}",
            bf16=self.mcfg.bf16,
        )

    def score_uncached(self, model: RewardModel, pairs: list, label: str) -> np.ndarray:
        """Rewards (2B,) of pairs that are not kept (e.g. SEAM's principle-prefixed variants)."""
        enc, _ = encode_pairs(pairs, self.loaded.tokenizer, self.max_length)
        seqs, _ = _seqs(enc)
        states = self._trunk_states(seqs, f"{self.role} trunk ({label})")
        return score_sequences_sharded(
            model,
            seqs,
            self.pad_id,
            states=states,
            max_tokens=self.mcfg.eval_max_tokens,
            desc=f"{label} scores",
            bf16=self.mcfg.bf16,
        )


class SourceContext:
    """Everything a grid row (one source dataset) shares across seeds and methods: data, and the teacher's and
    student's loaded models with their cached features."""

    def __init__(self, cfg: RunConfig, src, run_dir: Path):
        self.cfg, self.src, self.run_dir = cfg, src, run_dir
        self.name = src.display
        self.seed = cfg.seeds[0]
        self.splits, self.ood, self.summary = prepare_data(cfg, src, self.seed)
        self.eval_sets = {self.name: self.splits["test"], **self.ood}
        self.data_digest = _digest(source_digest(cfg, src))
        self._tf = self._sf = None
        self.zero_shot_rewards: dict = {}
        self.seam_relevance: dict = {}  # SEAM relevance question -> the strong LM's log p(Yes) - log p(No)

    def use_seed(self, seed: int) -> None:
        """Under data.resplit_per_seed: split the source for training seed ``seed`` and drop the cached features of
        the split sets (the loaded models and the OOD features stay). A no-op otherwise."""
        if not self.cfg.data.resplit_per_seed or seed == self.seed:
            return
        self.seed = seed
        self.splits, self.ood, self.summary = prepare_data(self.cfg, self.src, seed)
        self.eval_sets = {self.name: self.splits["test"], **self.ood}
        names = {"teacher_train", "student_train", self.name}
        for f in (self._tf, self._sf):
            if f is not None:
                for cache in (f.feats, f.truncated, f._ref, f._probes):
                    for key in [k for k in cache if (k[0] if isinstance(k, tuple) else k) in names]:
                        del cache[key]
        self.zero_shot_rewards = {}

    def teacher(self) -> Featurizer:
        if self._tf is None:
            try:
                self._tf = Featurizer(self.cfg.teacher, "teacher")
            except ValueError as e:
                raise ValueError(f"teacher {self.cfg.teacher.name}: {e}") from None
        return self._tf

    def student(self) -> Featurizer:
        if self._sf is None:
            try:
                self._sf = Featurizer(self.cfg.student, "student")
            except ValueError as e:
                raise ValueError(f"student {self.cfg.student.name}: {e}") from None
            _log(f"student: {self._sf.describe()}")
        return self._sf


def _trained_or_train(model, state_path: Path, digest: str, train_fn, drift_cb=None) -> list:
    """Load the trained state saved by an earlier (killed) run of this stage, or train and save it.
    Returns the training log history; ``drift_cb``'s rows (drift during training) are saved and restored too."""
    meta = state_path.with_suffix(".json")
    try:
        info = read_json(meta)
        if info.get("digest") == digest and state_path.is_file() and (drift_cb is None or "drift_during" in info):
            load_trained_state(model, state_path)
            _log(f"{state_path.stem}: trained earlier, loading its weights")
            if drift_cb is not None:
                drift_cb.rows = list(info["drift_during"])
            return info["log_history"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    hist = train_fn()
    run_on_main(save_trained_state, model, state_path)
    write_json_atomic(
        meta,
        {"digest": digest, "log_history": hist, **({"drift_during": drift_cb.rows} if drift_cb is not None else {})},
    )
    return hist


_DEFAULT_THREADS = torch.get_num_threads()


def _use_threads(mcfg, cfg: RunConfig) -> None:
    """torch CPU threads for one model's work: its own setting, else the run's, else torch's default."""
    torch.set_num_threads(mcfg.threads or cfg.threads or _DEFAULT_THREADS)


def _teacher_digest(ctx: SourceContext, seed: int) -> str:
    return _digest(
        ctx.data_digest, ctx.cfg.teacher.model_dump(mode="json", exclude={"threads"}), seed, stage_versions("teacher")
    )


def _seam_stage_name(m) -> str:
    """Name of a SEAM setting's stage marker (``stages/<name>.json``; the report reads its effect shares)."""
    return f"seam-{m.seam_nodes}-{m.seam_exit_margin:g}"


def _seam_stage(ctx: SourceContext, cell_dir: Path, seed: int, m) -> Stage:
    """SEAM labels depend on the teacher, the pretrained student and the SEAM settings."""
    return Stage(
        cell_dir,
        _seam_stage_name(m),
        _digest(
            _teacher_digest(ctx, seed),
            ctx.cfg.student.model_dump(mode="json", exclude={"threads"}),
            m.seam_nodes,
            m.seam_exit_margin,
            stage_versions("seam"),
        ),
    )


def _cell_teacher(ctx: SourceContext, cell_dir: Path, seed: int, need_model: bool):
    """Teacher stage of one cell: train on gold, score student-train and the evaluation sets, write soft labels.
    Returns the trained teacher when ``need_model`` (for SEAM), else None."""
    cfg = ctx.cfg
    _use_threads(cfg.teacher, cfg)
    digest = _teacher_digest(ctx, seed)
    stage = Stage(cell_dir, "teacher", digest)
    if stage.done() and not need_model:
        _log(f"{ctx.name} seed {seed}: teacher done earlier, reusing its labels and rewards")
        return None
    tf = ctx.teacher()
    teacher = tf.new_model(seed)
    ds = tf.dataset("teacher_train", ctx.splits["teacher_train"], [1.0] * len(ctx.splits["teacher_train"]))
    ckpt = cell_dir / "checkpoints" / f"teacher-{digest[:8]}"
    if not stage.done():
        _log(f"{ctx.name} seed {seed}: teacher {tf.describe()} on {len(ds)} gold pairs")
    hist = _trained_or_train(
        teacher,
        cell_dir / "models" / "teacher.safetensors",
        digest,
        lambda: train_pairs(
            teacher,
            ds,
            tf.pad_id,
            _train_cfg(
                cfg.teacher,
                seed,
                cfg,
                f"teacher ({ctx.name}, seed {seed})",
                teacher,
                logging_dir=str(cell_dir / "tensorboard" / "teacher"),
            ),
            str(ckpt),
            callbacks=[_FaultCallback("teacher")],
        ),
    )
    shutil.rmtree(ckpt, ignore_errors=True)
    if stage.done():
        return teacher
    for k, (name, pairs) in enumerate({"student_train": ctx.splits["student_train"], **ctx.eval_sets}.items()):
        save_rewards(cell_dir, "teacher", name, pairs, tf.score(teacher, name, pairs, "teacher"))
        if k == 0:
            _fault("teacher:labels")
    rc, rr = load_rewards(cell_dir, "teacher", "student_train")
    q = 1.0 / (1.0 + np.exp(-(rc - rr)))
    write_jsonl_atomic(
        cell_dir / "teacher_labels.jsonl",
        [
            {"index": i, "id": p.id, "q": float(q[i]), "gold_agrees": bool(q[i] > 0.5)}
            for i, p in enumerate(ctx.splits["student_train"])
        ],
    )
    write_jsonl_atomic(cell_dir / "logs" / "teacher.jsonl", hist)
    outputs = [f"rewards/teacher__{n}.jsonl" for n in ["student_train", *ctx.eval_sets]] + [
        "teacher_labels.jsonl",
        "logs/teacher.jsonl",
    ]
    stage.finish(
        outputs,
        truncated_pairs=dict(tf.truncated),
        cut_counts=dict(tf.cut_counts),
        rendering={"teacher_chat_template": uses_chat_template(tf.loaded.tokenizer)},
    )
    return teacher


def _cell_seam(ctx: SourceContext, cell_dir: Path, seed: int, m, teacher) -> tuple:
    """SEAM labels (an approximation, see :mod:`w2s_shift.methods.seam`) for one cell and SEAM setting.
    Returns (label rows, summary)."""
    from .methods.seam import SeamConfig, seam_labels
    from .models.lm import lm_head_weight, next_token_logprob_diff

    cfg = ctx.cfg
    _use_threads(cfg.student, cfg)
    sf, tf = ctx.student(), ctx.teacher()
    head_w = lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
    scfg = SeamConfig(n_nodes=m.seam_nodes, exit_margin=m.seam_exit_margin)

    def ask(prompts):
        try:
            return next_token_logprob_diff(sf.loaded.backbone, head_w, sf.loaded.tokenizer, prompts)
        except ValueError as e:  # a tokenizer that splits " Yes" into " " + "Yes": ask without the space
            if "same token" not in str(e):
                raise
            return next_token_logprob_diff(sf.loaded.backbone, head_w, sf.loaded.tokenizer, prompts, yes="Yes", no="No")

    def strong(prompts):
        # the pretrained strong model's answer depends on the question only: asked once per source, shared by seeds
        new = list(dict.fromkeys(p for p in prompts if p not in ctx.seam_relevance))
        if new:
            ctx.seam_relevance.update(zip(new, (float(x) for x in ask(new))))
        return np.array([ctx.seam_relevance[p] for p in prompts], dtype=np.float64)

    def weak(pairs):
        r = tf.score_uncached(teacher, pairs, "teacher (SEAM principles)")
        return r[: len(pairs)] - r[len(pairs) :]

    _log(f"{ctx.name} seed {seed}: SEAM labels ({scfg.n_nodes} principle nodes, exit margin {scfg.exit_margin:g})")
    q, info = seam_labels(ctx.splits["student_train"], strong, weak, scfg)
    exit_node, order = np.asarray(info["exit_node"]), np.asarray(info["order"])
    rows = [
        {
            "index": i,
            "id": p.id,
            "q": float(q[i]),
            "gold_agrees": bool(q[i] > 0.5),
            "exit_node": int(exit_node[i]),
            "principle_order": [int(x) for x in order[i]],
        }
        for i, p in enumerate(ctx.splits["student_train"])
    ]
    summary = {
        "principles": list(info["principles"]),
        "n_nodes": scfg.n_nodes,
        "exit_margin": scfg.exit_margin,
        "exit_share": float(info["exit_share"]),
        "effect": info["effect"],
        "approximations": info["approximations"],
    }
    if info["effect"]["warning"]:
        _log(f"{ctx.name} seed {seed}: warning: {info['effect']['warning']}")
    return rows, summary


def _seam_file(m) -> str:
    return f"seam_labels__{m.seam_nodes}-{m.seam_exit_margin:g}.jsonl"


def _cell_student(ctx: SourceContext, cell_dir: Path, seed: int, m, labels: list) -> None:
    """Train one student method in one cell, score every evaluation set, measure drift, save its weights."""
    cfg = ctx.cfg
    label = m.display
    digest = _digest(
        ctx.data_digest,
        cfg.teacher.model_dump(mode="json", exclude={"threads"}),
        cfg.student.model_dump(mode="json", exclude={"threads"}),
        seed,
        m.model_dump(mode="json", exclude={"label"}),
        stage_versions("student"),
    )
    stage = Stage(cell_dir, f"student-{label}", digest)
    if stage.done():
        _log(f"{ctx.name} seed {seed}: student {label} done earlier, reusing its rewards")
        return
    _use_threads(cfg.student, cfg)
    sf = ctx.student()
    if m.name == "zero_shot":
        _cell_zero_shot(ctx, cell_dir, m, stage)
        return
    model = sf.new_model(seed)
    q = [1.0] * len(labels) if m.name == "ceiling" else labels
    extra, reference, layers = {}, None, None
    cached_ref = m.name == "anchor" and m.reference == "cached"
    if m.name == "anchor":
        layers = sf.anchor_layers(m.anchor_layers)
        auto = m.anchor_lambda == "auto"
        extra.update(
            anchor_lambda=m.anchor_lambda_init if auto else m.anchor_lambda,
            anchor_lambda_auto=auto,
            anchor_normalize=m.anchor_normalize,
            anchor_target_drift=m.anchor_target_drift,
            anchor_k=m.anchor_k,
            anchor_layers=None if layers == [sf.n_layers] else layers,
            reference_mode=m.reference,
        )
        if m.reference == "frozen_copy" and m.anchor_active:
            reference = make_reference(sf.base, sf.offset, autocast_bf16=cfg.student.bf16)
    if m.name == "confidence":
        extra.update(
            loss="confidence", confidence_alpha_max=m.confidence_alpha_max, confidence_warmup=m.confidence_warmup
        )
    ref_layers = None if layers in (None, [sf.n_layers]) else layers
    ds = sf.dataset(
        "student_train",
        ctx.splits["student_train"],
        q,
        reference_layers=ref_layers,
        with_reference=cached_ref and m.anchor_active,
    )
    callbacks = [_FaultCallback(f"student-{label}")]
    drift_cb = None
    if cfg.drift and cfg.drift_interval:
        dl = sorted(set(layers or []) | {sf.n_layers})
        probes = {n: sf.drift_probe(n, ctx.eval_sets[n], 32, dl) for n in list(ctx.eval_sets)[:2]}
        drift_cb = _DriftCallback(probes, cfg.drift_interval)
        callbacks.append(drift_cb)
    _log(
        f"{ctx.name} seed {seed}: student {label}: {len(q)} pairs ("
        + ("gold labels" if m.name == "ceiling" else "SEAM labels" if m.name == "seam" else "teacher soft labels")
        + (f", lambda {m.lambda_text}, layers {layers}, reference {m.reference}" if m.name == "anchor" else "")
        + ")"
    )
    ckpt = cell_dir / "checkpoints" / f"{label}-{digest[:8]}"
    hist = _trained_or_train(
        model,
        cell_dir / "models" / f"{label}.safetensors",
        digest,
        lambda: train_pairs(
            model,
            ds,
            sf.pad_id,
            _train_cfg(
                cfg.student,
                seed,
                cfg,
                f"student {label} ({ctx.name}, seed {seed})",
                model,
                logging_dir=str(cell_dir / "tensorboard" / label),
                **extra,
            ),
            str(ckpt),
            reference=reference,
            callbacks=callbacks,
        ),
        drift_cb,
    )
    shutil.rmtree(ckpt, ignore_errors=True)
    reference = None  # free the frozen copy before scoring
    for k, (name, pairs) in enumerate(ctx.eval_sets.items()):
        save_rewards(cell_dir, label, name, pairs, sf.score(model, name, pairs, label))
        if k == 0:
            _fault(f"student-{label}:eval")
    outputs = [f"rewards/{label}__{n}.jsonl" for n in ctx.eval_sets] + [f"logs/{label}.jsonl"]
    write_jsonl_atomic(cell_dir / "logs" / f"{label}.jsonl", hist)
    if cfg.drift:
        dl = sf.drift_layers(layers)
        final = {n: sf.drift_probe(n, pairs, cfg.drift_pairs, dl).measure(model) for n, pairs in ctx.eval_sets.items()}
        write_json_atomic(
            cell_dir / "drift" / f"{label}.json",
            {
                "layers": dl,
                "final": final,
                "during": drift_cb.rows if drift_cb else [],
                "probe_pairs": {"final": cfg.drift_pairs, "during": 32},
            },
        )
        outputs.append(f"drift/{label}.json")
    stage.finish(
        outputs,
        truncated_pairs=dict(sf.truncated),
        cut_counts=dict(sf.cut_counts),
        rendering={"student_chat_template": uses_chat_template(sf.loaded.tokenizer)},
    )


def _export_students(ctx: SourceContext, cell_dir: Path, seed: int, methods: list) -> None:
    """Export the students named in ``export`` from their saved weights (also for a run finished earlier)."""
    from .models.export import export_reward_model, read_export_info

    cfg = ctx.cfg
    wanted = [
        m
        for m in methods
        if m.name != "zero_shot" and (cfg.export == "all" or (isinstance(cfg.export, list) and m.display in cfg.export))
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
        ):  # an export from an older rendering is redone
            continue
        sf = ctx.student()
        model = sf.new_model(seed)
        load_trained_state(model, cell_dir / "models" / f"{label}.safetensors")
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
            },
        )
        _log(f"{ctx.name} seed {seed}: student {label} exported to {out} (AutoModelForSequenceClassification)")


def load_check(spec: str, *, trust_remote_code: bool = False, allow_pickle: bool = False) -> None:
    """Cheap check that ``spec`` will load, without reading its weights (issue 17: a broken student was found
    only after the teacher had trained). A hub id is left to the load itself (it may need the network).

    Checks: the folder's files (:func:`~w2s_shift.models.loading.resolve_source`: config.json, tokenizer files,
    pickle, remote code), the tokenizer loads, config.json loads in transformers; a ``.gguf`` file starts with
    the GGUF magic; each ``*.safetensors`` header parses (``safe_open``) and, against the model built from
    config.json on the meta device (no memory), no weight is missing, no shape differs and the embedding has
    a row for every token id (skipped for quantized checkpoints and for models whose checkpoint keys transformers
    renames or fuses on load). NaN weights are found when the model loads (that reads every tensor).

    Raises:
        ModelError: naming ``spec`` and the file, with the reason.
    """
    from .models.loading import load_tokenizer, resolve_source

    kind, src, kw = resolve_source(spec, allow_pickle, trust_remote_code)
    if kind == "hub":
        return
    if kind == "gguf":
        f = Path(src) / kw["gguf_file"]
        with open(f, "rb") as fh:
            head = fh.read(4)
        if head != b"GGUF":
            raise ModelError(f"{f}: not a GGUF file (it starts with {head!r}, not the magic b'GGUF')")
        load_tokenizer(spec, trust_remote_code=trust_remote_code)
        return
    folder = Path(src)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: not a Hugging Face model folder (no config.json)")
    tok = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    from accelerate import init_empty_weights
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModel

    try:
        mc = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelError(
            f"{folder}/config.json: transformers cannot read it: {type(e).__name__}: {str(e)[:300]}"
        ) from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if allow_pickle and any(p.suffix in (".bin", ".pt", ".pth", ".ckpt") for p in folder.iterdir()):
            return  # pickle weights: their header cannot be read without unpickling
        raise ModelError(f"{folder}: no weights file (model.safetensors or sharded *.safetensors)")
    shapes = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
        except (SafetensorError, OSError) as e:
            raise ModelError(f"{folder}: {f.name}: not a valid safetensors file, truncated or corrupt ({e})") from None
    if getattr(mc, "quantization_config", None):
        return  # packed quantized tensors: their shapes are not the model's, the load checks them
    try:
        from transformers.conversion_mapping import extract_weight_conversions_for_model

        with init_empty_weights():
            model = AutoModel.from_config(mc, trust_remote_code=trust_remote_code)
        if extract_weight_conversions_for_model(model):
            return  # transformers renames / fuses this model's checkpoint keys on load (e.g. MoE experts)
    except Exception:  # an architecture that cannot be built on the meta device: the load checks the rest
        return
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else None
    legacy = {".gamma": ".weight", ".beta": ".bias"}  # old LayerNorm names transformers still renames on load
    have = {}
    for k, v in shapes.items():
        k = k[len(prefix) :] if prefix and k.startswith(prefix) else k
        have[next((k[: -len(a)] + b for a, b in legacy.items() if k.endswith(a)), k)] = v
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(k for k in expected if k not in have and ".pooler." not in f".{k}")
    if missing and len(missing) < len(expected):  # none matching at all: another naming scheme, left to the load
        raise ModelError(
            f"{folder}: the checkpoint lacks {len(missing)} weight(s) of the model (e.g. {', '.join(missing[:3])}); "
            "refused because they would be initialised at random. Is the weights file complete?"
        )
    wrong = [k for k in expected if k in have and have[k] != expected[k]]
    if wrong:
        k = wrong[0]
        raise ModelError(
            f"{folder}: the weights' shapes do not match config.json ({k}: {list(have[k])} in the file, "
            f"{list(expected[k])} by config.json); the weights file and config.json must come from the same model"
        )
    emb = model.get_input_embeddings()
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None and len(tok) > rows:
        raise ModelError(
            f"{folder}: the tokenizer has {len(tok)} tokens but the model's embedding has {rows} rows; "
            "ids past the table would crash or be misread: the tokenizer does not belong to this model"
        )


def _load_check_all(cfg: RunConfig) -> None:
    """:func:`load_check` on every model of the run before any training: the teacher and the student (the ceiling
    and zero-shot reuse the student). Raises ModelError naming the config key (``teacher.name``) and file."""
    for key, mcfg in (("teacher", cfg.teacher), ("student", cfg.student)):
        try:
            load_check(mcfg.name, trust_remote_code=mcfg.trust_remote_code, allow_pickle=mcfg.allow_pickle)
        except ModelError as e:
            raise ModelError(f"{key}.name: {e}") from None
    _log(f"preflight: teacher {cfg.teacher.name} and student {cfg.student.name} load-checked")


def _preflight(ctx: SourceContext, methods: list) -> None:
    """Checks that need the student model, done before any training: anchored layers that train, LoRA target
    modules that exist, an LM head for SEAM and zero-shot.

    Raises:
        ValueError: naming the method or field.
    """
    cfg = ctx.cfg
    needs = [m for m in methods if m.name in ("anchor", "seam", "zero_shot")] or cfg.student.lora
    if not needs:
        return
    sf = ctx.student()
    for m in methods:
        if m.name == "anchor":
            try:
                sf.anchor_layers(m.anchor_layers)
            except ValueError as e:
                raise ValueError(f"method {m.display}: {e}") from None
        if m.name in ("seam", "zero_shot"):
            from .models.lm import lm_head_weight

            try:
                lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
            except (ValueError, ModelError) as e:
                raise ValueError(f"method {m.display} needs the student's language-model head: {e}") from None
    if cfg.student.lora:
        try:
            sf.new_model(0)
        except ValueError as e:
            raise ValueError(
                f"student.lora.target_modules {list(cfg.student.lora.target_modules)} on {cfg.student.name}: {e}"
            ) from None


def zero_shot_rewards(sf: Featurizer, name: str, pairs: list) -> np.ndarray:
    """Zero-shot rewards (2B,) of the pretrained strong model on an evaluation set: the mean log-likelihood of
    the response tokens under its LM head (chosen_1..chosen_B then rejected_1..rejected_B)."""
    from .models.lm import lm_head_weight, sequence_logprobs

    head_w = lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
    f = sf.features(name, pairs)
    # with cached trunk states only the pretrained top layers run (sf.base is never trained: students copy it)
    return sequence_logprobs(
        sf.base,
        head_w,
        f["seqs"],
        f["masks"],
        sf.pad_id,
        max_tokens=sf.mcfg.eval_max_tokens,
        bf16=sf.mcfg.bf16,
        reduce="mean",
        states=f["states"],
    )


def _cell_zero_shot(ctx: SourceContext, cell_dir: Path, m, stage: Stage) -> None:
    """The pretrained strong model with no training: reward = mean log-likelihood of the response tokens."""
    sf = ctx.student()
    label = m.display
    if not ctx.zero_shot_rewards:
        for name, pairs in ctx.eval_sets.items():
            _log(f"{ctx.name}: zero-shot {sf.mcfg.name} log-likelihoods on {name}")
            ctx.zero_shot_rewards[name] = zero_shot_rewards(sf, name, pairs)
    for name, pairs in ctx.eval_sets.items():
        save_rewards(cell_dir, label, name, pairs, ctx.zero_shot_rewards[name])
    stage.finish([f"rewards/{label}__{n}.jsonl" for n in ctx.eval_sets], reward="mean response log-likelihood")


def _method_dict(m, finetune: str) -> dict:
    layers = m.anchor_layers
    return {
        "label": m.display,
        "name": m.name,
        "finetune": finetune if m.name != "zero_shot" else "none",
        "anchor_lambda": (None if m.anchor_lambda == "auto" else float(m.anchor_lambda)) if m.name == "anchor" else 0.0,
        **(
            {
                "anchor_lambda_mode": "auto" if m.anchor_lambda == "auto" else "fixed",
                "anchor_normalize": m.anchor_normalize,
                "anchor_target_drift": m.anchor_target_drift,
            }
            if m.name == "anchor"
            else {}
        ),
        "anchor_layers": layers if m.name == "anchor" else "last",
        "layer_spec": (layers if isinstance(layers, str) else "custom") if m.name == "anchor" else "last",
        "reference": m.reference if m.name == "anchor" else None,
        **({"seam_stage": _seam_stage_name(m)} if m.name == "seam" else {}),
    }


def describe_grid(cfg: RunConfig) -> str:
    """The grid a config runs, without loading data or models: sources with their OOD targets, seeds, methods,
    and where each dataset and model comes from (a name unknown offline is flagged, not fetched)."""
    from .data.adapters import DATASETS
    from .models.loading import PRESETS

    def where_data(ref):
        if ref.name:
            s = DATASETS.get(ref.name)
            return "unknown name" if s is None else ("bundled" if s.bundled else "shared" if s.files else "hub")
        return "file" if ref.path else "hub"

    def where_model(name):
        p = Path(name)
        return (
            "local folder"
            if p.is_dir()
            else ".gguf file"
            if p.suffix == ".gguf"
            else "offline preset"
            if name in PRESETS
            else "hub id"
        )

    methods = cfg.expanded_methods()
    lines = [
        f"grid: {len(cfg.data.sources)} source(s) x {len(cfg.seeds)} seed(s) x {len(methods)} method(s) "
        f"-> {len(cfg.data.sources) * len(cfg.seeds)} teacher run(s), "
        f"{len(cfg.data.sources) * len(cfg.seeds) * len(methods)} student stage(s)",
        f"output: {cfg.output_dir}",
    ]
    for src in cfg.data.sources:
        lines.append(
            f"source {src.display} ({where_data(src)}) -> OOD "
            + ", ".join(f"{o.display} ({where_data(o)})" for o in cfg.data.ood_for(src))
        )
    lines.append(f"seeds: {cfg.seeds}")
    lines.append(
        f"teacher: {cfg.teacher.name} ({where_model(cfg.teacher.name)}); student: {cfg.student.name} "
        f"({where_model(cfg.student.name)}, {cfg.student.finetune})"
    )
    from .models.precision import precision_lines, resolve_precisions

    lines += precision_lines(resolve_precisions(cfg))
    for m in methods:
        extra = (
            f" lambda={m.lambda_text} layers={m.anchor_layers} reference={m.reference}" if m.name == "anchor" else ""
        )
        lines.append(f"  method {m.display}: {m.name}{extra}")
    return "\n".join(lines)


def run(cfg: RunConfig, overwrite: bool = False, wait: bool = False) -> dict:
    """:func:`_run` holding the run directory's lock (:mod:`w2s_shift.runlock`) from start to end: one writer
    per run directory. ``wait``: wait for a run holding it to finish instead of refusing.

    Raises:
        RunDirError: another live process holds the directory (its PID named), or the lock cannot be created;
            and whatever :func:`_run` raises.
    """
    from .runlock import RunLockError, lock_run_dir

    try:
        lock = lock_run_dir(cfg.output_dir, wait=wait)
    except RunLockError as e:
        raise RunDirError(str(e)) from None
    except OSError as e:
        raise RunDirError(f"{cfg.output_dir}: cannot write to the run directory: {e}") from None
    try:
        return _run(cfg, overwrite)
    finally:
        if lock is not None:
            lock.release()


def _run(cfg: RunConfig, overwrite: bool = False) -> dict:
    """Run the whole grid for ``cfg`` (every source x seed x method); returns the metrics dict (also written to
    ``metrics.json``) and writes ``report.md``/``report.html``.

    Raises:
        RunDirError, ConfigError, DataError, ModelError, TrainingDiverged: each with a clear message.
    """
    t0 = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from .models.precision import environment, precision_lines, resolve_precisions

    cfg = resolve_precisions(cfg)  # bf16: auto -> this machine's precision, once, before any digest
    run_dir = prepare_run_dir(cfg, overwrite)
    for line in precision_lines(cfg):
        _log(line)
    import transformers

    transformers.logging.set_verbosity_error()
    from .report import aggregate, build_cell_metrics, write_report

    methods = cfg.expanded_methods()
    cells = []
    claimed = False
    for src in cfg.data.sources:
        ts = time.time()
        ctx = SourceContext(cfg, src, run_dir)
        _log(
            f"data: source {ctx.name}: "
            + ", ".join(f"{k} {len(v)}" for k, v in ctx.splits.items())
            + "; OOD "
            + ", ".join(f"{k} {len(v)}" for k, v in ctx.ood.items())
        )
        for what, summ in [("source " + ctx.name, ctx.summary["source"])] + [
            (f"OOD {k}", v) for k, v in ctx.summary["ood"].items()
        ]:
            sk = summ["invalid_rows_skipped"]
            if sk["skipped"]:
                _log(f"data: {what}: skipped {sk['skipped']} invalid rows (skip_invalid is on): {sk['by_reason']}")
            if summ.get("prompt_overlap_removed"):
                _log(f"data: {what}: removed {summ['prompt_overlap_removed']} pairs whose prompt is in the source")
        for sf_ in ctx.summary.get("shortfalls", []):
            _log(
                f"WARNING: data: source {ctx.name}: {sf_['split']}: requested {sf_['requested']} pairs, only "
                f"{sf_['available']} available"
            )
        t_data = time.time() - ts
        if not claimed:
            _load_check_all(cfg)
        _preflight(ctx, methods)
        if not claimed:
            claim_run_dir(cfg, run_dir)
            claimed = True
        for seed in cfg.seeds:
            ctx.use_seed(seed)
            cell_dir = run_dir / ctx.name / f"seed{seed}"
            timings = {"data": t_data}
            ts = time.time()
            need_seam = {}
            for m in methods:
                st = _seam_stage(ctx, cell_dir, seed, m) if m.name == "seam" else None
                if st is not None and not st.done() and st.name not in need_seam:
                    need_seam[st.name] = (m, st)
            teacher = _cell_teacher(ctx, cell_dir, seed, need_model=bool(need_seam))
            for m, st in need_seam.values():
                rows, info = _cell_seam(ctx, cell_dir, seed, m, teacher)
                write_jsonl_atomic(cell_dir / _seam_file(m), rows)
                write_json_atomic(cell_dir / _seam_file(m).replace(".jsonl", ".info.json"), info)
                st.finish(
                    [_seam_file(m), _seam_file(m).replace(".jsonl", ".info.json")],
                    exit_share=info["exit_share"],
                    effect=info["effect"],
                )
            del teacher
            timings["teacher"] = time.time() - ts
            labels = [r["q"] for r in read_jsonl(cell_dir / "teacher_labels.jsonl")]
            ts = time.time()
            for m in methods:
                q = [r["q"] for r in read_jsonl(cell_dir / _seam_file(m))] if m.name == "seam" else labels
                t1 = time.time()
                _cell_student(ctx, cell_dir, seed, m, q)
                timings[f"student-{m.display}"] = time.time() - t1
            timings["students"] = time.time() - ts
            _export_students(ctx, cell_dir, seed, methods)
            ceiling = next((m.display for m in methods if m.name == "ceiling"), None)
            zero = next((m.display for m in methods if m.name == "zero_shot"), None)
            cell = {
                "source": ctx.name,
                "seed": seed,
                "dir": f"{ctx.name}/seed{seed}",
                "id": ctx.name,
                "ood": list(ctx.ood),
                "models": ["teacher", *[m.display for m in methods]],
                "methods": [_method_dict(m, cfg.student.finetune) for m in methods],
                "ceiling": ceiling,
                "zero_shot": zero,
                "data": ctx.summary,
                "timings": {k: round(v, 1) for k, v in timings.items()},
                "stages": {p.stem: read_json(p) for p in sorted((cell_dir / "stages").glob("*.json"))},
            }
            cm = build_cell_metrics(cell_dir, cell, cfg.bootstrap, seed)
            write_json_atomic(cell_dir / "metrics.json", cm)
            cells.append(cm)
            if not cm.get("teacher_beats_chance_id", True):
                lo, hi = cm["accuracy_ci95"]["teacher"][ctx.name]
                _log(
                    f"WARNING: {ctx.name} seed {seed}: the teacher does not beat chance on the ID test split "
                    f"(95% interval {lo:.1f}-{hi:.1f} includes 50%): its labels carry little signal and W2S gains "
                    "are not interpretable; use more teacher data or epochs"
                )
        del ctx

    metrics = {
        "cells": cells,
        "aggregate": aggregate(cells),
        "config": cfg.model_dump(mode="json"),
        "w2s_shift_version": __version__,
        "environment": environment(cfg, _DEFAULT_THREADS),
        "wall_seconds": round(time.time() - t0, 1),
    }
    write_json_atomic(run_dir / "metrics.json", metrics)
    table = run_on_main(write_report, run_dir, metrics) or ""
    print(table, flush=True)
    _log(
        f"done in {metrics['wall_seconds']:.0f} s; results in {run_dir}/ (report.md, report.html, metrics.json, "
        "<source>/seed<k>/ with rewards, labels, logs, drift)"
    )
    return metrics

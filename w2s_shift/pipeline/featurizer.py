"""One loaded model per role and grid row: encoded datasets, the frozen trunk's cached states, ANCHOR reference
states and drift probes, shared by every seed and method (:class:`Featurizer`, :class:`SourceContext`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..config import RunConfig
from ..data.render import cut_counts, encode_pairs
from ..device import available_host_bytes, current_device
from ..distributed import min_over_processes, sharded
from ..inference import can_share_prefixes, compute_reference_states, compute_trunk_states
from ..metrics.drift import DriftProbe
from ..models.loading import load_backbone
from ..models.reward_model import (
    RewardModel,
    can_pack,
    can_split,
    num_blocks,
    resolve_layer_spec,
    split_decoder,
)
from ..models.students import trainable_model
from ..training import PairDataset, make_reference
from .prepare import prepare_data
from .rundir import eval_set_digest, log, source_digest, stage_digest

#: Share of the host memory still available that one cache may take (the rest: the models, batches, the OS).
HOST_SHARE = 0.9


class HostMemoryError(ValueError):
    """A cache of hidden states would not fit the host memory this process can take (says the numbers and the
    alternatives); raised before anything is computed."""


def _nbytes(x) -> int:
    """Bytes of the tensors in a (nested) list or tuple of tensors; 0 for None."""
    if x is None:
        return 0
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return sum(_nbytes(v) for v in x)


def seqs_of(encoded: list) -> tuple:
    """Flatten encoded pairs to sequences [chosen_1..chosen_B, rejected_1..rejected_B] and response masks."""
    seqs = [e.chosen.input_ids for e in encoded] + [e.rejected.input_ids for e in encoded]
    masks = [e.chosen.response_mask for e in encoded] + [e.rejected.response_mask for e in encoded]
    return seqs, masks


def pairs_of(flat: list) -> list:
    b = len(flat) // 2
    return [(flat[i], flat[i + b]) for i in range(b)]


class Featurizer:
    """One model config, loaded once, and what it computes once per evaluation set: encodings, in partial
    fine-tuning with trunk caching the frozen trunk's states, ANCHOR reference states and drift probes; every model
    trained from this checkpoint (all seeds, methods, lambdas) reuses them. A trainable student is built by
    :func:`w2s_shift.models.students.trainable_model`; a model is scored on a set by
    :func:`w2s_shift.pipeline.score_stage.score_set`."""

    def __init__(self, mcfg, role: str):
        if not isinstance(mcfg.bf16, bool):  # bf16: auto not resolved by run(): resolve it here
            from ..models.precision import resolve_model_precision

            mcfg = resolve_model_precision(mcfg)
        self.mcfg, self.role = mcfg, role
        # float32 master weights whatever the checkpoint's stored dtype (bf16 compute is autocast's); bf16 weights
        # only when pure_bf16 asks for them
        self.loaded = load_backbone(
            mcfg.name,
            trust_remote_code=mcfg.trust_remote_code,
            allow_pickle=mcfg.allow_pickle,
            dtype="bfloat16" if mcfg.pure_bf16 else "float32",
        )
        tok = self.loaded.tokenizer
        tok.model_max_length = int(1e9)  # truncation is ours (data.render); silence the tokenizer's warning
        self.pad_id = tok.pad_token_id
        self.max_length = min(mcfg.max_length, self.loaded.max_positions or mcfg.max_length)
        if self.max_length < mcfg.max_length:  # the config says more than the model can read: say what is used
            log(
                f"WARNING: {role}.max_length {mcfg.max_length} exceeds the {self.loaded.max_positions} positions of "
                f"{mcfg.name}: it trains and is scored at {self.max_length} tokens (recorded as max_length in its "
                "stage markers)"
            )
        self.split_mode = bool(mcfg.trainable_layers and mcfg.trunk_cache and can_split(self.loaded.backbone))
        self.trunk, self.base = None, self.loaded.backbone
        self.n_layers = num_blocks(self.loaded.backbone)
        self.offset = 0
        if self.split_mode:
            self.trunk, self.base = split_decoder(self.loaded.backbone, mcfg.trainable_layers)
            self.offset = self.n_layers - mcfg.trainable_layers
            if mcfg.bf16:
                self.trunk = self.trunk.to(torch.bfloat16)
            if current_device() != "cpu":
                self.trunk = self.trunk.to(current_device())
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
        self._device_copies: dict = {}  # id(pretrained module) -> its frozen inference copy on the run's device

    def on_device(self, which: str = "base") -> torch.nn.Module:
        """The pretrained model for inference on the run's device (:func:`~w2s_shift.device.current_device`):
        ``"base"`` (what students copy: the split head over cached trunk states, or the whole backbone) for the
        ANCHOR reference states, drift references and zero-shot rewards; ``"full"`` (the whole backbone, which
        reads token ids) for SEAM's questions.

        On the CPU this is the pretrained module itself (already there; never trained: students copy it). On a
        GPU it is a frozen copy made once (:func:`~w2s_shift.training.loop.make_reference`: eval mode, no
        gradients, its linear weights in bfloat16 when the model computes in bf16, which autocast gives
        bit-identical outputs) and moved there, so no pretrained forward runs on the host; the float32 original
        stays on the host as the source of each student's weights. :meth:`release_device_copies` frees it."""
        module = self.base if which == "base" else self.loaded.backbone
        dev = current_device()
        if dev == "cpu":
            return module
        key = id(module)
        if key not in self._device_copies:
            offset = self.offset if module is self.base else 0
            self._device_copies[key] = make_reference(module, offset, autocast_bf16=self.mcfg.bf16).to(dev)
        return self._device_copies[key]

    def release_device_copies(self) -> None:
        """Free the device copies of :meth:`on_device` (before a student trains: its memory is the student's);
        the next inference pass makes them again."""
        self._device_copies.clear()
        if current_device() == "cuda":
            torch.cuda.empty_cache()

    def cached_bytes(self) -> int:
        """Host bytes of the hidden states this featurizer keeps (trunk states, ANCHOR reference states, drift
        probes' references)."""
        trunk = sum(_nbytes(f["states"]) for f in self.feats.values())
        return trunk + _nbytes(list(self._ref.values())) + sum(_nbytes(p.ref) for p in self._probes.values())

    def _reserve(self, nbytes: int, what: str, evict_reference: bool = False) -> None:
        """Check, before computing it, that a cache of ``nbytes`` fits :data:`HOST_SHARE` of the host memory this
        process can still take (:func:`~w2s_shift.device.available_host_bytes`); with ``evict_reference``, the
        reference states cached for earlier students are dropped first when it would not (they are computed again
        if a later student needs them).

        Raises:
            HostMemoryError: it does not fit: the numbers, and what caches nothing (frozen copy, LoRA)."""
        avail = min_over_processes(available_host_bytes())  # every process decides alike
        if avail is None or nbytes <= HOST_SHARE * avail:
            return
        if evict_reference and self._ref:
            freed = _nbytes(list(self._ref.values()))
            self._ref.clear()
            log(f"{self.role}: freed {freed / 2**30:.2f} GiB of earlier students' cached reference states for {what}")
            avail = min_over_processes(available_host_bytes()) or avail
            if nbytes <= HOST_SHARE * avail:
                return
        gib = 2**30
        raise HostMemoryError(
            f"{self.role} {self.mcfg.name}: {what} would take {nbytes / gib:.1f} GiB of host memory, but this process "
            f"can take {avail / gib:.1f} GiB ({100 * HOST_SHARE:.0f}% of it may go to one cache; it already holds "
            f"{self.cached_bytes() / gib:.1f} GiB of cached states; processes on this machine: "
            f"{os.environ.get('LOCAL_WORLD_SIZE', '1')}, each with its own copy). Cache nothing: the ANCHOR reference "
            "as `reference: frozen_copy` (one more forward per step) or a LoRA student with `reference: "
            "adapter_disabled`; `trunk_cache: false` for the frozen layers; or fewer pairs (data.n_student_train). "
            "`w2s-shift plan CONFIG` estimates the caches before a run."
        )

    def forget(self, names: set) -> None:
        """Drop what was computed for the evaluation sets ``names`` (encodings, truncation counts, trunk, reference
        and drift-probe states): the sets changed (a new split of the source); the loaded models stay."""
        for cache in (self.feats, self.truncated, self._ref, self._probes):
            for key in [k for k in cache if (k[0] if isinstance(k, tuple) else k) in names]:
                del cache[key]

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

    def trunk_states(self, seqs: list, desc: str) -> list | None:
        """The frozen trunk's states of each sequence (:func:`compute_trunk_states`; ``seqs`` as :func:`seqs_of`
        lays them out, so a pair's shared prefix can run once), or None without trunk caching."""
        if not self.split_mode:
            return None
        tokens = sum(len(x) for x in seqs)
        self._reserve(
            tokens * self.loaded.hidden_size * self._dtype().itemsize,
            f"{desc}: {tokens:,} tokens x hidden {self.loaded.hidden_size} in {self._dtype()}",
        )
        n = len(seqs) // 2

        def pairs_states(idx: list) -> list:  # (chosen states, rejected states) of the pairs idx
            sub = [seqs[i] for i in idx] + [seqs[i + n] for i in idx]
            st = compute_trunk_states(
                self.trunk,
                sub,
                self.pad_id,
                max_tokens=self.mcfg.eval_max_tokens,
                dtype=self._dtype(),
                desc=desc,
                share_prefixes=self.mcfg.trunk_share_prefixes and can_share_prefixes(self.trunk),
            )
            return [(st[j], st[j + len(idx)]) for j in range(len(idx))]

        per_pair = sharded(pairs_states, list(range(n)))  # each process a share of the pairs, gathered in order
        return [c for c, _ in per_pair] + [r for _, r in per_pair]

    def features(self, name: str, pairs: list) -> dict:
        if name not in self.feats:
            enc, self.truncated[name] = encode_pairs(pairs, self.loaded.tokenizer, self.max_length)
            self.cut_counts[name] = cc = cut_counts(enc)
            if cc["truncated"]:
                log(
                    f"{self.role} {name}: {cc['truncated']} of {cc['pairs']} pairs truncated "
                    f"at {self.max_length} tokens; "
                    f"share of pairs whose response was cut: {100 * cc['response_cut_share']:.1f}%"
                )
            seqs, masks = seqs_of(enc)
            states = self.trunk_states(seqs, f"{self.role} trunk {name}")
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
        """A fresh trainable student of this model for ``seed`` (:func:`w2s_shift.models.students.trainable_model`)."""
        return trainable_model(
            self.base,
            self.loaded.hidden_size,
            self.mcfg,
            seed,
            layer_offset=self.offset,
            cached_trunk=self.split_mode,
            n_layers=self.n_layers,
        )

    def dataset(
        self, name: str, pairs: list, labels: list, reference_layers: list | None = None, with_reference: bool = False
    ) -> PairDataset:
        f = self.features(name, pairs)
        states = pairs_of(f["states"]) if f["states"] is not None else None
        ref = None
        if with_reference:
            key = (name, tuple(reference_layers) if reference_layers else None)
            if key not in self._ref:
                tokens, k = sum(sum(m) for m in f["masks"]), len(reference_layers or [None])
                self._reserve(
                    tokens * k * self.loaded.hidden_size * self._dtype().itemsize,
                    f"ANCHOR reference states of {name}: {tokens:,} response tokens x {k} layer(s) x hidden "
                    f"{self.loaded.hidden_size} in {self._dtype()}",
                    evict_reference=True,
                )
                seqs, masks, trunk = f["seqs"], f["masks"], f["states"]

                def reference(idx: list) -> list:
                    return compute_reference_states(
                        self.on_device(),
                        [seqs[i] for i in idx],
                        [masks[i] for i in idx],
                        self.pad_id,
                        states=None if trunk is None else [trunk[i] for i in idx],
                        max_tokens=self.mcfg.eval_max_tokens,
                        dtype=self._dtype(),
                        bf16=self.mcfg.bf16,
                        layers=reference_layers,
                        layer_offset=self.offset,
                        desc=f"reference states {name}",
                    )

                # each process computes a share of the sequences; every process keeps them all (its batches
                # come from the whole training split)
                self._ref[key] = pairs_of(sharded(reference, list(range(len(seqs)))))
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
                self.on_device(),
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
        """Layers whose final drift is measured (:func:`drift_blocks` of this model's trainable blocks)."""
        return drift_blocks(self.first_trainable, self.n_layers, anchored)


class SourceContext:
    """Everything a grid row (one source dataset) shares across seeds and methods: data, and the teacher's and
    student's loaded models with their cached features."""

    def __init__(self, cfg: RunConfig, src, run_dir: Path):
        self.cfg, self.src, self.run_dir = cfg, src, run_dir
        self.name = src.display
        self.seed = cfg.seeds[0]
        self.splits, self.ood, self.summary = prepare_data(cfg, src, self.seed)
        self.eval_sets = {self.name: self.splits["test"], **self.ood}
        self.data_digest = stage_digest(source_digest(cfg, src))
        # identity of each evaluation set: the ID test split follows the training data, each OOD target its own
        self.eval_digests = {
            self.name: stage_digest(self.data_digest, "test"),
            **{ref.display: eval_set_digest(cfg, src, ref) for ref in cfg.data.ood_for(src)},
        }
        self._tf = self._sf = None
        self.zero_shot_rewards: dict = {}
        self.pretrained_diffs: dict = {}  # set name -> the pretrained student's pooled pair differences (mechanism)
        # (seed, label, training digest, set name) -> a scored student's pooled states, kept by its scoring stage
        # for its mechanism stage (see keep_student_pooled)
        self._student_pooled: dict = {}
        self.seam_relevance: dict = {}  # SEAM relevance question -> the strong LM's log p(Yes) - log p(No)

    def keep_student_pooled(self, key: tuple, pooled: np.ndarray) -> None:
        """Keep a scored student's (2B, H) pooled states on one set (the B chosen, then the B rejected sequences)
        for its mechanism stage (:func:`~w2s_shift.pipeline.intervene.cell_mechanism`). ``key``: (seed, label,
        training digest, set name). Only one student's sets are kept at a time: keeping another's drops the rest."""
        self._student_pooled = {k: v for k, v in self._student_pooled.items() if k[:3] == key[:3]}
        self._student_pooled[key] = pooled

    def take_student_pooled(self, key: tuple) -> np.ndarray | None:
        """What :meth:`keep_student_pooled` kept under ``key``, removed from the context; None when nothing was kept
        (the set was scored in another process, or by the drift probe's pass)."""
        return self._student_pooled.pop(key, None)

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
                f.forget(names)
        self.zero_shot_rewards = {}
        self.pretrained_diffs = {k: v for k, v in self.pretrained_diffs.items() if k not in names}

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
            log(f"student: {self._sf.describe()}")
        return self._sf


def to_run_device(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` on the run's device (a model loaded from its saved weights starts on the host; one the Trainer
    trained is there already). A model FSDP or ZeRO-3 left sharded is returned as it is (the scorer refuses it)."""
    from ..distributed import is_sharded_model

    dev = current_device()
    if is_sharded_model(model) or str(next(model.parameters()).device).split(":")[0] == dev:
        return model
    return model.to(dev)


def drift_blocks(first: int, n_layers: int, anchored: list | None = None) -> list:
    """1-based blocks whose drift is measured, where fine-tuning can move them (``first``..``n_layers``, the
    trainable blocks): all of them when there are at most 8; else every third from the first trainable one, the
    blocks at 50% and 75% depth that train, and the last; always the ``anchored`` ones. So a deep or LoRA student
    shows where drift starts and grows through the network, and where anchoring stops it."""
    trainable = list(range(first, n_layers + 1))
    if len(trainable) <= 8:
        chosen = set(trainable)
    else:
        chosen = set(trainable[::3]) | set(resolve_layer_spec("middle", n_layers)) | {n_layers}
        chosen = {k for k in chosen if k >= first}
    return sorted(chosen | set(anchored or []))

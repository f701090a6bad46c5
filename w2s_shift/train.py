"""Training reward models on the Hugging Face Trainer: gold Bradley-Terry, soft labels, ANCHOR.

:class:`PairTrainer` subclasses ``transformers.Trainer`` and overrides ``compute_loss`` only; batches come
from :class:`PairCollator` (chosen and rejected of a pair in one forward) in length-grouped order
(:class:`LengthGroupedPairSampler`), either padded to the batch's longest sequence or, for causal decoders,
packed without padding (``packing``; rows of several sequences whose ``position_ids`` restart, so attention
stays within each sequence), so no compute goes to padding on real variable-length data.

Inputs are either token ids (full model) or cached trunk states (partial fine-tuning of the top layers of
a decoder, see :func:`w2s_shift.models.reward_model.split_decoder`).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset, Sampler
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState

from .losses import (
    adaptive_anchor_lambda,
    anchor_mse_layers,
    anchor_sq_sums,
    confidence_alpha,
    confidence_loss,
    pairwise_margin,
    soft_bradley_terry,
)
from .models.reward_model import last_token_index, pack_sequences, packed_positions, select_layers


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step."""


@dataclass
class PairTrainerConfig:
    """Hyperparameters of one reward-model training run (TRL-style config beside its trainer)."""

    epochs: float = field(default=1.0, metadata={"help": "Passes over the training pairs."})
    batch_size: int = field(default=8, metadata={"help": "Pairs per optimizer step (2x sequences per forward)."})
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={
            "help": "Micro-batches per optimizer step; each "
            "forward takes batch_size / (this x processes) pairs. Must divide batch_size."
        },
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW peak learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_ratio: float = field(default=0.1, metadata={"help": "Share of steps with linear LR warm-up."})
    lr_scheduler: str = field(default="linear", metadata={"help": "transformers LR schedule name."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    seed: int = field(default=0, metadata={"help": "Seed of init, batch order and dropout."})
    logging_steps: int = field(default=10, metadata={"help": "Log the loss every N steps."})
    loss: str = field(default="soft_bt", metadata={"help": "'soft_bt' (Naive W2S / gold BT) or 'confidence'."})
    anchor_lambda: float = field(
        default=0.0,
        metadata={
            "help": "ANCHOR weight lambda (0 disables anchoring); with anchor_lambda_auto, lambda at the first step."
        },
    )
    anchor_normalize: bool = field(
        default=False,
        metadata={
            "help": "L_anchor per layer relative to the reference's mean "
            "squared norm (losses.anchor_relative); False: the paper's raw MSE (losses.anchor_mse)."
        },
    )
    anchor_lambda_auto: bool = field(
        default=False,
        metadata={
            "help": "Drift budget: lambda adapts every optimizer step "
            "(losses.adaptive_anchor_lambda, Ziegler et al. 2019 sec. 2.2) so the anchored layers' "
            "relative squared error stays near anchor_target_drift."
        },
    )
    anchor_target_drift: float = field(
        default=0.02, metadata={"help": "anchor_lambda_auto: target relative squared error."}
    )
    anchor_k: float = field(
        default=0.1,
        metadata={
            "help": "anchor_lambda_auto: controller gain K (lambda changes by at most a factor 1 +- 0.2 K a step)."
        },
    )
    confidence_alpha_max: float = field(default=0.5, metadata={"help": "Confidence loss: final alpha."})
    confidence_warmup: float = field(
        default=0.2, metadata={"help": "Confidence loss: share of training for alpha's linear warm-up."}
    )
    length_group_size: int = field(
        default=16, metadata={"help": "Batches per length-sorted mega-batch (0: plain shuffle)."}
    )
    finite_check_every_step: bool | None = field(
        default=None,
        metadata={
            "help": "Check the loss for NaN/inf at every "
            "step (a host synchronisation) or only when logging and before a checkpoint, "
            "naming the first bad step either way. None: every step on CPU, deferred on GPU."
        },
    )
    packing: bool = field(
        default=False,
        metadata={
            "help": "Padding-free packing of each batch's 2B sequences into rows "
            "(position_ids restart per sequence; decoders with last-token pooling only, see "
            "reward_model.can_pack). Checked against padded rewards before training."
        },
    )
    bf16: bool = field(
        default=False, metadata={"help": "bfloat16 autocast for forward/backward (weights and AdamW stay float32)."}
    )
    head_lr_multiplier: float = field(
        default=1.0, metadata={"help": "Learning rate of the new scalar head = this x learning_rate."}
    )
    anchor_layers: list | None = field(
        default=None,
        metadata={
            "help": "1-based global blocks anchored (None: the last layer's normalized output, what the head reads)."
        },
    )
    reference_mode: str = field(
        default="frozen_copy",
        metadata={
            "help": "ANCHOR reference: 'frozen_copy' (a module run every "
            "step), 'adapter_disabled' (the LoRA model with adapters off) or 'cached' (states in the dataset)."
        },
    )
    checkpoint_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Save a checkpoint every this share of steps (0: never; the pipeline sets it from the run config)."
        },
    )
    report_to: list = field(default_factory=list, metadata={"help": "Trainer integrations, e.g. ['tensorboard']."})
    label: str = field(
        default="model", metadata={"help": "Name of the model being trained, in messages (teacher, a method label)."}
    )
    logging_dir: str | None = field(
        default=None, metadata={"help": "TensorBoard event folder (default: under output_dir)."}
    )


class PairDataset(Dataset):
    """Training pairs as index records; the features themselves live in ``store``.

    Args:
        pairs: list of :class:`~w2s_shift.data.render.EncodedPair`.
        labels: (B,) soft labels q_i in [0, 1] (1.0 for gold).
        states: optional list of per-pair (chosen_states (Tc, H), rejected_states (Tr, H)) trunk outputs.
        ref_states: optional list of per-pair (chosen (Rc, K, H), rejected (Rr, K, H)) cached ANCHOR reference
            states of K anchored layers on response tokens only (Rc = response tokens of the chosen sequence);
            (Rc, H) is read as K = 1.
    """

    def __init__(self, pairs: list, labels: list, states: list | None = None, ref_states: list | None = None):
        if len(pairs) != len(labels):
            raise ValueError(f"{len(pairs)} pairs but {len(labels)} labels")
        for what, x in (("trunk states", states), ("reference states", ref_states)):
            if x is not None and len(x) != len(pairs):
                raise ValueError(f"{len(pairs)} pairs but {len(x)} {what}")
        self.pairs, self.labels, self.states, self.ref_states = pairs, [float(q) for q in labels], states, ref_states

    def __len__(self) -> int:
        return len(self.pairs)

    def lengths(self) -> list:
        return [max(len(p.chosen.input_ids), len(p.rejected.input_ids)) for p in self.pairs]

    def __getitem__(self, i: int) -> dict:
        d = {"pair": self.pairs[i], "label": self.labels[i], "index": i}
        if self.states is not None:
            d["states"] = self.states[i]
        if self.ref_states is not None:
            d["ref_states"] = self.ref_states[i]
        return d


class PairCollator:
    """Collates a list of pairs into one forward's batch of 2B sequences, [chosen_1..chosen_B, rejected_1..rejected_B].

    Padded (``packing=False``): ``attention_mask`` (2B, T), ``response_mask`` (2B, T), ``labels`` (B,), and either
    ``input_ids`` (2B, T) or ``inputs_embeds`` (2B, T, H) float32; with cached reference states also
    ``ref_hidden`` (2B, T, K, H), zero outside response tokens. Padding is on the right with ``pad_id``; pooling
    reads the last attention-mask position, so the pad id is never looked for.

    Packed (``packing=True``, padding-free): the 2B sequences are first-fit-decreasing packed into R rows of at
    most T tokens (T = the batch's longest sequence; see
    :func:`~w2s_shift.models.reward_model.pack_sequences`): ``input_ids`` (R, L) or ``inputs_embeds`` (R, L, H),
    ``position_ids`` (R, L) restarting at each sequence, ``last_index`` (2B,) flat positions of each sequence's
    last token (same sequence order as padded), ``response_mask`` (R, L), ``ref_hidden`` (R, L, K, H); no
    attention mask. The same tokens are computed with the same positions and causal context, so rewards,
    losses and gradients equal the padded batch's up to float rounding (tested), with no compute on padding.
    """

    def __init__(self, pad_id: int, packing: bool = False):
        self.pad_id = int(pad_id)
        self.packing = bool(packing)

    def __call__(self, items: list) -> dict:
        seqs = [it["pair"].chosen for it in items] + [it["pair"].rejected for it in items]
        lengths = [len(s.input_ids) for s in seqs]
        n = len(seqs)
        if self.packing:
            rows = pack_sequences(lengths, max(lengths))
            pos, starts, last = packed_positions(rows, lengths)
            shape = tuple(pos.shape)
            where = [slice(int(starts[k, 1]), int(starts[k, 1]) + lengths[k]) for k in range(n)]
            at = [int(starts[k, 0]) for k in range(n)]
        else:
            shape = (n, max(lengths))
            where = [slice(0, ln) for ln in lengths]
            at = list(range(n))
        ids = torch.full(shape, self.pad_id, dtype=torch.long)
        rm = torch.zeros(shape, dtype=torch.long)
        for k, s in enumerate(seqs):
            ids[at[k], where[k]] = torch.tensor(s.input_ids)
            rm[at[k], where[k]] = torch.tensor(s.response_mask)
        batch = {"response_mask": rm, "labels": torch.tensor([it["label"] for it in items], dtype=torch.float32)}
        if self.packing:
            batch.update(position_ids=pos, last_index=last)
        else:
            am = torch.zeros(shape, dtype=torch.long)
            for k in range(n):
                am[k, where[k]] = 1
            batch["attention_mask"] = am
        if "index" in items[0]:
            batch["pair_index"] = torch.tensor([it["index"] for it in items], dtype=torch.long)
        if "states" in items[0]:
            states = [it["states"][0] for it in items] + [it["states"][1] for it in items]
            # one buffer in the stored dtype, cast once (a per-sequence cast costs up to 0.5 s a batch on a loaded
            # 2-core CPU)
            emb = torch.zeros(shape + (states[0].shape[-1],), dtype=states[0].dtype)
            for k, st in enumerate(states):
                emb[at[k], where[k]] = st
            batch["inputs_embeds"] = emb.float()
        else:
            batch["input_ids"] = ids
        if "ref_states" in items[0]:
            refs = [it["ref_states"][0] for it in items] + [it["ref_states"][1] for it in items]
            refs = [r if r.dim() == 3 else r.unsqueeze(1) for r in refs]  # (R_k, K, H)
            ref = torch.zeros(shape + tuple(refs[0].shape[1:]), dtype=torch.float32)
            for k, r in enumerate(refs):
                ref[at[k], where[k]][rm[at[k], where[k]] > 0] = r.float()
            batch["ref_hidden"] = ref
        return batch


class LengthGroupedPairSampler(Sampler):
    """Seeded length grouping: shuffle, cut into mega-batches of ``group`` batches, sort each by length.

    Batches then hold pairs of similar length (little padding) while the order stays random across
    mega-batches; the longest mega-batch's batch comes first so an out-of-memory error shows at once.
    """

    def __init__(self, lengths: list, batch_size: int, group: int, seed: int):
        self.lengths, self.batch_size, self.group, self.seed = lengths, batch_size, group, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = random.Random(self.seed * 1000003 + self.epoch)
        idx = list(range(len(self.lengths)))
        rng.shuffle(idx)
        self.epoch += 1
        if self.group <= 0:
            return iter(idx)
        mega = self.batch_size * self.group
        out = []
        for s in range(0, len(idx), mega):
            out.extend(sorted(idx[s : s + mega], key=lambda i: -self.lengths[i]))
        return iter(out)


class PairTrainer(Trainer):
    """``transformers.Trainer`` for pairwise reward models (soft Bradley-Terry, confidence, ANCHOR).

    Loss per batch (Le et al. 2026): L = L_w2s(d, q) + lambda * L_anchor, where d = r(chosen) - r(rejected)
    and L_anchor is the response-token masked MSE between the model's last-layer states and those of
    ``reference`` (a frozen copy of the model's backbone before training) on the same input; with
    ``anchor_normalize`` each layer's error is relative to the reference's mean squared norm
    (:func:`~w2s_shift.losses.anchor_relative`). With ``anchor_lambda_auto`` lambda follows the drift budget
    (:func:`~w2s_shift.losses.adaptive_anchor_lambda`, once per optimizer step). Logged besides the loss:
    loss_w2s, loss_anchor, anchor_drift (relative squared error of the batch), anchor_lambda and anchor_ratio
    (lambda x L_anchor / L_w2s), each averaged over the logging interval.
    """

    def __init__(self, *args, pair_config: PairTrainerConfig, reference: torch.nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pair_config = pair_config
        self.reference = reference
        if reference is not None and getattr(reference, "autocast_bf16", False) and not pair_config.bf16:
            raise ValueError(
                "the frozen reference keeps bfloat16 linear weights for bf16 autocast "
                "(make_reference(autocast_bf16=True)) but training runs without bf16: make the reference "
                "with autocast_bf16=False or train with bf16"
            )
        if (
            _anchoring(pair_config)
            and reference is None
            and pair_config.reference_mode != "adapter_disabled"
            and getattr(self.train_dataset, "ref_states", None) is None
        ):
            raise ValueError(
                "anchor_lambda > 0 needs a reference model, cached reference states or a LoRA model "
                "(reference_mode adapter_disabled)"
            )
        self._parts: dict = {}
        self._pending: list = []  # (step, loss, pair indices, loss parts) not yet checked for finiteness
        if pair_config.anchor_lambda_auto:
            if not pair_config.anchor_lambda > 0:
                raise ValueError(
                    f"{pair_config.label}: anchor_lambda_auto needs anchor_lambda > 0 (its starting value)"
                )
            self.add_callback(AnchorLambdaState(float(pair_config.anchor_lambda)))
        self._anchor_lam = None  # the current lambda of anchor_lambda_auto, a 0-dim tensor on the model's device
        self._drifts: list = []  # this optimizer step's per-micro-batch (err (K,), ref_sq (K,)) sums, not yet applied
        self._drift_step = 0  # the optimizer step the drifts in _drifts belong to
        # compute_loss normalizes by the counts of the whole accumulated batch (get_batch_samples): the Trainer must
        # neither divide by the accumulation steps again nor count num_items_in_batch from its own rules
        self.model_accepts_loss_kwargs = True
        self._accum_tokens = None  # response tokens (2B sequences) of the current accumulated batch, all processes
        self._micro = (-1, 0)  # (optimizer step, micro-batch index within it): the confidence loss's orientation seed
        self._step_ref_sq = None  # (K,) reference squared-norm sums of the whole accumulated step (anchor_normalize)
        # (pair_index, reference states) of this step's micro-batches, from get_batch_samples
        self._ref_cache: list = []

    loss_is_scaled_for_ga = True  # transformers >= 5: the loss from compute_loss is already scaled for accumulation

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The micro-batches of one optimizer step, and ``num_items_in_batch``: the number of pairs in all of
        them, summed over processes. Also keeps the step's response-token count (ANCHOR's normalizer) in
        ``self._accum_tokens``, and with ``anchor_normalize`` the step's reference sums (:meth:`_step_reference_sums`).
        Counting ourselves does not rely on the Trainer's rule (labels != -100, which happens to count our float
        soft labels)."""
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batch_samples:
            return batch_samples, None
        counts = torch.tensor(
            [[float(b["labels"].numel()), float(self._response_mask(b).sum())] for b in batch_samples], device=device
        ).sum(0)
        if self.args.world_size > 1:
            counts = self.accelerator.gather(counts.unsqueeze(0)).sum(0)
        self._accum_tokens = counts[1]
        self._step_ref_sq, self._ref_cache = None, []
        if (
            self.pair_config.anchor_normalize
            and _anchoring(self.pair_config)
            and (len(batch_samples) > 1 or self.args.world_size > 1)
        ):
            self._step_reference_sums(batch_samples)
        return batch_samples, counts[0]

    @torch.no_grad()
    def _step_reference_sums(self, batch_samples: list) -> None:
        """``anchor_normalize`` under accumulation or several processes: the per-layer reference sums
        sum_{n,t} m ||h^ref||^2 over the response tokens of every micro-batch of this optimizer step, summed over
        processes, into ``self._step_ref_sq`` (K,), before the first micro-batch's backward. compute_loss divides
        each micro-batch's squared error by them, so the micro-batches' terms add up to the relative error of the
        whole step, as one batch computes it (not a mean of per-micro-batch ratios). The reference states are
        computed here once and kept in ``self._ref_cache`` for compute_loss: the reference runs once per
        micro-batch as without accumulation, at the cost of holding the step's anchored-layer reference states
        (K x (2B, T, H) for the B pairs of the step, like a one-batch step) until their micro-batch is trained."""
        total = None
        for b in batch_samples:
            inputs = self._prepare_inputs(b)
            mask = self._response_mask(inputs)
            fwd = {
                k: inputs[k] for k in ("input_ids", "inputs_embeds", "attention_mask", "position_ids") if k in inputs
            }
            refs = self._reference_hidden(self.model_wrapped, inputs, fwd, self.pair_config.anchor_layers)
            sq = torch.stack([anchor_sq_sums(r, r, mask)[1] for r in refs])
            total = sq if total is None else total + sq
            self._ref_cache.append((inputs.get("pair_index"), refs))
        if self.args.world_size > 1:
            total = self.accelerator.gather(total.unsqueeze(0)).sum(0)
        self._step_ref_sq = total

    def _cached_reference(self, inputs: dict) -> list | None:
        """The reference states :meth:`_step_reference_sums` computed for this micro-batch (matched on its pair
        indices), or None."""
        if not self._ref_cache:
            return None
        idx, refs = self._ref_cache.pop(0)
        mine = inputs.get("pair_index")
        if (idx is None) != (mine is None) or (idx is not None and not torch.equal(idx.to(mine.device), mine)):
            self._ref_cache = []
            return None
        return refs

    @staticmethod
    def _response_mask(inputs: dict) -> torch.Tensor:
        """Response tokens inside the attention mask (padded rows); packed rows carry no padding in the mask."""
        rm = inputs["response_mask"]
        return rm * inputs["attention_mask"] if "attention_mask" in inputs else rm

    def create_optimizer(self, *args, **kwargs):
        """AdamW with two groups: the new scalar head at ``head_lr_multiplier`` x the learning rate."""
        if self.optimizer is None and self.pair_config.head_lr_multiplier != 1.0:
            head = [p for n, p in self.model.named_parameters() if p.requires_grad and n.startswith("score.")]
            rest = [p for n, p in self.model.named_parameters() if p.requires_grad and not n.startswith("score.")]
            lr = self.args.learning_rate
            groups = [{"params": rest, "lr": lr}, {"params": head, "lr": lr * self.pair_config.head_lr_multiplier}]
            # the optimizer class and kwargs the Trainer would use (fused AdamW by default: one kernel per step
            # instead of a foreach chain, which matters for the optimizer step of a large student on a GPU)
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
            kwargs = {**kwargs, "weight_decay": self.args.weight_decay}
            self.optimizer = cls([g for g in groups if g["params"]], **kwargs)
            return self.optimizer
        return super().create_optimizer(*args, **kwargs)

    def _get_train_sampler(self, *args, **kwargs):
        ds = self.train_dataset
        return LengthGroupedPairSampler(
            ds.lengths(), self.pair_config.batch_size, self.pair_config.length_group_size, self.pair_config.seed
        )

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        labels = inputs["labels"]
        # padded rows: response tokens inside the attention mask; packed rows carry no padding in the mask
        response_mask = self._response_mask(inputs)
        fwd = {k: inputs[k] for k in ("input_ids", "inputs_embeds", "attention_mask", "position_ids") if k in inputs}
        pool = {"last_index": inputs["last_index"]} if "last_index" in inputs else {}
        cfg = self.pair_config
        anchoring = _anchoring(cfg)
        layers = cfg.anchor_layers
        if anchoring and layers is not None:
            rewards, hidden = model(**fwd, **pool, output_layers=layers)
        else:
            rewards, hidden = model(**fwd, **pool)
            hidden = [hidden]
        margin = pairwise_margin(rewards)
        # Normalization over the whole optimizer step (gradient accumulation, several processes): the loss of
        # this micro-batch is sum_i l_i / P + lambda * sum_tokens anchor / M, P the pairs and M the response tokens
        # of all micro-batches of the step on all processes (get_batch_samples), times the process count because
        # DDP/FSDP average gradients over processes. Summed over micro-batches and processes this is exactly the
        # one-batch loss mean_i l_i + lambda * L_anchor (ANCHOR per response token of the whole step, as in one batch;
        # tests/test_accumulation.py). Without counts (num_items_in_batch None: outside Trainer.train) the
        # micro-batch is the whole batch.
        n_local = labels.new_tensor(float(labels.numel()))
        scale = float(self.args.world_size) if num_items_in_batch is not None else 1.0
        n_pairs = num_items_in_batch if num_items_in_batch is not None else n_local
        if cfg.loss == "confidence":
            frac = self.state.global_step / max(1, self.state.max_steps)
            alpha = confidence_alpha(frac, cfg.confidence_alpha_max, cfg.confidence_warmup)
            step = self.state.global_step
            k = self._micro[1] + 1 if self._micro[0] == step else 0
            self._micro = (step, k)
            # a fresh orientation per micro-batch and process, reproducible on resume (Burns et al. harden per batch:
            # under accumulation the median is the micro-batch's)
            seed = ((cfg.seed * 1_000_003 + step) * 1024 + k) * 4096 + self.args.process_index
            w2s_sum = confidence_loss(margin, labels, alpha, seed=seed, reduction="sum")
        else:
            w2s_sum = soft_bradley_terry(margin, labels, reduction="sum")
        loss = w2s_sum * scale / n_pairs
        parts = {"loss_w2s": (w2s_sum / n_local).detach()}
        if anchoring:
            refs = self._reference_hidden(model, inputs, fwd, layers)
            refs = self._cached_reference(inputs) or self._reference_hidden(model, inputs, fwd, layers)
            tiny = torch.finfo(torch.float32).tiny
            tokens_local = response_mask.sum().clamp_min(1).float()
            if cfg.anchor_normalize:
                # relative error of the whole optimizer step: this micro-batch's squared error over the step's
                # reference sums (get_batch_samples); on one micro-batch and one process, its own sums
                sums = [anchor_sq_sums(h, r, response_mask) for h, r in zip(hidden, refs)]
                err = torch.stack([e for e, _ in sums])
                ref_sq = torch.stack([r for _, r in sums])
                step = self._step_ref_sq is not None and num_items_in_batch is not None
                anc_term = (err / (self._step_ref_sq if step else ref_sq).clamp_min(tiny)).mean() * scale
                anc_local = (err.detach() / ref_sq.clamp_min(tiny)).mean()
                err = err.detach()
            else:
                anc_sum = anchor_mse_layers(hidden, refs, response_mask, reduction="sum")
                tokens = (
                    self._accum_tokens
                    if num_items_in_batch is not None and self._accum_tokens is not None
                    else tokens_local
                )
                anc_term = anc_sum * scale / tokens.clamp_min(1)
                anc_local = anc_sum.detach().float() / tokens_local
                with torch.no_grad():
                    sums = [anchor_sq_sums(h.detach(), r, response_mask) for h, r in zip(hidden, refs)]
                    err = torch.stack([e for e, _ in sums])
                    ref_sq = torch.stack([r for _, r in sums])
            # relative squared error of this micro-batch, mean over the anchored layers (logged)
            drift = (err / ref_sq.clamp_min(tiny)).mean()
            lam = self._anchor_lambda(err, ref_sq) if cfg.anchor_lambda_auto else cfg.anchor_lambda
            loss = loss + lam * anc_term
            parts["loss_anchor"] = anc_local
            parts["anchor_drift"] = drift
            lam_t = lam if torch.is_tensor(lam) else torch.tensor(float(lam), device=drift.device)
            parts["anchor_lambda"] = lam_t
            # the anchor term's share: lambda x L_anchor / L_w2s of this micro-batch (both detached)
            parts["anchor_ratio"] = lam_t * anc_local / parts["loss_w2s"].float().clamp_min(1e-12)
        every = cfg.finite_check_every_step
        if every is None:
            every = loss.device.type == "cpu"
        self._pending.append((self.state.global_step, loss.detach(), inputs.get("pair_index"), parts))
        if every:
            self.check_finite()
        for k, v in parts.items():
            self._parts.setdefault(k, []).append(v)
        return (loss, {"rewards": rewards}) if return_outputs else loss

    @torch.no_grad()
    def _anchor_lambda(self, err: torch.Tensor, ref_sq: torch.Tensor) -> torch.Tensor:
        """lambda of ``anchor_lambda_auto`` for this micro-batch; this micro-batch's per-layer sums (K,) of the
        squared error and of the reference's squared norm (:func:`~w2s_shift.losses.anchor_sq_sums`) are kept for
        this optimizer step.

        At the first micro-batch of a new optimizer step, the previous step's drift updates lambda once
        (:func:`~w2s_shift.losses.adaptive_anchor_lambda`): the relative squared error of the whole step, i.e.
        per layer the sums over its micro-batches and processes divided, then the mean over layers, which is what
        one batch of the same pairs gives, so gradient accumulation changes neither the rule nor its input.
        lambda stays a device tensor: no host synchronisation per step.
        """
        cfg = self.pair_config
        if self._anchor_lam is None:  # from the checkpoint's callback state on resume, else anchor_lambda
            st = next((cb for cb in self.callback_handler.callbacks if isinstance(cb, AnchorLambdaState)), None)
            self._anchor_lam = torch.tensor(st.lam if st else float(cfg.anchor_lambda), device=err.device)
        if self.state.global_step != self._drift_step:
            self._apply_drifts()
            self._drift_step = self.state.global_step
        self._drifts.append((err.detach().float(), ref_sq.detach().float()))
        return self._anchor_lam

    def step_drift(self) -> torch.Tensor | None:
        """The relative squared error of the micro-batches kept so far for this optimizer step (mean over the
        anchored layers of sum err / sum ref, sums over micro-batches and processes), or None when none is kept."""
        from .distributed import all_mean

        if not self._drifts:
            return None
        err = all_mean(torch.stack([e for e, _ in self._drifts]).sum(0))  # (K,); the process count cancels
        ref = all_mean(torch.stack([r for _, r in self._drifts]).sum(0))
        return (err / ref.clamp_min(torch.finfo(torch.float32).tiny)).mean()

    def _apply_drifts(self) -> None:
        if self._drifts and self._anchor_lam is not None:
            cfg = self.pair_config
            self._anchor_lam = adaptive_anchor_lambda(
                self._anchor_lam, self.step_drift(), cfg.anchor_target_drift, cfg.anchor_k
            )
        self._drifts = []

    @torch.no_grad()
    def _reference_hidden(self, model, inputs: dict, fwd: dict, layers: list | None) -> list:
        """The frozen reference's states of the anchored layers on this batch: K tensors (2B, T, H) (packed rows:
        (R, L, H), the reference reads the same ``position_ids``)."""
        mode = self.pair_config.reference_mode
        if "ref_hidden" in inputs:
            ref = inputs["ref_hidden"]
            return [ref[:, :, k] for k in range(ref.shape[2])]
        # the Trainer autocasts the model's forward only: the reference gets the same precision explicitly
        amp = torch.autocast(inputs["labels"].device.type, dtype=torch.bfloat16, enabled=self.pair_config.bf16)
        if mode == "adapter_disabled":
            rm = self.accelerator.unwrap_model(model)
            backbone = rm.backbone
            offset = rm.layer_offset
            with backbone.disable_adapter(), amp:
                out = backbone(**fwd, use_cache=False, output_hidden_states=layers is not None)
        else:
            offset = getattr(self.reference, "layer_offset", 0)
            with amp:
                out = self.reference(**fwd, use_cache=False, output_hidden_states=layers is not None)
        if layers is None:
            return [out.last_hidden_state]
        return select_layers(out, layers, offset)

    def check_finite(self) -> None:
        """Raise :class:`TrainingDivergedError` for the first step since the last check whose loss is NaN/inf.

        One host synchronisation for all pending steps: called every step on CPU, and on GPU when logging and
        before a checkpoint is written (so a checkpoint never holds weights updated by a non-finite loss).
        """
        pending, self._pending = self._pending, []
        if not pending:
            return
        bad = ~torch.isfinite(torch.stack([loss for _, loss, _, _ in pending]))
        if not bool(bad.any()):
            return
        step, loss, idx, parts = pending[int(bad.nonzero()[0, 0])]
        raise TrainingDivergedError(
            step,
            float(loss),
            self.pair_config.label,
            idx.tolist() if idx is not None else [],
            {k: float(v) for k, v in parts.items()},
        )

    def _save_checkpoint(self, *args, **kwargs):
        self.check_finite()
        if self._anchor_lam is not None:  # lambda after this step goes into the checkpoint's trainer_state.json
            self._apply_drifts()
            self._drift_step = self.state.global_step
            for cb in self.callback_handler.callbacks:
                if isinstance(cb, AnchorLambdaState):
                    cb.lam = float(self._anchor_lam)
        self._save_resume_state()
        return super()._save_checkpoint(*args, **kwargs)

    def _save_resume_state(self) -> None:
        """Write what the Trainer keeps only in memory into the checkpoint folder (before the Trainer writes its
        ``trainer_state.json`` last, which marks the checkpoint complete): the summed training loss (logged and
        not yet logged) and the step last logged, from which ``train_loss`` and the next logged ``loss`` are
        computed, and the state of callbacks with ``checkpoint_state()`` (drift measured during training).
        A resumed run then logs what the uninterrupted run logs (tests/test_resume.py)."""
        import os

        from transformers.trainer_pt_utils import nested_gather
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from .io import write_json_atomic

        unlogged = nested_gather(self._tr_loss, self.args.parallel_mode).mean().item()  # as the Trainer's log does
        state = {
            "total_loss_scalar": self._total_loss_scalar,
            "unlogged_loss": unlogged,
            "globalstep_last_logged": self._globalstep_last_logged,
            # loss parts of the steps since the last log (the next log averages them): float32 values, exact
            "parts": {k: [float(v) for v in vs] for k, vs in self._parts.items()},
            "callbacks": {
                type(cb).__name__: cb.checkpoint_state()
                for cb in self.callback_handler.callbacks
                if hasattr(cb, "checkpoint_state")
            },
        }
        if self.args.should_save:
            folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            write_json_atomic(os.path.join(folder, RESUME_STATE_FILE), state)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; when resuming, also restores :meth:`_save_resume_state`'s state (a checkpoint
        without that file resumes as the plain Trainer does)."""
        import json
        import os

        self._resume_state = None
        if isinstance(resume_from_checkpoint, str):
            try:
                with open(os.path.join(resume_from_checkpoint, RESUME_STATE_FILE), encoding="utf-8") as f:
                    self._resume_state = json.load(f)
            except (OSError, ValueError):
                pass
        if self._resume_state:
            saved = self._resume_state.get("callbacks", {})
            for cb in self.callback_handler.callbacks:
                if hasattr(cb, "restore_checkpoint_state") and type(cb).__name__ in saved:
                    cb.restore_checkpoint_state(saved[type(cb).__name__])
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def training_step(self, *args, **kwargs):
        st, self._resume_state = getattr(self, "_resume_state", None), None
        if st:  # first step after a resume: the loss sums as they were at the checkpoint (the Trainer zeroes them)
            self._total_loss_scalar = float(st["total_loss_scalar"])
            self._tr_loss += float(st["unlogged_loss"])
            self._globalstep_last_logged = int(st["globalstep_last_logged"])
            self._parts = {
                k: [torch.tensor(x, dtype=torch.float32, device=self.args.device) for x in vs]
                for k, vs in st.get("parts", {}).items()
            }
            self._initial_global_step = 0  # train_loss averages over every step, as in one uninterrupted call
        return super().training_step(*args, **kwargs)

    def log(self, logs: dict, *args, **kwargs) -> None:
        from .distributed import all_mean

        self.check_finite()

        for k, vs in self._parts.items():  # averaged over the steps since the last log and over processes
            logs[k] = round(float(all_mean(torch.stack(vs).mean())), 6)
        self._parts = {}
        super().log(logs, *args, **kwargs)


def _anchoring(cfg: PairTrainerConfig) -> bool:
    return cfg.anchor_lambda_auto or cfg.anchor_lambda > 0


class AnchorLambdaState(TrainerCallback, ExportableState):
    """The current lambda of ``anchor_lambda_auto``, saved in checkpoints (``TrainerState.stateful_callbacks``) so
    a resumed run continues from it. ``lam``: float."""

    def __init__(self, lam: float = 1.0):
        self.lam = float(lam)

    def state(self) -> dict:
        return {"args": {"lam": self.lam}, "attributes": {}}


RESUME_STATE_FILE = "w2s_resume_state.json"


class TrainingDivergedError(TrainingDiverged):
    """The loss of one batch is NaN/inf: names the model, the optimizer step, the batch's pair indices (positions in
    the training split) and the loss parts."""

    def __init__(
        self, step: int, value: float, label: str = "model", pair_indices: list | None = None, parts: dict | None = None
    ):
        where = f"{label}: training diverged: loss is {value} at optimizer step {step + 1}"
        if pair_indices:
            where += f", batch of training pairs {pair_indices[:16]}{' ...' if len(pair_indices) > 16 else ''}"
        if parts:
            where += " (" + ", ".join(f"{k} {v}" for k, v in parts.items()) + ")"
        hint = (
            "non-finite at the first step: check the model weights and inputs (the learning rate has not acted yet)"
            if step == 0
            else "lower the learning rate or set max_grad_norm"
        )
        super().__init__(f"{where}; {hint}")
        self.step, self.label, self.pair_indices = step, label, pair_indices


def make_reference(backbone: torch.nn.Module, layer_offset: int = 0, autocast_bf16: bool = False) -> torch.nn.Module:
    """A frozen copy of ``backbone`` (eval mode, no gradients): ANCHOR's reference, taken before training.

    Args:
        layer_offset: blocks below it (a split head's cached trunk), for selecting anchored layers.
        autocast_bf16: the reference will run under bfloat16 autocast (as the trainer runs it when ``bf16``):
            its ``nn.Linear`` weights are then stored in bfloat16 once. Autocast would round them to bfloat16
            at every forward anyway, so the outputs are bit-identical (tested), while the per-step weight casts
            go and the copy's linear weights take half the memory; norms and embeddings stay float32, so the
            residual stream is as the student's.
    """
    ref = copy.deepcopy(backbone).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if autocast_bf16:
        for m in ref.modules():
            if type(m) is torch.nn.Linear:  # exact type: peft/quantized subclasses keep their own dtype rules
                m.to(torch.bfloat16)
    ref.layer_offset = layer_offset
    ref.autocast_bf16 = bool(autocast_bf16)
    return ref


class PackingMismatchError(ValueError):
    """Packed rows gave other final states than padded rows: this model's attention ignores restarting position_ids."""


@torch.no_grad()
def check_packing(
    model: torch.nn.Module, dataset: PairDataset, pad_id: int, label: str = "model", lengths: tuple = (24, 9, 14, 10)
) -> float:
    """Check padding-free packing on this model before training: packed rows must give the padded rows' states.

    Runs four probe sequences of ``lengths`` tokens built from the first pair's tokens (and cached trunk
    states), repeated as needed, once padded and once packed, in eval mode without autocast (a few dozen
    tokens: cheap even for large models). With the default lengths one packed row always holds two sequences
    and another has an unused tail, so the check cannot pass vacuously.

    Returns:
        the largest relative difference ||h_packed - h_padded|| / ||h_padded|| of the final states the reward
        head reads (one per sequence).

    Raises:
        PackingMismatchError: a difference above 1e-4 (float32 weights; 3e-2 with 16-bit weights), naming the
            model and its attention implementation.
    """
    from types import SimpleNamespace

    from .inference import module_device as _device

    if len(dataset) == 0:
        return 0.0
    # four probe sequences of fixed lengths cut from the first pair, its tokens (and cached states) repeated
    # when it is shorter: FFD packing of (24, 9, 14, 10) always puts 14 and 10 in one row and leaves a tail
    # after 9, whatever the data. Any inputs serve: the check is packed == padded on the same inputs.
    first = dataset[0]
    src_ids = first["pair"].chosen.input_ids + first["pair"].rejected.input_ids
    src_states = torch.cat(first["states"]) if "states" in first else None
    probes = []
    for n in lengths:
        idx = [j % len(src_ids) for j in range(n)]
        probes.append(
            (
                SimpleNamespace(input_ids=[src_ids[j] for j in idx], response_mask=[1] * n),
                None if src_states is None else src_states[idx],
            )
        )
    items = []
    for i in range(len(probes) // 2):
        (c, cs), (r, rs) = probes[2 * i], probes[2 * i + 1]
        d = {"pair": SimpleNamespace(chosen=c, rejected=r), "label": first["label"]}
        if src_states is not None:
            d["states"] = (cs, rs)
        items.append(d)
    dev = _device(model)
    was_training = model.training
    model.eval()
    try:
        pooled = []
        for packing in (False, True):
            batch = PairCollator(pad_id, packing=packing)(items)
            fwd = {k: v.to(dev) for k, v in batch.items() if k not in ("labels", "response_mask")}
            with torch.autocast(dev.type, enabled=False):
                _, hidden = model(**fwd)
            if packing:
                pooled.append(hidden.reshape(-1, hidden.shape[-1])[fwd["last_index"]].float())
            else:
                idx = last_token_index(fwd["attention_mask"])
                pooled.append(hidden[torch.arange(hidden.shape[0], device=dev), idx].float())
    finally:
        model.train(was_training)
    # the states the reward head reads, compared per sequence relative to their norm (a reward difference
    # alone would hide behind a small head)
    diff = float(((pooled[1] - pooled[0]).norm(dim=-1) / pooled[0].norm(dim=-1).clamp_min(1e-12)).max())
    half = any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters())
    tol = 3e-2 if half else 1e-4
    if not diff <= tol:
        bb = getattr(model, "backbone", model)
        cfg = getattr(bb, "config", None)
        raise PackingMismatchError(
            f"{label}: packed rows give final states {diff:.3g} (relative) away from padded rows (tolerance {tol:g}; "
            f"model type {getattr(cfg, 'model_type', '?')}, attention {getattr(cfg, '_attn_implementation', '?')}): "
            "this attention does not separate packed sequences; set packing: false for this model"
        )
    return diff


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` that the Trainer finished writing (its
    ``trainer_state.json`` is written last), or None."""
    import os

    best, best_step = None, -1
    if not os.path.isdir(output_dir):
        return None
    for name in os.listdir(output_dir):
        if name.startswith("checkpoint-") and name[11:].isdigit():
            path = os.path.join(output_dir, name)
            if os.path.isfile(os.path.join(path, "trainer_state.json")) and int(name[11:]) > best_step:
                best, best_step = path, int(name[11:])
    return best


def train_pairs(
    model: torch.nn.Module,
    dataset: PairDataset,
    pad_id: int,
    cfg: PairTrainerConfig,
    output_dir: str,
    reference: torch.nn.Module | None = None,
    callbacks: list | None = None,
) -> list:
    """Train ``model`` (a :class:`~w2s_shift.models.reward_model.RewardModel`) on ``dataset`` in place.

    Checkpoints go to ``output_dir`` every ``checkpoint_fraction`` of the steps; when a finished checkpoint is
    there (a killed run), training resumes from it (model, optimizer, scheduler, RNG and data order).

    Returns:
        the Trainer's log history (list of dicts: loss, loss_w2s, loss_anchor, learning_rate, step).

    Raises:
        TrainingDiverged: the loss became NaN/inf (names the step).
        PackingMismatchError: ``cfg.packing`` on a model whose attention does not separate packed sequences.
    """
    from .distributed import per_device_batch, set_layer_wrap_classes, world

    accum = int(cfg.gradient_accumulation_steps)
    if accum < 1 or cfg.batch_size % accum:
        raise ValueError(
            f"{cfg.label}: batch_size {cfg.batch_size} is not divisible by gradient_accumulation_steps {accum}"
        )
    steps_per_epoch = math.ceil(len(dataset) / cfg.batch_size)
    # W processes (accelerate launch) each take batch_size / W pairs of the same global batch: accelerate's
    # BatchSamplerShard hands out consecutive per-device batches round-robin from the one seeded sampler order,
    # so the global batch and the optimizer steps equal the one-process run (tests/test_distributed.py)
    set_layer_wrap_classes(model)  # FSDP transformer-layer auto-wrap reads model._no_split_modules
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=per_device_batch(cfg.batch_size // accum, world()[1]),
        gradient_accumulation_steps=accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=int(cfg.warmup_ratio * steps_per_epoch * cfg.epochs),
        lr_scheduler_type=cfg.lr_scheduler,
        max_grad_norm=cfg.max_grad_norm,
        logging_steps=max(1, cfg.logging_steps),
        save_strategy="steps" if cfg.checkpoint_fraction > 0 else "no",
        save_steps=max(1, math.ceil(cfg.checkpoint_fraction * steps_per_epoch * cfg.epochs))
        if cfg.checkpoint_fraction > 0
        else 500,
        save_total_limit=1,
        save_only_model=False,
        report_to=list(cfg.report_to) or "none",
        logging_nan_inf_filter=False,  # our compute_loss checks finiteness; the filter adds a host sync per step
        use_cpu=not torch.cuda.is_available(),
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=False,
        bf16=cfg.bf16,
    )
    if reference is not None:
        reference.to(args.device)  # the Trainer moves only the trained model; each process uses its own device
    import os

    if cfg.logging_dir and "tensorboard" in cfg.report_to:
        os.environ["TENSORBOARD_LOGGING_DIR"] = cfg.logging_dir  # read by transformers' TensorBoardCallback
    if cfg.packing and args.n_gpu > 1:
        # one process seeing several GPUs: the Trainer wraps the model in nn.DataParallel, which splits every
        # input along dim 0; packed rows' flat last-token indices cannot be split that way
        import dataclasses
        import warnings

        warnings.warn(
            f"{cfg.label}: {args.n_gpu} GPUs in one process (nn.DataParallel): training on padded batches; "
            "run under `accelerate launch` (one process per GPU) to keep packing",
            stacklevel=2,
        )
        cfg = dataclasses.replace(cfg, packing=False)
    if cfg.packing:
        check_packing(model, dataset, pad_id, cfg.label)
    trainer = PairTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=PairCollator(pad_id, cfg.packing),
        pair_config=cfg,
        reference=reference,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(output_dir))
    return list(trainer.state.log_history)

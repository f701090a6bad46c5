"""The ``transformers.Trainer`` subclass of pairwise reward models: :class:`PairTrainer` (soft Bradley-Terry,
confidence, ANCHOR with its drift-budget lambda controller), its checkpointed state and its errors."""

from __future__ import annotations

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from ..losses import (
    LOSSES,
    adaptive_anchor_lambda,
    anchor_mse_layers,
    anchor_sq_sums,
    confidence_alpha,
    pairwise_margin,
)
from ..models.reward_model import select_layers
from .args import PairTrainingArguments
from .collator import LengthGroupedPairSampler


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step."""


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

    def __init__(
        self,
        *args,
        reference: torch.nn.Module | None = None,
        **kwargs,
    ):
        """``Trainer``'s arguments, with ``args`` a :class:`~w2s_shift.training.args.PairTrainingArguments`, and
        ``reference``: ANCHOR's frozen reference module (:func:`~w2s_shift.training.loop.make_reference`), or None.

        Raises:
            TypeError: ``args`` is not a PairTrainingArguments.
            ValueError: a bfloat16 reference without ``bf16``; anchoring without any reference.
        """
        super().__init__(*args, **kwargs)
        a = self.args
        if not isinstance(a, PairTrainingArguments):
            raise TypeError(f"PairTrainer needs PairTrainingArguments, got {type(a).__name__}")
        self.reference = reference
        self.loss_fn = LOSSES[a.loss]  # the name was checked when the arguments were built
        if reference is not None and getattr(reference, "autocast_bf16", False) and not a.bf16:
            raise ValueError(
                "the frozen reference keeps bfloat16 linear weights for bf16 autocast "
                "(make_reference(autocast_bf16=True)) but training runs without bf16: make the reference "
                "with autocast_bf16=False or train with bf16"
            )
        if (
            a.anchoring
            and reference is None
            and a.reference_mode != "adapter_disabled"
            and getattr(self.train_dataset, "ref_states", None) is None
        ):
            raise ValueError(
                "anchor_lambda > 0 needs a reference model, cached reference states or a LoRA model "
                "(reference_mode adapter_disabled)"
            )
        self._parts: dict = {}
        self._pending: list = []  # (step, loss, pair indices, loss parts) not yet checked for finiteness
        if a.anchor_lambda_auto:
            self.add_callback(AnchorLambdaState(float(a.anchor_lambda)))
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
        if self.args.anchor_normalize and self.args.anchoring and (len(batch_samples) > 1 or self.args.world_size > 1):
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
            refs = self._reference_hidden(self.model_wrapped, inputs, fwd, self.args.anchor_layers)
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
        if self.optimizer is None and self.args.head_lr_multiplier != 1.0:
            head = [p for n, p in self.model.named_parameters() if p.requires_grad and n.startswith("score.")]
            rest = [p for n, p in self.model.named_parameters() if p.requires_grad and not n.startswith("score.")]
            lr = self.args.learning_rate
            groups = [{"params": rest, "lr": lr}, {"params": head, "lr": lr * self.args.head_lr_multiplier}]
            # the optimizer class and kwargs the Trainer would use (fused AdamW by default: one kernel per step
            # instead of a foreach chain, which matters for the optimizer step of a large student on a GPU)
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
            kwargs = {**kwargs, "weight_decay": self.args.weight_decay}
            self.optimizer = cls([g for g in groups if g["params"]], **kwargs)
            return self.optimizer
        return super().create_optimizer(*args, **kwargs)

    def _get_train_sampler(self, *args, **kwargs):
        ds = self.train_dataset
        return LengthGroupedPairSampler(ds.lengths(), self.args.batch_size, self.args.length_group_size, self.args.seed)

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        labels = inputs["labels"]
        # padded rows: response tokens inside the attention mask; packed rows carry no padding in the mask
        response_mask = self._response_mask(inputs)
        fwd = {k: inputs[k] for k in ("input_ids", "inputs_embeds", "attention_mask", "position_ids") if k in inputs}
        pool = {"last_index": inputs["last_index"]} if "last_index" in inputs else {}
        cfg = self.args
        anchoring = cfg.anchoring
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
        # the pairwise loss by name (losses.LOSSES, looked up in __init__); every registered loss takes the
        # confidence schedule alpha and an orientation seed (Burns et al. 2023), which losses without hardening ignore
        frac = self.state.global_step / max(1, self.state.max_steps)
        alpha = confidence_alpha(frac, cfg.confidence_alpha_max, cfg.confidence_warmup)
        step = self.state.global_step
        k = self._micro[1] + 1 if self._micro[0] == step else 0
        self._micro = (step, k)
        # a fresh orientation per micro-batch and process, reproducible on resume (Burns et al. harden per batch:
        # under accumulation the median is the micro-batch's)
        seed = ((cfg.seed * 1_000_003 + step) * 1024 + k) * 4096 + self.args.process_index
        w2s_sum = self.loss_fn(margin, labels, alpha=alpha, seed=seed, reduction="sum")
        loss = w2s_sum * scale / n_pairs
        parts = {"loss_w2s": (w2s_sum / n_local).detach()}
        if anchoring:
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
        cfg = self.args
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
        from ..distributed import all_mean

        if not self._drifts:
            return None
        err = all_mean(torch.stack([e for e, _ in self._drifts]).sum(0))  # (K,); the process count cancels
        ref = all_mean(torch.stack([r for _, r in self._drifts]).sum(0))
        return (err / ref.clamp_min(torch.finfo(torch.float32).tiny)).mean()

    def _apply_drifts(self) -> None:
        if self._drifts and self._anchor_lam is not None:
            cfg = self.args
            self._anchor_lam = adaptive_anchor_lambda(
                self._anchor_lam, self.step_drift(), cfg.anchor_target_drift, cfg.anchor_k
            )
        self._drifts = []

    @torch.no_grad()
    def _reference_hidden(self, model, inputs: dict, fwd: dict, layers: list | None) -> list:
        """The frozen reference's states of the anchored layers on this batch: K tensors (2B, T, H) (packed rows:
        (R, L, H), the reference reads the same ``position_ids``)."""
        mode = self.args.reference_mode
        if "ref_hidden" in inputs:
            ref = inputs["ref_hidden"]
            return [ref[:, :, k] for k in range(ref.shape[2])]
        # the Trainer autocasts the model's forward only: the reference gets the same precision explicitly
        amp = torch.autocast(inputs["labels"].device.type, dtype=torch.bfloat16, enabled=self.args.bf16)
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
            self.args.label,
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

        from ..io import write_json_atomic

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
        from ..distributed import all_mean

        self.check_finite()

        for k, vs in self._parts.items():  # averaged over the steps since the last log and over processes
            logs[k] = round(float(all_mean(torch.stack(vs).mean())), 6)
        self._parts = {}
        super().log(logs, *args, **kwargs)


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

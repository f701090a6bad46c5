"""The ``transformers.Trainer`` subclass of pairwise reward models: :class:`PairTrainer`, which minimizes a
method's :class:`~w2s_shift.methods.Objective` (its pairwise loss plus an optional regularizer on hidden states),
its checkpointed state and its error."""

from __future__ import annotations

import torch
from transformers import Trainer

from ..losses import LOSSES, pairwise_margin
from ..methods.base import Objective, StepContext
from .args import PairTrainingArguments
from .collator import LengthGroupedPairSampler, forward_inputs


class PairTrainer(Trainer):
    """``transformers.Trainer`` for pairwise reward models.

    Loss per batch: ``objective``'s pairwise loss L_pair(d, q), d = r(chosen) - r(rejected) (soft Bradley-Terry,
    confidence, ...), plus its regularizer's term when it has one (ANCHOR's lambda x L_anchor,
    :class:`w2s_shift.methods.anchor_term.AnchorTerm`), both normalized over the whole optimizer step. Logged
    besides the loss: loss_w2s and the regularizer's parts, each averaged over the logging interval.
    """

    def __init__(self, *args, objective: Objective | None = None, **kwargs):
        """``Trainer``'s arguments, with ``args`` a :class:`~w2s_shift.training.args.PairTrainingArguments`, and
        ``objective``: what to minimize (None: the soft Bradley-Terry loss alone, as for the teacher).

        Raises:
            TypeError: ``args`` is not a PairTrainingArguments.
            ValueError: from the regularizer's checks (e.g. anchoring without any reference).
        """
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, PairTrainingArguments):
            raise TypeError(f"PairTrainer needs PairTrainingArguments, got {type(self.args).__name__}")
        self.objective = objective if objective is not None else Objective(LOSSES["soft_bt"])
        self.regularizer = self.objective.regularizer
        if self.regularizer is not None:
            self.regularizer.bind(self.step_context())
        self._parts: dict = {}
        self._pending: list = []  # (step, loss, pair indices, loss parts) not yet checked for finiteness
        # compute_loss normalizes by the counts of the whole accumulated batch (get_batch_samples): the Trainer must
        # neither divide by the accumulation steps again nor count num_items_in_batch from its own rules
        self.model_accepts_loss_kwargs = True
        self._micro = (-1, 0)  # (optimizer step, micro-batch index within it): the confidence loss's orientation seed

    loss_is_scaled_for_ga = True  # transformers >= 5: the loss from compute_loss is already scaled for accumulation

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The micro-batches of one optimizer step, and ``num_items_in_batch``: the number of pairs in all of
        them, summed over processes (counting ourselves does not rely on the Trainer's rule, labels != -100, which
        happens to count our float soft labels). The regularizer prepares the step (its own normalizers)."""
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batch_samples:
            return batch_samples, None
        # counted on the host (shapes only) and copied without waiting for the device queue
        pairs = torch.tensor(float(sum(b["labels"].numel() for b in batch_samples))).to(device, non_blocking=True)
        if self.args.world_size > 1:
            pairs = self.accelerator.gather(pairs.reshape(1)).sum()
        if self.regularizer is not None:
            self.regularizer.prepare_step(self.step_context(), batch_samples)
        return batch_samples, pairs

    def step_context(self) -> StepContext:
        """What the regularizer may use of this trainer now (:class:`~w2s_shift.methods.base.StepContext`)."""
        model = self.model_wrapped if self.model_wrapped is not None else self.model

        def gather_sum(t: torch.Tensor) -> torch.Tensor:
            return self.accelerator.gather(t.unsqueeze(0)).sum(0)

        return StepContext(
            model=model,
            step=self.state.global_step,
            world_size=self.args.world_size,
            device=self.args.device,
            bf16=bool(self.args.bf16),
            has_cached_reference=getattr(self.train_dataset, "ref_states", None) is not None,
            prepare=self._prepare_inputs,
            unwrap=self.accelerator.unwrap_model,
            gather_sum=gather_sum,
            mp_policy=getattr(getattr(self.accelerator.state, "fsdp_plugin", None), "mixed_precision_policy", None),
            batch_key=getattr(self, "_batch_key", None),
        )

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
        fwd = forward_inputs(inputs)
        pool = {"last_index": inputs["last_index"]} if "last_index" in inputs else {}
        reg = self.regularizer
        layers = reg.output_layers if reg is not None else None
        if layers is not None:
            rewards, hidden = model(**fwd, **pool, output_layers=layers)
        else:
            rewards, hidden = model(**fwd, **pool)
            hidden = [hidden]
        margin = pairwise_margin(rewards)
        # Normalization over the whole optimizer step (gradient accumulation, several processes): this
        # micro-batch's pairwise loss is sum_i l_i / P, P the pairs of all micro-batches of the step on all
        # processes (get_batch_samples), times the process count because DDP/FSDP average gradients over
        # processes; summed over micro-batches and processes this is the one-batch mean (the regularizer does the
        # same per response token; tests/test_accumulation.py). Without counts (num_items_in_batch None: outside
        # Trainer.train) the micro-batch is the whole batch.
        n_local = float(labels.numel())  # a Python number: no copy to the device
        scale = float(self.args.world_size) if num_items_in_batch is not None else 1.0
        n_pairs = num_items_in_batch if num_items_in_batch is not None else n_local
        step = self.state.global_step
        k = self._micro[1] + 1 if self._micro[0] == step else 0
        self._micro = (step, k)
        # a fresh orientation per micro-batch and process, reproducible on resume (Burns et al. harden per batch:
        # under accumulation the median is the micro-batch's); losses without hardening ignore it
        seed = ((self.args.seed * 1_000_003 + step) * 1024 + k) * 4096 + self.args.process_index
        progress = step / max(1, self.state.max_steps)
        w2s_sum = self.objective.pair_loss(margin, labels, progress=progress, seed=seed, reduction="sum")
        loss = w2s_sum * scale / n_pairs
        parts = {"loss_w2s": (w2s_sum / n_local).detach()}
        if reg is not None:
            ctx = self.step_context()
            term, reg_parts = reg.loss(ctx, inputs, fwd, hidden, num_items_in_batch, scale, parts["loss_w2s"])
            if k == 0 and step % max(1, int(self.args.logging_steps)) == 0 and model.training:
                reg_parts.update(grad_ratio(term, loss, hidden, model))
            loss = loss + term
            parts.update(reg_parts)
        every = self.args.finite_check_every_step
        if every is None:
            every = loss.device.type == "cpu"
        self._pending.append((self.state.global_step, loss.detach(), inputs.get("pair_index"), parts))
        if every:
            self.check_finite()
        for key, v in parts.items():
            self._parts.setdefault(key, []).append(v)
        return (loss, {"rewards": rewards}) if return_outputs else loss

    def check_finite(self) -> None:
        """Raise :class:`TrainingDiverged` for the first step since the last check whose loss is NaN/inf.

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
        raise TrainingDiverged(
            step,
            float(loss),
            self.args.label,
            idx.tolist() if idx is not None else [],
            {k: float(v) for k, v in parts.items()},
        )

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save a checkpoint's model weights: only what trains (the trainable blocks or the LoRA adapters, and the
        head), plus buffers. The frozen weights are the pretrained ones the stage rebuilds before it resumes, and the
        Trainer loads a checkpoint's weights with ``strict=False``, so resume is exact while a checkpoint of an 8B LoRA
        student takes megabytes instead of the whole model (~30 GB in float32). A state dict handed in (DeepSpeed
        ZeRO-3's gathered one) is kept as given; FSDP saves through its own sharded path."""
        if state_dict is None:
            frozen = {n for n, p in self.model.named_parameters() if not p.requires_grad}
            state_dict = {k: v for k, v in self.model.state_dict().items() if k not in frozen}
        return super()._save(output_dir, state_dict=state_dict)

    def _issue_warnings_after_load(self, load_result) -> None:
        """After a checkpoint's weights are loaded (``strict=False``): the frozen weights are missing on purpose
        (:meth:`_save`); a missing trainable weight or an unexpected key means the checkpoint is not this model's.

        Raises:
            ValueError: naming the first missing or unexpected keys."""
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        missing = sorted(set(load_result.missing_keys) & trainable)
        unexpected = sorted(load_result.unexpected_keys)
        if missing or unexpected:
            raise ValueError(
                f"{self.args.label}: the checkpoint does not hold this model's trainable weights (missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}); remove {self.args.output_dir} to train from the start"
            )

    def _save_checkpoint(self, *args, **kwargs):
        self.check_finite()
        try:
            if self.regularizer is not None:  # its state after this step (ANCHOR's lambda) goes into the checkpoint
                self.regularizer.before_checkpoint(self.state.global_step)
            self._save_resume_state()
            return super()._save_checkpoint(*args, **kwargs)
        except Exception as e:
            if not is_write_failure(e):
                raise
            raise checkpoint_write_error(e, self.args.output_dir, self.state.global_step) from None

    def _save_resume_state(self) -> None:
        """Write what the Trainer keeps only in memory into the checkpoint folder (before the Trainer writes its
        ``trainer_state.json`` last, which marks the checkpoint complete): the summed training loss (logged and
        not yet logged) and the step last logged, from which ``train_loss`` and the next logged ``loss`` are
        computed, the regularizer's state (ANCHOR's lambda controller) and the state of callbacks with
        ``checkpoint_state()`` (drift measured during training).
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
            "regularizer": self.regularizer.state_dict() if self.regularizer is not None else None,
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
            if self.regularizer is not None and self._resume_state.get("regularizer") is not None:
                self.regularizer.load_state_dict(self._resume_state["regularizer"])
            saved = self._resume_state.get("callbacks", {})
            for cb in self.callback_handler.callbacks:
                if hasattr(cb, "restore_checkpoint_state") and type(cb).__name__ in saved:
                    cb.restore_checkpoint_state(saved[type(cb).__name__])
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def training_step(self, *args, **kwargs):
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        self._batch_key = id(inputs)  # the micro-batch object get_batch_samples handed out (step_context.batch_key)
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


def grad_ratio(term: torch.Tensor, pair_loss: torch.Tensor, hidden: list, model) -> dict:
    """{"reg_grad_ratio": ||d term / d h|| / ||d pair_loss / d h||}: how hard the regularizer pulls on the regularized
    states h (the K tensors ``hidden``) against the pairwise loss, both as they enter the step's loss, over all of h
    (Frobenius norms; 0-dim tensor, no host sync). Computed at logging steps only (two partial backward passes
    through the upper layers); {} for a model sharded across processes (FSDP2 and ZeRO-3 track one backward per
    step) or when neither term reaches h."""
    from ..distributed import is_sharded_model

    if is_sharded_model(model) or not term.requires_grad or not pair_loss.requires_grad:
        return {}
    g_reg = torch.autograd.grad(term, hidden, retain_graph=True, allow_unused=True)
    if all(g is None for g in g_reg):  # a regularizer on the weights (L2-SP) does not act through h
        return {}
    g_pair = torch.autograd.grad(pair_loss, hidden, retain_graph=True, allow_unused=True)

    def norm(gs) -> torch.Tensor:
        return torch.sqrt(
            sum((g.float().pow(2).sum() for g in gs if g is not None), torch.zeros((), device=term.device))
        )

    return {"reg_grad_ratio": (norm(g_reg) / norm(g_pair).clamp_min(1e-30)).detach()}


RESUME_STATE_FILE = "w2s_resume_state.json"


class TrainingDiverged(RuntimeError):
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


#: errno values of a write that ran out of room: no space, over the disk quota, over the file size limit (ulimit -f).
WRITE_ERRNOS = (28, 122, 27)  # ENOSPC, EDQUOT, EFBIG (Linux numbering; errno.ENOSPC is 28 everywhere)
#: How torch's zip writer (torch.save) reports a failed write: a RuntimeError, errno lost.
TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed")


def is_write_failure(e: BaseException) -> bool:
    """True for an exception of a failed file write (disk full, quota, file size limit), as raised by Python's
    own writes (OSError), by torch.save (RuntimeError "[enforce fail at inline_container.cc:...]") or by
    safetensors (its message names the OS error)."""
    if isinstance(e, OSError):
        return e.errno in WRITE_ERRNOS
    text = str(e)
    return any(k in text for k in TORCH_WRITE_FAILURES) or any(
        k in text for k in ("No space left on device", "Disk quota exceeded", "File too large")
    )


def checkpoint_write_error(e: BaseException, output_dir: str, step: int) -> OSError:
    """The error for a checkpoint that could not be written: the file being written (the newest in the checkpoint
    folder), that space ran out, the free space left, and that a rerun resumes from the last complete
    checkpoint."""
    import errno
    import os
    import resource
    import shutil

    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    files = [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
    newest = max(files, key=lambda f: os.stat(f).st_mtime_ns, default=None)
    # under a file size limit the file cut at the limit is the one that failed (the newest may be a later small one)
    cap = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    cap = None if cap == resource.RLIM_INFINITY else cap
    at_cap = [f for f in files if cap is not None and os.stat(f).st_size >= cap]
    newest = getattr(e, "filename", None) or (at_cap[0] if at_cap else newest)
    try:
        free = f"{shutil.disk_usage(output_dir).free / 2**20:.0f} MiB free on its disk"
    except OSError:
        free = "free space unknown"
    if at_cap or (cap is not None and getattr(e, "errno", None) == errno.EFBIG):
        why, fix = f"the file size limit (ulimit -f: {cap} bytes) was reached", "raise the limit (ulimit -f)"
    else:
        limit = " (or the file size limit, ulimit -f, was reached)" if getattr(e, "errno", None) == errno.EFBIG else ""
        why, fix = f"no space left on the device{limit}", "free some space"
    return OSError(
        errno.EFBIG if at_cap else errno.ENOSPC,
        f"could not write the checkpoint {folder}"
        + (f": the file {newest} could not be written" if newest else "")
        + f": {why} ({free}; {type(e).__name__}: {str(e)[:120]}); {fix} "
        "(or set checkpoint_fraction: 0 to write no checkpoints) and rerun: training resumes from the last complete "
        "checkpoint",
    )

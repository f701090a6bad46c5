"""ANCHOR's term during training: :class:`AnchorLambda` (the lambda controller: fixed, or the drift budget) and
:class:`AnchorTerm` (the regularizer the trainer adds to the pairwise loss; Le et al. 2026, arXiv 2605.25629).

L = L_w2s + lambda * L_anchor, with L_anchor the response-token squared error between the student's hidden states
of the anchored layers and those of the frozen pretrained reference on the same input, as the paper's masked MSE
(:func:`w2s_shift.losses.anchor_mse_layers`) or, with ``normalize``, relative to the reference's squared norm
(:func:`w2s_shift.losses.anchor_relative`). Both are normalized over the whole optimizer step (every micro-batch
and process), so gradient accumulation and several processes give the one-batch loss (tests/test_accumulation.py).
"""

from __future__ import annotations

import torch

from ..device import autocast
from ..distributed import all_mean, shard_like
from ..losses import adaptive_anchor_lambda, anchor_lambda_units, anchor_mse_layers, anchor_sq_sums
from ..models.reward_model import layer_states
from ..training.collator import forward_inputs


def response_mask(inputs: dict) -> torch.Tensor:
    """(N, T) response tokens inside the attention mask (padded rows); packed rows carry no padding in the mask."""
    rm = inputs["response_mask"]
    return rm * inputs["attention_mask"] if "attention_mask" in inputs else rm


class AnchorLambda:
    """lambda of one ANCHOR student: fixed, or the drift budget of ``anchor_lambda: auto``.

    Drift budget (the adaptive KL controller of Ziegler et al. 2019, sec. 2.2, with drift for KL;
    :func:`w2s_shift.losses.adaptive_anchor_lambda`): lambda starts at ``init`` and, at the first micro-batch of each
    new optimizer step, moves once on the previous step's drift, the relative squared error of that whole step
    (per layer the sums over its micro-batches and processes divided, then the mean over layers: what one batch of
    the same pairs gives). lambda stays a 0-dim device tensor (no host synchronisation per step).

    Its state (:meth:`state_dict`) goes into every training checkpoint, so a resumed run continues from the lambda
    of the checkpoint, not from ``init`` (tests/test_resume.py).

    Args:
        init: the fixed lambda (>= 0), or the first lambda of the drift budget (> 0).
        auto: the drift budget. target: its drift target (> 0, relative squared error). k: the gain K (> 0).

    Raises:
        ValueError: ``auto`` with ``init`` <= 0, a negative fixed lambda.
    """

    def __init__(self, init: float, auto: bool = False, target: float = 0.02, k: float = 0.1):
        if auto and not init > 0:
            raise ValueError("anchor_lambda auto needs a starting lambda > 0 (anchor_lambda_init)")
        if init < 0:
            raise ValueError(f"anchor_lambda {init} < 0")
        self.init, self.auto, self.target, self.k = float(init), bool(auto), float(target), float(k)
        self._lam = None  # auto: the current lambda, a 0-dim tensor on the model's device
        self._restored = None  # auto: lambda read from a checkpoint, made a tensor at the next step
        self._drifts: list = []  # this optimizer step's per-micro-batch (err (K,), ref_sq (K,)) sums
        self._step = 0  # the optimizer step the sums in _drifts belong to

    @property
    def active(self) -> bool:
        """Whether the term acts (a lambda > 0 or the drift budget)."""
        return self.auto or self.init > 0

    def value(self, step: int, err: torch.Tensor, ref_sq: torch.Tensor):
        """lambda for a micro-batch of optimizer step ``step`` with per-layer sums ``err`` (K,) of the squared error
        and ``ref_sq`` (K,) of the reference's squared norm (kept for the drift budget's next update).
        Returns a float (fixed) or a 0-dim tensor (auto)."""
        if not self.auto:
            return self.init
        if self._lam is None:
            start = self._restored if self._restored is not None else self.init
            self._lam = err.new_full((), float(start), dtype=torch.float32)  # a fill on the device, no copy
        if step != self._step:
            self._apply()
            self._step = step
        self._drifts.append((err.detach().float(), ref_sq.detach().float()))
        return self._lam

    def step_drift(self) -> torch.Tensor | None:
        """The relative squared error of the micro-batches kept so far for this optimizer step (mean over the
        anchored layers of sum err / sum ref, sums over micro-batches and processes), or None when none is kept."""
        if not self._drifts:
            return None
        err = all_mean(torch.stack([e for e, _ in self._drifts]).sum(0))  # (K,); the process count cancels
        ref = all_mean(torch.stack([r for _, r in self._drifts]).sum(0))
        return (err / ref.clamp_min(torch.finfo(torch.float32).tiny)).mean()

    def _apply(self) -> None:
        if self._drifts and self._lam is not None:
            self._lam = adaptive_anchor_lambda(self._lam, self.step_drift(), self.target, self.k)
        self._drifts = []

    def end_step(self, step: int) -> None:
        """Before a checkpoint after optimizer step ``step`` - 1: the finished step's drift updates lambda now, so
        the checkpoint holds the lambda the next step uses."""
        if self._lam is not None:
            self._apply()
            self._step = step

    def current(self) -> float:
        """The lambda the next micro-batch uses (a float)."""
        if self._lam is not None:
            return float(self._lam)
        return self._restored if self._restored is not None else self.init

    def state_dict(self) -> dict:
        """{"lambda": the current lambda, "auto": bool}: what a checkpoint keeps."""
        return {"lambda": self.current(), "auto": self.auto}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (the fixed lambda needs nothing).

        Raises:
            ValueError: the state is not a dict with a finite positive "lambda" (a damaged checkpoint).
        """
        lam = state.get("lambda") if isinstance(state, dict) else None
        if not isinstance(lam, (int, float)) or isinstance(lam, bool) or not lam > 0 or lam == float("inf"):
            raise ValueError(f"checkpoint lambda state {state!r}: expected a finite lambda > 0")
        if self.auto:
            self._lam, self._restored, self._drifts = None, float(lam), []


class AnchorTerm:
    """The ANCHOR regularizer of one training run, called by :class:`w2s_shift.training.PairTrainer`.

    Args:
        lam: its :class:`AnchorLambda`. normalize: relative squared error per layer (else the paper's raw MSE).
        layers: anchored 1-based blocks (None: the final normalized output the reward head reads).
        reference: a frozen copy of the pretrained backbone run every step (``frozen_copy``); None for states
            cached in the dataset (``ref_hidden`` in the batch) or, with ``adapter_disabled``, the LoRA model with
            its adapters off.
        adapter_disabled: the reference is the trained LoRA model with adapters disabled.
        units: the raw MSE's reduction over hidden units, "mean" or "sum" (:func:`w2s_shift.losses.anchor_mse`).

    Logged per micro-batch (averaged over the logging interval by the trainer): loss_anchor, anchor_drift (relative
    squared error of the batch), anchor_lambda and anchor_ratio (lambda x L_anchor / L_w2s), and lambda on the three
    scales (:func:`w2s_shift.losses.anchor_lambda_units`: anchor_lambda_relative, _per_unit, _per_token) for this
    batch's reference norm.
    """

    def __init__(
        self,
        lam: AnchorLambda,
        normalize: bool = True,
        layers: list | None = None,
        reference=None,
        adapter_disabled: bool = False,
        units: str = "mean",
    ):
        if units not in ("mean", "sum"):
            raise ValueError(f"AnchorTerm: units must be 'mean' or 'sum', got {units!r}")
        self.lam, self.normalize, self.output_layers, self.units = lam, bool(normalize), layers, units
        self.reference, self.adapter_disabled = reference, bool(adapter_disabled)
        self._accum_tokens = None  # response tokens (2B sequences) of the current optimizer step, all processes
        self._step_ref_sq = None  # (K,) reference squared-norm sums of the whole step (normalize, accumulation)
        self._ref_cache: list = []  # (pair_index, reference states) of this step's micro-batches
        self._sharded = False  # shard_like has seen the frozen copy

    def to(self, device) -> AnchorTerm:
        """Move the frozen copy (if any) to ``device``: the Trainer moves only the trained model."""
        if self.reference is not None:
            self.reference.to(device)
        return self

    def bind(self, ctx) -> None:
        """Checks against the training it serves (``ctx``: a :class:`~w2s_shift.methods.base.StepContext`).

        Raises:
            ValueError: a bfloat16 reference copy without bf16 training; no reference at all (no frozen copy, no
                cached states in the dataset, not adapter_disabled).
        """
        if self.reference is not None and getattr(self.reference, "autocast_bf16", False) and not ctx.bf16:
            raise ValueError(
                "the frozen reference keeps bfloat16 linear weights for bf16 autocast "
                "(make_reference(autocast_bf16=True)) but training runs without bf16: make the reference "
                "with autocast_bf16=False or train with bf16"
            )
        if self.reference is None and not self.adapter_disabled and not ctx.has_cached_reference:
            raise ValueError(
                "anchor_lambda > 0 needs a reference model, cached reference states or a LoRA model "
                "(reference adapter_disabled)"
            )

    def prepare_step(self, ctx, batch_samples: list) -> None:
        """At the start of an optimizer step: the step's response-token count (the raw MSE's normalizer) and, with
        ``normalize`` under accumulation or several processes, the per-layer reference sums
        sum_{n,t} m ||h^ref||^2 of every micro-batch of the step (summed over processes), so that each
        micro-batch's squared error divided by them adds up to the relative error of the whole step, as one batch
        computes it. The reference states computed for those sums are kept for :meth:`loss` (the reference runs
        once per micro-batch, as without accumulation)."""
        tokens = torch.stack([response_mask(b).sum().float() for b in batch_samples]).sum()
        tokens = tokens.to(ctx.device, non_blocking=True)  # the batches are still on the host: no device sync
        if ctx.world_size > 1:
            tokens = ctx.gather_sum(tokens)
        self._accum_tokens = tokens
        self._step_ref_sq, self._ref_cache = None, []
        if self.normalize and (len(batch_samples) > 1 or ctx.world_size > 1):
            self._step_reference_sums(ctx, batch_samples)

    @torch.no_grad()
    def _step_reference_sums(self, ctx, batch_samples: list) -> None:
        total = None
        for b in batch_samples:
            inputs = ctx.prepare(b)
            mask = response_mask(inputs)
            refs = self.reference_hidden(ctx, inputs, forward_inputs(inputs))
            sq = torch.stack([anchor_sq_sums(r, r, mask)[1] for r in refs])
            total = sq if total is None else total + sq
            self._ref_cache.append((id(b), refs))
        if ctx.world_size > 1:
            total = ctx.gather_sum(total)
        self._step_ref_sq = total

    def _cached_reference(self, ctx) -> list | None:
        """The reference states :meth:`prepare_step` computed for this micro-batch, matched on the batch object the
        trainer is training on (``ctx.batch_key``: the same dict it handed to ``get_batch_samples``), with no look at
        the device's values (comparing its pair indices was a host synchronisation per micro-batch)."""
        if not self._ref_cache:
            return None
        key, refs = self._ref_cache.pop(0)
        if ctx.batch_key is None or key != ctx.batch_key:
            self._ref_cache = []
            return None
        return refs

    @torch.no_grad()
    def reference_hidden(self, ctx, inputs: dict, fwd: dict) -> list:
        """The frozen reference's states of the anchored layers on this batch: K tensors (2B, T, H) (packed rows:
        (R, L, H), the reference reads the same ``position_ids``): the batch's cached states, the LoRA model with
        its adapters off (through the wrapped model, so FSDP gathers its shards), or the frozen copy."""
        layers = self.output_layers
        if "ref_hidden" in inputs:
            ref = inputs["ref_hidden"]
            return [ref[:, :, k] for k in range(ref.shape[2])]
        if self.adapter_disabled:
            pool = {"last_index": inputs["last_index"]} if "last_index" in inputs else {}
            return ctx.forward_without_adapters({**fwd, **pool}, layers)
        if not self._sharded:  # FSDP2: the frozen copy is sharded as the student is, once
            self.reference, self._sharded = shard_like(self.reference, ctx.model, ctx.mp_policy), True
        # the Trainer autocasts the model's forward only: the reference gets the same precision explicitly
        amp = autocast(inputs["labels"].device.type, enabled=ctx.bf16)
        with amp:
            if layers is None:
                return [self.reference(**fwd, use_cache=False).last_hidden_state]
            offset = getattr(self.reference, "layer_offset", 0)
            run = lambda hs: self.reference(**fwd, use_cache=False, output_hidden_states=hs)  # noqa: E731
            return layer_states(run, self.reference, layers, offset)[1]

    def loss(self, ctx, inputs, fwd, hidden, num_items_in_batch, scale: float, loss_w2s) -> tuple:
        """lambda x L_anchor of one micro-batch, normalized over the whole optimizer step, and the logged parts.

        Args:
            ctx: the step's :class:`~w2s_shift.methods.base.StepContext`.
            hidden: K student tensors (2B, T, H) of the anchored layers. num_items_in_batch: the step's pair count
                (None outside ``Trainer.train``: the micro-batch is the whole batch). scale: the process count
                (DDP/FSDP average gradients over processes). loss_w2s: this micro-batch's mean pairwise loss.

        Returns:
            (term, {"loss_anchor", "anchor_drift", "anchor_lambda", "anchor_ratio"}: detached 0-dim tensors).
        """
        mask = response_mask(inputs)
        refs = self._cached_reference(ctx) or self.reference_hidden(ctx, inputs, fwd)
        tiny = torch.finfo(torch.float32).tiny
        tokens_local = mask.sum().clamp_min(1).float()
        if self.normalize:
            # relative error of the whole optimizer step: this micro-batch's squared error over the step's
            # reference sums (prepare_step); on one micro-batch and one process, its own sums
            whole_step = self._step_ref_sq is not None and num_items_in_batch is not None
            den = self._step_ref_sq if whole_step else None
            anc_term = anchor_mse_layers(hidden, refs, mask, normalize=True, ref_sq_norm=den) * scale
            with torch.no_grad():
                sums = [anchor_sq_sums(h.detach(), r, mask) for h, r in zip(hidden, refs)]
                err = torch.stack([e for e, _ in sums])
                ref_sq = torch.stack([r for _, r in sums])
            anc_local = (err / ref_sq.clamp_min(tiny)).mean()
        else:
            anc_sum = anchor_mse_layers(hidden, refs, mask, reduction="sum", units=self.units)
            step_tokens = num_items_in_batch is not None and self._accum_tokens is not None
            tokens = self._accum_tokens if step_tokens else tokens_local
            anc_term = anc_sum * scale / tokens.clamp_min(1)
            anc_local = anc_sum.detach().float() / tokens_local
            with torch.no_grad():
                sums = [anchor_sq_sums(h.detach(), r, mask) for h, r in zip(hidden, refs)]
                err = torch.stack([e for e, _ in sums])
                ref_sq = torch.stack([r for _, r in sums])
        drift = (err / ref_sq.clamp_min(tiny)).mean()  # relative squared error of this micro-batch, layer mean
        lam = self.lam.value(ctx.step, err, ref_sq)
        lam_t = lam if torch.is_tensor(lam) else drift.new_full((), float(lam))  # a fill on the device, no copy
        reading = "relative" if self.normalize else ("per_unit" if self.units == "mean" else "per_token")
        per_token = ref_sq.mean() / tokens_local  # the reference's mean per-token squared norm (layer mean)
        scales = anchor_lambda_units(lam_t, reading, per_token.clamp_min(tiny), hidden[0].shape[-1])
        parts = {
            "loss_anchor": anc_local,
            "anchor_drift": drift,
            "anchor_lambda": lam_t,
            # the anchor term's share: lambda x L_anchor / L_w2s of this micro-batch (both detached)
            "anchor_ratio": lam_t * anc_local / loss_w2s.float().clamp_min(1e-12),
            **{f"anchor_lambda_{k}": v.detach().float() for k, v in scales.items()},
        }
        return lam * anc_term, parts

    def before_checkpoint(self, step: int) -> None:
        """A checkpoint after optimizer step ``step`` - 1 is written now (:meth:`AnchorLambda.end_step`)."""
        self.lam.end_step(step)

    def state_dict(self) -> dict:
        return {"lambda": self.lam.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Raises ValueError for a state that is not a dict with a "lambda" entry."""
        if not isinstance(state, dict) or "lambda" not in state:
            raise ValueError(f"checkpoint regularizer state {state!r}: expected a dict with 'lambda'")
        self.lam.load_state_dict(state["lambda"])

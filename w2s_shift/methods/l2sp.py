"""L2-SP: Naive W2S plus a penalty pulling the trainable weights toward their pretrained values (Li, Grandvalet and
Davoine 2018, "Explicit inductive bias for transfer learning with convolutional networks", ICML; their L2-SP
penalty):

    L = L_pair(d, q) + lambda * sum_j ||theta_j - theta_j^0||^2,

the sum over the student's trainable weights that come from the checkpoint (theta^0: their values when training
starts, read from the model itself, no extra forward). Li et al. write Omega(w) = alpha/2 ||w_S - w_S^0||^2 +
beta/2 ||w_{S-bar}||^2: lambda here is their alpha/2, and the new scalar reward head (``score.*``, their w_{S-bar})
gets no term of its own (beta = 0; ``weight_decay`` is the trainer's). Under LoRA the trainable weights are the
adapters and theta^0 their initialization (lora_B = 0), so the penalty is on the adapters' departure from the
start. Units: lambda per squared weight unit; the term is in nats like the pairwise loss.

Refused under FSDP2 / ZeRO-3 (parameters sharded across processes): theta^0 is kept as plain full tensors, which
do not match a sharded parameter; DDP and one process are supported.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from .base import FixedWeightState, Method, MethodConfig, Objective

#: The lambda of an entry without ``l2sp_lambda``: the declared setting of the presets (docs/measurements.md).
DEFAULT_LAMBDA = 0.01
#: Parameter names of the new reward head (no pretrained value, so no L2-SP term).
HEAD_PREFIX = "score."


class L2SPConfig(MethodConfig):
    """Settings of L2-SP."""

    l2sp_lambda: float = Field(
        DEFAULT_LAMBDA,
        gt=0,
        le=1e6,
        description="L2-SP weight lambda > 0 on sum ||theta - theta_0||^2 over the trainable pretrained weights (Li "
        "et al. 2018's alpha/2); the reward head is not penalized.",
    )

    @field_validator("l2sp_lambda", mode="before")
    @classmethod
    def _number(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"l2sp_lambda {v!r}: give a finite number > 0")
        return v


class L2SPTerm(FixedWeightState):
    """The L2-SP regularizer of one training run, with the hooks :class:`w2s_shift.training.PairTrainer` calls
    (as :class:`w2s_shift.methods.anchor_term.AnchorTerm`'s).

    Each micro-batch adds lambda * P * n_b / N (P the process count, n_b its pairs, N the pairs of the optimizer step
    on all processes), so that summed over the step's micro-batches and averaged over processes the gradient is that
    of lambda * ||theta - theta_0||^2 once per optimizer step. Logged: ``l2sp_sq`` (||theta - theta_0||^2) and
    ``l2sp_term`` (lambda times it).
    """

    output_layers = None  # no hidden states of its own

    def __init__(self, lam: float):
        if not (math.isfinite(lam) and lam > 0):
            raise ValueError(f"l2sp_lambda {lam!r}: give a finite number > 0")
        self.lam = float(lam)
        self.theta0: dict | None = None  # name -> the pretrained value (detached copy)

    def to(self, device) -> L2SPTerm:
        """Move theta_0 to ``device``."""
        if self.theta0 is not None:
            self.theta0 = {k: v.to(device) for k, v in self.theta0.items()}
        return self

    def bind(self, ctx) -> None:
        """Record theta_0: the trainable parameters' values now (before training and before a checkpoint is restored,
        so a resumed run keeps the pretrained values), the reward head excepted."""
        model = ctx.unwrap(ctx.model)
        self.theta0 = {n: p.detach().clone() for n, p in self.penalized(model)}
        if not self.theta0:
            raise ValueError("l2sp: the student has no trainable pretrained weights to anchor")

    @staticmethod
    def penalized(model) -> list:
        """(name, parameter) of the trainable weights with a pretrained value: all but the reward head."""
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith(HEAD_PREFIX)]

    def prepare_step(self, ctx, batch_samples: list) -> None:
        """Nothing to prepare: the penalty needs no batch."""

    def squared_distance(self, model):
        """sum_j ||theta_j - theta_j^0||^2 over the penalized weights (0-dim float32 tensor, differentiable)."""
        from ..distributed import is_sharded_model

        if is_sharded_model(model):
            raise ValueError(
                "l2sp under FSDP2 / ZeRO-3: the parameters are sharded across processes and theta_0 is kept whole; "
                "train with DDP or one process"
            )
        total = None
        for n, p in self.penalized(model):
            ref = self.theta0[n]
            if ref.device != p.device:
                ref = self.theta0[n] = ref.to(p.device)
            sq = (p.float() - ref.float()).pow(2).sum()
            total = sq if total is None else total + sq
        return total

    def loss(self, ctx, inputs, fwd, hidden, num_items_in_batch, scale: float, loss_w2s) -> tuple:
        """This micro-batch's share of lambda * ||theta - theta_0||^2 (see the class docstring) and the logged parts."""
        sq = self.squared_distance(ctx.unwrap(ctx.model))
        n_local = float(inputs["labels"].numel())
        share = scale * n_local / num_items_in_batch if num_items_in_batch is not None else 1.0  # no host sync
        parts = {"l2sp_sq": sq.detach(), "l2sp_term": (self.lam * sq).detach()}
        return self.lam * share * sq, parts


class L2SP(Method):
    """L2-SP's behaviour (see the module docstring)."""

    config = L2SPConfig

    def objective(self, cfg, layers=None, reference=None) -> Objective:
        obj = super().objective(cfg)
        obj.regularizer = L2SPTerm(cfg.l2sp_lambda)
        return obj

    def summary(self, cfg) -> str:
        return f"lambda {cfg.l2sp_lambda:g} on ||theta - theta_0||^2"

    def describe(self, cfg) -> dict:
        return {"l2sp_lambda": cfg.l2sp_lambda}

    def table_text(self, d: dict) -> list:
        return [f"λ={d['l2sp_lambda']:g} (L2-SP)"] if d.get("l2sp_lambda") is not None else []


METHOD = L2SP(
    name="l2sp",
    display="l2sp",
    description="soft Bradley-Terry on teacher labels + lambda x ||theta - theta_0||^2 to the pretrained weights",
    competitor=True,
)

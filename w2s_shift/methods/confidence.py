"""Auxiliary confidence loss (Burns et al. 2023, "Weak-to-Strong Generalization", eq. 1), on the weak
teacher's soft labels (:func:`w2s_shift.losses.confidence_loss`); alpha rises linearly over a warm-up share of
training (:func:`w2s_shift.losses.confidence_alpha`)."""

from __future__ import annotations

from functools import partial

from pydantic import Field

from .base import Method, MethodConfig, Objective


class ConfidenceConfig(MethodConfig):
    """Settings of the confidence loss."""

    confidence_alpha_max: float = Field(
        0.5, ge=0, le=1, description="Confidence loss: final alpha (Burns et al. 2023)."
    )
    confidence_warmup: float = Field(
        0.2, ge=0, le=1, description="Confidence loss: share of training over which alpha rises linearly."
    )


class Confidence(Method):
    config = ConfidenceConfig

    def objective(self, cfg, layers=None, reference=None) -> Objective:
        from ..losses import LOSSES, confidence_alpha

        alpha = partial(confidence_alpha, alpha_max=cfg.confidence_alpha_max, warmup_frac=cfg.confidence_warmup)
        return Objective(LOSSES[self.loss], alpha=alpha)

    def summary(self, cfg) -> str:
        return f"alpha max {cfg.confidence_alpha_max:g}, warm-up {cfg.confidence_warmup:g}"

    def describe(self, cfg) -> dict:
        return {"confidence_alpha_max": cfg.confidence_alpha_max, "confidence_warmup": cfg.confidence_warmup}


METHOD = Confidence(
    name="confidence",
    display="confidence",
    description="auxiliary confidence loss (Burns et al. 2023) on the weak teacher's soft labels",
    loss="confidence",
)

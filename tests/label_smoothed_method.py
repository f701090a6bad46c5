"""A third-party W2S method in one file, registered from outside the package (tests/test_method_extension.py):
label-smoothed soft Bradley-Terry. The weak teacher's soft labels are pulled toward 1/2 by ``smoothing`` eps,
q' = (1 - eps) q + eps / 2 (Szegedy et al. 2016, label smoothing), a hedge against an over-confident teacher;
the loss is the soft Bradley-Terry loss on q', registered as ``label_smoothed_bt``."""

from functools import partial

import torch.nn.functional as F
from pydantic import Field

from w2s_shift.losses import LOSSES, register
from w2s_shift.methods import Method, MethodConfig, Objective, register_method


def label_smoothed_bt(margin, q, *, smoothing: float, alpha=0.0, seed=0, reduction="mean"):
    """Soft Bradley-Terry on q' = (1 - smoothing) q + smoothing / 2: margin (B,), q (B,) -> scalar in nats."""
    target = (1 - smoothing) * q.to(margin.dtype) + smoothing / 2
    return F.binary_cross_entropy_with_logits(margin, target, reduction=reduction)


if "label_smoothed_bt" not in LOSSES:
    register("label_smoothed_bt")(label_smoothed_bt)


class SmoothedConfig(MethodConfig):
    smoothing: float = Field(0.1, ge=0, le=1, description="Label smoothing eps: q' = (1 - eps) q + eps / 2.")


class LabelSmoothed(Method):
    config = SmoothedConfig

    def objective(self, cfg, layers=None, reference=None) -> Objective:
        return Objective(partial(LOSSES[self.loss], smoothing=cfg.smoothing))

    def summary(self, cfg) -> str:
        return f"smoothing {cfg.smoothing:g}"

    def describe(self, cfg) -> dict:
        return {"smoothing": cfg.smoothing}

    def table_text(self, d: dict) -> list:
        return [f"ε={d['smoothing']:g}"]


METHOD = register_method(
    LabelSmoothed(
        name="smoothed",
        display="smoothed",
        description="label-smoothed soft Bradley-Terry on the weak teacher's labels",
        loss="label_smoothed_bt",
    ),
    replace=True,
)

"""WiSE-FT: the fine-tuned student's weights interpolated with the pretrained ones after training (Wortsman et al.
2022, "Robust fine-tuning of zero-shot models", CVPR; their weight-space ensemble):

    theta(a) = (1 - a) * theta_0 + a * theta_student,   a in [0, 1],

one model per mixing coefficient a (``wise_alpha``, default 0.25, 0.5, 0.75), evaluated only: the student is trained
once per cell (soft Bradley-Terry on the teacher's labels, as naive) and every a is a weight transform of it (the
post-hoc hook :meth:`~w2s_shift.methods.Method.posthoc`), no retraining. a = 0 is the pretrained backbone, a = 1 the
fine-tuned student.

The scalar reward head is kept from the student at every a: the pretrained model has none (Wortsman et al.
interpolate a zero-shot classifier head that exists at theta_0; a reward model's new head does not), so theta(0)
scores with the pretrained representation read by the student's head. Under LoRA the merged weight
W_0 + B A becomes W_0 + a B A: the adapters are scaled (each lora_B times a, lora_A kept), which is the interpolation
of the merged weights; other trainable weights interpolate as above.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, field_validator

from .base import Method, MethodConfig

#: The mixing coefficients of an entry without ``wise_alpha`` (Wortsman et al.'s grid, its interior points).
DEFAULT_ALPHAS = (0.25, 0.5, 0.75)
#: Parameter names of the reward head (kept from the student).
HEAD_PREFIX = "score."


class WiseFTConfig(MethodConfig):
    """Settings of WiSE-FT. A list of ``wise_alpha`` expands into one model per value (:meth:`WiseFT.expand`),
    all from one trained student."""

    wise_alpha: float | list[float] = Field(
        list(DEFAULT_ALPHAS),
        description="Mixing coefficient a in [0, 1] of theta(a) = (1 - a) theta_0 + a theta_student (0: the "
        "pretrained backbone, 1: the fine-tuned student; the reward head is the student's), or a list: one model "
        "per value, all from one training.",
    )

    @field_validator("wise_alpha", mode="before")
    @classmethod
    def _alphas(cls, v):
        vals = v if isinstance(v, list) else [v]
        for x in vals:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not 0 <= x <= 1:
                raise ValueError(f"wise_alpha {x!r}: give numbers in [0, 1]")
        if not vals or len(set(vals)) != len(vals):
            raise ValueError(f"wise_alpha {v!r}: a non-empty list of distinct values")
        return v[0] if isinstance(v, list) and len(v) == 1 else v

    def alphas(self) -> list:
        return self.wise_alpha if isinstance(self.wise_alpha, list) else [self.wise_alpha]


def fmt_alpha(a: float) -> str:
    """a in a label: 0.25 -> '0.25', 1 -> '1'."""
    return f"{a:g}"


@torch.no_grad()
def interpolate(model, pretrained, alpha: float) -> None:
    """Set ``model``'s trainable weights to theta(a) = (1 - a) theta_0 + a theta, theta_0 from ``pretrained`` (the
    same architecture before training), in place. The head (``score.*``) is kept; LoRA's lora_A (and
    lora_embedding_A) are kept and lora_B (lora_embedding_B) scaled by a, so W_0 + B A becomes W_0 + a B A.

    Raises:
        ValueError: a trainable weight of ``model`` that ``pretrained`` lacks or holds in another shape."""
    pre = dict(pretrained.named_parameters())
    for n, p in model.named_parameters():
        if not p.requires_grad or n.startswith(HEAD_PREFIX) or ".lora_A." in n or ".lora_embedding_A." in n:
            continue
        if ".lora_B." in n or ".lora_embedding_B." in n:
            p.mul_(alpha)
            continue
        if n not in pre or pre[n].shape != p.shape:
            raise ValueError(f"wise_ft: the pretrained model has no weight {n} of shape {tuple(p.shape)}")
        p.copy_((1 - alpha) * pre[n].to(p.device, p.dtype) + alpha * p)


class WiseFT(Method):
    """WiSE-FT's behaviour (see the module docstring)."""

    config = WiseFTConfig

    def default_label(self, cfg) -> str:
        return f"{self.display}-a{fmt_alpha(cfg.wise_alpha)}" if not isinstance(cfg.wise_alpha, list) else self.display

    def expand(self, cfg) -> list:
        if not isinstance(cfg.wise_alpha, list):
            return [cfg]
        out = []
        for a in cfg.alphas():
            label = f"{cfg.label}-a{fmt_alpha(a)}" if cfg.label else None
            out.append(cfg.model_copy(update={"wise_alpha": a, "label": label}))
        return out

    def trained_as(self, cfg):
        from .naive import METHOD as NAIVE

        return NAIVE.config(name=NAIVE.name, label=f"{self.name}-finetuned")

    def posthoc(self, cfg, model, pretrained) -> None:
        interpolate(model, pretrained, float(cfg.wise_alpha))

    def summary(self, cfg) -> str:
        return f"a {cfg.wise_alpha} (weights (1 - a) theta_0 + a theta_student, head from the student)"

    def describe(self, cfg) -> dict:
        return {"wise_alpha": cfg.wise_alpha}

    def table_text(self, d: dict) -> list:
        return [f"a={d['wise_alpha']:g} (WiSE-FT, student's head)"] if d.get("wise_alpha") is not None else []


METHOD = WiseFT(
    name="wise_ft",
    display="wise_ft",
    description="naive student's weights interpolated with the pretrained ones after training, "
    "(1 - a) theta_0 + a theta",
    competitor=True,
)

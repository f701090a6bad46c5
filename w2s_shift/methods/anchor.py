"""ANCHOR: Naive W2S plus lambda x a representation-anchoring term that keeps the student's hidden states on
the response tokens near the pretrained reference's (Le et al. 2026, arXiv 2605.25629).

:class:`AnchorConfig` holds its settings (declared and validated here only), :class:`Anchor` its behaviour: grid
expansion over lambdas and layers, what it needs of the reference, its training objective (the term itself and
the lambda controller are :mod:`w2s_shift.methods.anchor_term`, built only when training) and how it is shown.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from ..models.reward_model import layers_outside
from .base import Method, MethodConfig, Objective, ReferenceNeed

LayerSpec = Literal["last", "middle"] | list[int]
ReferenceMode = Literal["cached", "frozen_copy", "adapter_disabled"]
#: Where ANCHOR's reference states come from (:attr:`AnchorConfig.reference`).
REFERENCE_MODES = get_args(ReferenceMode)

#: The lambda of an entry without ``anchor_lambda``, on the relative squared error (``anchor_normalize: true``):
#: on the quickstart it cuts the naive student's last-layer drift to about a quarter (docs/measurements.md).
DEFAULT_LAMBDA = 1.0
#: The paper's lambda, on its raw (unnormalized) MSE.
PAPER_LAMBDA = 1e-4


class AnchorConfig(MethodConfig):
    """Settings of ANCHOR. ``anchor_lambda`` and ``anchor_layers`` may list several values: the entry then expands
    into one method per combination (:meth:`Anchor.expand`)."""

    anchor_lambda: float | Literal["auto"] | list[float | Literal["auto"]] = Field(
        DEFAULT_LAMBDA,
        description="ANCHOR weight lambda >= 0 (default 1 on the relative error; with anchor_normalize: false give "
        "it: the paper's 1e-4 on the raw MSE), 'auto' (a drift budget: lambda adapts each optimizer step so the "
        "anchored layers' relative drift stays near anchor_target_drift), or a list of these (a grid).",
    )
    anchor_normalize: bool = Field(
        True,
        description="Divide each anchored layer's squared error by the reference's mean squared norm at that layer "
        "(same response tokens and hidden units): L_anchor is then a relative squared error, so one "
        "lambda means the same for every model and layer. false: the paper's raw MSE.",
    )
    anchor_reduction: Literal["mean", "sum"] = Field(
        "mean",
        description="The raw MSE's reduction over a token's hidden units (anchor_normalize: false): mean (per unit, "
        "torch's mse_loss) or sum (the per-token squared norm, H times larger: a lambda set on it is H times stronger, "
        "4096x for Llama-3.1-8B). The paper writes 'MSE' without saying which; a relative error does not depend on "
        "it. Every run logs lambda on all three scales (anchor_lambda_relative, _per_unit, _per_token).",
    )
    anchor_target_drift: float = Field(
        0.02,
        gt=0,
        description="anchor_lambda auto: the drift budget, a relative squared error sum ||h - h_ref||^2 / "
        "sum ||h_ref||^2 over response tokens, mean over the anchored layers, per batch.",
    )
    anchor_lambda_init: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="anchor_lambda auto: lambda at the first step."
    )
    anchor_k: float = Field(
        0.1,
        gt=0,
        le=5,
        description="anchor_lambda auto: controller gain K; each optimizer step lambda <- lambda * (1 + K * "
        "clip((drift - target) / target, -0.2, 0.2)) (Ziegler et al. 2019 sec. 2.2, K = 0.1: at "
        "most 2% a step, so over S steps lambda moves at most 1.02^S from anchor_lambda_init).",
    )
    anchor_layers: LayerSpec | list[LayerSpec] = Field(
        "last",
        description="Anchored layers: 'last' (the final normalized output the head reads), 'middle' (blocks at 50% "
        "and 75% of depth), or an explicit list of 1-based block indices; a list of these is a grid.",
    )
    reference: ReferenceMode = Field(
        "cached",
        description="ANCHOR reference: states computed once and reused (cached), a frozen copy run every step, "
        "or under LoRA the same model with its adapters disabled.",
    )

    @field_validator("anchor_lambda", mode="before")
    @classmethod
    def _lam_words(cls, v):
        return check_lambda_words(v)

    @field_validator("anchor_lambda")
    @classmethod
    def _lam(cls, v):
        return check_lambdas(v)

    @field_validator("anchor_layers", mode="before")
    @classmethod
    def _layer_words(cls, v):
        return check_layer_words(v)

    @field_validator("anchor_layers")
    @classmethod
    def _layers(cls, v):
        return check_layers(v)

    @model_validator(mode="after")
    def _reduction_needs_raw_mse(self):
        if self.anchor_normalize and self.anchor_reduction != "mean":
            raise ValueError(
                "anchor_reduction: sum applies to the raw MSE (anchor_normalize: false); a relative error is the same "
                "either way"
            )
        return self

    @model_validator(mode="after")
    def _raw_mse_needs_a_lambda(self):
        if not self.anchor_normalize and "anchor_lambda" not in self.model_fields_set:
            raise ValueError(
                f"anchor_normalize: false (the paper's raw MSE) needs an explicit anchor_lambda: the default "
                f"{DEFAULT_LAMBDA:g} is for the relative error; the paper used {PAPER_LAMBDA:g} on the raw MSE"
            )
        return self

    def layer_specs(self) -> list:
        return layer_specs(self.anchor_layers)

    def lambdas(self) -> list:
        return self.anchor_lambda if isinstance(self.anchor_lambda, list) else [self.anchor_lambda]

    @property
    def anchor_active(self) -> bool:
        """Whether the anchor term is on (lambda auto or > 0)."""
        return self.anchor_lambda == "auto" or (not isinstance(self.anchor_lambda, list) and self.anchor_lambda > 0)

    @property
    def lambda_text(self) -> str:
        """Lambda in logs (:func:`lambda_text`)."""
        return lambda_text(
            self.anchor_lambda, self.anchor_target_drift, self.anchor_lambda_init, self.anchor_k, self.anchor_normalize
        )

    @property
    def layer_spec_name(self) -> str:
        return layer_spec_name(self.anchor_layers)

    def is_grid(self) -> bool:
        return len(self.lambdas()) > 1 or len(self.layer_specs()) > 1


class Anchor(Method):
    """ANCHOR's behaviour (see the module docstring)."""

    config = AnchorConfig

    def default_label(self, cfg) -> str:
        return f"{self.display}-auto" if cfg.anchor_lambda == "auto" else self.display

    def expand(self, cfg) -> list:
        return expand_grid(cfg)

    def check_run(self, cfg, run_cfg) -> None:
        if cfg.reference == "adapter_disabled" and not run_cfg.student.lora:
            raise ValueError("reference adapter_disabled needs a LoRA student (student.lora)")

    def layers_outside(self, cfg, depth: int) -> list:
        # an entry may list several specs (a grid, e.g. [last] or [last, middle]): each is checked
        return [k for spec in layer_specs(cfg.anchor_layers) for k in layers_outside(spec, depth)]

    def reference_need(self, cfg, resolve_layers) -> ReferenceNeed | None:
        if not cfg.anchor_active:
            return None
        return ReferenceNeed(
            layers=resolve_layers(cfg.anchor_layers),
            cached_states=cfg.reference == "cached",
            frozen_copy=cfg.reference == "frozen_copy",
        )

    def drift_layers(self, cfg, resolve_layers) -> list:
        return list(resolve_layers(cfg.anchor_layers))

    def objective(self, cfg, layers=None, reference=None) -> Objective:
        """Soft Bradley-Terry plus :class:`~w2s_shift.methods.anchor_term.AnchorTerm` (none when lambda is 0)."""
        obj = super().objective(cfg)
        if cfg.anchor_active:
            from .anchor_term import AnchorLambda, AnchorTerm

            auto = cfg.anchor_lambda == "auto"
            lam = AnchorLambda(
                cfg.anchor_lambda_init if auto else cfg.anchor_lambda, auto, cfg.anchor_target_drift, cfg.anchor_k
            )
            obj.regularizer = AnchorTerm(
                lam,
                cfg.anchor_normalize,
                layers,
                reference,
                adapter_disabled=cfg.reference == "adapter_disabled",
                units=cfg.anchor_reduction,
            )
        return obj

    def summary(self, cfg) -> str:
        return f"lambda {cfg.lambda_text}, layers {cfg.anchor_layers}, reference {cfg.reference}"

    def describe(self, cfg) -> dict:
        auto = cfg.anchor_lambda == "auto"
        layers = cfg.anchor_layers
        return {
            "anchor_lambda": None if auto else float(cfg.anchor_lambda),
            "anchor_lambda_mode": "auto" if auto else "fixed",
            "anchor_normalize": cfg.anchor_normalize,
            "anchor_target_drift": cfg.anchor_target_drift,
            "anchor_layers": layers,
            "layer_spec": layers if isinstance(layers, str) else "custom",
            "reference": cfg.reference,
        }

    def table_text(self, d: dict) -> list:
        parts = []
        lam = d.get("anchor_lambda")
        if d.get("anchor_lambda_mode") == "auto":
            parts.append(f"λ=auto (target drift {d.get('anchor_target_drift')})")
        elif lam is not None:
            parts.append(f"λ={lam:g}" + (" (relative error)" if d.get("anchor_normalize") else ""))
        spec = d.get("layer_spec") or ("last" if d.get("anchor_layers") in (None, "last") else "custom")
        parts.append(f"layers {spec}" + (f" {d.get('anchor_layers')}" if spec == "custom" else ""))
        return parts


METHOD = Anchor(
    name="anchor",
    display="anchor",
    description="soft Bradley-Terry on teacher labels + lambda x representation anchoring to the pretrained model",
    needs_reference=True,
)


def check_lambda_words(v):
    """Before parsing: a string lambda is 'auto' or a number. Raises ValueError naming the bad entry."""
    for x in v if isinstance(v, list) else [v]:
        if isinstance(x, bool):  # YAML true/false would pass as 1.0/0.0
            raise ValueError(f"anchor_lambda {x!r}: a boolean is not a weight; give a number >= 0, 'auto' or a list")
        if isinstance(x, str) and x != "auto":
            try:
                float(x)
            except ValueError:
                raise ValueError(f"anchor_lambda {x!r}: give a number >= 0, 'auto' or a list of these") from None
    return v


def check_lambdas(v):
    """Lambda values finite and >= 0 or 'auto'; a one-value list is that value (not a grid). Raises ValueError."""
    vals = v if isinstance(v, list) else [v]
    if not vals or any(x != "auto" and ((not math.isfinite(x)) or x < 0) for x in vals):
        raise ValueError("lambda values must be finite and >= 0 or 'auto' (a non-empty list for a grid)")
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def layer_specs(v) -> list:
    """The layer specs of ``anchor_layers``: one spec ('last', 'middle' or a list of block indices) or a list
    of specs (a grid)."""
    return v if (isinstance(v, list) and v and not all(isinstance(x, int) for x in v)) else [v]


def check_layer_words(v):
    """Before parsing, the shape of ``anchor_layers``: 'last', 'middle', a list of block indices, or a list of
    these (a grid); no boolean where a block index goes (YAML ``[true]`` would pass as layer 1). One clear error
    instead of pydantic's line per union member.

    Raises:
        ValueError: naming the value that fits no shape.
    """
    hint = "give 'last', 'middle', a list of 1-based block indices such as [4, 8], or a list of these (a grid)"

    def is_index(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    def is_spec(x) -> bool:
        return x in ("last", "middle") or (isinstance(x, list) and all(is_index(y) for y in x))

    for x in v if isinstance(v, list) else [v]:
        for y in x if isinstance(x, list) else [x]:
            if isinstance(y, bool):
                raise ValueError(f"anchor_layers: {y!r} is not a block index; give 'last', 'middle' or 1-based indices")
    if is_spec(v) or (isinstance(v, list) and all(is_spec(x) for x in v)):
        return v
    if isinstance(v, list) and any(is_index(x) for x in v):  # indices mixed with something else
        bad = next(x for x in v if not is_index(x))
        raise ValueError(f"anchor_layers {v!r}: {bad!r} is not a block index; {hint}")
    bad = next((x for x in v if not is_spec(x)), v) if isinstance(v, list) else v
    where = f"anchor_layers {v!r}: {bad!r}" if bad is not v else f"anchor_layers {v!r}"
    raise ValueError(f"{where} is not a layer spec; {hint}")


def check_layers(v):
    """Explicit layer lists hold distinct 1-based block indices. Raises ValueError naming the repeats."""
    for sp in layer_specs(v):
        if isinstance(sp, list) and (not sp or any(x < 1 for x in sp)):
            raise ValueError("an explicit layer list holds 1-based block indices (>= 1)")
        if isinstance(sp, list) and len(set(sp)) != len(sp):
            raise ValueError(f"the layer list {sp} repeats layer(s) {sorted({x for x in sp if sp.count(x) > 1})}")
    return v


def layer_spec_name(sp) -> str:
    """'last', 'middle' or 'L<i>-<j>' for an explicit list."""
    return sp if isinstance(sp, str) else "L" + "-".join(str(x) for x in sp)


def lambda_text(lam, target_drift: float, init: float, k: float, normalize: bool) -> str:
    """Lambda in logs: '1e-4', or 'auto (target drift 0.02, init 1, K 0.1)'; then ', relative error' when
    normalized, else ', raw MSE'."""
    if lam == "auto":
        txt = f"auto (target drift {target_drift:g}, init {init:g}, K {k:g})"
    else:
        txt = str(lam) if isinstance(lam, list) else f"{lam:g}"
    return txt + (", relative error" if normalize else ", raw MSE")


def fmt_lambda(x: float) -> str:
    """Lambda in a label: 0, 1e-4, 1.5e-4, 2e1 (exact to 6 significant digits, so distinct values never collide)."""
    if x == 0:
        return "0"
    m, e = f"{x:.5e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


def expand_grid(m) -> list:
    """The concrete methods of one ANCHOR entry (an :class:`AnchorConfig`): one per combination of
    its lambdas and layer specs, labelled ``<label>-lam<lambda>`` and/or ``-<last|middle|L<i>-<j>>`` (an entry
    that is no grid: ``[m]``)."""
    if not m.is_grid():
        return [m]
    out, specs, lams = [], m.layer_specs(), m.lambdas()
    for sp in specs:
        for lam in lams:
            c = m.model_copy(update={"anchor_lambda": lam, "anchor_layers": sp, "label": None})
            parts = [m.display]
            if len(specs) > 1:
                parts.append(c.layer_spec_name)
            if len(lams) > 1:
                parts.append("auto" if lam == "auto" else "lam" + fmt_lambda(lam))
            elif lam == "auto" and not m.label:
                parts[0] = c.display  # anchor-auto
            out.append(c.model_copy(update={"label": "-".join(parts)}))
    return out

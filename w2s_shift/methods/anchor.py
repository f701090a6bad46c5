"""ANCHOR: Naive W2S plus lambda x a representation-anchoring term that keeps the student's hidden states on
the response tokens near the pretrained reference's (Le et al. 2026, arXiv 2605.25629; the loss is
:func:`w2s_shift.losses.anchor_mse_layers`, lambda auto follows :func:`w2s_shift.losses.adaptive_anchor_lambda`).

Besides :data:`METHOD`, the config-time checks and labels of ANCHOR's settings (``anchor_lambda``,
``anchor_layers``), used by :class:`w2s_shift.config.MethodConfig`.
"""

from __future__ import annotations

import math

from .base import Method

METHOD = Method(
    name="anchor",
    w2s_student=True,
    labels="teacher",
    trains=True,
    loss="soft_bt",
    needs_reference=True,
    display="anchor",
    description="soft Bradley-Terry on teacher labels + lambda x representation anchoring to the pretrained model",
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
    """Before parsing: no boolean where a block index goes (YAML ``[true]`` would pass as layer 1).

    Raises:
        ValueError: naming the boolean.
    """

    def walk(x):
        if isinstance(x, bool):
            raise ValueError(f"anchor_layers: {x!r} is not a block index; give 'last', 'middle' or 1-based indices")
        if isinstance(x, list):
            for y in x:
                walk(y)

    walk(v)
    return v


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
    """The concrete methods of one ANCHOR entry (a :class:`w2s_shift.config.MethodConfig`): one per combination of
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

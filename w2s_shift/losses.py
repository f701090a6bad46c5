"""Losses as small pure functions of tensors; the pairwise W2S losses are registered by name in :data:`LOSSES`.

Notation (Le et al. 2026, "When In-Distribution Gains Fail", arXiv 2605.25629): for pair i the reward
margin is d_i = r(x, y_c) - r(x, y_r) and q_i in [0, 1] is the weak teacher's soft label, the probability
that the chosen response is preferred (q_i = 1 for gold labels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LOSSES: dict[str, Callable] = {}
"""The pairwise W2S losses by name (a method's ``loss``, :class:`w2s_shift.methods.Method`), each called as
``fn(margin (B,), q (B,), *, alpha, seed, reduction)`` -> scalar in nats; ``alpha`` and ``seed`` are the confidence
loss's schedule and orientation, which losses without hardening ignore. The ANCHOR term (:func:`anchor_mse_layers`)
is not one of them: it is the regularizer of ANCHOR's objective (:mod:`w2s_shift.methods.anchor_term`)."""


def register(name: str):
    """Decorator: register a pairwise loss in :data:`LOSSES` under ``name``.

    Raises:
        ValueError: ``name`` is already registered."""

    def deco(fn):
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered ({LOSSES[name].__name__})")
        LOSSES[name] = fn
        return fn

    return deco


@register("soft_bt")
def soft_bradley_terry(
    margin: torch.Tensor, q: torch.Tensor, reduction: str = "mean", *, alpha: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """Soft Bradley-Terry loss, the "Naive W2S" loss (Le et al. 2026, Eq. for L_w2s; Bradley & Terry 1952).

    L = mean_i -[q_i log sigmoid(d_i) + (1 - q_i) log sigmoid(-d_i)], i.e. binary cross-entropy of
    sigmoid(d_i) against q_i. With q_i = 1 it is the gold Bradley-Terry loss -log sigmoid(d_i).

    Args:
        margin: (B,) reward margins d_i, in reward units (logits).
        q: (B,) soft labels in [0, 1].
        reduction: "mean" over the batch or "sum" (the trainer divides by the pairs of an accumulated batch).
        alpha, seed: unused (the common signature of :data:`LOSSES`).

    Returns:
        scalar, mean (or sum) over the batch, in nats.
    """
    return F.binary_cross_entropy_with_logits(margin, q.to(margin.dtype), reduction=reduction)


def anchor_mse(
    hidden: torch.Tensor, ref_hidden: torch.Tensor, mask: torch.Tensor, reduction: str = "mean", units: str = "mean"
) -> torch.Tensor:
    """ANCHOR's representation-anchoring term (Le et al. 2026, L_anchor): masked mean squared error.

    L_anchor = sum_{n,t} m_{n,t} * ||h_{n,t} - h^ref_{n,t}||^2 / (H * sum_{n,t} m_{n,t}),
    the mean over every hidden unit of every masked (response) token (``units="mean"``, the reading of "MSE" as
    torch's ``mse_loss``); ``units="sum"`` drops the 1 / H: the mean over tokens of the per-token squared norm
    (H times larger, so a lambda set on it is H times stronger than the same lambda on the per-unit mean).

    Args:
        hidden: (N, T, H) student hidden states (N = 2B: chosen and rejected sequences).
        ref_hidden: (N, T, H) frozen reference hidden states on the same input (no gradient flows into it).
        mask: (N, T) 1 on response tokens, 0 on prompt and padding tokens.
        reduction: "mean" (the formula above) or "sum" (the numerator over H, i.e. without dividing by the
            token count: the trainer divides by the response tokens of a whole accumulated batch).
        units: "mean" or "sum" over the H hidden units of a token (see above).

    Returns:
        scalar (0 if the mask is empty).

    Raises:
        ValueError: ``units`` neither "mean" nor "sum".
    """
    if units not in ("mean", "sum"):
        raise ValueError(f"anchor_mse: units must be 'mean' or 'sum', got {units!r}")
    m = mask.to(hidden.dtype)
    d2 = (hidden - ref_hidden.detach()).pow(2)
    sq = d2.mean(-1) if units == "mean" else d2.sum(-1)  # (N, T)
    if reduction == "sum":
        return (sq * m).sum()
    return (sq * m).sum() / m.sum().clamp_min(1.0)


def anchor_relative(
    hidden: torch.Tensor, ref_hidden: torch.Tensor, mask: torch.Tensor, ref_sq: torch.Tensor | None = None
) -> torch.Tensor:
    """Normalized ANCHOR term: the relative squared error of one layer (``anchor_normalize``; not in the paper).

    L_rel = sum_{n,t} m_{n,t} ||h_{n,t} - h^ref_{n,t}||^2 / sum_{n,t} m_{n,t} ||h^ref_{n,t}||^2
          = :func:`anchor_mse` / (the reference's mean squared state over the same tokens and hidden units),

    so that one lambda means the same for every model and layer (the raw MSE scales with the layer's squared
    norm, e.g. middle residual streams are far larger than the final normed output). It is the drift measure
    of the report (:func:`w2s_shift.metrics.drift.relative_squared_error`), computed on this batch. The
    denominator comes from the frozen reference only (no gradient). Sums are taken in float32.

    Args:
        hidden: (N, T, H) student hidden states. ref_hidden: (N, T, H) reference states. mask: (N, T), 1 on
            response tokens. ref_sq: the denominator, when it is not this batch's own reference sum (0-dim; the
            trainer passes the sum over the whole accumulated optimizer step, :func:`anchor_mse_layers`).

    Returns:
        scalar, dimensionless (0 if the mask is empty or the reference states are all zero there).
    """
    err, ref = anchor_sq_sums(hidden, ref_hidden, mask)
    den = ref if ref_sq is None else ref_sq.to(err.device, torch.float32)
    return err / den.clamp_min(torch.finfo(torch.float32).tiny)


def anchor_sq_sums(hidden: torch.Tensor, ref_hidden: torch.Tensor, mask: torch.Tensor) -> tuple:
    """The two sums of :func:`anchor_relative` for one layer, in float32:
    (sum_{n,t} m_{n,t} ||h_{n,t} - h^ref_{n,t}||^2, sum_{n,t} m_{n,t} ||h^ref_{n,t}||^2). The first carries the
    gradient of ``hidden``; the second comes from the reference only (no gradient). Sums, not means, so that
    they add up over the micro-batches of an accumulated optimizer step (and over processes) to the sums of the
    whole batch.

    Args:
        hidden: (N, T, H) student states. ref_hidden: (N, T, H) reference states. mask: (N, T), 1 on response tokens.

    Returns:
        two 0-dim float32 tensors, in squared state units.
    """
    m = mask.to(torch.float32)
    ref = ref_hidden.detach().float()
    err = ((hidden.float() - ref).pow(2).sum(-1) * m).sum()
    return err, (ref.pow(2).sum(-1) * m).sum()


def anchor_mse_layers(
    hidden: list,
    ref_hidden: list,
    mask: torch.Tensor,
    normalize: bool = False,
    reduction: str = "mean",
    ref_sq_norm: torch.Tensor | None = None,
    units: str = "mean",
) -> torch.Tensor:
    """ANCHOR over several layers (Le et al. 2026, middle-layer variant): the mean over the K anchored layers of
    :func:`anchor_mse` (``normalize=False``, the paper's term, with the same ``reduction``) or of
    :func:`anchor_relative` (``normalize=True``, each layer's error relative to that layer's reference mean squared
    norm).

    With ``normalize`` and ``ref_sq_norm`` (K,) given, layer k's term is sum_{n,t} m ||h - h^ref||^2 of this batch
    divided by ``ref_sq_norm[k]`` instead of by this batch's own reference sum: the trainer passes the reference
    sums of the whole accumulated optimizer step (all micro-batches, all processes), so each micro-batch's term is
    its share of the step's relative error, and the shares add up exactly to the one-batch value
    (tests/test_accumulation.py).

    Args:
        hidden, ref_hidden: K tensors (N, T, H) each. mask: (N, T). normalize: relative error. reduction: "mean"
            or "sum" (raw MSE only: the numerator of :func:`anchor_mse`). ref_sq_norm: optional (K,) denominators
            (normalize only). units: the raw MSE's reduction over hidden units (:func:`anchor_mse`); a relative
            error does not depend on it.

    Returns:
        a scalar.

    Raises:
        ValueError: different numbers of student and reference layers, or none; ``reduction="sum"`` with
            ``normalize`` (a relative error is a ratio of sums: pass ``ref_sq_norm``); ``ref_sq_norm`` without
            ``normalize`` or of another length than the layers.
    """
    if len(hidden) != len(ref_hidden) or not hidden:
        raise ValueError(f"{len(hidden)} student layers but {len(ref_hidden)} reference layers")
    if not normalize:
        if ref_sq_norm is not None:
            raise ValueError("ref_sq_norm is for the normalized anchor term (normalize=True) only")
        return torch.stack([anchor_mse(h, r, mask, reduction, units) for h, r in zip(hidden, ref_hidden)]).mean()
    if reduction != "mean":
        raise ValueError("normalize=True takes no reduction='sum': pass the step's reference sums as ref_sq_norm")
    if ref_sq_norm is not None and tuple(ref_sq_norm.shape) != (len(hidden),):
        raise ValueError(f"ref_sq_norm has shape {tuple(ref_sq_norm.shape)} for {len(hidden)} anchored layers")
    dens = [None] * len(hidden) if ref_sq_norm is None else list(ref_sq_norm)
    return torch.stack([anchor_relative(h, r, mask, d) for h, r, d in zip(hidden, ref_hidden, dens)]).mean()


def anchor_lambda_units(lam, scale: str, ref_sq_per_token, hidden_size: int) -> dict:
    """One ANCHOR lambda in the three scales it can be read on, for a batch whose reference states have the mean
    per-token squared norm ``ref_sq_per_token`` (r = sum_{n,t} m ||h^ref||^2 / sum_{n,t} m): the lambdas that give
    the same term, hence the same gradients, on that batch (tests/test_anchor.py).

        relative   lambda_rel x sum m ||h - h^ref||^2 / sum m ||h^ref||^2            (anchor_normalize: true)
        per token  lambda_tok x sum m ||h - h^ref||^2 / sum m                         (raw, anchor_reduction: sum)
        per unit   lambda_unit x sum m ||h - h^ref||^2 / (H sum m)                    (raw, anchor_reduction: mean)

    so lambda_tok = lambda_rel / r and lambda_unit = H x lambda_tok. (Le et al. 2026 write "MSE" without saying
    which reduction over hidden units; their lambda 1e-4 is 1e-4 per unit or per token, H-fold apart.)

    Args:
        lam: the configured lambda (float or 0-dim tensor). scale: "relative", "per_unit" or "per_token".
        ref_sq_per_token: r (float or 0-dim tensor, squared state units). hidden_size: H.

    Returns:
        {"relative", "per_unit", "per_token"}: the same type as ``lam`` (tensors stay on their device).

    Raises:
        ValueError: an unknown scale.
    """
    if scale == "relative":
        tok = lam / ref_sq_per_token
    elif scale == "per_token":
        tok = lam
    elif scale == "per_unit":
        tok = lam / hidden_size
    else:
        raise ValueError(f"anchor_lambda_units: scale must be relative, per_unit or per_token, got {scale!r}")
    return {"relative": tok * ref_sq_per_token, "per_unit": tok * hidden_size, "per_token": tok}


def adaptive_anchor_lambda(lam, drift, target: float, k: float = 0.1, clip: float = 0.2):
    """One step of the drift-budget controller of ``anchor_lambda: auto`` (the adaptive KL controller of Ziegler
    et al. 2019, "Fine-Tuning Language Models from Human Preferences", sec. 2.2, with the KL replaced by drift):

        e_t = clip((drift_t - target) / target, -clip, clip),    lambda_{t+1} = lambda_t * (1 + k * e_t).

    Drift above the target raises lambda, drift below lowers it, by at most a factor (1 +- k * clip) per optimizer
    step (Ziegler et al.: k = 0.1, clip 0.2, i.e. 2% a step); lambda stays positive. Works on floats or on
    tensors (no host synchronisation).

    Args:
        lam: current lambda (> 0), float or 0-dim tensor. drift: this step's drift (relative squared error of the
            anchored layers, dimensionless), float or 0-dim tensor. target: the drift budget (> 0). k: gain
            (> 0). clip: bound on the proportional error (> 0).

    Returns:
        the next lambda, of the type of ``lam`` (a tensor if either input is one).

    Raises:
        ValueError: target, k or clip not > 0.
    """
    if not (target > 0 and k > 0 and clip > 0):
        raise ValueError(f"target ({target}), k ({k}) and clip ({clip}) must be > 0")
    e = (drift - target) / target
    e = torch.clamp(e, -clip, clip) if torch.is_tensor(e) else min(clip, max(-clip, e))
    return lam * (1 + k * e)


def orientation(n: int, seed: int) -> torch.Tensor:
    """A seeded random orientation of a batch of ``n`` pairs: (n,) float signs, exactly ``n // 2`` of them -1.

    A pair with sign -1 is read the other way round (rejected first): d -> -d, q -> 1 - q. Deterministic in
    ``seed`` (a CPU ``torch.Generator``), so a resumed run hardens the same batches the same way.
    """
    g = torch.Generator().manual_seed(int(seed) % (2**63))
    s = torch.ones(n)
    s[torch.randperm(n, generator=g)[: n // 2]] = -1.0
    return s


def confidence_targets(margin: torch.Tensor, q: torch.Tensor, alpha: float, seed: int = 0) -> torch.Tensor:
    """Targets of the confidence loss: (1 - alpha) q_i + alpha h_i, h_i the hardened student label (detached).

    Burns et al. 2023 (Sec. 4.3.2, "auxiliary confidence loss") harden the strong model's own predictions with
    an adaptive threshold t: the share of examples hardened to the positive class is the class prior (their
    code: the weak labels' mean), which keeps the hardening from collapsing onto one class. A pair has no class,
    only an orientation: chosen is always written first, so mean(q) is the teacher's average agreement with gold
    (0.55 in the quickstart) and hardening the top round(B mean q) margins to 1 pushes the other ~45% of every
    batch toward "rejected is better" even when the student prefers chosen on all of them.

    Here the hardening runs on a seeded random orientation of the batch (:func:`orientation`: d'_i = s_i d_i,
    s_i = -1 for exactly B // 2 pairs). The orientation is independent of the pairs' content, so in the oriented
    batch P(first response preferred) = 1/2 for every pair whatever the teacher: the class prior that Burns et
    al.'s threshold estimates is known exactly, and the threshold is the median of the oriented margins: the top
    B - B // 2 d'_i get h'_i = 1, the rest 0 (for odd B the median pair counts as positive, matching the
    B - B // 2 pairs left unflipped). The teacher's mean(q') would only estimate the same 1/2 with noise.
    Back in the original orientation h_i = h'_i where s_i = 1 and 1 - h'_i where s_i = -1 (BCE(d', t') equals
    BCE(d, t) under d -> -d, t -> 1 - t). Confident pairs are hardened toward the student's own preference (a large
    |d_i| lands at the top or the bottom of the oriented batch either way); a student that prefers chosen on every
    pair gets h_i = 1 on every pair.

    Args:
        margin: (B,) reward margins d_i. q: (B,) soft labels in [0, 1]. alpha: coefficient in [0, 1].
        seed: seed of the orientation (the trainer derives it from the run seed, the optimizer step and the
            micro-batch).

    Returns:
        (B,) targets in [0, 1], in ``margin``'s dtype, without gradient.
    """
    n = margin.numel()
    s = orientation(n, seed).to(margin.device, margin.dtype, non_blocking=True)  # built on the host: no sync
    oriented = margin.detach() * s
    h_or = torch.zeros_like(margin)
    h_or[torch.topk(oriented, n - n // 2).indices] = 1.0
    h = torch.where(s > 0, h_or, 1.0 - h_or)
    return ((1 - alpha) * q.to(margin.dtype) + alpha * h).detach()


@register("confidence")
def confidence_loss(
    margin: torch.Tensor, q: torch.Tensor, alpha: float, seed: int = 0, reduction: str = "mean"
) -> torch.Tensor:
    """Auxiliary confidence loss (Burns et al. 2023, Eq. 1) adapted to pairs (protocol.md).

    p_i = sigmoid(d_i); loss = BCE(p_i, (1 - alpha) q_i + alpha h_i) with the hardened label h_i of
    :func:`confidence_targets` (a median threshold on a seeded random orientation of the batch). The soft
    Bradley-Terry part is :func:`soft_bradley_terry`'s, unchanged (alpha = 0 gives it exactly).

    Args:
        margin: (B,) reward margins. q: (B,) soft labels. alpha: coefficient in [0, 1]. seed: orientation seed.
        reduction: "mean" over the batch or "sum" (the trainer divides by the pairs of an accumulated batch).

    Returns:
        scalar in nats.
    """
    return F.binary_cross_entropy_with_logits(margin, confidence_targets(margin, q, alpha, seed), reduction=reduction)


def confidence_alpha(step_frac: float, alpha_max: float = 0.5, warmup_frac: float = 0.2) -> float:
    """Confidence-loss coefficient: rises linearly from 0 to alpha_max over the first ``warmup_frac`` of
    training, then stays at alpha_max (no jump at the end of warm-up). step_frac in [0, 1]."""
    if warmup_frac <= 0:
        return alpha_max
    return alpha_max * min(1.0, max(0.0, step_frac) / warmup_frac)


def pairwise_margin(rewards: torch.Tensor) -> torch.Tensor:
    """Split (2B,) rewards laid out as [chosen_1..chosen_B, rejected_1..rejected_B] into margins (B,)."""
    b = rewards.shape[0] // 2
    return rewards[:b] - rewards[b:]

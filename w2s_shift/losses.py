"""Losses as small pure functions of tensors, registered by name.

Notation (Le et al. 2026, "When In-Distribution Gains Fail", arXiv 2605.25629): for pair i the reward
margin is d_i = r(x, y_c) - r(x, y_r) and q_i in [0, 1] is the weak teacher's soft label, the probability
that the chosen response is preferred (q_i = 1 for gold labels).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

LOSSES: dict[str, Callable] = {}


def register(name: str):
    def deco(fn):
        LOSSES[name] = fn
        return fn

    return deco


@register("soft_bt")
def soft_bradley_terry(margin: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Soft Bradley-Terry loss, the "Naive W2S" loss (Le et al. 2026, Eq. for L_w2s; Bradley & Terry 1952).

    L = mean_i -[q_i log sigmoid(d_i) + (1 - q_i) log sigmoid(-d_i)], i.e. binary cross-entropy of
    sigmoid(d_i) against q_i. With q_i = 1 it is the gold Bradley-Terry loss -log sigmoid(d_i).

    Args:
        margin: (B,) reward margins d_i, in reward units (logits).
        q: (B,) soft labels in [0, 1].

    Returns:
        scalar, mean over the batch, in nats.
    """
    return F.binary_cross_entropy_with_logits(margin, q.to(margin.dtype))


@register("bt")
def bradley_terry(margin: torch.Tensor) -> torch.Tensor:
    """Gold Bradley-Terry loss: mean_i -log sigmoid(d_i). margin: (B,). Returns a scalar in nats."""
    return -F.logsigmoid(margin).mean()


@register("anchor_mse")
def anchor_mse(hidden: torch.Tensor, ref_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ANCHOR's representation-anchoring term (Le et al. 2026, L_anchor): masked mean squared error.

    L_anchor = sum_{n,t} m_{n,t} * ||h_{n,t} - h^ref_{n,t}||^2 / (H * sum_{n,t} m_{n,t}),
    the mean over every hidden unit of every masked (response) token.

    Args:
        hidden: (N, T, H) student hidden states (N = 2B: chosen and rejected sequences).
        ref_hidden: (N, T, H) frozen reference hidden states on the same input (no gradient flows into it).
        mask: (N, T) 1 on response tokens, 0 on prompt and padding tokens.

    Returns:
        scalar (0 if the mask is empty).
    """
    m = mask.to(hidden.dtype)
    sq = (hidden - ref_hidden.detach()).pow(2).mean(-1)  # (N, T)
    return (sq * m).sum() / m.sum().clamp_min(1.0)


@register("anchor_rel")
def anchor_relative(hidden: torch.Tensor, ref_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalized ANCHOR term: the relative squared error of one layer (``anchor_normalize``; not in the paper).

    L_rel = sum_{n,t} m_{n,t} ||h_{n,t} - h^ref_{n,t}||^2 / sum_{n,t} m_{n,t} ||h^ref_{n,t}||^2
          = :func:`anchor_mse` / (the reference's mean squared state over the same tokens and hidden units),

    so that one lambda means the same for every model and layer (the raw MSE scales with the layer's squared
    norm, e.g. middle residual streams are far larger than the final normed output). It is the drift measure
    of the report (``diagnostics``: relative squared error), computed on this batch. The denominator comes from
    the frozen reference only (no gradient). Sums are taken in float32.

    Args:
        hidden: (N, T, H) student hidden states. ref_hidden: (N, T, H) reference states. mask: (N, T), 1 on
            response tokens.

    Returns:
        scalar, dimensionless (0 if the mask is empty or the reference states are all zero there).
    """
    m = mask.to(torch.float32)
    err = ((hidden.float() - ref_hidden.detach().float()).pow(2).sum(-1) * m).sum()
    ref = (ref_hidden.detach().float().pow(2).sum(-1) * m).sum()
    return err / ref.clamp_min(torch.finfo(torch.float32).tiny)


@register("anchor")
def anchor_mse_layers(hidden: list, ref_hidden: list, mask: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """ANCHOR over several layers (Le et al. 2026, middle-layer variant): the mean over the K anchored layers of
    :func:`anchor_mse` (``normalize=False``, the paper's term) or of :func:`anchor_relative` (``normalize=True``,
    each layer's error relative to that layer's reference mean squared norm). hidden, ref_hidden: K tensors
    (N, T, H) each; mask: (N, T). Returns a scalar.

    Raises:
        ValueError: different numbers of student and reference layers, or none.
    """
    if len(hidden) != len(ref_hidden) or not hidden:
        raise ValueError(f"{len(hidden)} student layers but {len(ref_hidden)} reference layers")
    fn = anchor_relative if normalize else anchor_mse
    return torch.stack([fn(h, r, mask) for h, r in zip(hidden, ref_hidden)]).mean()


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


@register("confidence")
def confidence_loss(margin: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """Auxiliary confidence loss (Burns et al. 2023, Eq. 1) adapted to pairs (protocol.md).

    p_i = sigmoid(d_i); the hardened student label h_i = 1[p_i >= t], with the threshold t chosen per batch
    so that the number of h_i = 1 equals round(B * mean(q)) (the top-k p_i); target
    = (1 - alpha) q_i + alpha h_i, h_i detached; loss = mean BCE(p_i, target).

    Args:
        margin: (B,) reward margins. q: (B,) soft labels. alpha: coefficient in [0, 1].
    """
    k = int(torch.round(q.float().mean() * q.numel()).item())
    h = torch.zeros_like(margin)
    if k > 0:
        top = torch.topk(margin.detach(), k).indices
        h[top] = 1.0
    target = (1 - alpha) * q.to(margin.dtype) + alpha * h
    return F.binary_cross_entropy_with_logits(margin, target)


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

"""Inference with the project's models: right padding, token-budget batching, rewards of token sequences, and the
frozen trunk's / reference's hidden states (computed once, cached by the pipeline).

Padding and token-budget batching are :mod:`w2s_shift.batching`'s (also used by drift, ``score``, the export check
and LM log-probabilities, below this module).
Metrics on the rewards: :mod:`w2s_shift.metrics.stats`.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from .batching import batch_inputs, batches_by_tokens, bf16_autocast, module_device, pad_sequences
from .models.reward_model import last_token_index, layer_states
from .progress import leave_bars


@torch.no_grad()
def compute_trunk_states(
    trunk: torch.nn.Module,
    seqs: list,
    pad_id: int,
    max_tokens: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    desc: str = "trunk states",
    share_prefixes: bool = False,
) -> list:
    """Run the frozen trunk once over token sequences; return each sequence's states (T_i, H) in ``dtype``.

    Args:
        trunk: module returning ``last_hidden_state`` (N, T, H) from ``input_ids``/``attention_mask``.
        seqs: list of token id lists.
        max_tokens: padded tokens per forward.
        dtype: storage dtype (bfloat16 halves memory; the trunk also runs in it when it is bfloat16).
        share_prefixes: ``seqs`` are pairs laid out [chosen_1..chosen_B, rejected_1..rejected_B] and the trunk is
            causal (:func:`can_share_prefixes`): the tokens a pair's two sequences share at their start (the
            chat template's system turn and the prompt) run once, each pair packed in one row with an attention
            mask that keeps its two responses apart (:func:`_pair_tree_states`); the states equal the plain
            pass's up to the rounding of the trunk's dtype. ``max_tokens`` then counts a batch's packed rows.

    Raises:
        ValueError: ``share_prefixes`` with an odd number of sequences or a trunk that is not causal.
    """
    out: list = [None] * len(seqs)
    trunk.eval()
    dev = module_device(trunk)
    if share_prefixes:
        if len(seqs) % 2 or not can_share_prefixes(trunk):
            raise ValueError(
                f"share_prefixes needs pairs [chosen..., rejected...] (got {len(seqs)} sequences) and a causal "
                f"full-attention decoder (got {getattr(getattr(trunk, 'config', None), 'model_type', '?')!r})"
            )
        rows = _pair_rows(seqs)
        n, cdtype = len(rows), next(trunk.parameters()).dtype
        row_len = [len(c) + len(r) - p for p, c, r in rows]
        for b in tqdm(batches_by_tokens(row_len, max_tokens), desc=desc, leave=leave_bars()):
            for i, (c, r) in zip(b, _pair_tree_states(trunk, [rows[i] for i in b], cdtype)):
                out[i], out[i + n] = c.to("cpu", dtype).clone(), r.to("cpu", dtype).clone()
        return out
    for b in tqdm(batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=leave_bars()):
        ids, am = (x.to(dev) for x in pad_sequences([seqs[i] for i in b], pad_id))
        h = trunk(input_ids=ids, attention_mask=am, use_cache=False).last_hidden_state
        for k, i in enumerate(b):
            out[i] = h[k, : len(seqs[i])].to("cpu", dtype).clone()
    return out


def can_share_prefixes(trunk: torch.nn.Module) -> bool:
    """Whether a trunk's state at a token depends only on the tokens before it, so that tokens a pair's chosen and
    rejected sequences share at their start can be run once (:func:`compute_trunk_states` with
    ``share_prefixes``): a causal decoder with full attention in every block and a ``layers`` list (the ones
    :func:`~w2s_shift.models.reward_model.split_decoder` cuts), whose attention takes an explicit 4D mask (``sdpa``
    or ``eager``). Encoders (bidirectional), sliding-window attention (the explicit mask replaces the window) and
    flash / flex attention (no arbitrary 4D mask) are excluded."""
    from .models.reward_model import SPLITTABLE

    cfg = getattr(trunk, "config", None)
    if getattr(cfg, "model_type", None) not in SPLITTABLE or not hasattr(trunk, "layers"):
        return False
    if getattr(cfg, "_attn_implementation", None) not in (None, "sdpa", "eager"):
        return False
    types = getattr(cfg, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return getattr(cfg, "sliding_window", None) is None or not getattr(cfg, "use_sliding_window", True)


def _common_prefix(a: list, b: list) -> int:
    k, n = 0, min(len(a), len(b))
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _pair_rows(seqs: list) -> list:
    """Per pair of ``seqs`` = [chosen_1..chosen_B, rejected_1..rejected_B]: (P, chosen, rejected), P the number of
    tokens the two share at their start."""
    n = len(seqs) // 2
    return [(_common_prefix(c, r), c, r) for c, r in zip(seqs[:n], seqs[n:])]


def _pair_tree_states(trunk: torch.nn.Module, rows: list, dtype: torch.dtype) -> list:
    """A causal trunk's states of pairs packed one pair a row: [shared prefix (P), chosen tail, rejected tail].

    The rejected tail takes positions P, P+1, ... as the chosen tail does and attends to the prefix and to itself
    (causally), never to the chosen tail; padding after the row attends only to itself. Every state then equals the
    one of the whole sequence run alone (a causal decoder's state depends only on the tokens at earlier
    positions it attends to), while the prefix runs once: (2P + Tc + Tr) tokens become (P + Tc + Tr).

    Args:
        rows: per pair (P, chosen ids, rejected ids), as :func:`_pair_rows` gives.
        dtype: the trunk's compute dtype (the additive mask's -inf stand-in is its most negative finite value).

    Returns:
        per pair (chosen states (len(chosen), H), rejected states (len(rejected), H)) on the trunk's device.
    """
    dev = module_device(trunk)
    width = max(len(c) + len(r) - p for p, c, r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.zeros((len(rows), 1, width, width), dtype=torch.bool)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for k, (p, c, r) in enumerate(rows):
        end_c, end = len(c), len(c) + len(r) - p
        ids[k, :end_c] = torch.as_tensor(c)
        ids[k, end_c:end] = torch.as_tensor(r[p:])
        pos[k, :end_c] = torch.arange(end_c)
        pos[k, end_c:end] = torch.arange(p, len(r))
        allowed[k, 0] = causal
        allowed[k, 0, end_c:, p:end_c] = False  # the rejected tail never sees the chosen tail
        allowed[k, 0, end:] = False
        allowed[k, 0, torch.arange(end, width), torch.arange(end, width)] = True  # padding: itself only
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    h = trunk(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
    h = h.last_hidden_state
    out = []
    for k, (p, c, r) in enumerate(rows):
        end_c, end = len(c), len(c) + len(r) - p
        out.append((h[k, :end_c], torch.cat([h[k, :p], h[k, end_c:end]])))
    return out


@torch.no_grad()
def score_sequences(
    model: torch.nn.Module,
    seqs: list,
    pad_id: int,
    states: list | None = None,
    max_tokens: int = 8192,
    desc: str = "scoring",
    bf16: bool = False,
    with_pooled: bool = False,
):
    """Rewards r(x, y) of token sequences, in input order.

    Args:
        model: a :class:`~w2s_shift.models.reward_model.RewardModel`.
        seqs: list of token id lists (N sequences).
        states: optional cached trunk states per sequence (then ``model`` is a split head).
        bf16: run under bfloat16 autocast (as in training).
        with_pooled: also return what :func:`pooled_states` gives of ``model.backbone`` on these sequences, taken
            from the same forwards (same batches, precision and modules, so equal to the bit): the mechanism
            stage reads a scored student's features without a second pass.

    Returns:
        (N,) float64 rewards; with ``with_pooled``, (rewards, (N, H) float32 numpy array).
    """
    model.eval()
    dev = module_device(model)
    out = np.zeros(len(seqs), dtype=np.float64)
    pooled: list = [None] * len(seqs)
    for b in tqdm(batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=leave_bars()):
        inputs = batch_inputs(seqs, states, b, pad_id, dev)
        with bf16_autocast(bf16):
            r, hidden = model(**inputs)
        out[b] = r.double().cpu().numpy()
        if with_pooled:
            for k, h in zip(b, last_token_states(hidden, inputs["attention_mask"])):
                pooled[k] = h
    return (out, torch.stack(pooled).numpy()) if with_pooled else out


@torch.no_grad()
def pooled_states(
    backbone: torch.nn.Module,
    seqs: list,
    pad_id: int,
    states: list | None = None,
    max_tokens: int = 8192,
    bf16: bool = False,
) -> torch.Tensor:
    """The state a reward head reads of each sequence: the backbone's final (normalized) output at its last real
    token, in input order, as the reward model pools it (:class:`~w2s_shift.models.reward_model.RewardModel`,
    ``pooling="last"``), under the same batches and precision as :func:`score_sequences`.

    Args:
        backbone: returns ``last_hidden_state`` (a split head with cached trunk ``states``, or a whole backbone).
        seqs: N token id lists.

    Returns:
        (N, H) float32 tensor on the host.
    """
    backbone.eval()
    dev = module_device(backbone)
    out: list = [None] * len(seqs)
    for b in batches_by_tokens([len(s) for s in seqs], max_tokens):
        inputs = batch_inputs(seqs, states, b, pad_id, dev)
        with bf16_autocast(bf16):
            h = backbone(**inputs, use_cache=False).last_hidden_state
        for i, last in zip(b, last_token_states(h, inputs["attention_mask"])):
            out[i] = last
    return torch.stack(out)


def last_token_states(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, H) float32 host copy of each row's state at its last real token, from ``hidden`` (N, T, H) and the
    (N, T) 0/1 ``attention_mask``."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, last_token_index(attention_mask)].float().cpu()


def finite_or_raise(values: np.ndarray, what: str) -> None:
    """Raise ValueError if any reward is NaN/inf, so that no NaN reaches a metric."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"{what}: {int(bad.sum())} non-finite rewards (first at index {int(np.argmax(bad))})")


@torch.no_grad()
def compute_reference_states(
    backbone: torch.nn.Module,
    seqs: list,
    response_masks: list,
    pad_id: int,
    states: list | None = None,
    max_tokens: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    desc: str = "reference states",
    bf16: bool = False,
    layers: list | None = None,
    layer_offset: int = 0,
) -> list:
    """ANCHOR reference states computed once: the frozen backbone's outputs on response tokens only.

    Args:
        backbone: the reference (pre-training copy) returning ``last_hidden_state``.
        seqs: N token id lists; response_masks: N lists of 0/1 (1 on response tokens).
        states: optional cached trunk states (then ``backbone`` is a split head taking inputs_embeds).
        layers: 1-based global blocks (see :func:`~w2s_shift.models.reward_model.select_layers`); None: the last
            layer's normalized output. layer_offset: blocks below ``backbone`` (a split head's trunk).

    Returns:
        N tensors (R_i, H) in ``dtype`` (``layers`` None) or (R_i, K, H) for K layers; R_i = number of response
        tokens of sequence i.
    """
    out: list = [None] * len(seqs)
    backbone.eval()
    dev = module_device(backbone)
    for b in tqdm(batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=leave_bars()):
        inputs = batch_inputs(seqs, states, b, pad_id, dev)
        with bf16_autocast(bf16):
            if layers is None:
                o, kept = backbone(**inputs, use_cache=False), None
            else:
                run = lambda hs, x=inputs: backbone(**x, use_cache=False, output_hidden_states=hs)  # noqa: E731
                o, kept = layer_states(run, backbone, layers, layer_offset)
        h = o.last_hidden_state if layers is None else torch.stack(kept, dim=2)
        for k, i in enumerate(b):
            m = torch.tensor(response_masks[i], dtype=torch.bool, device=h.device)
            out[i] = h[k, : len(seqs[i])][m].to("cpu", dtype).clone()
    return out


__all__ = [
    "batch_inputs",
    "batches_by_tokens",
    "bf16_autocast",
    "can_share_prefixes",
    "compute_reference_states",
    "compute_trunk_states",
    "finite_or_raise",
    "module_device",
    "pad_sequences",
    "pooled_states",
    "score_sequences",
]

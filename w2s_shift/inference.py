"""Inference with the project's models: right padding, token-budget batching, rewards of token sequences, and the
frozen trunk's / reference's hidden states (computed once, cached by the pipeline).

The padding (:func:`pad_sequences`: right padding with an attention mask) and token-budget batching
(:func:`batches_by_tokens`) here are the ones used for scoring, trunk and reference states, drift
(:mod:`w2s_shift.metrics.drift`), ``score``, the export check and LM log-probabilities (:mod:`w2s_shift.models.lm`).
Metrics on the rewards: :mod:`w2s_shift.metrics.stats`.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from tqdm.auto import tqdm

from .device import current_device
from .models.reward_model import select_layers
from .progress import leave_bars


def batches_by_tokens(lengths: list, max_tokens: int, max_rows: int = 64) -> list:
    """Group sequence indices into batches of at most ``max_tokens`` padded tokens and ``max_rows`` rows.

    Indices go in descending length (ties in input order), so each batch pads little; a batch's padded size is
    its longest sequence times its row count. A sequence longer than ``max_tokens`` gets a batch of its own.

    Args:
        lengths: N sequence lengths in tokens.
        max_tokens: padded tokens per batch (rows x longest length).
        max_rows: rows per batch at most.

    Returns:
        A list of batches, each a list of indices into ``lengths``; every index appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and (new_max * (len(cur) + 1) > max_tokens or len(cur) >= max_rows):
            out.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter; CPU for a module without parameters."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def bf16_autocast(enabled: bool):
    """A ``torch.autocast`` context in bfloat16 on the run's device (:func:`w2s_shift.device.current_device`); a no-op
    when not ``enabled``."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(current_device(), dtype=torch.bfloat16)


def pad_sequences(seqs: list, pad_id: int) -> tuple:
    """Right-pad token id lists into one batch (``torch.nn.utils.rnn.pad_sequence``; no tokenizer is at hand where
    cached trunk states and packed rows are batched, so ``tokenizer.pad`` does not fit).

    Args:
        seqs: N non-empty lists of token ids.
        pad_id: the id written after each sequence's end (masked out, never read by the models here).

    Returns:
        (ids, mask): two (N, T) int64 CPU tensors, T = the longest length; ``mask`` is 1 on real tokens, 0 on
        padding (the ``attention_mask`` of Hugging Face models).

    Raises:
        ValueError: ``seqs`` is empty.
    """
    if not seqs:
        raise ValueError("pad_sequences: no sequences to pad")
    from torch.nn.utils.rnn import pad_sequence

    rows = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    ids = pad_sequence(rows, batch_first=True, padding_value=pad_id)
    am = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_value=0)
    return ids, am


def batch_inputs(seqs: list, states: list | None, b: list, pad_id: int, dev) -> dict:
    """Model inputs for the sequences ``b`` (indices into ``seqs``), right-padded, on device ``dev``.

    Returns ``input_ids`` (len(b), T) int64 or, with cached trunk states (one (T_i, H) tensor per sequence),
    ``inputs_embeds`` (len(b), T, H) float32 with zeros on padding; always ``attention_mask`` (len(b), T).
    """
    ids, am = pad_sequences([seqs[i] for i in b], pad_id)
    if states is None:
        return {"input_ids": ids.to(dev), "attention_mask": am.to(dev)}
    emb = torch.zeros((len(b), ids.shape[1], states[b[0]].shape[-1]), dtype=torch.float32)
    for k, i in enumerate(b):
        emb[k, : states[i].shape[0]] = states[i].float()
    return {"inputs_embeds": emb.to(dev), "attention_mask": am.to(dev)}


@torch.no_grad()
def compute_trunk_states(
    trunk: torch.nn.Module,
    seqs: list,
    pad_id: int,
    max_tokens: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    desc: str = "trunk states",
) -> list:
    """Run the frozen trunk once over token sequences; return each sequence's states (T_i, H) in ``dtype``.

    Args:
        trunk: module returning ``last_hidden_state`` (N, T, H) from ``input_ids``/``attention_mask``.
        seqs: list of token id lists.
        max_tokens: padded tokens per forward.
        dtype: storage dtype (bfloat16 halves memory; the trunk also runs in it when it is bfloat16).
    """
    out: list = [None] * len(seqs)
    trunk.eval()
    dev = module_device(trunk)
    for b in tqdm(batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=leave_bars()):
        ids, am = (x.to(dev) for x in pad_sequences([seqs[i] for i in b], pad_id))
        h = trunk(input_ids=ids, attention_mask=am, use_cache=False).last_hidden_state
        for k, i in enumerate(b):
            out[i] = h[k, : len(seqs[i])].to("cpu", dtype).clone()
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
) -> np.ndarray:
    """Rewards r(x, y) of token sequences, in input order.

    Args:
        model: a :class:`~w2s_shift.models.reward_model.RewardModel`.
        seqs: list of token id lists (N sequences).
        states: optional cached trunk states per sequence (then ``model`` is a split head).
        bf16: run under bfloat16 autocast (as in training).

    Returns:
        (N,) float64 rewards.
    """
    model.eval()
    dev = module_device(model)
    out = np.zeros(len(seqs), dtype=np.float64)
    for b in tqdm(batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=leave_bars()):
        inputs = batch_inputs(seqs, states, b, pad_id, dev)
        with bf16_autocast(bf16):
            r, _ = model(**inputs)
        out[b] = r.double().cpu().numpy()
    return out


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
            o = backbone(**inputs, use_cache=False, output_hidden_states=layers is not None)
        h = o.last_hidden_state if layers is None else torch.stack(select_layers(o, layers, layer_offset), dim=2)
        for k, i in enumerate(b):
            m = torch.tensor(response_masks[i], dtype=torch.bool, device=h.device)
            out[i] = h[k, : len(seqs[i])][m].to("cpu", dtype).clone()
    return out


__all__ = [
    "batch_inputs",
    "batches_by_tokens",
    "bf16_autocast",
    "compute_reference_states",
    "compute_trunk_states",
    "finite_or_raise",
    "module_device",
    "pad_sequences",
    "score_sequences",
]

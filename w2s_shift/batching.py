"""Right padding and token-budget batching of token sequences, one rule for every forward of the project (scoring,
trunk and reference states, drift, ``score``, the export check, LM log-probabilities): :func:`pad_sequences` (right
padding with an attention mask), :func:`batches_by_tokens`, :func:`batch_inputs`, and the device and precision of a
forward (:func:`module_device`, :func:`bf16_autocast`). Below the models: it imports only torch and
:mod:`w2s_shift.device`."""

from __future__ import annotations

import contextlib

import torch

from .device import autocast, current_device


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
    return autocast(current_device())


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

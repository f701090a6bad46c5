"""Inference with the project's models: right padding, token-budget batching, rewards of token sequences, and the
frozen trunk's / reference's hidden states (computed once, cached by the pipeline).

The padding (:func:`pad_sequences`: right padding with an attention mask) and token-budget batching
(:func:`batches_by_tokens`) here are the ones used for scoring, trunk and reference states, drift
(:mod:`w2s_shift.metrics.drift`), ``score``, the export check and LM log-probabilities (:mod:`w2s_shift.models.lm`).
Metrics on the rewards: :mod:`w2s_shift.metrics.stats`.
"""

from __future__ import annotations

import contextlib
import inspect

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
            chat template's system turn and the prompt) are run once, and the prefix common to a group of pairs
            once per group, with the cached keys and values; the states equal the plain pass's up to the
            rounding of the trunk's dtype. Groups of at most 64 pairs and 4 x ``max_tokens`` tokens bound the
            memory of the cached keys and values.

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
        n = len(seqs) // 2
        pair_len = [max(len(seqs[i]), len(seqs[i + n])) for i in range(n)]
        for grp in tqdm(batches_by_tokens(pair_len, 4 * max_tokens), desc=desc, leave=leave_bars()):
            states = _shared_prefix_states(trunk, [seqs[i] for i in grp] + [seqs[i + n] for i in grp], max_tokens)
            for k, i in enumerate(grp):
                out[i] = states[k].to("cpu", dtype).clone()
                out[i + n] = states[k + len(grp)].to("cpu", dtype).clone()
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
    :func:`~w2s_shift.models.reward_model.split_decoder` cuts). Encoders (bidirectional) and sliding-window
    attention (a window would see different tokens after the middle padding used here) are excluded."""
    from .models.reward_model import SPLITTABLE

    cfg = getattr(trunk, "config", None)
    if getattr(cfg, "model_type", None) not in SPLITTABLE or not hasattr(trunk, "layers"):
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


def _extend(trunk: torch.nn.Module, pasts: list, news: list, max_tokens: int) -> tuple:
    """Run a causal trunk on new tokens after cached prefixes.

    Rows of a batch hold their prefix's keys and values padded at its end to the batch's longest prefix (the
    padding masked out), then the new tokens at positions continuing their own prefix; a causal decoder's states
    then equal those of the whole sequence run at once.

    Args:
        pasts: per item, None (no prefix) or a list over blocks of (keys, values), each (1, kv_heads, P_i, head_dim).
        news: per item, a non-empty list of token ids (N_i tokens).

    Returns:
        (states, caches): per item the states (N_i, H) of its new tokens, on the trunk's device and dtype, and its
        cache over prefix and new tokens (the form of ``pasts``).
    """
    from transformers import DynamicCache

    dev = module_device(trunk)
    n_blocks = len(trunk.layers)
    plen = [0 if p is None else p[0][0].shape[2] for p in pasts]
    states, caches = [None] * len(news), [None] * len(news)
    for b in batches_by_tokens([plen[i] + len(news[i]) for i in range(len(news))], max_tokens):
        big_p, big_n = max(plen[i] for i in b), max(len(news[i]) for i in b)
        ids = torch.zeros((len(b), big_n), dtype=torch.long)
        mask = torch.zeros((len(b), big_p + big_n), dtype=torch.long)
        pos = torch.zeros((len(b), big_n), dtype=torch.long)
        for r, i in enumerate(b):
            ids[r, : len(news[i])] = torch.as_tensor(news[i])
            mask[r, : plen[i]] = 1
            mask[r, big_p : big_p + len(news[i])] = 1
            pos[r] = plen[i] + torch.arange(big_n)
        cache = DynamicCache()
        if big_p:
            k0 = next(pasts[i] for i in b if plen[i])[0][0]
            data = []
            for layer in range(n_blocks):
                kv = []
                for t in (0, 1):
                    rows = []
                    for i in b:
                        pad = k0.new_zeros((1, k0.shape[1], big_p - plen[i], k0.shape[3]))
                        rows.append(torch.cat([pasts[i][layer][t], pad], 2) if plen[i] else pad)
                    kv.append(torch.cat(rows))
                data.append(tuple(kv))
            cache = DynamicCache(data)
        # transformers renamed the cache argument and output field from past_key_values to cache within 5.x
        key = "cache" if "cache" in inspect.signature(trunk.forward).parameters else "past_key_values"
        out = trunk(
            input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=True, **{key: cache}
        )
        kv = out[key]
        for r, i in enumerate(b):
            n = len(news[i])
            states[i] = out.last_hidden_state[r, :n]
            caches[i] = [
                tuple(
                    torch.cat([t[r : r + 1, :, : plen[i]], t[r : r + 1, :, big_p : big_p + n]], 2)
                    for t in (kv.layers[layer].keys, kv.layers[layer].values)
                )
                for layer in range(n_blocks)
            ]
    return states, caches


def _shared_prefix_states(trunk: torch.nn.Module, seqs: list, max_tokens: int) -> list:
    """States of ``seqs`` = [chosen_1..chosen_B, rejected_1..rejected_B] in three passes: the prefix common to all
    of them once, then each pair's common prefix beyond it once, then each sequence's own tail (every sequence
    keeps at least its last token in its tail)."""
    n = len(seqs) // 2
    g = 0
    while all(len(s) > g + 1 and s[g] == seqs[0][g] for s in seqs):
        g += 1
    p = [max(g, min(_common_prefix(seqs[i], seqs[i + n]), len(seqs[i]) - 1, len(seqs[i + n]) - 1)) for i in range(n)]
    if g:
        (s_g,), (kv_g,) = _extend(trunk, [None], [seqs[0][:g]], max_tokens)
    else:
        s_g, kv_g = None, None
    own = [i for i in range(n) if p[i] > g]
    s1, kv1 = _extend(trunk, [kv_g] * len(own), [seqs[i][g : p[i]] for i in own], max_tokens) if own else ([], [])
    pair_s, pair_kv = [s_g] * n, [kv_g] * n
    for j, i in enumerate(own):
        pair_s[i], pair_kv[i] = s1[j] if s_g is None else torch.cat([s_g, s1[j]]), kv1[j]
    tails, _ = _extend(
        trunk, [pair_kv[i % n] for i in range(2 * n)], [s[p[i % n] :] for i, s in enumerate(seqs)], max_tokens
    )
    return [tails[i] if pair_s[i % n] is None else torch.cat([pair_s[i % n], tails[i]]) for i in range(2 * n)]


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
    "can_share_prefixes",
    "compute_reference_states",
    "compute_trunk_states",
    "finite_or_raise",
    "module_device",
    "pad_sequences",
    "score_sequences",
]

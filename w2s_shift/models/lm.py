"""Language-model log-probabilities from a base backbone (``AutoModel``, no LM head).

The project loads every model as ``AutoModel``: the transformer without its language-model head. Most
small instruct models tie the output projection to the input embedding (``config.tie_word_embeddings``;
SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B do), so the head is the embedding matrix E (V, H) and

    log p(token_t = v | tokens_<t) = log_softmax(h_{t-1} E^T)_v,

with h_{t-1} the backbone's last-layer output (after its final norm) at position t-1. Models whose head is
untied (Llama-3.1-8B, Qwen2.5-7B) keep it in the ``*ForCausalLM`` class only: :func:`lm_head_weight`
refuses them unless the weight is passed explicitly. Gemma-2/3's final logit soft-capping
(``config.final_logit_softcapping``: logits = c * tanh(logits / c)) is applied; no other head-side
transform is.

Used by SEAM (:mod:`w2s_shift.methods.seam`) for the pretrained strong model's yes/no judgments.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batching import batch_inputs, batches_by_tokens, bf16_autocast, module_device, pad_sequences
from .reward_model import last_token_index

LOGIT_ROWS = 1024  # positions whose (V,) logits are materialised at once (memory: LOGIT_ROWS * V * 4 bytes)


def _config(backbone):
    cfg = getattr(backbone, "config", None)
    if cfg is None:
        raise ValueError(f"{type(backbone).__name__} has no .config; expected a Hugging Face AutoModel backbone")
    return cfg


def lm_head_weight(backbone: torch.nn.Module, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The LM-head matrix W (V, H) such that logits = h W^T, for a decoder-only ``AutoModel`` backbone.

    Args:
        backbone: a Hugging Face base model (e.g. ``LlamaModel``) whose input embedding is (V, H).
        weight: an explicit head weight (V, H) for a model with an untied head (loaded by the caller from
            the checkpoint's ``lm_head.weight``); checked against the embedding's shape.

    Returns:
        ``weight`` if given, else the input embedding matrix (shared storage, not a copy) when
        ``config.tie_word_embeddings`` is true.

    Raises:
        ValueError: the backbone is not a left-to-right LM (an encoder such as BERT, whose LM head has an
            extra transform, or an encoder-decoder); the head is untied and no ``weight`` is given; or
            ``weight`` has the wrong shape.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    cfg = _config(backbone)
    mt = getattr(cfg, "model_type", "?")
    if (
        getattr(cfg, "is_encoder_decoder", False)
        or mt in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        or mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    ):
        raise ValueError(
            f"model type {mt!r} is not a decoder-only causal language model; LM log-probabilities "
            "need one (the pretrained strong student, e.g. Llama or Qwen)"
        )
    emb = backbone.get_input_embeddings().weight
    if weight is not None:
        if tuple(weight.shape) != tuple(emb.shape):
            raise ValueError(
                f"LM head weight has shape {tuple(weight.shape)}; model type {mt!r} needs "
                f"(vocab, hidden) = {tuple(emb.shape)}"
            )
        return weight
    if not getattr(cfg, "tie_word_embeddings", False):
        raise ValueError(
            f"model type {mt!r} has an untied LM head (config.tie_word_embeddings is false) that the "
            "AutoModel backbone does not hold; pass the head weight explicitly (its lm_head.weight) or "
            "use a model with tied embeddings"
        )
    return emb


def _logits(hidden: torch.Tensor, head_w: torch.Tensor, cfg) -> torch.Tensor:
    """(K, H) hidden states -> (K, V) float32 logits (matmul in the head's dtype, soft-capping if configured)."""
    logits = (hidden.to(head_w.dtype) @ head_w.T).float()
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.no_grad()
def sequence_logprobs(
    backbone: torch.nn.Module,
    head_w: torch.Tensor,
    seqs: list,
    target_masks: list,
    pad_id: int,
    max_tokens: int = 8192,
    bf16: bool = False,
    reduce: str = "mean",
    states: list | None = None,
) -> np.ndarray:
    """Log-likelihood of the target tokens of each sequence: sum or mean over t with mask_t = 1 of
    log p(token_t | tokens_<t) (natural log, nats).

    Position 0 is never scored: it has no context to be predicted from. A mask of 1 there is ignored, so a
    mask of all ones scores tokens 1..T-1. With the response mask of :func:`w2s_shift.data.render.encode`
    this is the response log-likelihood given the prompt.

    Sequences are grouped into right-padded batches of at most ``max_tokens`` padded tokens (attention mask
    on the real tokens; causal attention means padding never affects real positions). Logits are computed
    only at the positions that predict a target (hidden @ head_w^T, ``LOGIT_ROWS`` positions at a time),
    then log_softmax in float32.

    Args:
        backbone: decoder-only ``AutoModel`` returning ``last_hidden_state`` (N, T, H).
        head_w: (V, H) LM head, from :func:`lm_head_weight`.
        seqs: N token id lists.
        target_masks: N lists of 0/1, each as long as its sequence.
        pad_id: id used for padding (never read).
        max_tokens: padded tokens per forward.
        bf16: run the backbone under bfloat16 autocast.
        reduce: ``"mean"`` (per scored token) or ``"sum"``.
        states: optional cached trunk states, one (T_i, H) tensor per sequence
            (:func:`w2s_shift.inference.compute_trunk_states`); then ``backbone`` is the top slice of a
            :func:`~w2s_shift.models.reward_model.split_decoder` split (``inputs_embeds`` in, final norm kept) and
            only the top layers run: the same log-likelihoods as the whole backbone, for a fraction of its cost.

    Returns:
        (N,) float64 log-likelihoods in nats, in input order.

    Raises:
        ValueError: ``reduce`` unknown; masks and sequences differ in number or length; a sequence has no
            scored target (mask all zero outside position 0).
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    if len(seqs) != len(target_masks):
        raise ValueError(f"{len(seqs)} sequences but {len(target_masks)} target masks")
    for i, (s, m) in enumerate(zip(seqs, target_masks)):
        if len(s) != len(m):
            raise ValueError(f"sequence {i}: {len(s)} tokens but a target mask of length {len(m)}")
        if not any(m[1:]):
            raise ValueError(f"sequence {i}: no target token to score (mask is 0 everywhere after position 0)")
    cfg = _config(backbone)
    backbone.eval()
    dev = module_device(backbone)
    head_w = head_w.to(dev)
    total = np.zeros(len(seqs), dtype=np.float64)
    count = np.zeros(len(seqs), dtype=np.float64)
    for b in batches_by_tokens([len(s) for s in seqs], max_tokens):
        inputs = batch_inputs(seqs, states, b, pad_id, dev)
        ids, am = pad_sequences([seqs[i] for i in b], pad_id)[0].to(dev), inputs["attention_mask"]
        tgt = torch.zeros_like(am, dtype=torch.bool)
        for k, i in enumerate(b):
            tgt[k, : len(seqs[i])] = torch.tensor(target_masks[i], dtype=torch.bool)
        tgt[:, 0] = False
        with bf16_autocast(bf16):
            h = backbone(**inputs, use_cache=False).last_hidden_state
        rows, cols = tgt.nonzero(as_tuple=True)  # target (row, t); predicted from position t - 1
        lp = torch.empty(rows.shape[0], dtype=torch.float32, device=dev)
        for lo in range(0, rows.shape[0], LOGIT_ROWS):
            r, c = rows[lo : lo + LOGIT_ROWS], cols[lo : lo + LOGIT_ROWS]
            logits = _logits(h[r, c - 1], head_w, cfg)
            lp[lo : lo + LOGIT_ROWS] = torch.log_softmax(logits, -1).gather(1, ids[r, c].unsqueeze(1)).squeeze(1)
        sums = torch.zeros(len(b), dtype=torch.float64, device=dev).index_add_(0, rows, lp.double())
        total[b] = sums.cpu().numpy()
        count[b] = tgt.sum(1).double().cpu().numpy()
    return total / count if reduce == "mean" else total


def _first_token(tokenizer, text: str, what: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"{what} answer {text!r} produces no token")
    return int(ids[0])


@torch.no_grad()
def next_token_logprob_diff(
    backbone: torch.nn.Module,
    head_w: torch.Tensor,
    tokenizer,
    prompts: list,
    yes: str = " Yes",
    no: str = " No",
    max_tokens: int = 8192,
    bf16: bool = False,
    max_length: int | None = None,
) -> np.ndarray:
    """log p(yes | prompt) - log p(no | prompt) for the next token after each prompt (nats).

    Only the first token of each answer string is compared (``yes``/``no`` are tokenized without special
    tokens). Each prompt is tokenized as-is with the tokenizer's own special tokens (no chat template);
    one longer than ``max_length`` tokens (default: ``config.max_position_embeddings``) keeps its last
    ``max_length`` tokens, so a question placed at the end of the prompt survives.

    Args:
        backbone, head_w: as in :func:`sequence_logprobs`.
        tokenizer: the backbone's tokenizer.
        prompts: N strings.

    Returns:
        (N,) float64 log-probability differences, in input order.

    Raises:
        ValueError: an answer produces no token, both answers start with the same token, or a prompt
            produces no token.
    """
    yes_id, no_id = _first_token(tokenizer, yes, "yes"), _first_token(tokenizer, no, "no")
    if yes_id == no_id:
        raise ValueError(f"answers {yes!r} and {no!r} start with the same token ({yes_id}); they cannot be told apart")
    cfg = _config(backbone)
    limit = max_length or getattr(cfg, "max_position_embeddings", None)
    seqs = []
    for i, p in enumerate(prompts):
        ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        if not ids:
            raise ValueError(f"prompt {i} produces no token")
        seqs.append(ids[-limit:] if limit else ids)
    backbone.eval()
    dev = module_device(backbone)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    pick = torch.tensor([yes_id, no_id], device=dev)
    head_w = head_w.to(dev)  # once, not per batch
    out = np.zeros(len(seqs), dtype=np.float64)
    for b in batches_by_tokens([len(s) for s in seqs], max_tokens):
        ids, am = (x.to(dev) for x in pad_sequences([seqs[i] for i in b], pad_id))
        with bf16_autocast(bf16):
            h = backbone(input_ids=ids, attention_mask=am, use_cache=False).last_hidden_state
        last = h[torch.arange(len(b), device=dev), last_token_index(am)]
        lp = torch.log_softmax(_logits(last, head_w, cfg), -1)[:, pick]
        out[b] = (lp[:, 0] - lp[:, 1]).double().cpu().numpy()
    return out


__all__ = ["lm_head_weight", "next_token_logprob_diff", "sequence_logprobs"]

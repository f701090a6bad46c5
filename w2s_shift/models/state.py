"""Trained-state files: a safetensors file with only the parameters that train (``requires_grad``) plus the
scalar ``score`` head -- the top layers of a partially fine-tuned student, or the LoRA adapters under peft. Small;
the pipeline keeps one per trained model (``models/<label>.safetensors``) and builds exports from it. The pipeline
writes the model's training digest into the file's header (``digest``) and checks it on every load, so weights
swapped or copied between models (same shapes, so no other check sees it) are never used for the wrong model."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..io import write_bytes_atomic

STATE_FORMAT = "w2s-shift trained state"


def trainable_parameters(model: nn.Module) -> dict:
    """{name: parameter} of every ``requires_grad`` parameter plus ``score.weight`` (as held: possibly sharded)."""
    out = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if isinstance(getattr(model, "score", None), nn.Module):
        for n, p in model.score.named_parameters():
            out.setdefault(f"score.{n}", p)
    return out


def trainable_state(model: nn.Module) -> dict:
    """The parameters that train, by name, whole: every ``requires_grad`` parameter plus ``score.weight``.

    A model sharded across processes gives its full tensors: FSDP2 parameters (DTensors) through
    ``DTensor.full_tensor()``, DeepSpeed ZeRO-3 partitions inside ``deepspeed.zero.GatheredParameters``. Both are
    collectives: call this on every process, in the same order (the pipeline does, before the main process writes
    the file).

    Returns:
        {name: tensor}, names as in ``model.named_parameters()``: detached views for a whole model, gathered
        copies for a sharded one.
    """
    out = trainable_parameters(model)
    partitioned = [p for p in out.values() if hasattr(p, "ds_id")]
    if partitioned:  # ZeRO-3: each process holds a partition; gather them for the copy
        import deepspeed

        with deepspeed.zero.GatheredParameters(partitioned):
            return {n: p.detach().clone() for n, p in out.items()}
    return {n: (p.full_tensor() if type(p).__name__ == "DTensor" else p).detach() for n, p in out.items()}


def save_state_tensors(tensors: dict, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Write {name: tensor} (:func:`trainable_state`) to a safetensors file, atomically, with the header
    ``format`` / ``version`` and ``metadata`` ({str: str}, e.g. the training digest). Returns the path written."""
    from safetensors.torch import save

    tensors = {n: t.to("cpu").contiguous().clone() for n, t in tensors.items()}
    meta = {"format": STATE_FORMAT, "version": "1"}
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    path = Path(path)
    write_bytes_atomic(path, save(tensors, metadata=meta))
    return path


def save_trained_state(model: nn.Module, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Write the trainable parameters of ``model`` (see :func:`trainable_state`) to a safetensors file, atomically.

    Under LoRA (a peft-wrapped backbone) these are the adapter matrices and the reward head; for a split
    student the head's layers, final norm and reward head. For a model sharded across processes, call
    :func:`trainable_state` on every process and :func:`save_state_tensors` on one.

    Args:
        model: a :class:`RewardModel` (any module with a ``score`` head works).
        path: the file to write (``.safetensors``).
        metadata: optional {str: str} stored in the file header (e.g. method, seed).

    Returns:
        the path written.
    """
    return save_state_tensors(trainable_state(model), path, metadata)


def digest_mismatch(meta: dict, digest: str | None) -> str | None:
    """Why a trained-state file whose header is ``meta`` does not belong to training digest ``digest``, or None.

    None also when ``digest`` is None or the file predates the header digest (no ``digest`` key)."""
    saved = meta.get("digest")
    if digest is None or saved is None or saved == digest:
        return None
    return (
        f"these weights were saved by training digest {saved}, not {digest} (the file was swapped with or copied "
        "from another model's)"
    )


def saved_weights_problem(path: str | os.PathLike, digest: str) -> str | None:
    """What stops a saved trained-state file from being reused as training digest ``digest``'s weights, or None.

    Reads the header only (no tensor): a missing or unreadable file, another format, or another digest in the
    header (:func:`digest_mismatch`)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for a damaged header or a truncated file
        return f"{path}: not a readable safetensors file ({type(e).__name__}: {e})"
    if meta.get("format") != STATE_FORMAT:
        return f"{path}: not a w2s-shift trained-state file (header format {meta.get('format')!r})"
    wrong = digest_mismatch(meta, digest)
    return f"{path}: {wrong}" if wrong else None


def load_trained_state(model: nn.Module, path: str | os.PathLike, digest: str | None = None) -> dict:
    """Copy a file written by :func:`save_trained_state` into ``model`` (built the same way: same split,
    same peft wrapping), in place.

    Args:
        digest: the training digest the weights must carry in their header (:func:`digest_mismatch`); None: any.

    Returns:
        the file's metadata {str: str}.

    Raises:
        ValueError: the file is unreadable or not a trained-state file, its header names another training digest,
            a tensor name is missing on either side, or a shape differs (the message lists up to five of each).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: trained-state file not found")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: not a w2s-shift trained-state file (header format {meta.get('format')!r})")
    wrong = digest_mismatch(meta, digest)
    if wrong:
        raise ValueError(f"{path}: {wrong}")
    params = dict(model.named_parameters())
    expected = set(trainable_parameters(model))
    unknown = sorted(set(tensors) - set(params))
    missing = sorted(expected - set(tensors))
    shapes = [
        f"{n}: file {tuple(t.shape)} vs model {tuple(params[n].shape)}"
        for n, t in tensors.items()
        if n in params and tuple(t.shape) != tuple(params[n].shape)
    ]
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} tensors the model does not have (e.g. {', '.join(unknown[:5])})")
    if missing:
        problems.append(f"{len(missing)} trainable parameters not in the file (e.g. {', '.join(missing[:5])})")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatches ({'; '.join(shapes[:5])})")
    if problems:
        raise ValueError(
            f"{path}: does not fit this model: "
            + "; ".join(problems)
            + ". Build the model as it was trained (same base, trainable_layers, LoRA settings)."
        )
    with torch.no_grad():
        for n, t in tensors.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
    return meta

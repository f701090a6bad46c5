"""Data-parallel helpers on top of accelerate and torch.distributed (no engine of our own).

Training scales out through ``transformers.Trainer`` + accelerate (DDP, FSDP, DeepSpeed ZeRO): launch with
``accelerate launch --config_file w2s_shift/configs/accelerate/<backend>.yaml -m w2s_shift run CONFIG``.
Each process then trains on ``batch_size / world_size`` pairs per optimizer step (:func:`per_device_batch`),
so the global batch and the number of optimizer steps equal a one-process run.

What the Trainer does not cover is inference outside it (teacher labelling, scoring the evaluation sets)
and writing result files once. For those:

* :func:`sharded` / :func:`score_sequences_sharded`: each process scores its shard, the shards are
  gathered back into input order, padding duplicates dropped, and every index checked to appear exactly once.
* :func:`run_on_main`: run a writer (e.g. ``write_json_atomic``) on the main process only; the others wait
  for it and raise if it failed (no process goes on to read a file that was never written).

Every function works in a plain single process with no torch.distributed initialised: it then computes
the whole input itself and returns what the one-process code returns.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

PAD_INDEX = -1
"""Index of a padding slot in a shard (:func:`shard_indices` with ``pad=True``); its value is discarded."""


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def world() -> tuple:
    """(rank, world_size) of this process: from torch.distributed when initialised, else from the launcher's
    ``RANK`` / ``WORLD_SIZE`` environment (set by ``accelerate launch`` and ``torchrun``), else (0, 1)."""
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_distributed() -> tuple:
    """Initialise the process group through accelerate when the launcher started several processes and nobody
    has yet (e.g. teacher scoring before the first Trainer); returns (rank, world_size).

    The backend is accelerate's choice: nccl on GPUs, gloo on CPUs.
    """
    if _dist() is None and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())
    return world()


def is_main_process() -> bool:
    """True on the global rank 0 (the process that writes result files)."""
    return world()[0] == 0


def barrier() -> None:
    """Wait for every process (no-op in a single process)."""
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()


def per_device_batch(batch_size: int, world_size: int) -> int:
    """Pairs per process per optimizer step so that ``world_size`` processes take the global ``batch_size``.

    Raises:
        ValueError: ``batch_size`` is not a multiple of ``world_size`` (the global batch, hence the number
            of optimizer steps, would differ from a one-process run).
    """
    if batch_size < 1 or world_size < 1:
        raise ValueError(f"batch_size and world_size must be >= 1, got {batch_size} and {world_size}")
    if batch_size % world_size:
        raise ValueError(
            f"batch_size {batch_size} (pairs per optimizer step) is not divisible by the {world_size} "
            f"processes; use a multiple of {world_size} (e.g. {world_size * max(1, round(batch_size / world_size))})"
        )
    return batch_size // world_size


def shard_indices(n: int, rank: int, world_size: int, strided: bool = True, pad: bool = False) -> list:
    """Indices of the items ``0..n-1`` that process ``rank`` of ``world_size`` handles.

    Args:
        strided: ``rank, rank + W, rank + 2W, ...`` (balances lengths when items are sorted); else one
            contiguous block (sizes differ by at most one, the first ``n % W`` blocks are longer).
        pad: give every process ``ceil(n / W)`` slots, filling short shards with :data:`PAD_INDEX`, so that
            every process makes the same number of calls (needed when a forward is a collective).

    Returns:
        list of int; the shards of all ranks together hold each index exactly once (plus padding).

    Raises:
        ValueError: n < 0, world_size < 1 or rank outside 0..world_size-1.
    """
    if n < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"shard_indices needs n >= 0, world_size >= 1 and 0 <= rank < world_size; "
            f"got n={n}, rank={rank}, world_size={world_size}"
        )
    if strided:
        idx = list(range(rank, n, world_size))
    else:
        base, extra = divmod(n, world_size)
        start = rank * base + min(rank, extra)
        idx = list(range(start, start + base + (rank < extra)))
    if pad:
        idx += [PAD_INDEX] * (math.ceil(n / world_size) - len(idx))
    return idx


def _all_gather(obj) -> list:
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _as_array(values: list):
    if values and all(np.ndim(v) == 0 and isinstance(np.asarray(v).item(), (int, float, bool)) for v in values):
        return np.asarray(values)
    return values


def gather_in_order(local_values: Sequence, local_indices: Sequence, n: int):
    """Collect every process's ``(index, value)`` pairs and put the values back in the original order.

    Args:
        local_values: this process's values, one per entry of ``local_indices``.
        local_indices: this process's item indices; :data:`PAD_INDEX` marks a padding slot whose value is dropped.
        n: the number of items in all.

    Returns:
        the n values in index order: a numpy array when every value is a number, else a list.
        In a single process, the local values reordered.

    Raises:
        ValueError: lengths differ, or after dropping padding some index in 0..n-1 is missing, appears
            twice or is out of range (the message lists the first offenders); raised on every process.
    """
    local_indices = [int(i) for i in local_indices]
    local_values = list(local_values)
    if len(local_values) != len(local_indices):
        raise ValueError(f"gather_in_order: {len(local_values)} values for {len(local_indices)} indices")
    parts = _all_gather((local_indices, local_values))
    out: list = [None] * n
    count = np.zeros(n, dtype=np.int64)
    bad = []
    for idx, vals in parts:
        for i, v in zip(idx, vals):
            if i == PAD_INDEX:
                continue
            if not 0 <= i < n:
                bad.append(i)
                continue
            count[i] += 1
            out[i] = v
    missing, doubled = np.flatnonzero(count == 0).tolist(), np.flatnonzero(count > 1).tolist()
    if bad or missing or doubled:
        raise ValueError(
            f"gather_in_order: the shards do not cover 0..{n - 1} exactly once: "
            f"{len(missing)} missing {missing[:5]}, {len(doubled)} doubled {doubled[:5]}, "
            f"{len(bad)} out of range {bad[:5]}"
        )
    return _as_array(out)


def sharded(fn: Callable[[list], Sequence], items: Sequence, strided: bool = True, pad: bool = True):
    """Run ``fn`` on this process's shard of ``items`` and gather the results of all processes in order.

    Args:
        fn: maps a list of items to a sequence of as many values (e.g. rewards); it must be deterministic
            and independent across items, since a padding slot re-runs ``items[0]`` and is discarded.
        items: the full list (every process passes the same one).
        strided, pad: see :func:`shard_indices`.

    Returns:
        ``fn(items)`` computed piecewise: a numpy array when the values are numbers, else a list. In a
        single process with no torch.distributed, exactly ``fn(list(items))``.

    Raises:
        ValueError: ``fn`` returned the wrong number of values, or the gather check failed.
        RuntimeError: ``fn`` failed on another process (named); the failing process re-raises its own error.
            Every process raises, so none is left waiting in a collective.
    """
    items = list(items)
    rank, ws = init_distributed()
    if ws == 1:
        return fn(items)
    idx = shard_indices(len(items), rank, ws, strided=strided, pad=pad)
    local = [items[i] if i != PAD_INDEX else items[0] for i in idx]
    err, exc, vals = None, None, []
    try:
        vals = list(fn(local)) if local else []
        if len(vals) != len(local):
            raise ValueError(f"sharded: fn returned {len(vals)} values for {len(local)} items")
    except Exception as e:  # noqa: BLE001 -- every process learns of it below
        err, exc = f"{type(e).__name__}: {e}", e
    failed = [(r, m) for r, m in enumerate(_all_gather(err)) if m is not None]
    if failed:
        if exc is not None:
            raise exc
        raise RuntimeError(f"sharded: process {failed[0][0]} failed: {failed[0][1]}")
    return gather_in_order(vals, idx, len(items))


def is_sharded_model(model: torch.nn.Module) -> bool:
    """True when the parameters are sharded across processes (FSDP2 DTensor, FSDP1 wrapper, DeepSpeed ZeRO-3),
    so that every forward is a collective that all processes must run in lockstep."""
    if any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        return True
    for p in model.parameters():
        if hasattr(p, "ds_id") or type(p).__name__ == "DTensor":
            return True
    return False


def score_sequences_sharded(
    model: torch.nn.Module, seqs: list, pad_id: int, states: list | None = None, **kwargs
) -> np.ndarray:
    """:func:`w2s_shift.inference.score_sequences` split over the processes: same arguments, same result
    ((N,) float64 rewards in input order), each process scoring about N / world_size sequences.

    The model must be whole on every process (one process, or DDP replicas; the unwrapped model after
    training). Raises ValueError for a model sharded by FSDP / ZeRO-3: gather its full weights first
    (``accelerator.get_state_dict``) or score it in one process.
    """
    from .inference import score_sequences

    if init_distributed()[1] > 1 and is_sharded_model(model):
        raise ValueError(
            "score_sequences_sharded: the model is sharded across processes (FSDP / ZeRO-3); shards would "
            "run different numbers of forwards and hang. Gather the full weights first or score in one process"
        )

    def fn(idx: list) -> np.ndarray:
        return score_sequences(
            model, [seqs[i] for i in idx], pad_id, states=None if states is None else [states[i] for i in idx], **kwargs
        )

    return np.asarray(sharded(fn, list(range(len(seqs)))), dtype=np.float64)


def run_on_main(fn: Callable, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on the main process only; every process returns when it has finished.

    Use for result files, e.g. ``run_on_main(write_json_atomic, path, obj)``. The other processes block on a
    broadcast from the main process (the barrier), so no process reads a file before it exists. If ``fn``
    raises on the main process, it re-raises there and the others raise RuntimeError naming the error.

    Returns:
        ``fn``'s result on the main process, None on the others.
    """
    rank, ws = init_distributed()
    if ws == 1:
        return fn(*args, **kwargs)
    result, err, exc = None, None, None
    if rank == 0:
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- reported to every process, re-raised below
            err, exc = f"{type(e).__name__}: {e}", e
    box = [err]
    _dist().broadcast_object_list(box, src=0)
    if box[0] is not None:
        if exc is not None:
            raise exc
        raise RuntimeError(f"the main process failed: {box[0]}")
    return result


def all_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a tensor over all processes (e.g. a logged loss part); the tensor itself in one process.
    It must sit on the backend's device (the model's device under nccl)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return value
    out = value.detach().clone().float()
    dist.all_reduce(out)
    return out / dist.get_world_size()


def set_layer_wrap_classes(model: torch.nn.Module) -> list:
    """Tell FSDP's transformer-layer auto-wrap (and ZeRO-3) which blocks to shard one by one.

    accelerate reads ``model._no_split_modules``; a :class:`~w2s_shift.models.reward_model.RewardModel` is a
    plain module, so the backbone's list is copied onto it, keeping only the classes present in the model
    (a split head has no embedding block). Without it FSDP wraps the whole model as one unit and gathers
    every parameter at once.

    Returns:
        the class names set (empty if the backbone declares none).
    """
    backbone = getattr(model, "backbone", None)
    names = list(getattr(backbone, "_no_split_modules", None) or [])
    present = {type(m).__name__ for m in model.modules()}
    keep = [n for n in names if n in present]
    if keep:
        model._no_split_modules = keep
    return keep


__all__ = [
    "PAD_INDEX",
    "world",
    "init_distributed",
    "is_main_process",
    "barrier",
    "per_device_batch",
    "shard_indices",
    "gather_in_order",
    "sharded",
    "score_sequences_sharded",
    "is_sharded_model",
    "run_on_main",
    "all_mean",
    "set_layer_wrap_classes",
]

"""Data-parallel helpers: a thin layer over accelerate, keeping only what it lacks.

Training scales out through ``transformers.Trainer`` + accelerate (DDP, FSDP, DeepSpeed ZeRO): launch with
``accelerate launch --config_file w2s_shift/configs/accelerate/<backend>.yaml -m w2s_shift run CONFIG``.
Each process then trains on ``batch_size / world_size`` pairs per optimizer step (:func:`per_device_batch`),
so the global batch and the number of optimizer steps equal a one-process run.

Inference outside the Trainer (teacher labelling, scoring the evaluation sets) uses accelerate's
``PartialState.split_between_processes(..., apply_padding=True)`` and ``accelerate.utils.gather_object``.
What accelerate does not give, and this module adds:

* :func:`gather_in_order` / :func:`sharded`: the gathered values are put back in input order and every index is
  checked to appear exactly once (accelerate's padding repeats the last item; it is dropped here); a failure
  of ``fn`` on one process makes every process raise instead of leaving the others waiting in a collective.
* :func:`run_on_main`: accelerate's ``on_main_process`` runs a writer on the main process only, but the other
  processes neither wait for it nor learn that it failed. Here they block until it has finished and raise if
  it failed, so no process goes on to read a result file that was never written.
* :func:`end_process`: how a process of a launched run ends, without the interpreter teardown that gloo's worker
  threads can abort.

Every function works in a plain single process with no torch.distributed: it then computes the whole input
itself and returns what the one-process code returns.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object, reduce

from .device import current_device


def state() -> PartialState:
    """accelerate's process state (a shared singleton). The first call in a process started by
    ``accelerate launch`` / ``torchrun`` initialises the process group: nccl on GPUs, gloo on CPUs."""
    return PartialState(cpu=current_device() == "cpu")


def world() -> tuple:
    """(rank, world_size) of this process: from accelerate once torch.distributed is initialised, else from the
    launcher's ``RANK`` / ``WORLD_SIZE`` environment (no process group is started), else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        s = state()
        return s.process_index, s.num_processes
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_distributed() -> tuple:
    """Initialise the process group through accelerate if the launcher started several processes and nobody
    has yet (e.g. teacher scoring before the first Trainer); returns (rank, world_size)."""
    s = state()
    return s.process_index, s.num_processes


def is_main_process() -> bool:
    """True on the global rank 0 (the process that writes result files); starts no process group."""
    return world()[0] == 0


def barrier() -> None:
    """Wait for every process (accelerate's ``wait_for_everyone``; no-op in a single process)."""
    state().wait_for_everyone()


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


def split_indices(n: int) -> tuple:
    """This process's share of the items ``0..n-1``, as accelerate's ``split_between_processes`` cuts it.

    Returns:
        (own, padded): ``own`` the indices this process is responsible for (one contiguous block; the blocks of
        all processes cover 0..n-1 once, sizes differ by at most one); ``padded`` the indices to run, ``own``
        followed by copies of ``n - 1`` up to ``ceil(n / world_size)`` entries (``apply_padding=True``), so that
        every process makes the same number of calls. One process: both are ``0..n-1``.
    """
    s, idx = state(), list(range(n))
    if n == 0:
        return [], []  # accelerate's padding reads inputs[-1]
    with s.split_between_processes(idx) as own, s.split_between_processes(idx, apply_padding=True) as padded:
        return list(own), list(padded)


def _is_number(v) -> bool:
    """A scalar number (Python, numpy or a 0-dim array / tensor), without converting anything else (a tuple of
    tensors of different shapes would not convert)."""
    if isinstance(v, (bool, int, float, np.number, np.bool_)):
        return True
    if isinstance(v, (np.ndarray, torch.Tensor)) and v.ndim == 0:
        return not v.dtype.is_complex if isinstance(v, torch.Tensor) else v.dtype.kind in "biuf"
    return False


def _as_array(values: list):
    if values and all(_is_number(v) for v in values):
        return np.asarray(values)
    return values


def gather_in_order(local_values: Sequence, local_indices: Sequence, n: int):
    """Collect every process's ``(index, value)`` pairs (``accelerate.utils.gather_object``) and put the values
    back in the original order, checking that each index 0..n-1 was scored exactly once across processes.

    Args:
        local_values: this process's values, one per entry of ``local_indices`` (padding already dropped).
        local_indices: this process's item indices.
        n: the number of items in all.

    Returns:
        the n values in index order: a numpy array when every value is a number, else a list.
        In a single process, the local values reordered.

    Raises:
        ValueError: lengths differ, or some index in 0..n-1 is missing, appears more than once or is out of
            range (the message lists the first offenders); raised on every process.
    """
    local_indices = [int(i) for i in local_indices]
    local_values = list(local_values)
    if len(local_values) != len(local_indices):
        raise ValueError(f"gather_in_order: {len(local_values)} values for {len(local_indices)} indices")
    state()
    parts = gather_object([(local_indices, local_values)])  # one (indices, values) per process, rank order
    out: list = [None] * n
    count = np.zeros(n, dtype=np.int64)
    bad = []
    for idx, vals in parts:
        for i, v in zip(idx, vals):
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


def sharded(fn: Callable[[list], Sequence], items: Sequence):
    """Run ``fn`` on this process's share of ``items`` (:func:`split_indices`) and gather every process's
    results in input order (:func:`gather_in_order`).

    Args:
        fn: maps a list of items to a sequence of as many values (e.g. rewards); it must be deterministic
            and independent across items, since a padding slot re-runs ``items[-1]`` and is discarded.
        items: the full list (every process passes the same one).

    Returns:
        ``fn(items)`` computed piecewise: a numpy array when the values are numbers, else a list. In a
        single process, exactly ``fn(list(items))``.

    Raises:
        ValueError: ``fn`` returned the wrong number of values, or the exactly-once check failed.
        RuntimeError: ``fn`` failed on another process (named); the failing process re-raises its own error.
            Every process raises, so none is left waiting in a collective.
    """
    items = list(items)
    if state().num_processes == 1 or not items:
        return fn(items)
    own, padded = split_indices(len(items))
    err, exc, vals = None, None, []
    try:
        vals = list(fn([items[i] for i in padded]))
        if len(vals) != len(padded):
            raise ValueError(f"sharded: fn returned {len(vals)} values for {len(padded)} items")
    except Exception as e:  # noqa: BLE001 -- every process learns of it below
        err, exc = f"{type(e).__name__}: {e}", e
    failed = [(r, m) for r, m in enumerate(gather_object([err])) if m is not None]
    if failed:
        if exc is not None:
            raise exc
        raise RuntimeError(f"sharded: process {failed[0][0]} failed: {failed[0][1]}")
    return gather_in_order(vals[: len(own)], own, len(items))  # padded == own + copies of the last index


def is_sharded_model(model: torch.nn.Module) -> bool:
    """True when the parameters are sharded across processes (FSDP2 DTensor, FSDP1 wrapper, DeepSpeed ZeRO-3),
    so that every forward is a collective that all processes must run in lockstep."""
    if any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        return True
    return any(hasattr(p, "ds_id") or type(p).__name__ == "DTensor" for p in model.parameters())


def score_sequences_sharded(
    model: torch.nn.Module, seqs: list, pad_id: int, states: list | None = None, with_pooled: bool = False, **kwargs
):
    """:func:`w2s_shift.inference.score_sequences` split over the processes: same arguments, same result
    ((N,) float64 rewards in input order; with ``with_pooled``, (rewards, (N, H) float32 pooled states)), each
    process scoring about N / world_size sequences.

    The model must be whole on every process (one process, or DDP replicas; the unwrapped model after
    training). Raises ValueError for a model sharded by FSDP / ZeRO-3: gather its full weights first
    (``accelerator.get_state_dict``) or score it in one process.
    """
    from .inference import score_sequences

    if state().num_processes > 1 and is_sharded_model(model):
        raise ValueError(
            "score_sequences_sharded: the model is sharded across processes (FSDP / ZeRO-3); shards would "
            "run different numbers of forwards and hang. Gather the full weights first or score in one process"
        )

    def fn(idx: list):
        out = score_sequences(
            model,
            [seqs[i] for i in idx],
            pad_id,
            states=None if states is None else [states[i] for i in idx],
            with_pooled=with_pooled,
            **kwargs,
        )
        return list(zip(*out)) if with_pooled else out  # per sequence: (reward, pooled state)

    got = sharded(fn, list(range(len(seqs))))
    if not with_pooled:
        return np.asarray(got, dtype=np.float64)
    return np.array([r for r, _ in got], dtype=np.float64), np.stack([h for _, h in got])


def run_on_main(fn: Callable, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on the main process only; every process returns when it has finished.

    Use for result files, e.g. ``run_on_main(write_json_atomic, path, obj)``. The other processes block on a
    broadcast from the main process (``accelerate.utils.broadcast_object_list``, a barrier), so no process
    reads a file before it exists. If ``fn`` raises on the main process, it re-raises there and the others
    raise RuntimeError naming the error.

    Returns:
        ``fn``'s result on the main process, None on the others.
    """
    s = state()
    if s.num_processes == 1:
        return fn(*args, **kwargs)
    result, err, exc = None, None, None
    if s.is_main_process:
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- reported to every process, re-raised below
            err, exc = f"{type(e).__name__}: {e}", e
    box = broadcast_object_list([err], from_process=0)
    if box[0] is not None:
        if exc is not None:
            raise exc
        raise RuntimeError(f"the main process failed: {box[0]}")
    return result


def min_over_processes(value):
    """The smallest of every process's ``value`` (a number, or None for unknown: None if any is None), the same on
    every process; ``value`` itself in one process. For decisions every process must take alike (whether a cache
    fits this machine's memory): each process reads its own free memory, and ranks that decided differently would
    leave the others waiting in a collective."""
    if state().num_processes == 1:
        return value
    values = gather_object([value])
    return None if any(v is None for v in values) else min(values)


def all_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a float tensor over all processes (``accelerate.utils.reduce``; e.g. a logged loss part), a
    float32 copy of it in one process. It must sit on the backend's device (the model's device under nccl)."""
    state()
    return reduce(value.detach().float(), reduction="mean")


class ShardedReference(torch.nn.Module):
    """The holder :func:`shard_like` shards in place of a frozen backbone: ``fully_shard`` swaps the class of the
    module it is called on for a generated ``FSDP<Name>`` subclass, and transformers registers which submodules'
    outputs ``output_hidden_states=True`` records by the model's class name, so a sharded ``LlamaModel`` itself would
    return ``hidden_states=None``. Sharding this holder instead leaves the backbone's class (and its recorded hidden
    states) as they were; its forward is the backbone's. ``layer_offset`` and ``autocast_bf16`` are read through."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.layer_offset = getattr(inner, "layer_offset", 0)
        self.autocast_bf16 = getattr(inner, "autocast_bf16", False)

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def shard_like(frozen: torch.nn.Module, trained: torch.nn.Module, mp_policy=None) -> torch.nn.Module:
    """Shard a frozen module (ANCHOR's frozen copy of the pretrained backbone) as FSDP2 shards the trained model:
    each of its blocks of the trained model's ``_no_split_modules`` classes, then the rest in a
    :class:`ShardedReference` holder (so the backbone's class and hidden-state recording stay as they were), on the
    trained model's device mesh (``torch.distributed.fsdp.fully_shard``), so each process holds 1 / world_size of it
    instead of a full replica, and each forward gathers one block at a time. Every process must then run the same
    forwards of it (the trainer does: one per micro-batch). A model that FSDP2 has not sharded, or a module sharded
    already, is returned as it is (DDP, ZeRO, one process: the copy stays a replica).

    Args:
        mp_policy: the student's ``MixedPrecisionPolicy`` (accelerate's, from the launcher's mixed precision), so the
            frozen copy computes in the student's precision: under ``mixed_precision: bf16`` both residual streams
            are bfloat16 and ANCHOR's term is exactly 0 before the first update. None: float32 parameters.

    Returns:
        the sharded holder, or ``frozen`` unchanged.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    dt = next((p for p in trained.parameters() if type(p).__name__ == "DTensor"), None)
    if dt is None or isinstance(frozen, FSDPModule):
        return frozen
    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    inner = getattr(trained, "module", trained)
    names = set(getattr(inner, "_no_split_modules", None) or getattr(frozen, "_no_split_modules", None) or [])
    blocks = [m for m in list(frozen.modules())[1:] if type(m).__name__ in names]
    for m in blocks:
        fully_shard(m, mesh=dt.device_mesh, mp_policy=policy)
    holder = ShardedReference(frozen)
    fully_shard(holder, mesh=dt.device_mesh, mp_policy=policy)
    if is_main_process():
        dtype = policy.param_dtype or "float32"
        print(
            f"[w2s-shift] frozen reference sharded like the student (FSDP2, {len(blocks)} blocks, "
            f"{dt.device_mesh.size()} processes, parameters in {str(dtype).replace('torch.', '')})",
            flush=True,
        )
    return holder


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


def end_process(code: int) -> int:
    """End this process of a launched run with exit status ``code``: destroy the process group, flush stdout, stderr
    and the logging handlers, and leave with ``os._exit(code)``, skipping the interpreter's teardown. Without a
    process group (one process) nothing happens and ``code`` is returned, for a normal exit.

    Why no teardown: gloo runs each collective on a worker thread (``pt_gloo_runloop``), and that thread drops the
    collective's buffers only after the caller has been woken; when Python has already let go of those tensors,
    dropping them takes the GIL. ``destroy_process_group`` does not stop the workers while anything still holds the
    group, and DTensor's caches, filled by FSDP2, hold its device mesh (hence the group) for the life of the
    process. A worker that asks for the GIL after the interpreter has begun to finalize is ended by CPython with
    ``pthread_exit``, whose unwinding through that C++ destructor calls ``std::terminate``: "terminate called
    without an active exception", SIGABRT, exit -6, after every result was written. The 2-process gloo FSDP2 tests
    hit it in none to a third of their launches, depending on the load (the core's stack: ``~AsyncWork`` ->
    ``gil_scoped_acquire`` -> ``PyThread_exit_thread``); ``benchmarks/exit_race.py`` provokes it in about half.
    Without a teardown there is nothing to race.
    Result files need none: each is written atomically before this point.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return code
    dist.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            pass
    logging.shutdown()
    os._exit(code)


__all__ = [
    "state",
    "world",
    "init_distributed",
    "is_main_process",
    "barrier",
    "per_device_batch",
    "split_indices",
    "gather_in_order",
    "sharded",
    "score_sequences_sharded",
    "is_sharded_model",
    "run_on_main",
    "all_mean",
    "min_over_processes",
    "set_layer_wrap_classes",
    "shard_like",
    "ShardedReference",
    "end_process",
]

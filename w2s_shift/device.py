"""Where the models run: one device for the process, chosen from the config's ``device`` (auto, cpu, cuda, mps).

``auto`` picks CUDA when ``torch.cuda.is_available()``, else Apple's Metal backend (MPS) when
``torch.backends.mps.is_available()``, else the CPU. The setting is set once per run (:func:`use_device`, called
when the run resolves its precision) and read by training (``PairTrainingArguments.use_cpu``: the Trainer itself
places the model on CUDA or MPS), scoring and the frozen trunk (:func:`current_device`).

Precision on MPS: ``bf16: auto`` resolves to float32 there, and ``bf16: true`` is refused
(:func:`w2s_shift.models.precision.decide_bf16`): bfloat16 autocast support on MPS depends on the macOS and torch
versions and this project has measured none of them. MPS has never been run by this project (no Mac here): the
selection logic is tested with mocks only.
"""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda", "mps")
_SETTING: dict = {"device": "auto"}  # the run's setting, set by use_device; resolved on every read


def mps_available() -> bool:
    """Whether torch can use Apple's Metal backend (False on a torch build without it)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def select_device(setting: str = "auto") -> str:
    """The device type a ``device`` setting means on this machine.

    Args:
        setting: ``auto``, ``cpu``, ``cuda`` or ``mps``.

    Returns:
        ``"cuda"``, ``"mps"`` or ``"cpu"``.

    Raises:
        ValueError: an unknown setting, or ``cuda`` / ``mps`` asked for where torch cannot use it.
    """
    import torch

    if setting not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {setting!r}")
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    if setting == "mps" and not mps_available():
        raise ValueError("device: mps, but torch cannot use Apple's Metal backend (torch.backends.mps.is_available())")
    return setting


def use_device(setting: str = "auto") -> str:
    """Set the process's ``device`` setting (checked now: :func:`select_device`) and return the device it means.

    Raises:
        ValueError: as :func:`select_device`.
    """
    device = select_device(setting)
    _SETTING["device"] = setting
    if device == "cuda":
        own_cuda_device()
    return device


def own_cuda_device() -> int | None:
    """Make this process's GPU the current CUDA device, before any model moves: under ``accelerate launch`` /
    ``torchrun`` (``LOCAL_RANK`` set), GPU ``LOCAL_RANK``, so a bare ``"cuda"`` (what :func:`current_device` returns)
    means this process's own GPU rather than GPU 0 for every process. Returns the index set, or None outside a
    launcher (one process keeps CUDA's current device, GPU 0 unless ``CUDA_VISIBLE_DEVICES`` says otherwise)."""
    import os

    import torch

    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.strip().isdigit():
        return None
    torch.cuda.set_device(int(local))
    return int(local)


def current_device() -> str:
    """The device the setting of :func:`use_device` (default ``auto``) means now: ``cuda``, ``mps`` or ``cpu``."""
    return select_device(_SETTING["device"])


def autocast(device_type: str, enabled: bool = True):
    """``torch.autocast`` in bfloat16 on ``device_type`` (``enabled=False``: autocast off inside, e.g. for a float32
    head); a no-op context on a device type torch has no autocast for (``meta``, where a forward computes shapes
    only: the tests run the GPU path there)."""
    import contextlib

    import torch

    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)


def available_host_bytes() -> int | None:
    """Host memory this process can still take, in bytes: the kernel's ``MemAvailable`` (free memory plus what the
    page cache can give back, /proc/meminfo), capped by the cgroup v2 limit left (``memory.max`` -
    ``memory.current``) inside a container, divided by the processes a launcher started on this machine
    (``LOCAL_WORLD_SIZE``: each process caches its own copy). None where neither can be read (not Linux)."""
    import os

    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            used = int(f.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    if not found:
        return None
    return min(found) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))

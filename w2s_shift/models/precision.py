"""Which precision a model trains and scores in: ``bf16: auto | true | false`` resolved for this machine.

bfloat16 autocast halves memory traffic and is fast where the hardware computes bfloat16 natively (CUDA
devices of compute capability 8.0+, x86 CPUs with AMX-BF16 or AVX512_BF16). On a CPU without it, PyTorch's
bfloat16 matmul is emulated and several times *slower* than float32: the quickstart's teacher step took 4.8 s in
bfloat16 against 1.36 s in float32 on a 2-core Xeon with AVX-512 but no AVX512_BF16.
``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` answers True there, so it is no usable test; this module reads
the CPU's flags and times a short matmul probe instead.

:func:`decide_bf16` is the one decision; :func:`resolve_precisions` applies it to a run config once, early,
so every later reader of ``ModelConfig.bf16`` sees a bool, and the run's identity digest holds the resolved
precision (``auto`` itself is not part of it).
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo names of native bfloat16 arithmetic (x86)
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")  # recorded in run.json
MIN_SPEEDUP = 1.3  # bfloat16 on a CPU only when the probe's matmul is at least this much faster than float32
PROBE_SHAPE = (512, 1024, 1024)  # (m, k, n): a (512 x 1024) @ (1024 x 1024) matmul, 1.07 GFLOP
PROBE_REPS = 7

_WARNED: set = set()  # CPUs already warned about a forced bf16: true (one warning per process and CPU)


def read_cpu_info(path: Path | None = None) -> tuple:
    """The CPU's model name and flags from ``/proc/cpuinfo`` (Linux).

    Args:
        path: the cpuinfo file (default :data:`CPUINFO`; tests pass their own).

    Returns:
        (model name or ``platform.processor()``, frozenset of flags or None when they are unknown: not Linux,
        or a cpuinfo file without a ``flags`` line, e.g. ARM's ``Features``).
    """
    path = CPUINFO if path is None else Path(path)
    name, flags = None, None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return (platform.processor() or platform.machine() or "unknown CPU"), None
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "model name" and name is None:
            name = val.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(val.split())
        if name is not None and flags is not None:
            break
    return (name or platform.processor() or platform.machine() or "unknown CPU"), flags


def native_bf16_flags(flags) -> list:
    """The native bfloat16 flags among ``flags`` (e.g. ``['avx512_bf16']``); [] for None (unknown)."""
    return [f for f in NATIVE_BF16_FLAGS if flags and f in flags]


def run_probe(shape=PROBE_SHAPE, reps: int = PROBE_REPS) -> dict:
    """Time float32 and bfloat16 ``(m x k) @ (k x n)`` matmuls on one thread: one warm-up each, then ``reps``
    rounds alternating the two dtypes (so a load spike from other processes hits both), median per dtype.

    About 0.1 s of matmuls on a CPU with native bfloat16, 0.3 s where bfloat16 is emulated (4.8x slower).

    Returns:
        dict with ``float32_ms``, ``bfloat16_ms`` (median milliseconds per matmul), ``speedup`` (float32 time /
        bfloat16 time: above 1 means bfloat16 is faster), ``shape``, ``reps``, ``threads`` (1).
    """
    import torch

    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.to(torch.bfloat16), b.to(torch.bfloat16))}
    times: dict = {dt: [] for dt in pairs}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the ratio of the arithmetic, not of the machine's load
    try:
        for x, y in pairs.values():
            torch.mm(x, y)  # warm-up: kernel selection, first touch
        for _ in range(reps):
            for dt, (x, y) in pairs.items():
                t = time.perf_counter()
                torch.mm(x, y)
                times[dt].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    t32, t16 = statistics.median(times[torch.float32]), statistics.median(times[torch.bfloat16])
    return {
        "float32_ms": round(t32 * 1e3, 3),
        "bfloat16_ms": round(t16 * 1e3, 3),
        "speedup": round(t32 / t16, 3),
        "shape": list(shape),
        "reps": reps,
        "threads": 1,
    }


def probe_cache_path(cpu_name: str, flags) -> Path:
    """The probe's cache file: one per CPU (model name + flags) and torch version, in the model cache folder
    (``$W2S_SHIFT_CACHE`` or ``~/.cache/w2s-shift``, as :func:`w2s_shift.models.loading.cache_dir`)."""
    import torch

    from .loading import cache_dir

    key = json.dumps([cpu_name, sorted(flags) if flags is not None else None, torch.__version__])
    return cache_dir() / "precision" / f"bf16-probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_probe(cpu_name: str, flags) -> dict:
    """:func:`run_probe`'s result for this CPU and torch version, measured once and kept in a small JSON file
    (written atomically; an unreadable file is measured again). A cache that cannot be written is not an error."""
    from ..io import read_json, write_json_atomic

    path = probe_cache_path(cpu_name, flags)
    try:
        got = read_json(path)
        if isinstance(got, dict) and float(got["speedup"]) > 0:
            return got
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import torch

    res = {**run_probe(), "cpu": cpu_name, "native_bf16_flags": native_bf16_flags(flags), "torch": torch.__version__}
    try:
        write_json_atomic(path, res)
    except OSError:
        pass
    return res


def _ratio(speedup: float) -> str:
    """'bf16 2.1x faster' / 'bf16 4.8x slower' (float32 time / bfloat16 time = ``speedup``)."""
    return f"bf16 {speedup:.1f}x faster" if speedup >= 1 else f"bf16 {1 / speedup:.1f}x slower"


def decide_bf16(setting="auto", device: str | None = None) -> tuple:
    """Decide whether a model runs under bfloat16 autocast (and keeps its frozen trunk in bfloat16).

    Rules:
      * ``True`` / ``False``: forced. ``True`` on a CPU without native bfloat16 warns once per process with the
        probe's measured ratio.
      * ``"auto"`` on CUDA: bfloat16 iff ``torch.cuda.is_bf16_supported()``.
      * on MPS (Apple): ``"auto"`` is float32 and ``True`` is refused; bfloat16 autocast on MPS depends on the
        macOS and torch versions and was never measured here (MPS was never run by this project).
      * ``"auto"`` on a CPU: bfloat16 only when the CPU's flags show native bfloat16 (``amx_bf16`` or
        ``avx512_bf16``, :func:`read_cpu_info`) AND the cached probe (:func:`cached_probe`) measured a bfloat16
        matmul at least :data:`MIN_SPEEDUP` x faster than float32; unknown flags (not Linux) count as no native
        bfloat16.

    Args:
        setting: ``"auto"``, ``True`` or ``False`` (``ModelConfig.bf16``).
        device: ``"cuda"``, ``"mps"`` or ``"cpu"``; None: the run's device (:func:`w2s_shift.device.current_device`).

    Returns:
        (use_bf16, reason): e.g. ``(False, "float32: this CPU has no native bfloat16 (probe: bf16 4.8x
        slower)")``, ``(True, "bfloat16: AVX512_BF16 and probe bf16 2.1x faster than float32")``, ``(True,
        "bfloat16: CUDA device supports it")``.

    Raises:
        ValueError: a setting other than "auto", True or False; True on MPS.
    """
    if setting not in ("auto", True, False) or (setting != "auto" and not isinstance(setting, bool)):
        raise ValueError(f"bf16 must be auto, true or false, got {setting!r}")
    import torch

    if device is None:
        from ..device import current_device

        device = current_device()
    if setting is False:
        return False, "float32: forced (bf16: false)"
    if device.startswith("mps"):
        if setting is True:
            raise ValueError("bf16: true on MPS is not supported (never measured here); set bf16: auto or false")
        return False, "float32: MPS (bfloat16 autocast on MPS not measured; MPS was never run by this project)"
    if device.startswith("cuda"):
        if setting is True:
            return True, "bfloat16: forced (bf16: true)"
        if torch.cuda.is_bf16_supported():
            return True, "bfloat16: CUDA device supports it"
        return False, "float32: this CUDA device does not support bfloat16"
    cpu_name, flags = read_cpu_info()
    native = native_bf16_flags(flags)
    if setting is True and native:
        return True, "bfloat16: forced (bf16: true)"
    probe = cached_probe(cpu_name, flags)
    speedup = float(probe["speedup"])
    if setting is True:
        key = (cpu_name, flags)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"bf16: true on a CPU without native bfloat16 ({cpu_name}: no AMX-BF16 or AVX512_BF16 in its "
                f"flags): the probe measured {_ratio(speedup)} than float32; set bf16: auto or false to run "
                "in float32",
                RuntimeWarning,
                stacklevel=2,
            )
        return True, f"bfloat16: forced (bf16: true) on a CPU without native bfloat16 (probe: {_ratio(speedup)})"
    if flags is None:
        return (
            False,
            "float32: the CPU's flags are unknown (no /proc/cpuinfo), native bfloat16 unconfirmed "
            f"(probe: {_ratio(speedup)})",
        )
    if not native:
        return False, f"float32: this CPU has no native bfloat16 (probe: {_ratio(speedup)})"
    names = "/".join(f.upper().replace("AMX_BF16", "AMX-BF16") for f in native)
    if speedup >= MIN_SPEEDUP:
        return True, f"bfloat16: {names} and probe {_ratio(speedup)} than float32"
    return (
        False,
        f"float32: {names} present but probe {_ratio(speedup)} than float32 "
        f"(bfloat16 only when >= {MIN_SPEEDUP}x faster)",
    )


def device_name() -> str:
    """'cuda:0 (NVIDIA H200)' or 'cpu (Intel(R) Xeon(R) Processor)': where the models run."""
    import torch

    from ..device import current_device

    if current_device() == "cuda":
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    if current_device() == "mps":
        return "mps (Apple Metal)"
    return f"cpu ({read_cpu_info()[0]})"


def launcher_precision(mcfg, role: str = "model") -> tuple | None:
    """The precision an accelerate launcher imposes on one model, checked against its ``bf16`` setting.

    ``accelerate launch`` exports its config's ``mixed_precision`` as ``ACCELERATE_MIXED_PRECISION``, and
    ``TrainingArguments`` (hence the Accelerator, FSDP2's ``MixedPrecisionPolicy`` and DeepSpeed's engine) takes it
    over the run's own ``bf16``. So a launched run has one precision: ``bf16: auto`` follows the launcher, and an
    explicit setting must say the same. Every shipped GPU launch config says ``bf16``; ``cpu-2proc.yaml`` says ``no``.

    Returns:
        None when no launcher set a mixed precision (one process: :func:`decide_bf16` decides), else
        ``(use_bf16, reason)``.

    Args:
        role: ``teacher`` or ``student``, for messages.

    Raises:
        ValueError: the launcher's mixed precision and the model's ``bf16`` disagree, naming both and the fix;
            ``fp16`` or ``fp8`` (not supported: reward margins overflow fp16's range without loss scaling of our own);
            ``pure_bf16`` under FSDP with mixed precision (accelerate upcasts trainable weights to float32 there).
    """
    import os

    mp = os.environ.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    if not mp:
        return None
    if mp not in ("no", "bf16"):
        raise ValueError(
            f"the launcher's accelerate config sets mixed_precision: {mp}; w2s-shift trains in bf16 or float32 only: "
            "set mixed_precision to bf16 or 'no' in the --config_file"
        )
    launched = mp == "bf16"
    if mcfg.bf16 != "auto" and bool(mcfg.bf16) != launched:
        raise ValueError(
            f"{role}.bf16 is {str(mcfg.bf16).lower()}, but the launcher's accelerate config sets mixed_precision: {mp} "
            f"(ACCELERATE_MIXED_PRECISION={mp}), which the Trainer would apply instead: set {role}.bf16 to "
            f"{'true' if launched else 'false'} or auto, or launch with a config whose mixed_precision is "
            f"{'bf16' if mcfg.bf16 else chr(39) + 'no' + chr(39)}"
        )
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").strip().lower() == "true"
    if launched and fsdp and getattr(mcfg, "pure_bf16", False):
        raise ValueError(
            f"{role}.pure_bf16 under FSDP with mixed_precision: bf16: accelerate keeps float32 master weights there "
            "(its MixedPrecisionPolicy computes in bfloat16), so the weights would not stay bfloat16; set pure_bf16: "
            "false"
        )
    return launched, f"{'bfloat16' if launched else 'float32'}: the launcher's mixed_precision {mp}"


def resolve_model_precision(mcfg, role: str = "model"):
    """A copy of one :class:`~w2s_shift.config.ModelConfig` with ``bf16`` resolved to a bool by
    :func:`decide_bf16`; the setting, device and reason are kept in its private ``_precision`` dict (not part of
    ``model_dump``, so digests hold only the resolved bool). A model config resolved earlier is returned as it is."""
    if mcfg._precision is not None:
        return mcfg
    launched = launcher_precision(mcfg, role)
    if launched is not None:
        use, reason = launched
    else:
        use, reason = decide_bf16(mcfg.bf16)
    if getattr(mcfg, "pure_bf16", False) and not use:  # bf16 weights need bf16 compute
        use, reason = True, f"bfloat16: pure_bf16 (auto alone would give {reason})"
    r = mcfg.model_copy(update={"bf16": use})
    r._precision = {
        "setting": mcfg.bf16,
        "bf16": use,
        "dtype": "bfloat16" if use else "float32",
        "device": device_name(),
        "reason": reason,
    }
    return r


def resolve_precisions(cfg):
    """The run config with ``teacher.bf16`` and ``student.bf16`` resolved to bools (:func:`resolve_model_precision`),
    so that every later reader of ``bf16`` sees a bool and the identity digest holds the resolved precision. The
    process's device is chosen here first, from ``cfg.device`` (:func:`w2s_shift.device.use_device`).

    Raises:
        ValueError: ``device`` cuda/mps where torch cannot use it; ``bf16: true`` on MPS."""
    from ..device import use_device

    use_device(getattr(cfg, "device", "auto"))
    update = {role: resolve_model_precision(getattr(cfg, role), role) for role in ("teacher", "student")}
    if all(update[r] is getattr(cfg, r) for r in update):
        return cfg
    return cfg.model_copy(update=update)


def _setting_text(setting) -> str:
    return str(setting).lower()  # true / false / auto, as written in YAML


def precision_lines(cfg) -> list:
    """One line per model, e.g. ``teacher precision: float32 (bf16: auto) on cpu (Intel(R) Xeon(R) Processor):
    float32: this CPU has no native bfloat16 (probe: bf16 4.8x slower)``. ``cfg`` must be resolved
    (:func:`resolve_precisions`)."""
    out = []
    for role in ("teacher", "student"):
        p = getattr(cfg, role)._precision
        out.append(
            f"{role} precision: {p['dtype']} (bf16: {_setting_text(p['setting'])}) on {p['device']}: {p['reason']}"
        )
    return out


def environment(cfg, default_threads: int | None = None) -> dict:
    """The hardware and software a run ran on, for run.json and report.md: CPU model and the flags that matter
    for speed (:data:`REPORTED_FLAGS`; None when unknown), the GPU (or None), torch CPU threads per model (its
    own ``threads``, else the run's, else ``default_threads``, else torch's current count), torch and
    transformers versions, and each model's precision (setting, dtype, device, reason) when resolved."""
    import torch
    import transformers

    name, flags = read_cpu_info()
    dflt = default_threads or torch.get_num_threads()
    env = {
        "cpu": name,
        "cpu_flags": None if flags is None else [f for f in REPORTED_FLAGS if f in flags],
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch_threads": {r: getattr(cfg, r).threads or cfg.threads or dflt for r in ("teacher", "student")},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "precision": {},
    }
    for role in ("teacher", "student"):
        p = getattr(cfg, role)._precision
        if p is not None:
            env["precision"][role] = dict(p)
    return env


def environment_lines(env: dict) -> list:
    """Bullet lines for report.md from :func:`environment`'s dict (missing keys are left out)."""
    flags = env.get("cpu_flags")
    hw = f"GPU {env['gpu']}" if env.get("gpu") else f"CPU {env.get('cpu')}"
    if not env.get("gpu"):
        shown = (
            ", ".join(flags) if flags else "none of " + ", ".join(REPORTED_FLAGS) if flags is not None else "unknown"
        )
        hw += f" (flags: {shown})"
    th = env.get("torch_threads") or {}
    lines = [
        f"hardware: {hw}; torch threads: " + ", ".join(f"{r} {n}" for r, n in th.items()),
        f"torch {env.get('torch')}, transformers {env.get('transformers')}",
    ]
    for role, p in (env.get("precision") or {}).items():
        lines.append(f"{role} precision: {p['dtype']} (bf16: {_setting_text(p['setting'])}): {p['reason']}")
    return lines

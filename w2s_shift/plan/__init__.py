"""``w2s-shift plan``: GPU memory per device, host memory, disk and GPU time of a reward-model run, per backend and
GPU count, before renting GPUs.

Model states (bytes per parameter; ZeRO accounting, Rajbhandari et al. 2020, "ZeRO", Sec. 3.1 and 5):
  precision ``mixed`` (bf16 compute, fp32 optimizer): bf16 weights 2 + fp32 master weights 4 + fp32 gradients 4
  + AdamW first and second moments 4 + 4 = 18 B/param (ZeRO's 16 counts bf16 gradients; PyTorch autocast, FSDP and
  DeepSpeed's bf16 optimizer accumulate them in fp32). Under autocast the "bf16 weights" are the cast copies held
  for the backward pass and the fp32 weights are the master copy.
  precision ``bf16`` (everything bf16, no master copy): weights 2 + gradients 2 + moments 2 + 2 = 8 B/param; this is
  how the cost table of docs/protocol.md was measured (an 8B model cannot take 66.9 GiB otherwise).
Sharding over W devices (ZeRO stages): ``ddp`` replicates everything; ``zero2`` (DeepSpeed ZeRO-2) shards master
weights, gradients and moments, replicates the bf16 weights; ``zero3`` and ``fsdp`` (full shard) shard all of them,
and hold two gathered transformer blocks (prefetch) plus the gathered embedding in bf16 while they compute.
DDP keeps gradient buckets of the gradients' size when W > 1.

Activations saved for backward, per token of one decoder block (Llama/Qwen/Mistral: RMSNorm, GQA attention with
SDPA/flash kernels that store no T x T matrix, SwiGLU MLP), counted tensor by tensor in the spirit of
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Sec. 4.1):
  two RMSNorms 2 x (4h fp32 input + 2h bf16 output) + q (2q) + k, v (2kv + 2kv) + attention output and its
  reshaped copy (2q + 2q) + SwiGLU gate, SiLU(gate), up and their product (4 x 2i)
  = 12h + 6q + 4kv + 8i bytes (h hidden, q = heads x head_dim, kv = kv_heads x head_dim, i intermediate).
Without gradient checkpointing: the trained blocks (L, or trainable_layers) + one more block of backward working
set. With it: each trained block's input (2h bytes per token, 4h under ``mixed``) + two blocks (the recomputed one
and its backward). Tokens per device = 2 x pairs x sequence length (chosen and rejected). With ``trainable_layers``
and ``trunk_cache`` the frozen blocks are not on the GPU (their states come from the host cache, 2h B per token).

ANCHOR (Le et al. 2026) adds a frozen reference: ``frozen_copy`` is a bf16 copy of the backbone (2 B/param), sharded
like the student under ``fsdp`` (FSDP2 shards the copy's blocks) and a full replica on every GPU under ``ddp``,
``zero2`` and ``zero3`` (DeepSpeed does not shard a module outside its engine); ``adapter_disabled`` (LoRA) adds no
weights; ``cached`` puts only the batch's reference states on the GPU (4 B per token and hidden unit). The
reference's forward adds one block of working set.

Peak: AdamW frees the gradients after each step (set to None), so the peak is the larger of
(weights + states + activations) and (weights + states + gradients); DDP buckets and DeepSpeed's gradient
partitions stay allocated and count in both. Checked against the protocol.md table (one H200, bf16, no
checkpointing, 1024 tokens): within 1% for every naive row and within 2% for the frozen-copy ANCHOR rows
(tests/test_plan.py), the estimate slightly lower than the measured peaks. The headline peak is the one of the run
config's ``gradient_checkpointing``; ``pure_bf16`` selects precision ``bf16`` (else ``mixed``).

Pairs per GPU per forward: ``batch_size / (gradient_accumulation_steps x GPUs)`` of the run config (the trainer's
split, w2s_shift.distributed.per_device_batch), or ``--batch`` pairs per GPU (default 2 without a config).

Host memory per process (:func:`host_bytes`; every process of a node holds its own, so a node of W GPUs holds W
times it): the base model as loaded (4 B/param, 2 under ``bf16``), the frozen copy while it is built (2 B/param),
and the caches of :func:`host_cache_bytes`: cached trunk states (``trainable_layers`` with ``trunk_cache``: every
token of every cached pair set x hidden x 2 B in bf16, 4 in fp32) and cached ANCHOR reference states (response
tokens of the student-train pairs x anchored layers x hidden x 2 B; every distinct layer set is its own cache, so
``[last, middle]`` keeps 1 + 2 layers). Token counts: ``mean_tokens`` per sequence (default the max length, an upper
bound), response tokens a share RESPONSE_SHARE of them (UltraFeedback at 1024 tokens with SmolLM2's chat template:
274 of 449, benchmarks/ultrafeedback_lengths.json). Disk (:func:`disk_bytes`): each trained student's state file
(trainable parameters, 4 B, 2 under ``bf16``) and one Trainer checkpoint at a time (``save_total_limit`` 1:
trainable weights + AdamW moments, 12 B/param, 6 under ``bf16``, deleted when the student finishes).

GPU time (:func:`gpu_flops`; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1: 2N FLOPs per
token forward, 4N backward, N the non-embedding parameters): training 6 N x tokens for trained blocks; a frozen
block that gradients pass through (LoRA's base) 4 N (forward + input gradients); gradient checkpointing +2 N
(one more forward); the ANCHOR reference 2 N per training token (frozen_copy, adapter_disabled) or once per cached
layer set (cached); scoring (every trained student and zero-shot on the test and OOD pairs), SEAM's labelling pass
and trunk caches 2 N per token. Seconds = FLOPs / (GPUs x MFU x peak), default 40% MFU of 989 TFLOP/s (H100 and H200
SXM bf16 dense peak, NVIDIA datasheets); the teacher's training and labelling, drift probes and data loading are not
counted. Small models reach a far lower MFU than 40% (per-step overheads dominate): pass ``--mfu``.
"""

from .costs import (
    ACCELERATE_CONFIG,
    ALIASES,
    BACKENDS,
    DECODER_TYPES,
    DEFAULT_PAIRS,
    FITS_SHARE,
    GIB,
    GPUS_PER_NODE,
    METHODS,
    MFU,
    PEAK_TFLOPS,
    PRECISION,
    REFERENCES,
    RESPONSE_SHARE,
    SHAPES,
    Plan,
    Shape,
    disk_bytes,
    estimate,
    gpu_flops,
    gpu_seconds,
    host_bytes,
    host_cache_bytes,
    known_shape,
    shape_from_config_json,
)
from .render import (
    RECOMMENDATION,
    fits,
    format_plan,
    parse_gpus,
    plan_json,
    resolve,
    run_defaults,
)

__all__ = [
    "ACCELERATE_CONFIG",
    "ALIASES",
    "BACKENDS",
    "DECODER_TYPES",
    "DEFAULT_PAIRS",
    "FITS_SHARE",
    "GIB",
    "GPUS_PER_NODE",
    "METHODS",
    "MFU",
    "PEAK_TFLOPS",
    "PRECISION",
    "Plan",
    "RECOMMENDATION",
    "REFERENCES",
    "RESPONSE_SHARE",
    "SHAPES",
    "Shape",
    "disk_bytes",
    "estimate",
    "fits",
    "format_plan",
    "gpu_flops",
    "gpu_seconds",
    "host_bytes",
    "host_cache_bytes",
    "known_shape",
    "parse_gpus",
    "plan_json",
    "resolve",
    "run_defaults",
    "shape_from_config_json",
]

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

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .config import DEFAULT_LORA_TARGETS
from .methods import BASELINE
from .methods import METHODS as REGISTERED
from .methods.anchor import REFERENCE_MODES

GIB = 1024**3
BACKENDS = {
    "ddp": "ddp",
    "fsdp": "fsdp",
    "zero2": "zero2",
    "zero3": "zero3",
    "deepspeed-zero2": "zero2",
    "deepspeed-zero3": "zero3",
}
ACCELERATE_CONFIG = {"ddp": "ddp", "fsdp": "fsdp", "zero2": "deepspeed-zero2", "zero3": "deepspeed-zero3"}
PRECISION = {  # bytes per trainable parameter: (bf16 weights, fp32 master, gradients, AdamW moments)
    "mixed": (2, 4, 4, 8),
    "bf16": (2, 0, 2, 4),
}
METHODS = tuple(n for n, m in REGISTERED.items() if m.trains)  # what --method can estimate (trained methods)
REFERENCES = REFERENCE_MODES
FITS_SHARE = 0.9  # "yes" up to 90% of the GPU: the rest for the CUDA context, allocator fragmentation and error
PEAK_TFLOPS = 989.0  # H100 / H200 SXM, bf16 dense tensor-core peak (NVIDIA datasheets; the H200 has the H100's compute)
MFU = 0.40  # assumed achieved share of the peak for billion-parameter models (--mfu)
RESPONSE_SHARE = 0.61  # response tokens / tokens per sequence: UltraFeedback at 1024 tokens, 274 / 449
DEFAULT_PAIRS = 20_000  # student-train pairs when the config caps none (a shared set of the paper's scale)
GPUS_PER_NODE = 8  # host memory is per node: min(GPUs, 8) processes share one host
RECOMMENDATION = (
    "ANCHOR reference: one GPU with an 8B student -> LoRA with reference: adapter_disabled (no extra weights), or full "
    "fine-tuning with gradient checkpointing where it fits; 8 GPUs -> FSDP2 (fsdp) full fine-tuning with reference: "
    "frozen_copy (sharded like the student); reference: cached only for partial fine-tuning (top layers) where the "
    "host-memory estimate of its caches fits."
)


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (the fields of its config.json) and parameter counts of the reward model built on it
    (backbone without LM head, plus the bias-free scalar head)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = False

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    def linears(self) -> dict:
        """(in, out) of each linear of one block, by its module name."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def block_params(self) -> int:
        lin = sum(a * b for a, b in self.linears().values())
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return lin + bias + 2 * self.hidden  # + two RMSNorm weights

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        """Backbone (embeddings, blocks, final norm) + reward head."""
        return self.embed_params() + self.layers * self.block_params() + self.hidden + self.hidden

    def lora_params(self, rank: int, targets: list) -> int:
        lin = self.linears()
        bad = [t for t in targets if t not in lin]
        if bad:
            raise ValueError(f"LoRA target modules {bad} are not linears of a {self.name} block ({', '.join(lin)})")
        return self.layers * sum(rank * (lin[t][0] + lin[t][1]) for t in targets)

    def block_activation_bytes_per_token(self) -> int:
        """Bytes saved for backward per token by one block (see the module docstring)."""
        return 12 * self.hidden + 6 * self.q_dim + 4 * self.kv_dim + 8 * self.intermediate


SHAPES = {
    s.name.lower(): s
    for s in [
        Shape("Qwen2.5-0.5B", 24, 896, 4864, 151936, 14, 2, qkv_bias=True),
        Shape("Qwen2.5-1.5B", 28, 1536, 8960, 151936, 12, 2, qkv_bias=True),
        Shape("Qwen2.5-7B", 28, 3584, 18944, 152064, 28, 4, qkv_bias=True),
        Shape("Llama-3.2-1B", 16, 2048, 8192, 128256, 32, 8),
        Shape("Llama-3.1-8B", 32, 4096, 14336, 128256, 32, 8),
        Shape("SmolLM2-135M", 30, 576, 1536, 49152, 9, 3),
    ]
}
ALIASES = {"smollm2-135m": "smollm2-135m"}
DECODER_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def shape_from_config_json(path: str | Path) -> Shape:
    """Read a Hugging Face decoder config.json (a file or a folder holding one).

    Raises:
        ValueError: no such file, invalid JSON, not a llama/qwen2/qwen3/mistral decoder, or a missing field
            (the message names the file and the field).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        c = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p}: not found") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a JSON config ({e})") from None
    if not isinstance(c, dict):
        raise ValueError(f"{p}: the top level must be an object")
    c = c.get("text_config", c)
    mt = c.get("model_type")
    if mt not in DECODER_TYPES:
        raise ValueError(
            f"{p}: model_type {mt!r} is not supported by the planner (decoders: {', '.join(DECODER_TYPES)})"
        )
    need = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "num_attention_heads")
    for k in need:
        if not isinstance(c.get(k), int) or c[k] < 1:
            raise ValueError(f"{p}: field {k!r} must be a positive integer, got {c.get(k)!r}")
    return Shape(
        name=str(c.get("_name_or_path") or p.parent.name),
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        intermediate=c["intermediate_size"],
        vocab=c["vocab_size"],
        heads=c["num_attention_heads"],
        kv_heads=int(c.get("num_key_value_heads") or c["num_attention_heads"]),
        head_dim=int(c.get("head_dim") or 0),
        qkv_bias=bool(c.get("attention_bias", mt == "qwen2")),
    )


def known_shape(spec: str) -> Shape | None:
    """A shape from :data:`SHAPES` by name, case-insensitive, with or without the hub organisation and an
    ``-Instruct`` suffix (e.g. ``meta-llama/Llama-3.1-8B-Instruct``)."""
    key = spec.strip().split("/")[-1].lower()
    for suffix in ("-instruct",):
        key = key[: -len(suffix)] if key.endswith(suffix) else key
    return SHAPES.get(ALIASES.get(key, key))


@dataclass
class Plan:
    """The inputs of an estimate (what ``w2s-shift plan`` was asked, or read from a run config)."""

    shape: Shape
    method: str = "anchor"
    reference: str = "frozen_copy"
    backend: str = "fsdp"
    finetune: str = "full"
    precision: str = "mixed"
    seq_len: int = 1024
    batch: int | None = None  # pairs per GPU per forward (--batch); None: from batch_size, else 2
    batch_size: int | None = None  # the config's pairs per optimizer step, all GPUs together
    grad_accum: int = 1  # the config's gradient_accumulation_steps
    gradient_checkpointing: bool = False  # which peak is the headline
    trainable_layers: int | None = None  # full fine-tuning of the top N blocks only (+ head)
    trunk_cache: bool = True  # with trainable_layers: the frozen blocks run once, their states kept on the host
    lora_rank: int = 8
    lora_targets: list = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    params: float | None = None  # overrides the parameter count of the shape
    pairs: int = DEFAULT_PAIRS  # student-train pairs of one cell
    eval_pairs: int = 0  # pairs scored by every student (test + OOD sets) of one cell
    mean_tokens: int | None = None  # mean tokens per sequence (None: seq_len, an upper bound)
    epochs: float = 1.0
    cells: int = 1  # sources x seeds
    students: int = 1  # trained students per cell
    step_references: int | None = None  # students whose reference runs every step (None: 1 for a per-step reference)
    cached_layer_sets: list | None = None  # layers of each distinct cached reference (None: [1] for cached)
    seam: bool = False  # a SEAM labelling pass over the student-train pairs per cell
    zero_shot: bool = False  # a zero-shot scoring pass per cell
    mfu: float = MFU
    peak_tflops: float = PEAK_TFLOPS
    notes: list = field(default_factory=list)

    @property
    def anchored(self) -> bool:
        """The method has ANCHOR's reference and anchor term (False for an unregistered name; check() names it)."""
        return getattr(REGISTERED.get(self.method), "needs_reference", False)

    @property
    def top(self) -> int:
        """Trained blocks: trainable_layers, or every block."""
        return min(self.trainable_layers or self.shape.layers, self.shape.layers)

    @property
    def split(self) -> bool:
        """The frozen blocks below the top ones run once and their states are cached (featurizer's split mode)."""
        return self.finetune == "full" and self.top < self.shape.layers and self.trunk_cache

    @property
    def tokens_per_seq(self) -> int:
        return min(self.mean_tokens or self.seq_len, self.seq_len)

    def pairs_per_gpu(self, gpus: int) -> int:
        """Pairs per GPU per forward: --batch, else the config's batch_size / (gradient_accumulation_steps x GPUs)
        rounded up (w2s_shift.distributed.per_device_batch refuses a remainder), else 2."""
        if self.batch is not None:
            return self.batch
        if self.batch_size is None:
            return 2
        return max(1, -(-self.batch_size // (self.grad_accum * gpus)))

    def check(self) -> None:
        """Raises ValueError naming the first bad field."""
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        self.backend = BACKENDS[self.backend]
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.reference not in REFERENCES:
            raise ValueError(f"--reference {self.reference!r}: choose one of {', '.join(REFERENCES)}")
        if self.finetune not in ("full", "lora"):
            raise ValueError(f"--finetune {self.finetune!r}: choose full or lora")
        if self.precision not in PRECISION:
            raise ValueError(f"--precision {self.precision!r}: choose one of {', '.join(PRECISION)}")
        if self.reference == "adapter_disabled" and self.finetune != "lora":
            raise ValueError("--reference adapter_disabled needs --finetune lora")
        for k in ("seq_len", "lora_rank", "pairs", "cells", "students", "grad_accum"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{k.replace('_', '-')} must be a positive integer, got {v!r}")
        for k in ("batch", "batch_size", "mean_tokens", "trainable_layers"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"--{k.replace('_', '-')} must be a positive integer, got {v!r}")
        if not isinstance(self.eval_pairs, int) or self.eval_pairs < 0:
            raise ValueError(f"--eval-pairs must be a non-negative integer, got {self.eval_pairs!r}")
        for k, hi in (("epochs", 1000.0), ("mfu", 1.0), ("peak_tflops", 1e6)):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= hi):
                raise ValueError(f"--{k.replace('_', '-')} must be a number in (0, {hi:g}], got {v!r}")
        if self.params is not None and not (
            isinstance(self.params, (int, float)) and math.isfinite(self.params) and self.params >= 1e3
        ):
            raise ValueError(f"--params must be a parameter count such as 8e9, got {self.params!r}")
        if self.finetune == "lora":
            self.shape.lora_params(self.lora_rank, self.lora_targets)


def _counts(plan: Plan) -> dict:
    """Parameter counts: ``all`` (the reward model), ``gpu`` (what a process holds: without the cached trunk in split
    mode), ``train``, ``frozen`` (held on the GPU, not trained), ``block`` (one block), ``embed``."""
    s = plan.shape
    scale = (plan.params / s.params()) if plan.params else 1.0
    blk, emb = s.block_params() * scale, s.embed_params() * scale
    n_all = s.params() * scale
    if plan.finetune == "lora":
        n_train = s.lora_params(plan.lora_rank, plan.lora_targets) + s.hidden
        return {"all": n_all, "gpu": n_all, "train": n_train, "frozen": n_all - s.hidden, "block": blk, "embed": emb}
    n_train = plan.top * blk + (s.hidden + s.hidden if plan.top < s.layers else n_all - plan.top * blk)
    n_gpu = n_train if plan.split else n_all
    return {"all": n_all, "gpu": n_gpu, "train": n_train, "frozen": n_gpu - n_train, "block": blk, "embed": emb}


def host_cache_bytes(
    hidden: int,
    pairs: int,
    tokens_per_seq: float,
    *,
    eval_pairs: int = 0,
    trunk: bool = False,
    reference_layers: int = 0,
    dtype_bytes: int = 2,
    response_share: float = RESPONSE_SHARE,
) -> dict:
    """Host bytes of the caches one process keeps (chosen + rejected of every pair, see the module docstring).

    Args:
        hidden: hidden size; pairs: student-train pairs; tokens_per_seq: mean tokens per sequence;
        eval_pairs: the other pair sets whose trunk states are cached (test, OOD); trunk: trunk states cached
        (``trainable_layers`` with ``trunk_cache``); reference_layers: anchored layers summed over the distinct cached
        reference layer sets ('last' 1, 'middle' 2); dtype_bytes: 2 (bf16) or 4 (fp32).

    Returns:
        {"trunk": bytes, "reference": bytes, "total": bytes}
    """
    tok = 2 * tokens_per_seq
    t = (pairs + eval_pairs) * tok * hidden * dtype_bytes if trunk else 0.0
    r = pairs * tok * response_share * reference_layers * hidden * dtype_bytes
    return {"trunk": t, "reference": r, "total": t + r}


def _cached_layers(plan: Plan) -> list:
    if plan.cached_layer_sets is not None:
        return list(plan.cached_layer_sets)
    return [1] if plan.anchored and plan.reference == "cached" else []


def host_bytes(plan: Plan) -> dict:
    """Host bytes of one process: ``base`` (the model as loaded), ``frozen_copy`` (built on the host before it moves
    to the GPU), ``trunk`` and ``reference`` caches (:func:`host_cache_bytes`), ``total``."""
    c = _counts(plan)
    bf16 = plan.precision == "bf16"
    base = c["all"] * (2 if bf16 else 4)
    copy = c["gpu"] * 2 if plan.anchored and plan.reference == "frozen_copy" else 0.0
    caches = host_cache_bytes(
        plan.shape.hidden,
        plan.pairs,
        plan.tokens_per_seq,
        eval_pairs=plan.eval_pairs,
        trunk=plan.split,
        reference_layers=sum(_cached_layers(plan)),
    )
    out = {"base": base, "frozen_copy": copy, "trunk": caches["trunk"], "reference": caches["reference"]}
    out["total"] = sum(out.values())
    return out


def disk_bytes(plan: Plan) -> dict:
    """Bytes on disk: ``state`` (one trained student's state file), ``states`` (all students of the run),
    ``checkpoint`` (one Trainer checkpoint: trainable weights + AdamW moments; one kept at a time)."""
    n = _counts(plan)["train"]
    bf16 = plan.precision == "bf16"
    state = n * (2 if bf16 else 4)
    return {"state": state, "states": state * plan.students * plan.cells, "checkpoint": n * (6 if bf16 else 12)}


def gpu_flops(plan: Plan) -> dict:
    """FLOPs of the run (all cells; see the module docstring): ``train``, ``reference``, ``scoring`` (scoring,
    SEAM's pass and trunk caches), ``total``."""
    c = _counts(plan)
    s = plan.shape
    ckpt = 2 if plan.gradient_checkpointing else 0
    t_once = plan.pairs * 2 * plan.tokens_per_seq
    t_train, t_eval = t_once * plan.epochs, plan.eval_pairs * 2 * plan.tokens_per_seq
    n_all = s.layers * c["block"]  # non-embedding
    n_top = plan.top * c["block"] if plan.finetune == "full" else n_all
    n_trunk = n_all - n_top
    if plan.finetune == "lora":
        train = (4 + ckpt) * n_all * t_train + 6 * c["train"] * t_train
    else:
        train = (6 + ckpt) * n_top * t_train + (0 if plan.split else 2 * n_trunk * t_train)
    n_path = n_top if plan.split else n_all  # what the reference and scoring run per token
    per_step = plan.step_references
    if per_step is None:
        per_step = 1 if plan.anchored and plan.reference != "cached" else 0
    reference = per_step * 2 * n_path * t_train + len(_cached_layers(plan)) * 2 * n_path * t_once
    scoring = (plan.students + plan.zero_shot) * 2 * n_path * t_eval
    scoring += (2 * n_all * t_once if plan.seam else 0) + (2 * n_trunk * (t_once + t_eval) if plan.split else 0)
    out = {"train": plan.students * train, "reference": reference, "scoring": scoring}
    out = {k: v * plan.cells for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def gpu_seconds(plan: Plan, gpus: int = 1) -> float:
    """Estimated seconds of the run on ``gpus`` GPUs: FLOPs / (gpus x mfu x peak), perfect scaling assumed."""
    return gpu_flops(plan)["total"] / (gpus * plan.mfu * plan.peak_tflops * 1e12)


def estimate(plan: Plan, gpus: int) -> dict:
    """Bytes per device of ``plan`` on ``gpus`` devices.

    Returns:
        dict of GiB: ``weights`` (bf16 + master), ``grads``, ``adamw``, ``reference``, ``gathered`` (fsdp/zero3
        transient), ``activations``, ``activations_ckpt``, ``other`` (final norm, ANCHOR's error terms, cached
        reference states, one reference block), ``total``, ``total_ckpt`` (peaks without / with gradient
        checkpointing), ``peak`` (the one of ``plan.gradient_checkpointing``), ``host`` (one node: min(gpus, 8)
        processes); the parameter counts used, ``pairs_per_gpu`` and ``tokens_per_device``.

    Raises:
        ValueError: gpus < 1 or a bad plan field.
    """
    plan.check()
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"GPU count must be a positive integer, got {gpus!r}")
    s, W, b = plan.shape, gpus, plan.backend
    c = _counts(plan)
    n_train, n_frozen = c["train"], c["frozen"]
    w, master, g, adam = PRECISION[plan.precision]
    full = 1.0
    shard = 1.0 / W
    f_w = shard if b in ("zero3", "fsdp") else full  # bf16 weights and frozen weights
    f_state = full if b == "ddp" else shard  # master, gradients, moments
    f_ref = shard if b == "fsdp" else full  # the frozen copy: sharded by FSDP2, a replica under DDP and DeepSpeed
    weights = n_train * (w * f_w + master * f_state) + n_frozen * 2 * f_w
    grads = n_train * g * f_state
    adamw = n_train * adam * f_state
    buckets = n_train * g if b == "ddp" and W > 1 else 0.0  # DDP's gradient buckets (a second copy)
    kept = grads if b in ("zero2", "zero3") else 0.0  # DeepSpeed keeps its gradient partitions allocated

    pairs = plan.pairs_per_gpu(W)
    tokens = 2 * pairs * plan.seq_len
    block = tokens * s.block_activation_bytes_per_token()
    resid = 4 if plan.precision == "mixed" else 2
    top = plan.top if plan.finetune == "full" else s.layers  # blocks that keep activations for backward
    act = top * block + block
    act_ckpt = top * tokens * resid * s.hidden + 2 * block
    emb = c["embed"] if not plan.split else 0.0
    gathered = (2 * c["block"] + emb) * 2 if b in ("zero3", "fsdp") and W > 1 else 0.0

    reference, other = 0.0, tokens * s.hidden * 6  # final RMSNorm (fp32 input + bf16 output)
    if plan.split:
        other += tokens * s.hidden * 2  # the batch's cached trunk states (bf16)
    if plan.anchored:
        other += tokens * s.hidden * 8  # fp32 difference and square of the anchored states
        if plan.reference == "frozen_copy":
            reference = c["gpu"] * 2 * f_ref
            other += block + tokens * s.hidden * 2
        elif plan.reference == "adapter_disabled":
            other += block + tokens * s.hidden * 2
        else:
            other += tokens * s.hidden * 4
    base = weights + adamw + reference + gathered + other
    step = weights + adamw + reference + grads + buckets  # at the optimizer step the activations are gone
    total = max(base + act + buckets + kept, step)
    total_ckpt = max(base + act_ckpt + buckets + kept, step)
    g_ = lambda x: x / GIB  # noqa: E731
    return {
        "gpus": W,
        "weights": g_(weights),
        "grads": g_(grads),
        "adamw": g_(adamw),
        "reference": g_(reference),
        "gathered": g_(gathered),
        "ddp_buckets": g_(buckets),
        "activations": g_(act),
        "activations_ckpt": g_(act_ckpt),
        "other": g_(other),
        "total": g_(total),
        "total_ckpt": g_(total_ckpt),
        "peak": g_(total_ckpt if plan.gradient_checkpointing else total),
        "host": g_(host_bytes(plan)["total"] * min(W, GPUS_PER_NODE)),
        "hours": gpu_seconds(plan, W) / 3600,
        "params": c["all"],
        "trainable_params": n_train,
        "pairs_per_gpu": pairs,
        "tokens_per_device": tokens,
    }


def fits(total_gib: float, gpu_mem_gib: float) -> str:
    """'yes' up to 90% of the GPU's memory, 'tight' up to 100%, else 'no'."""
    return "yes" if total_gib <= FITS_SHARE * gpu_mem_gib else ("tight" if total_gib <= gpu_mem_gib else "no")


def parse_gpus(text: str) -> list:
    """'1,2,4,8' -> [1, 2, 4, 8]. Raises ValueError on anything but positive integers."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpus {text!r}: expected a comma-separated list of GPU counts, e.g. 1,2,4,8") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"--gpus {text!r}: GPU counts must be positive integers")
    return sorted(set(out))


def run_defaults(cfg, shape: Shape, reference: str | None = None) -> dict:
    """Plan fields read from a run config (``RunConfig``): the student's sequence length, batch, accumulation,
    checkpointing, precision (``pure_bf16``), fine-tuning, and the run's pairs, cells and students for host memory,
    disk and GPU time. Unknown sizes (no ``n_student_train``, ``n_test`` or ``n_ood`` cap) are assumed and noted.
    ``reference`` (``--reference``): every ANCHOR entry of the config counted with that reference instead."""
    from .models.reward_model import resolve_layer_spec

    st, data = cfg.student, cfg.data
    methods = cfg.expanded_methods()
    anchors = [m for m in methods if m.method.needs_reference]
    if reference is not None:
        anchors = [m.model_copy(update={"reference": reference}) for m in anchors]
    first = next((m for m in anchors if m.reference == "frozen_copy"), anchors[0] if anchors else None)
    d = {"seq_len": st.max_length, "method": first.name if first else BASELINE, "notes": []}
    if first is not None:
        d["reference"] = first.reference
    lora = getattr(st, "lora", None)
    d["finetune"] = "lora" if lora else "full"
    if lora:
        d["lora_rank"], d["lora_targets"] = lora.r, list(lora.target_modules)
    d["batch_size"], d["grad_accum"] = st.batch_size, st.gradient_accumulation_steps
    d["gradient_checkpointing"] = bool(getattr(st, "gradient_checkpointing", False))
    d["precision"] = "bf16" if getattr(st, "pure_bf16", False) else "mixed"
    if st.trainable_layers and not lora:
        d["trainable_layers"], d["trunk_cache"] = st.trainable_layers, bool(st.trunk_cache)
    d["epochs"] = float(st.epochs)
    d["pairs"] = data.n_student_train or DEFAULT_PAIRS
    if data.n_student_train is None:
        d["notes"].append(f"data.n_student_train is not capped: {DEFAULT_PAIRS:,} student-train pairs assumed")
    f = data.split_fractions
    n_test = data.n_test or round(d["pairs"] * f[2] / f[1])
    n_ood = data.n_ood or 2000
    if data.n_test is None or data.n_ood is None:
        d["notes"].append(
            f"data.n_test / n_ood not capped: {n_test:,} test pairs (the split fractions) and {n_ood:,} per OOD set "
            "assumed"
        )
    srcs = [s.display for s in data.sources]
    ood = sum(len([o for o in data.ood if o.display != s]) for s in srcs) / max(len(srcs), 1)
    d["eval_pairs"] = int(n_test + n_ood * ood)
    d["cells"] = len(srcs) * len(cfg.seeds)
    d["students"] = sum(1 for m in methods if m.method.trains)
    d["step_references"] = sum(1 for m in anchors if m.reference != "cached")
    n_layers = shape.layers
    sets = {tuple(resolve_layer_spec(m.anchor_layers, n_layers)): m.reference for m in anchors}
    d["cached_layer_sets"] = [len(k) for k, r in sorted(sets.items()) if r == "cached"]

    d["seam"] = any(m.name == "seam" for m in methods)
    d["zero_shot"] = any(m.name == "zero_shot" for m in methods)
    return d


def resolve(spec: str, overrides: list | None = None, reference: str | None = None) -> tuple:
    """A model shape and run-config defaults from CONFIG_OR_MODEL: a known shape name, a folder or config.json
    of a decoder, or a w2s-shift run config (YAML file or preset, with ``overrides`` as ``--set KEY=VALUE``) whose
    student is one of those.

    Returns:
        (Shape, dict of Plan fields from the run config (:func:`run_defaults`); empty for a model).

    Raises:
        ValueError: none of these (the message lists the known shapes).
    """
    s = known_shape(spec)
    p = Path(spec)
    if s is not None or p.is_dir() or p.name == "config.json":
        if overrides:
            raise ValueError("--set applies to a run config, not to a model")
        return (s or shape_from_config_json(p)), {}
    from .config import ConfigError
    from .config_io import load_config, preset_names

    if p.suffix in (".yaml", ".yml") or spec in preset_names():
        try:
            cfg = load_config(spec, overrides or None)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        st = cfg.student
        shape = known_shape(st.name)
        if shape is None:
            if Path(st.name).is_dir():
                shape = shape_from_config_json(st.name)
            else:
                raise ValueError(
                    f"{spec}: student {st.name!r} is neither a known shape "
                    f"({', '.join(x.name for x in SHAPES.values())}) "
                    "nor a local model folder; pass the model (or its config.json) instead"
                )
        d = run_defaults(cfg, shape, reference)
        return shape, d
    raise ValueError(
        f"{spec}: not a known model shape ({', '.join(x.name for x in SHAPES.values())}), a model folder or "
        "config.json, or a w2s-shift run config"
    )


def _gib(x: float) -> str:
    return f"{x / GIB:,.1f} GiB"


def format_plan(plan: Plan, gpus: list, gpu_mem: float) -> str:
    """The text printed by ``w2s-shift plan``: GiB per device for each GPU count and whether it fits, host memory per
    node, hours of the run, host and disk breakdowns, and the ANCHOR reference recommendation."""
    rows = [estimate(plan, n) for n in gpus]
    s = plan.shape
    w, master, g, adam = PRECISION[plan.precision]
    ref = plan.reference if plan.anchored else "none"
    ck = plan.gradient_checkpointing
    how = f"top {plan.top} of {s.layers} blocks" if plan.top < s.layers and plan.finetune == "full" else "full"
    lines = [
        f"model {s.name}: {rows[0]['params']:.3g} parameters "
        f"(reward model: backbone + head){' [--params]' if plan.params else ''}; "
        f"{s.layers} layers, hidden {s.hidden}, MLP {s.intermediate}, vocab {s.vocab}, heads {s.heads}/{s.kv_heads}",
        f"method {plan.method} (reference: {ref}), {how if plan.finetune == 'full' else 'lora'} fine-tuning"
        + (
            f" (rank {plan.lora_rank} on {','.join(plan.lora_targets)}: {rows[0]['trainable_params']:.3g} trainable)"
            if plan.finetune == "lora"
            else ""
        )
        + (" with cached trunk states" if plan.split else "")
        + f", backend {plan.backend}, precision {plan.precision}, gradient checkpointing {'on' if ck else 'off'}",
        f"bytes per trained parameter: weights {w} (bf16) + master {master} + gradients {g} + AdamW moments {adam} "
        f"= {w + master + g + adam}; frozen weights 2 (bf16)",
    ]
    if plan.batch is None and plan.batch_size is not None:
        lines.append(
            f"per GPU: batch_size {plan.batch_size} / (gradient_accumulation_steps {plan.grad_accum} x GPUs) pairs "
            f"x {plan.seq_len} tokens (chosen + rejected) per forward"
        )
    else:
        lines.append(
            f"per GPU: {plan.pairs_per_gpu(1)} pairs x {plan.seq_len} tokens "
            f"({rows[0]['tokens_per_device']} tokens, chosen + rejected); "
            f"global batch = {plan.pairs_per_gpu(1)} x GPUs pairs/step"
        )
    alt = "no ckpt" if ck else "ckpt"
    lines += [
        "",
        f"{'GPUs':>4} | {'pairs':>5} | {'weights':>7} | {'grads':>6} | {'AdamW':>6} | {'ref':>5} | "
        f"{'gather':>6} | {'act':>6} | {'other':>5} | {'peak':>6} | "
        f"{'fits ' + format(gpu_mem, 'g') + ' GiB':>11} | {'peak ' + alt:>12} | {'host/node':>9} | {'hours':>7}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        a = r["activations_ckpt"] if ck else r["activations"]
        lines.append(
            f"{r['gpus']:>4} | {r['pairs_per_gpu']:>5} | {r['weights']:>7.1f} | {r['grads']:>6.1f} | "
            f"{r['adamw']:>6.1f} | {r['reference']:>5.1f} | {r['gathered']:>6.1f} | {a:>6.1f} | {r['other']:>5.1f} | "
            f"{r['peak']:>6.1f} | {fits(r['peak'], gpu_mem):>11} | "
            f"{(r['total'] if ck else r['total_ckpt']):>12.1f} | {r['host']:>9.1f} | {r['hours']:>7.2f}"
        )
    lines += [
        "",
        "GiB per GPU. peak = max(weights + AdamW + ref + gather + act + other, weights + AdamW + ref + grads) "
        "(gradients are freed after each step; DDP buckets and ZeRO gradient partitions stay and count in both), "
        f"{'with' if ck else 'without'} gradient checkpointing (the config's gradient_checkpointing); 'peak {alt}': "
        f"{'without' if ck else 'with'} it. 'yes': at most {FITS_SHARE:.0%} of the GPU; 'tight': at most 100%.",
    ]
    if plan.anchored and plan.reference == "frozen_copy":
        lines.append(
            "ref: the frozen copy in bf16, "
            + (
                "sharded like the student (FSDP2)."
                if plan.backend == "fsdp"
                else f"a full replica on every GPU under {plan.backend} (DeepSpeed and DDP do not shard it)."
            )
        )
    if plan.batch is None and plan.batch_size is not None:
        bad = [n for n in gpus if plan.batch_size % (plan.grad_accum * n)]
        if bad:
            lines.append(
                f"batch_size {plan.batch_size} is not a multiple of gradient_accumulation_steps x GPUs for "
                f"{','.join(map(str, bad))} GPU(s): the run refuses those counts (pairs rounded up here)."
            )
    h, dk, fl = host_bytes(plan), disk_bytes(plan), gpu_flops(plan)
    lines += [
        f"host/node: GiB of host memory on one node of min(GPUs, {GPUS_PER_NODE}) processes, each holding its own: "
        f"base model {_gib(h['base'])} + frozen copy while built {_gib(h['frozen_copy'])} + cached trunk states "
        f"{_gib(h['trunk'])} + cached reference states {_gib(h['reference'])} = {_gib(h['total'])} per process "
        f"({plan.pairs:,} student-train pairs, {plan.eval_pairs:,} scored pairs, {plan.tokens_per_seq} tokens per "
        f"sequence, {RESPONSE_SHARE:.0%} of them response).",
        f"disk: {_gib(dk['state'])} per trained student's state file, {_gib(dk['states'])} for the run's "
        f"{plan.students * plan.cells} student(s); one Trainer checkpoint at a time: {_gib(dk['checkpoint'])}.",
        f"hours: wall-clock hours of the run ({plan.cells} cell(s) x {plan.students} trained student(s), "
        f"{plan.epochs:g} epoch(s)): {fl['total']:.3g} FLOPs (training {fl['train']:.3g}, reference "
        f"{fl['reference']:.3g}, scoring {fl['scoring']:.3g}) at {plan.mfu:.0%} MFU of {plan.peak_tflops:g} TFLOP/s "
        "per GPU (an assumption, --mfu and --peak-tflops; perfect scaling over GPUs; teacher not counted).",
        RECOMMENDATION,
    ]
    lines += plan.notes
    ok = next((r["gpus"] for r in rows if fits(r["peak"], gpu_mem) == "yes"), None)
    cfgname = ACCELERATE_CONFIG[plan.backend]
    if ok is None:
        lines.append(
            "No listed GPU count fits; try a sharded backend, LoRA, gradient checkpointing, fewer pairs per GPU or "
            "more GPUs."
        )
    else:
        bs = plan.batch_size if plan.batch is None and plan.batch_size else plan.pairs_per_gpu(ok) * ok
        lines.append(
            f"Smallest fit: {ok} GPU(s): accelerate launch --config_file w2s_shift/configs/accelerate/{cfgname}.yaml "
            f"--num_processes {ok} -m w2s_shift run CONFIG  (student.batch_size = {bs})"
        )
    return "\n".join(lines)


def plan_json(plan: Plan, gpus: list, gpu_mem: float) -> str:
    rows = [dict(e, fits=fits(e["peak"], gpu_mem)) for e in (estimate(plan, n) for n in gpus)]
    d = {k: v for k, v in asdict(plan).items() if k != "shape"}
    extra = {"host_bytes_per_process": host_bytes(plan), "disk_bytes": disk_bytes(plan), "flops": gpu_flops(plan)}
    return json.dumps({"shape": asdict(plan.shape), "plan": d, "gpu_mem_gib": gpu_mem, "rows": rows, **extra}, indent=2)


__all__ = [
    "Shape",
    "SHAPES",
    "Plan",
    "RECOMMENDATION",
    "estimate",
    "fits",
    "gpu_flops",
    "gpu_seconds",
    "host_bytes",
    "host_cache_bytes",
    "disk_bytes",
    "parse_gpus",
    "resolve",
    "run_defaults",
    "shape_from_config_json",
    "known_shape",
    "format_plan",
    "plan_json",
]

"""The cost model of ``w2s-shift plan``: decoder shapes, the plan of one run and its estimates (GPU memory per
device, host memory, disk, FLOPs and GPU time). The formulas and their sources: :mod:`w2s_shift.plan`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..config import DEFAULT_LORA_TARGETS
from ..methods import METHODS as REGISTERED
from ..methods.anchor import REFERENCE_MODES

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
    anchor_layers: int = 1  # anchored blocks of a per-step reference (the paper's 'middle': 2); their states are kept
    mechanism: bool = True  # the mechanism stage: every student's and the pretrained features on the fit + eval sets
    fit_pairs: int | None = None  # pairs its probes are fitted on (teacher-train, which no student sees); None: pairs
    checkpoint_fraction: float = 0.25  # a Trainer checkpoint every this share of a training's steps
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
        for k in ("seq_len", "lora_rank", "pairs", "cells", "students", "grad_accum", "anchor_layers"):
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
    """Host bytes of one process at its peak, while a student is built: ``base`` (the model as loaded, kept as the
    source of every student), ``student`` (the student's copy of it, on the host until the Trainer moves it),
    ``frozen_copy`` (ANCHOR's, built on the host before it moves: its linear weights copied straight to bfloat16 under
    mixed precision, the rest, embeddings included, as loaded), ``trunk`` and ``reference`` caches
    (:func:`host_cache_bytes`), ``total``."""
    c = _counts(plan)
    bf16 = plan.precision == "bf16"
    per = 2 if bf16 else 4
    base = c["all"] * per
    student = c["gpu"] * per
    copy = 0.0
    if plan.anchored and plan.reference == "frozen_copy":
        on_gpu_blocks = plan.top if plan.split else plan.shape.layers
        linears = sum(a * b for a, b in plan.shape.linears().values()) * on_gpu_blocks
        linears *= c["block"] / plan.shape.block_params()  # --params scales the shape
        copy = linears * 2 + (c["gpu"] - linears) * per
    caches = host_cache_bytes(
        plan.shape.hidden,
        plan.pairs,
        plan.tokens_per_seq,
        eval_pairs=plan.eval_pairs,
        trunk=plan.split,
        reference_layers=sum(_cached_layers(plan)),
    )
    out = {
        "base": base,
        "student": student,
        "frozen_copy": copy,
        "trunk": caches["trunk"],
        "reference": caches["reference"],
    }
    out["total"] = sum(out.values())
    return out


def disk_bytes(plan: Plan) -> dict:
    """Bytes on disk: ``state`` (one trained student's state file), ``states`` (all students of the run),
    ``checkpoint`` (one Trainer checkpoint: the trainable weights, as the trainer saves only what trains, and their
    AdamW moments; one kept at a time), ``checkpoints_written`` (every checkpoint of every training of the run,
    teachers included: floor(1 / checkpoint_fraction) saves each), the I/O a run spends on them."""
    n = _counts(plan)["train"]
    bf16 = plan.precision == "bf16"
    state = n * (2 if bf16 else 4)
    checkpoint = n * (6 if bf16 else 12)
    saves = max(1, math.floor(1 / plan.checkpoint_fraction + 1e-9))
    return {
        "state": state,
        "states": state * plan.students * plan.cells,
        "checkpoint": checkpoint,
        "checkpoints_written": checkpoint * saves * plan.students * plan.cells,
    }


def gpu_flops(plan: Plan) -> dict:
    """FLOPs of the run (all cells; see the module docstring): ``train``, ``reference``, ``scoring`` (scoring,
    SEAM's pass and trunk caches), ``mechanism`` (its feature passes; split over the processes like scoring),
    ``total``."""
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
    # the mechanism stage: pooled features of every trained student on the pairs the probes are fitted on
    # (teacher-train, no student trains on them; its features on the evaluation sets come from its scoring forwards),
    # and of the pretrained model once on those and every evaluation set (pipeline/intervene.py); with cached trunk
    # states the fit pairs need the frozen trunk's pass once too
    t_fit = (plan.fit_pairs if plan.fit_pairs is not None else plan.pairs) * 2 * plan.tokens_per_seq
    mechanism = plan.students * 2 * n_path * t_fit + 2 * n_path * (t_fit + t_eval)
    mechanism += 2 * n_trunk * t_fit if plan.split else 0
    mechanism = mechanism if plan.mechanism else 0.0
    out = {"train": plan.students * train, "reference": reference, "scoring": scoring, "mechanism": mechanism}
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
    # frozen weights stay as loaded: float32 under mixed precision (bf16 compute by autocast), bfloat16 for pure bf16
    weights = n_train * (w * f_w + master * f_state) + n_frozen * (4 if plan.precision == "mixed" else 2) * f_w
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
        k = plan.anchor_layers
        other += k * tokens * s.hidden * 8  # fp32 difference and square of each anchored layer's states
        # a per-step reference keeps only its anchored layers' states (models.reward_model.layer_states), in the
        # residual stream's dtype, plus one block's transient outputs
        ref_states = k * tokens * s.hidden * resid
        if plan.reference == "frozen_copy":
            reference = c["gpu"] * 2 * f_ref
            other += block + ref_states
        elif plan.reference == "adapter_disabled":
            other += block + ref_states
        else:
            other += k * tokens * s.hidden * 4
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

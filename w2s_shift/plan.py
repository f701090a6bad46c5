"""``w2s-shift plan``: GPU memory per device of a reward-model run, per backend and GPU count, before renting GPUs.

Model states (bytes per parameter; ZeRO accounting, Rajbhandari et al. 2020, "ZeRO", Sec. 3.1 and 5):
  precision ``mixed`` (bf16 compute, fp32 optimizer): bf16 weights 2 + fp32 master weights 4 + fp32 gradients 4
  + AdamW first and second moments 4 + 4 = 18 B/param (ZeRO's 16 counts bf16 gradients; PyTorch autocast, FSDP and
  DeepSpeed's bf16 optimizer accumulate them in fp32). Under autocast the "bf16 weights" are the cast copies held
  for the backward pass and the fp32 weights are the master copy.
  precision ``bf16`` (everything bf16, no master copy): weights 2 + gradients 2 + moments 2 + 2 = 8 B/param; this is
  how the cost table of shared/docs/protocol.md was measured (an 8B model cannot take 66.9 GiB otherwise).
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
Without gradient checkpointing: L blocks + one more block of backward working set. With it: each block's input
(2h bytes per token, 4h under ``mixed``) + two blocks (the recomputed one and its backward). Tokens per device =
2 x pairs x sequence length (chosen and rejected).

ANCHOR (Le et al. 2026) adds a frozen reference: a bf16 copy of the backbone (2 B/param; sharded under fsdp/zero3,
which assumes it is prepared like the student: w2s-shift's frozen copy is a plain replica today), nothing under
LoRA with the adapters disabled, or under ``cached`` only the batch's reference states on the GPU (4 B per token
and hidden unit). Its forward adds one block of working set.

Peak: AdamW frees the gradients after each step (set to None), so the peak is the larger of
(weights + states + activations) and (weights + states + gradients); DDP buckets and DeepSpeed's gradient
partitions stay allocated and count in both. Checked against the protocol.md table (one H200, bf16, no
checkpointing, 1024 tokens): within 1% for every naive row and within 2% for the frozen-copy ANCHOR rows
(tests/test_plan.py), the estimate slightly lower than the measured peaks.
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
    """The inputs of an estimate (what ``w2s-shift plan`` was asked)."""

    shape: Shape
    method: str = "anchor"
    reference: str = "frozen_copy"
    backend: str = "fsdp"
    finetune: str = "full"
    precision: str = "mixed"
    seq_len: int = 1024
    batch: int = 2  # pairs per device per step
    lora_rank: int = 8
    lora_targets: list = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    params: float | None = None  # overrides the parameter count of the shape
    notes: list = field(default_factory=list)

    @property
    def anchored(self) -> bool:
        """The method has ANCHOR's reference and anchor term (False for an unregistered name; check() names it)."""
        return getattr(REGISTERED.get(self.method), "needs_reference", False)

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
        for k in ("seq_len", "batch", "lora_rank"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{k.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.params is not None and not (
            isinstance(self.params, (int, float)) and math.isfinite(self.params) and self.params >= 1e3
        ):
            raise ValueError(f"--params must be a parameter count such as 8e9, got {self.params!r}")
        if self.finetune == "lora":
            self.shape.lora_params(self.lora_rank, self.lora_targets)


def estimate(plan: Plan, gpus: int) -> dict:
    """Bytes per device of ``plan`` on ``gpus`` devices.

    Returns:
        dict of GiB: ``weights`` (bf16 + master), ``grads``, ``adamw``, ``reference``, ``gathered`` (fsdp/zero3
        transient), ``activations``, ``activations_ckpt``, ``other`` (final norm, ANCHOR's error terms, cached
        reference states, one reference block), ``total``, ``total_ckpt`` (peaks without / with gradient
        checkpointing), and the parameter counts used.

    Raises:
        ValueError: gpus < 1 or a bad plan field.
    """
    plan.check()
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"GPU count must be a positive integer, got {gpus!r}")
    s, W, b = plan.shape, gpus, plan.backend
    scale = (plan.params / s.params()) if plan.params else 1.0
    n_all = s.params() * scale
    if plan.finetune == "lora":
        n_train = s.lora_params(plan.lora_rank, plan.lora_targets) + s.hidden
        n_frozen = n_all - s.hidden
    else:
        n_train, n_frozen = n_all, 0.0
    w, master, g, adam = PRECISION[plan.precision]
    full = 1.0
    shard = 1.0 / W
    f_w = shard if b in ("zero3", "fsdp") else full  # bf16 weights and frozen weights
    f_state = full if b == "ddp" else shard  # master, gradients, moments
    weights = n_train * (w * f_w + master * f_state) + n_frozen * 2 * f_w
    grads = n_train * g * f_state
    adamw = n_train * adam * f_state
    buckets = n_train * g if b == "ddp" and W > 1 else 0.0  # DDP's gradient buckets (a second copy)
    kept = grads if b in ("zero2", "zero3") else 0.0  # DeepSpeed keeps its gradient partitions allocated

    tokens = 2 * plan.batch * plan.seq_len
    block = tokens * s.block_activation_bytes_per_token()
    resid = 4 if plan.precision == "mixed" else 2
    act = s.layers * block + block
    act_ckpt = s.layers * tokens * resid * s.hidden + 2 * block
    gathered = (
        (2 * s.block_params() * scale + s.embed_params() * scale) * 2 if b in ("zero3", "fsdp") and W > 1 else 0.0
    )

    reference, other = 0.0, tokens * s.hidden * 6  # final RMSNorm (fp32 input + bf16 output)
    if plan.anchored:
        other += tokens * s.hidden * 8  # fp32 difference and square of the anchored states
        if plan.reference == "frozen_copy":
            reference = n_all * 2 * f_w
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
        "params": n_all,
        "trainable_params": n_train,
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


def resolve(spec: str) -> tuple:
    """A model shape and run-config defaults from CONFIG_OR_MODEL: a known shape name, a folder or config.json
    of a decoder, or a w2s-shift run config (YAML file or preset) whose student is one of those.

    Returns:
        (Shape, dict of defaults from the run config: seq_len, method, reference, finetune, lora_rank, lora_targets,
        notes).

    Raises:
        ValueError: none of these (the message lists the known shapes).
    """
    s = known_shape(spec)
    if s is not None:
        return s, {}
    p = Path(spec)
    if p.is_dir() or p.name == "config.json":
        return shape_from_config_json(p), {}
    from .config import ConfigError
    from .config_io import load_config, preset_names

    if p.suffix in (".yaml", ".yml") or spec in preset_names():
        try:
            cfg = load_config(spec)
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
        methods = [m for m in getattr(cfg, "methods", [])]
        anchor = next((m for m in methods if m.method.needs_reference), None)
        # the others cost what the baseline costs
        d = {"seq_len": st.max_length, "method": anchor.name if anchor else BASELINE}
        if anchor is not None:
            d["reference"] = anchor.reference
        lora = getattr(st, "lora", None)
        d["finetune"] = "lora" if lora else "full"
        if lora:
            d["lora_rank"], d["lora_targets"] = lora.r, list(lora.target_modules)
        if getattr(st, "trainable_layers", None):
            d["notes"] = [
                f"the config trains only the top {st.trainable_layers} layers; the estimate is for full fine-tuning "
                "(an upper bound)"
            ]
        return shape, d
    raise ValueError(
        f"{spec}: not a known model shape ({', '.join(x.name for x in SHAPES.values())}), a model folder or "
        "config.json, or a w2s-shift run config"
    )


def format_plan(plan: Plan, gpus: list, gpu_mem: float) -> str:
    """The table printed by ``w2s-shift plan``: GiB per device for each GPU count, and whether it fits."""
    rows = [estimate(plan, n) for n in gpus]
    s = plan.shape
    w, master, g, adam = PRECISION[plan.precision]
    ref = plan.reference if plan.anchored else "none"
    lines = [
        f"model {s.name}: {rows[0]['params']:.3g} parameters "
        f"(reward model: backbone + head){' [--params]' if plan.params else ''}; "
        f"{s.layers} layers, hidden {s.hidden}, MLP {s.intermediate}, vocab {s.vocab}, heads {s.heads}/{s.kv_heads}",
        f"method {plan.method} (reference: {ref}), {plan.finetune} fine-tuning"
        + (
            f" (rank {plan.lora_rank} on {','.join(plan.lora_targets)}: {rows[0]['trainable_params']:.3g} trainable)"
            if plan.finetune == "lora"
            else ""
        )
        + f", backend {plan.backend}, precision {plan.precision}",
        f"bytes per trained parameter: weights {w} (bf16) + master {master} + gradients {g} + AdamW moments {adam} "
        f"= {w + master + g + adam}; frozen weights 2 (bf16)",
        f"per GPU: {plan.batch} pairs x {plan.seq_len} tokens "
        f"({rows[0]['tokens_per_device']} tokens, chosen + rejected); "
        f"global batch = {plan.batch} x GPUs pairs/step",
        "",
        f"{'GPUs':>4} | {'weights':>7} | {'grads':>6} | {'AdamW':>6} | {'ref':>5} | "
        f"{'gather':>6} | {'act':>6} | {'act ckpt':>8} "
        f"| {'other':>5} | {'peak':>6} | "
        f"{'fits ' + format(gpu_mem, 'g') + ' GiB':>11} | {'peak ckpt':>9} | {'fits ckpt':>9}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(
            f"{r['gpus']:>4} | {r['weights']:>7.1f} | {r['grads']:>6.1f} | {r['adamw']:>6.1f} | "
            f"{r['reference']:>5.1f} | {r['gathered']:>6.1f} | {r['activations']:>6.1f} | "
            f"{r['activations_ckpt']:>8.1f} | {r['other']:>5.1f} | {r['total']:>6.1f} | "
            f"{fits(r['total'], gpu_mem):>11} | {r['total_ckpt']:>9.1f} | {fits(r['total_ckpt'], gpu_mem):>9}"
        )
    lines += [
        "",
        "GiB per GPU. peak = max(weights + AdamW + ref + gather + act + other, weights + AdamW + ref + grads) "
        "(gradients are freed after each step; DDP buckets and ZeRO gradient partitions stay and count in both)."
        f" 'yes': at most {FITS_SHARE:.0%} of the GPU; 'tight': at most 100%. 'ckpt': with gradient checkpointing "
        "(the w2s-shift trainer does not turn it on yet).",
    ]
    if plan.anchored and plan.reference == "frozen_copy" and plan.backend in ("fsdp", "zero3"):
        lines.append(
            "The frozen reference is counted sharded like the student; "
            "w2s-shift's frozen copy is a full replica on each "
            "GPU today (add its full bf16 size), so prefer reference: cached (0 GiB of weights)."
        )
    lines += plan.notes
    ok = next((r["gpus"] for r in rows if fits(r["total"], gpu_mem) == "yes"), None)
    cfgname = ACCELERATE_CONFIG[plan.backend]
    if ok is None:
        lines.append(
            "No listed GPU count fits without checkpointing; "
            "try a sharded backend, LoRA, fewer pairs per GPU or more GPUs."
        )
    else:
        lines.append(
            f"Smallest fit: {ok} GPU(s): accelerate launch --config_file w2s_shift/configs/accelerate/{cfgname}.yaml "
            f"--num_processes {ok} -m w2s_shift run CONFIG  (student.batch_size = {plan.batch * ok})"
        )
    return "\n".join(lines)


def plan_json(plan: Plan, gpus: list, gpu_mem: float) -> str:
    rows = [
        dict(
            estimate(plan, n),
            fits=fits(estimate(plan, n)["total"], gpu_mem),
            fits_ckpt=fits(estimate(plan, n)["total_ckpt"], gpu_mem),
        )
        for n in gpus
    ]
    d = {k: v for k, v in asdict(plan).items() if k != "shape"}
    return json.dumps({"shape": asdict(plan.shape), "plan": d, "gpu_mem_gib": gpu_mem, "rows": rows}, indent=2)


__all__ = [
    "Shape",
    "SHAPES",
    "Plan",
    "estimate",
    "fits",
    "parse_gpus",
    "resolve",
    "shape_from_config_json",
    "known_shape",
    "format_plan",
    "plan_json",
]

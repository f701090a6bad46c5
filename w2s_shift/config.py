"""Run configuration: a pydantic model, YAML presets shipped in ``w2s_shift/configs/``, one error for all
problems.

Everything the command line can set lives here; ``--set a.b=value`` overrides any field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

METHODS = ("naive", "anchor", "confidence", "seam", "ceiling", "zero_shot")
W2S_METHODS = ("naive", "anchor", "confidence", "seam")  # trained on the weak teacher's labels: WRG/AOG/NTS apply
SAFE_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"  # labels become file names: no '/', no leading '.'


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem, one per line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DatasetRef(_Strict):
    """A dataset: a bundled/shared ``name``, a file ``path`` (with ``format`` and ``columns``), or a hub id."""

    name: str | None = Field(None, min_length=1, description="Dataset name from `w2s-shift data list`.")
    path: str | None = Field(None, min_length=1, description="A JSONL/JSON/CSV/Parquet file.")
    hf: str | None = Field(None, min_length=1, description="A Hugging Face dataset id (needs the hub).")
    format: str = Field("prompt_chosen_rejected", description="Row format of a file or hub dataset.")
    columns: dict[Literal["prompt", "chosen", "rejected", "id"], str] = Field(
        default_factory=dict, description="Map of prompt/chosen/rejected/id to the file's column names."
    )
    split: str = Field("test", description="Hub split.")
    subset: str | None = Field(None, description="Hub subset (configuration).")
    label: str | None = Field(
        None, pattern=SAFE_NAME, description="Short name in tables and file names (default: the name or file stem)."
    )

    @model_validator(mode="after")
    def _one_source(self):
        n = sum(x is not None for x in (self.name, self.path, self.hf))
        if n != 1:
            raise ValueError("give exactly one of name, path, hf")
        return self

    def identity(self) -> tuple:
        """What the dataset is (kind, name/path/hub id, subset, split): equal identities are the same data."""
        if self.name:
            return ("name", self.name)
        if self.path:
            return ("path", str(Path(self.path).resolve()), self.format)
        return ("hf", self.hf, self.subset, self.split, self.format)

    @property
    def display(self) -> str:
        """The name used in tables and in file names: letters, digits, '.', '_' and '-' only."""
        if self.label:
            return self.label
        raw = self.name or (Path(self.path).name.split(".")[0] if self.path else self.hf.split("/")[-1])
        return re.sub(r"[^A-Za-z0-9._-]", "_", raw).lstrip(".") or "dataset"


def _coerce_ref(v):
    if isinstance(v, str):
        p = Path(v)
        if p.suffix or "/" in v and p.exists():
            return {"path": v}
        if v.startswith("hf:"):
            return {"hf": v[3:]}
        return {"name": v}
    return v


def dataset_ref(spec: str, format: str | None = None) -> DatasetRef:
    """The dataset a string names, resolved as an entry of ``data.sources`` / ``data.ood`` is: a string with a
    suffix (or an existing path with a '/') is a file, ``hf:<id>`` a hub id, anything else a dataset name.
    ``format``: the row format of a file or hub id (None: the default)."""
    return DatasetRef.model_validate({**_coerce_ref(spec), **({"format": format} if format is not None else {})})


class DataConfig(_Strict):
    sources: list[DatasetRef] = Field(
        default_factory=lambda: [DatasetRef(name="ultrafeedback")],
        min_length=1,
        description="Source datasets (ID); each is one grid row, trained on alone. "
        "`source:` (one dataset) is accepted too.",
    )
    ood: list[DatasetRef] = Field(
        default_factory=lambda: [DatasetRef(name="hh-helpful-base")],
        min_length=1,
        description="OOD targets, never trained on; a target equal to the source of a grid row "
        "is left out of that row (each row needs at least one other).",
    )
    split_fractions: tuple[float, float, float] = Field(
        (0.45, 0.35, 0.20), description="teacher-train / student-train / ID-test shares, by prompt."
    )
    n_teacher_train: int | None = Field(None, ge=1, description="Cap on teacher-train pairs (None: all).")
    n_student_train: int | None = Field(None, ge=1, description="Cap on student-train pairs.")
    n_test: int | None = Field(None, ge=1, description="Cap on ID test pairs.")
    n_ood: int | None = Field(None, ge=1, description="Cap on pairs per OOD target.")
    skip_invalid: bool = Field(False, description="Skip and count invalid rows instead of stopping.")
    remove_ood_overlap: bool = Field(True, description="Drop OOD pairs whose prompt occurs in the source data.")
    seed: int = Field(0, description="Split and subsample seed.")
    resplit_per_seed: bool = Field(
        False,
        description="Split and subsample the source anew for each training seed k "
        "(split seed data.seed x 1000003 + k), so the spread over seeds covers the data split "
        "too; false: one split fixed by data.seed for every seed (training noise only).",
    )

    @model_validator(mode="before")
    @classmethod
    def _source_alias(cls, data):
        if isinstance(data, dict) and "source" in data:
            data = dict(data)
            if "sources" in data:
                raise ValueError("give sources or source, not both")
            data["sources"] = data.pop("source")
        return data

    @field_validator("sources", mode="before")
    @classmethod
    def _src(cls, v):
        if isinstance(v, (str, dict)):
            v = [v]
        return [_coerce_ref(x) for x in v] if isinstance(v, list) else v

    @field_validator("ood", mode="before")
    @classmethod
    def _ood(cls, v):
        if isinstance(v, (str, dict)):
            v = [v]
        return [_coerce_ref(x) for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _grid_rows(self):
        seen = {}
        for r in [*self.sources, *self.ood]:
            other = seen.setdefault(r.display, r)
            if other.identity() != r.identity():
                raise ValueError(
                    f"two different datasets are both named {r.display!r} ({other.identity()[1]} and "
                    f"{r.identity()[1]}); set label: on one of them"
                )
        names = [r.display for r in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names} (set label:)")
        onames = [r.display for r in self.ood]
        if len(set(onames)) != len(onames):
            raise ValueError(f"OOD target names must be unique, got {onames} (set label:)")
        for r in self.sources:
            if not self.ood_for(r):
                raise ValueError(f"source {r.display!r} has no OOD target other than itself")
        return self

    def ood_for(self, source: DatasetRef) -> list:
        """The OOD targets of one grid row: every target except the source itself."""
        return [o for o in self.ood if o.identity() != source.identity()]

    @field_validator("split_fractions")
    @classmethod
    def _fr(cls, v):
        if any(x < 0 for x in v) or abs(sum(v) - 1) > 1e-6 or v[0] == 0 or v[1] == 0 or v[2] == 0:
            raise ValueError("three positive shares summing to 1")
        return v


class LoraSettings(_Strict):
    """LoRA adapters (peft) on the trainable part of a student; the reward head trains in full and is saved."""

    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (scale alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names that get adapters (Llama/Qwen attention projections by default).",
    )


class ModelConfig(_Strict):
    name: str = Field(..., description="Local folder, .gguf file, preset name or hub id.")
    max_length: int = Field(
        256,
        ge=8,
        description=(
            "Tokens per sequence after truncation (the response end and end-of-turn markup are never cut; the prompt "
            "keeps its most recent tokens within a budget; an over-long response loses its middle)."
        ),
    )
    trainable_layers: int | None = Field(None, ge=1, description="Train only the top N layers (+ head); None: all.")
    trunk_cache: bool = Field(
        True, description="With trainable_layers on Llama/Qwen/Mistral: run frozen layers once and reuse."
    )
    freeze_embeddings: bool = Field(True, description="Keep the token embeddings frozen.")
    pooling: Literal["last", "mean"] = Field("last", description="Reward read at the last real token, or mean-pooled.")
    trust_remote_code: bool = Field(False, description="Allow the model's own Python code (off by default).")
    allow_pickle: bool = Field(False, description="Allow .bin/.pt pickle checkpoints (off by default).")
    epochs: float = Field(1.0, gt=0, description="Passes over the training pairs.")
    batch_size: int = Field(8, ge=1, description="Pairs per optimizer step.")
    gradient_accumulation_steps: int = Field(
        1,
        ge=1,
        description="Micro-batches per optimizer step (passed to the Trainer): each forward takes batch_size / "
        "(this x processes) pairs and the step still batch_size pairs; the loss is normalized over the "
        "whole step (pairs, and response tokens for ANCHOR), so gradients equal one batch of batch_size. "
        "Must divide batch_size.",
    )
    learning_rate: float = Field(5e-5, gt=0, description="AdamW peak learning rate (linear warm-up and decay).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="Share of steps with linear learning-rate warm-up.")
    head_lr_multiplier: float = Field(1.0, gt=0, description="The new scalar head learns at this x learning_rate.")
    bf16: Literal["auto"] | bool = Field(
        "auto",
        description="bfloat16 autocast (and bfloat16 frozen trunk): auto (bfloat16 on a CUDA device that supports it, "
        "or a CPU with native bfloat16 (AMX-BF16/AVX512_BF16) where a short probe finds it >= 1.3x faster "
        "than float32; else float32), true or false. The run resolves auto once, at its start "
        "(w2s_shift.models.precision); the resolved precision is part of the run's identity, auto is not.",
    )
    eval_max_tokens: int = Field(8192, ge=64, description="Padded tokens per inference forward.")
    disable_dropout: bool = Field(
        True,
        description="Train with every dropout probability at 0 (TRL RewardConfig's default; "
        "BERT-style attention dropout also triples a CPU training step); "
        "LoRA keeps its own lora.dropout.",
    )
    packing: bool = Field(
        True,
        description="Train on padding-free packed rows (position_ids restart per sequence) "
        "where exact: decoders (Llama, Qwen2/3, Mistral) with pooling 'last'; "
        "encoders and mean pooling are padded. Checked before training.",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch CPU threads while this model trains and scores "
        "(None: the run's threads). Small models run best on 1.",
    )
    lora: LoraSettings | None = Field(
        None, description="Train LoRA adapters instead of the weights (students; None: no LoRA)."
    )
    _precision: dict | None = PrivateAttr(
        None
    )  # set by models.precision.resolve_model_precision: setting, device, reason

    @model_validator(mode="after")
    def _accumulation_divides_batch(self):
        if self.batch_size % self.gradient_accumulation_steps:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps}"
            )
        return self

    @property
    def finetune(self) -> str:
        """'lora', 'top_layers' or 'full'."""
        return "lora" if self.lora else ("top_layers" if self.trainable_layers else "full")


LayerSpec = Literal["last", "middle"] | list[int]


class MethodConfig(_Strict):
    """One student method. ``anchor_lambda`` and ``anchor_layers`` may list several values: the entry then
    expands into one method per combination (see :meth:`RunConfig.expanded_methods`)."""

    name: Literal["naive", "anchor", "confidence", "seam", "ceiling", "zero_shot"] = Field(
        ...,
        description="naive (soft BT on teacher labels), anchor (+ lambda x representation anchoring), confidence "
        "(auxiliary confidence loss), seam (SEAM labels, soft BT), ceiling (gold labels), zero_shot "
        "(pretrained student, mean response log-likelihood; no training).",
    )
    anchor_lambda: float | Literal["auto"] | list[float | Literal["auto"]] = Field(
        1e-4,
        description="ANCHOR weight lambda >= 0, 'auto' (a drift budget: lambda adapts each optimizer step so the "
        "anchored layers' relative drift stays near anchor_target_drift), or a list of these (a grid).",
    )
    anchor_normalize: bool = Field(
        True,
        description="Divide each anchored layer's squared error by the reference's mean squared norm at that layer "
        "(same response tokens and hidden units): L_anchor is then a relative squared error, so one "
        "lambda means the same for every model and layer. false: the paper's raw MSE.",
    )
    anchor_target_drift: float = Field(
        0.02,
        gt=0,
        description="anchor_lambda auto: the drift budget, a relative squared error sum ||h - h_ref||^2 / "
        "sum ||h_ref||^2 over response tokens, mean over the anchored layers, per batch.",
    )
    anchor_lambda_init: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="anchor_lambda auto: lambda at the first step."
    )
    anchor_k: float = Field(
        0.1,
        gt=0,
        le=5,
        description="anchor_lambda auto: controller gain K; each optimizer step lambda <- lambda * (1 + K * "
        "clip((drift - target) / target, -0.2, 0.2)) (Ziegler et al. 2019 sec. 2.2, K = 0.1: at "
        "most 2% a step, so over S steps lambda moves at most 1.02^S from anchor_lambda_init).",
    )
    anchor_layers: LayerSpec | list[LayerSpec] = Field(
        "last",
        description="Anchored layers: 'last' (the final normalized output the head reads), 'middle' (blocks at 50% "
        "and 75% of depth), or an explicit list of 1-based block indices; a list of these is a grid.",
    )
    reference: Literal["cached", "frozen_copy", "adapter_disabled"] = Field(
        "cached",
        description="ANCHOR reference: states computed once and reused (cached), a frozen copy run every step, "
        "or under LoRA the same model with its adapters disabled.",
    )
    confidence_alpha_max: float = Field(
        0.5, ge=0, le=1, description="Confidence loss: final alpha (Burns et al. 2023)."
    )
    confidence_warmup: float = Field(
        0.2, ge=0, le=1, description="Confidence loss: share of training over which alpha rises linearly."
    )
    seam_nodes: int = Field(3, ge=1, description="SEAM: informative principles kept per pair.")
    seam_exit_margin: float = Field(
        1.0, gt=0, description="SEAM: |weak margin| at which the fast-and-frugal tree exits."
    )
    label: str | None = Field(
        None,
        pattern=SAFE_NAME,
        description="Name in tables and file names (default: the method name, "
        "with lambda/layers appended for grid entries).",
    )

    @field_validator("anchor_lambda", mode="before")
    @classmethod
    def _lam_words(cls, v):
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str) and x != "auto":
                try:
                    float(x)
                except ValueError:
                    raise ValueError(f"anchor_lambda {x!r}: give a number >= 0, 'auto' or a list of these") from None
        return v

    @field_validator("anchor_lambda")
    @classmethod
    def _lam(cls, v):
        vals = v if isinstance(v, list) else [v]
        if not vals or any(x != "auto" and ((not math.isfinite(x)) or x < 0) for x in vals):
            raise ValueError("lambda values must be finite and >= 0 or 'auto' (a non-empty list for a grid)")
        return v[0] if isinstance(v, list) and len(v) == 1 else v  # a one-value list is that value, not a grid

    @field_validator("anchor_layers")
    @classmethod
    def _layers(cls, v):
        specs = v if (isinstance(v, list) and v and not all(isinstance(x, int) for x in v)) else [v]
        for sp in specs:
            if isinstance(sp, list) and (not sp or any(x < 1 for x in sp)):
                raise ValueError("an explicit layer list holds 1-based block indices (>= 1)")
            if isinstance(sp, list) and len(set(sp)) != len(sp):
                raise ValueError(f"the layer list {sp} repeats layer(s) {sorted({x for x in sp if sp.count(x) > 1})}")
        return v

    def layer_specs(self) -> list:
        v = self.anchor_layers
        return v if (isinstance(v, list) and v and not all(isinstance(x, int) for x in v)) else [v]

    def lambdas(self) -> list:
        return self.anchor_lambda if isinstance(self.anchor_lambda, list) else [self.anchor_lambda]

    @property
    def display(self) -> str:
        """The label, else the method name (an ANCHOR with lambda auto: ``anchor-auto``, never the fixed one's)."""
        if self.label:
            return self.label
        return f"{self.name}-auto" if self.name == "anchor" and self.anchor_lambda == "auto" else self.name

    @property
    def anchor_active(self) -> bool:
        """An ANCHOR method whose anchor term is on (lambda auto or > 0)."""
        return self.name == "anchor" and (
            self.anchor_lambda == "auto" or (not isinstance(self.anchor_lambda, list) and self.anchor_lambda > 0)
        )

    @property
    def lambda_text(self) -> str:
        """Lambda in logs: '1e-4', or 'auto (target drift 0.02, init 1, K 0.1)'; '(relative)' when normalized."""
        lam = self.anchor_lambda
        txt = (
            f"auto (target drift {self.anchor_target_drift:g}, init {self.anchor_lambda_init:g}, K {self.anchor_k:g})"
            if lam == "auto"
            else f"{lam:g}"
            if not isinstance(lam, list)
            else str(lam)
        )
        return txt + (", relative error" if self.anchor_normalize else ", raw MSE")

    @property
    def layer_spec_name(self) -> str:
        sp = self.anchor_layers
        return sp if isinstance(sp, str) else "L" + "-".join(str(x) for x in sp)

    def is_grid(self) -> bool:
        return len(self.lambdas()) > 1 or len(self.layer_specs()) > 1


def _fmt_lambda(x: float) -> str:
    """Lambda in a label: 0, 1e-4, 1.5e-4, 2e1 (exact to 6 significant digits, so distinct values never collide)."""
    if x == 0:
        return "0"
    m, e = f"{x:.5e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


class RunConfig(_Strict):
    output_dir: str = Field("runs/quickstart", min_length=1, description="Run directory (results, labels, report).")
    seeds: list[Annotated[int, Field(ge=0, lt=2**32)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Training seeds (teacher and students); `seed:` (one) is accepted too. The data "
        "split is fixed by data.seed unless data.resplit_per_seed.",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    teacher: ModelConfig = Field(default_factory=lambda: ModelConfig(name="minilm-l6"))
    student: ModelConfig = Field(default_factory=lambda: ModelConfig(name="smollm2-135m", trainable_layers=4))
    methods: list[MethodConfig] = Field(
        default_factory=lambda: [MethodConfig(name="naive"), MethodConfig(name="anchor"), MethodConfig(name="ceiling")],
        min_length=1,
        description="Student methods (at least one).",
    )
    bootstrap: int = Field(2000, ge=100, description="Bootstrap resamples for intervals.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default).")
    drift: bool = Field(
        True,
        description="Measure representation drift of each trained student against its pretrained "
        "reference (relative squared error and linear CKA per layer).",
    )
    drift_pairs: int = Field(
        128, ge=8, description="Pairs per evaluation set used for the drift measurement at the end."
    )
    drift_interval: int = Field(
        10, ge=0, description="Also measure last-layer drift on 32 probe pairs every N optimizer steps (0: off)."
    )
    export: Literal["none", "all"] | list[str] = Field(
        "none",
        description="Students (method labels) saved as Hugging Face AutoModelForSequenceClassification folders "
        "('all': every trained student; zero-shot is not a reward model). Adding it to a finished "
        "run and rerunning exports from the saved weights.",
    )
    report_to: list[Literal["tensorboard"]] = Field(
        default_factory=list, description="Trainer logging integrations (tensorboard)."
    )
    min_free_disk_mb: int = Field(
        500, ge=0, description="Refuse to start when the run directory's disk has less free space (MiB)."
    )
    checkpoint_fraction: float = Field(
        0.25, gt=0, le=1, description="Save a training checkpoint every this share of steps (resume after a kill)."
    )

    @model_validator(mode="before")
    @classmethod
    def _seed_alias(cls, data):
        if isinstance(data, dict) and "seed" in data:
            data = dict(data)
            if "seeds" in data:
                raise ValueError("give seeds or seed, not both")
            s = data.pop("seed")
            data["seeds"] = s if isinstance(s, list) else [s]
        return data

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct, got {v}")
        return v

    @field_validator("methods", mode="before")
    @classmethod
    def _methods(cls, v):
        if isinstance(v, str):
            v = [v]
        return [{"name": m} if isinstance(m, str) else m for m in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _labels_unique(self):
        names = [m.display for m in self.expanded_methods()]
        if len(set(names)) != len(names):
            raise ValueError(f"method labels must be unique, got {names} (set label: for repeats)")
        if "teacher" in names:
            raise ValueError("'teacher' is reserved")
        for m in self.methods:
            if m.reference == "adapter_disabled" and m.name == "anchor" and not self.student.lora:
                raise ValueError("reference adapter_disabled needs a LoRA student (student.lora)")
        if sum(m.name == "ceiling" for m in self.methods) > 1 or sum(m.name == "zero_shot" for m in self.methods) > 1:
            raise ValueError("at most one ceiling and one zero_shot method")
        if isinstance(self.export, list):
            unknown = sorted(set(self.export) - set(names))
            if unknown:
                raise ValueError(f"export names unknown students {unknown} (students: {names})")
            untrained = [
                m.display for m in self.expanded_methods() if m.name == "zero_shot" and m.display in self.export
            ]
            if untrained:
                raise ValueError(
                    f"export: {untrained} is the untrained zero-shot model (a language model, not a reward "
                    "model with a head); export trained students only"
                )
        if "tensorboard" in self.report_to:
            import importlib.util

            if not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
                raise ValueError("report_to tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'")
        return self

    def expanded_methods(self) -> list:
        """Concrete methods: an anchor entry listing several lambdas and/or layer specs becomes one method per
        combination, labelled ``<label>-lam<lambda>`` and/or ``-<last|middle|L<i>-<j>>``."""
        out = []
        for m in self.methods:
            if m.name != "anchor" or not m.is_grid():
                out.append(m)
                continue
            base = m.display
            for sp in m.layer_specs():
                for lam in m.lambdas():
                    c = m.model_copy(update={"anchor_lambda": lam, "anchor_layers": sp, "label": None})
                    parts = [base]
                    if len(m.layer_specs()) > 1:
                        parts.append(c.layer_spec_name)
                    if len(m.lambdas()) > 1:
                        parts.append("auto" if lam == "auto" else "lam" + _fmt_lambda(lam))
                    elif lam == "auto" and not m.label:
                        parts[0] = "anchor-auto"
                    out.append(c.model_copy(update={"label": "-".join(parts)}))
        return out

    def digest(self, *parts: str) -> str:
        """sha256 (16 hex) of the JSON of the named sub-configs (what a stage depends on); the whole config
        without output_dir and threads when no part is named. ``bf16: auto`` counts as the precision it resolves
        to on this machine (``models.precision.resolve_precisions``), never as 'auto'."""
        if "auto" in (self.teacher.bf16, self.student.bf16):
            from .models.precision import resolve_precisions

            return resolve_precisions(self).digest(*parts)
        d = self.model_dump(mode="json", exclude={"output_dir", "threads", "export", "report_to", "min_free_disk_mb"})
        for role in ("teacher", "student"):
            d[role].pop("threads", None)
        sel = {p: _dig(d, p) for p in parts} if parts else d
        return hashlib.sha256(json.dumps(sel, sort_keys=True).encode()).hexdigest()[:16]


def _dig(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d[k]
    return d


def _format_errors(e: ValidationError, origin: str) -> str:
    lines = [f"{origin}: {e.error_count()} problem(s) in the configuration:"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        lines.append(f"  - {loc}: {err['msg']}")
    return "\n".join(lines)


def preset_names() -> list:
    return sorted(p.name[:-5] for p in resources.files("w2s_shift.configs").iterdir() if p.name.endswith(".yaml"))


MAX_CONFIG_DEPTH = 50  # a real config nests 4 levels; deeper is a mistake or a bomb for the validators


def _depth_exceeds(obj, limit: int) -> bool:
    """True when lists/mappings nest deeper than ``limit`` (checked iteratively: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (YAML 1.2 forbids it; PyYAML keeps the last).

    Raises:
        ConfigError: "<file>, line N: duplicate key 'k' (first on line M)".
    """

    origin = "config"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise ConfigError(
                            f"{self.origin}, line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                            f"(first on line {seen[key]})"
                        )
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: the constructor names it
                    continue
        return super().construct_mapping(node, deep=deep)


def read_yaml(path_or_preset: str | None) -> tuple:
    """Read a YAML config file or a shipped preset by name; (dict, origin). Safe loader only."""
    if path_or_preset is None:
        path_or_preset = "quickstart"
    p = Path(path_or_preset)
    if p.is_file():
        origin = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{origin}: not valid UTF-8 (byte {e.start})") from None
    elif path_or_preset in preset_names():
        text = resources.files("w2s_shift.configs").joinpath(f"{path_or_preset}.yaml").read_text(encoding="utf-8")
        origin = f"preset {path_or_preset}"
    else:
        raise ConfigError(f"{path_or_preset}: no such config file or preset (presets: {', '.join(preset_names())})")
    loader = _UniqueKeyLoader(text)
    loader.origin = origin
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"{origin}: invalid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{origin}: nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(f"{origin}: config file is empty (no settings; omit the file to run the quickstart)")
    if _depth_exceeds(data, MAX_CONFIG_DEPTH):
        raise ConfigError(f"{origin}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping")
    return data, origin


def apply_overrides(data: dict, overrides: list) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a config dict. A section the config file
    leaves out starts from its defaults, so ``--set teacher.epochs=1`` changes only that field.

    Raises:
        ConfigError: no ``=``, an empty key, a key through a non-section, or a value that is not YAML.
    """
    defaults = RunConfig().model_dump(mode="json")
    for o in overrides or []:
        if "=" not in o:
            raise ConfigError(f"--set {o!r}: expected KEY=VALUE, e.g. student.epochs=2")
        key, val = o.split("=", 1)
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"--set {o!r}: empty key")
        try:
            value = yaml.safe_load(val)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {o!r}: the value is not valid YAML ({str(e).splitlines()[0]})") from None
        cur, dflt = data, defaults
        for k in parts[:-1]:
            dflt = dflt.get(k, {}) if isinstance(dflt, dict) else {}
            if k not in cur:
                cur[k] = dict(dflt) if isinstance(dflt, dict) else {}
            cur = cur[k]
            if not isinstance(cur, dict):
                raise ConfigError(f"--set {o!r}: {k} is not a section")
        cur[parts[-1]] = value
        twin = _ALIASES.get(tuple(parts))  # `--set data.source=x` replaces a sources list, and back
        if twin:
            cur.pop(twin, None)
    return data


_ALIASES = {("data", "source"): "sources", ("data", "sources"): "source", ("seed",): "seeds", ("seeds",): "seed"}


def load_config(path_or_preset: str | None = None, overrides: list | None = None) -> RunConfig:
    """Load, override and validate a config.

    Raises:
        ConfigError: listing every problem (unknown keys, wrong types, out-of-range values).
    """
    data, origin = read_yaml(path_or_preset)
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, origin)) from None

"""Run configuration: the pydantic model of a run, one error for all problems.

Everything the command line can set lives here; reading YAML files and presets and applying ``--set a.b=value``
overrides is :mod:`w2s_shift.config_io`. Method names are checked against the registry (:mod:`w2s_shift.methods`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from .data.refs import DatasetRef, coerce_ref, dataset_ref, ref_kind
from .io import SAFE_NAME
from .methods import DEFAULT_METHODS, METHODS, MethodConfig, check_entries, method_entry

__all__ = [
    "BonConfig",
    "ConfigError",
    "DataConfig",
    "DatasetRef",
    "ModelConfig",
    "RunConfig",
    "dataset_ref",
    "ref_kind",
]

#: LoRA's default target modules: the attention projections of Llama/Qwen/Mistral blocks.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem, one per line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


#: Names of the source's training splits in the run (encoded features, rewards/teacher__student_train.jsonl): no
#: dataset may be named so.
INTERNAL_SETS = ("teacher_train", "student_train")

#: Best-of-n candidate sets are evaluation sets named ``bon-<set>`` (rewards/<model>__bon-<set>.jsonl): no dataset's
#: name may start so, in any case.
BON_SET_PREFIX = "bon-"


def reserved_set_name(name: str) -> str | None:
    """Why ``name`` cannot name a dataset of a run (its files would be another set's), or None when it can."""
    if name.casefold() in INTERNAL_SETS:
        return (
            f"is the name of an internal split of the source ({', '.join(INTERNAL_SETS)}), whose features and "
            "rewards it would share"
        )
    if name.casefold().startswith(BON_SET_PREFIX):
        return (
            f"starts with {BON_SET_PREFIX!r}, the prefix of best-of-n candidate sets, whose rewards files it would "
            "share"
        )
    return None


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
    n_teacher_train: int | None = Field(None, ge=1, le=10**8, description="Cap on teacher-train pairs (None: all).")
    n_student_train: int | None = Field(None, ge=1, le=10**8, description="Cap on student-train pairs.")
    n_test: int | None = Field(None, ge=1, le=10**8, description="Cap on ID test pairs.")
    n_ood: int | None = Field(None, ge=1, le=10**8, description="Cap on pairs per OOD target.")
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

    @field_validator("sources", "ood", mode="before")
    @classmethod
    def _refs(cls, v):
        if isinstance(v, (str, dict)):
            v = [v]
        return [coerce_ref(x) for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _grid_rows(self):
        seen = {}
        for r in [*self.sources, *self.ood]:
            # names become file names: equal up to case they are one file on a case-insensitive filesystem
            other = seen.setdefault(r.display.casefold(), r)
            if other.identity() != r.identity():
                same = "both named" if other.display == r.display else "named alike up to case,"
                raise ValueError(
                    f"two different datasets are {same} {other.display!r} ({other.identity()[1]}) and "
                    f"{r.display!r} ({r.identity()[1]}); set label: on one of them"
                )
        for r in [*self.sources, *self.ood]:
            why = reserved_set_name(r.display)
            if why:
                raise ValueError(f"dataset name {r.display!r} ({r.identity()[1]}) {why}; set label: on it")
        names = [r.display for r in self.sources]
        if len({n.casefold() for n in names}) != len(names):
            raise ValueError(f"source names must be unique, also up to case, got {names} (set label:)")
        onames = [r.display for r in self.ood]
        if len({n.casefold() for n in onames}) != len(onames):
            raise ValueError(f"OOD target names must be unique, also up to case, got {onames} (set label:)")
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
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        description="Module names that get adapters (Llama/Qwen attention projections by default).",
    )


class ModelConfig(_Strict):
    name: str = Field(..., description="Local folder, .gguf file, preset name or hub id.")
    max_length: int = Field(
        256,
        ge=8,
        le=2**20,
        description=(
            "Tokens per sequence after truncation (the response end and end-of-turn markup are never cut; the prompt "
            "keeps its most recent tokens within a budget, the same in both sequences of a pair; an over-long "
            "response loses its middle)."
        ),
    )
    trainable_layers: int | None = Field(None, ge=1, description="Train only the top N layers (+ head); None: all.")
    trunk_cache: bool = Field(
        True, description="With trainable_layers on Llama/Qwen/Mistral: run frozen layers once and reuse."
    )
    trunk_share_prefixes: bool = Field(
        True,
        description="With trunk_cache on a causal full-attention decoder (SDPA or eager attention): run the tokens a "
        "pair's chosen and rejected sequences share at their start (system turn, prompt) through the frozen layers "
        "once, the pair packed in one row with its two responses masked apart; the states equal the plain pass's up "
        "to rounding. On a 2-core AVX512_BF16 CPU: 27.6% fewer trunk tokens, 1.2x faster trunk, default job 516 s -> "
        "472 s. Off: every sequence whole.",
    )
    freeze_embeddings: bool = Field(True, description="Keep the token embeddings frozen.")
    pooling: Literal["last", "mean"] = Field("last", description="Reward read at the last real token, or mean-pooled.")
    trust_remote_code: bool = Field(False, description="Allow the model's own Python code (off by default).")
    allow_pickle: bool = Field(False, description="Allow .bin/.pt pickle checkpoints (off by default).")
    epochs: float = Field(1.0, gt=0, le=1000, description="Passes over the training pairs.")
    batch_size: int = Field(8, ge=1, le=2**16, description="Pairs per optimizer step.")
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
    pure_bf16: bool = Field(
        False,
        description="Weights, gradients and AdamW moments all in bfloat16, no float32 master copy (half the "
        "weight memory; `w2s-shift plan CONFIG --precision bf16`). Off (default): the checkpoint is loaded in float32 "
        "whatever dtype it was stored in, the optimizer steps on float32 master weights and bf16 compute comes from "
        "autocast; pure bf16 rounds AdamW updates below bf16's resolution (about |w| / 256) to zero, so at small "
        "learning rates most backbone weights do not move. Needs bf16 true (or auto resolving to true).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each trained block's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing, non-reentrant): activation memory of about one block instead of "
        "all, for about one more forward per step. Works with ANCHOR's hidden states, LoRA and FSDP.",
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
        le=4096,
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
        if self.pure_bf16 and self.bf16 is False:
            raise ValueError("pure_bf16: true needs bf16 true or auto (its weights are bfloat16), not bf16: false")
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


class BonConfig(_Strict):
    """Best-of-n against a gold judge (``w2s-shift bon RUN_DIR``, or after the grid with ``enabled``): N responses
    per prompt from a policy, scored by every model of the run and by a gold judge; the gold reward of each model's
    best-of-n pick for n = 1, 2, 4, ..., N (Gao et al. 2022)."""

    enabled: bool = Field(False, description="Run best-of-n after the grid in `w2s-shift run` (else: `w2s-shift bon`).")
    policy: str = Field(
        "smollm2-135m", min_length=1, description="Causal LM that samples the candidates (folder, preset or hub id)."
    )
    responses: dict[str, str] = Field(
        default_factory=dict,
        description="Candidates made elsewhere instead of sampling: prompt set name -> file of {prompt, responses: "
        "[...]} rows (the same even N per prompt); no policy is loaded.",
    )
    n_prompts: int = Field(
        50, ge=1, le=100_000, description="Prompts per set: the ID test split's and each OOD target's (distinct)."
    )
    n_samples: int = Field(16, ge=2, le=1024, description="Responses sampled per prompt (N, even).")
    max_new_tokens: int = Field(128, ge=1, le=32_768, description="Tokens sampled per response at most.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1: off).")
    max_prompt_tokens: int = Field(
        256, ge=1, description="Prompts longer than this (policy tokens) are not picked (counted in bon.json)."
    )
    batch_size: int = Field(64, ge=1, le=65_536, description="Sequences per generate call.")
    max_length: int = Field(
        384,
        ge=16,
        description="Tokens at which every reward model and the gold judge score a candidate (capped by "
        "each model's positions); the run's models trained at their own max_length.",
    )
    gold: str | None = Field(
        None,
        min_length=1,
        description="Gold judge: a reward model folder or hub id (as `w2s-shift score` loads it). None: a synthetic "
        "gold, the run's student architecture trained like the ceiling on every gold pair of the source (its "
        "teacher-train, student-train and test splits), as Gao et al. 2022 use a synthetic gold.",
    )
    gold_pairs: int | None = Field(
        None,
        ge=2,
        le=10**8,
        description="Gold pairs the synthetic gold trains on: a seeded sample (bon.seed) of every gold pair of the "
        "source, so a small run need not train it on all of them (its cost grows linearly with them). None: all.",
    )
    ns: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, min_length=1, description="The n of best-of-n (each <= N); None: 1, 2, 4, ..., N."
    )
    seed: int = Field(0, ge=0, lt=2**32, description="Sampling and prompt-choice seed.")

    @field_validator("responses")
    @classmethod
    def _set_names(cls, v):
        # a set's name is a file name (rewards/<model>__bon-<set>.jsonl): kept as it is, unique up to case
        seen = {}
        for name, path in v.items():
            if not re.match(SAFE_NAME, name):
                raise ValueError(
                    f"prompt set name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with "
                    "'.' (it names the set's rewards files)"
                )
            if name.casefold() in seen:
                raise ValueError(
                    f"prompt set names {seen[name.casefold()]!r} and {name!r} are equal up to case (one file on a "
                    "case-insensitive filesystem); rename one"
                )
            seen[name.casefold()] = name
            if not path:
                raise ValueError(f"prompt set {name!r}: the responses file is empty ('')")
        return v

    @field_validator("n_samples")
    @classmethod
    def _even(cls, v):
        if v % 2:
            raise ValueError(f"n_samples must be even (the candidates are scored as N / 2 pairs), got {v}")
        return v

    @model_validator(mode="after")
    def _ns(self):
        if self.ns and max(self.ns) > self.n_samples:
            raise ValueError(f"ns {self.ns}: every n must be at most n_samples {self.n_samples}")
        if self.gold is not None and self.gold_pairs is not None:
            raise ValueError("gold_pairs sizes the synthetic gold; with gold (an external judge) leave it out")
        return self


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
    methods: list[SerializeAsAny[MethodConfig]] = Field(
        default_factory=lambda: [method_entry(n) for n in DEFAULT_METHODS],
        min_length=1,
        description="Student methods (at least one): each entry is its method's settings model, "
        "name one of: " + "; ".join(f"{m.name} ({m.description})" for m in METHODS.values()),
    )
    bootstrap: int = Field(2000, ge=100, le=100_000, description="Bootstrap resamples for intervals.")
    threads: int | None = Field(None, ge=1, le=4096, description="torch CPU threads (None: torch's default).")
    drift: bool = Field(
        True,
        description="Measure representation drift of each trained student against its pretrained "
        "reference (relative squared error and linear CKA per layer).",
    )
    drift_pairs: int = Field(
        128, ge=8, le=100_000, description="Pairs per evaluation set used for the drift measurement at the end."
    )
    mechanism: bool = Field(
        True,
        description="Test the paper's mechanism by intervention for each trained student on every evaluation set: "
        "its head on features interpolated back to the pretrained ones, and a fresh linear probe on its frozen "
        "features against one on the pretrained features (w2s_shift.metrics.intervention); evaluation only.",
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
    report_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list, description="Trainer trackers.")
    device: Literal["auto", "cpu", "cuda", "mps"] = Field("auto", description="auto: cuda, else mps, else cpu.")
    min_free_disk_mb: int = Field(
        500, ge=0, description="Refuse to start when the run directory's disk has less free space (MiB)."
    )
    checkpoint_fraction: float = Field(
        0.25, gt=0, le=1, description="Save a training checkpoint every this share of steps (resume after a kill)."
    )
    bon: BonConfig = Field(default_factory=BonConfig, description="Best-of-n against a gold judge (evaluation only).")

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
        """Each entry validated by its own method's settings model; errors keep their place (methods.N.field)."""
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            return v
        out, errors = [], []
        for i, m in enumerate(v):
            try:
                out.append(method_entry(m))
            except ValidationError as e:
                errors += [
                    InitErrorDetails(type=x["type"], loc=(i, *x["loc"]), input=x["input"], ctx=x.get("ctx", {}))
                    for x in e.errors()
                ]
            except ValueError as e:
                where = (i, "name") if isinstance(m, str) or (isinstance(m, dict) and "name" in m) else (i,)
                errors.append(InitErrorDetails(type="value_error", loc=where, input=m, ctx={"error": e}))
        if errors:
            raise ValidationError.from_exception_data("methods", errors)
        return out

    @model_validator(mode="after")
    def _labels_unique(self):
        check_entries(self)  # labels, reserved names, one of each reference model, export
        from .tracking import check_report_to

        check_report_to(self.report_to)
        return self

    def expanded_methods(self) -> list:
        """Concrete methods: an entry that lists several values (ANCHOR's lambdas and/or layer specs) becomes one
        method per combination (:meth:`w2s_shift.methods.Method.expand`)."""
        return [c for m in self.methods for c in m.method.expand(m)]

    def digest(self, *parts: str) -> str:
        """sha256 (16 hex) of the JSON of the named sub-configs (what a stage depends on); the whole config
        without output_dir and threads when no part is named. ``bf16: auto`` counts as the precision it resolves
        to on this machine (``models.precision.resolve_precisions``), never as 'auto'."""
        if "auto" in (self.teacher.bf16, self.student.bf16):
            from .models.precision import resolve_precisions

            return resolve_precisions(self).digest(*parts)
        d = self.model_dump(
            mode="json", exclude={"output_dir", "threads", "export", "report_to", "min_free_disk_mb", "device", "bon"}
        )
        for role in ("teacher", "student"):
            d[role].pop("threads", None)
        sel = {p: _dig(d, p) for p in parts} if parts else d
        return hashlib.sha256(json.dumps(sel, sort_keys=True).encode()).hexdigest()[:16]


def _dig(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d[k]
    return d

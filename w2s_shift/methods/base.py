"""What every student method is: :class:`Method` (the behaviour, one object per method) and :class:`MethodConfig`
(its typed settings, one YAML entry of ``methods:``), and :class:`Objective`, what training minimizes.

A method owns (Le et al. 2026, arXiv 2605.25629, protocol.md): where its training targets come from
(:meth:`Method.targets`, and for a method that builds its own labels, :meth:`Method.label_stage` and
:meth:`Method.build_labels`), its pairwise loss with its hyperparameters (:meth:`Method.objective`, a function
registered in :data:`w2s_shift.losses.LOSSES`), an optional regularizer on hidden states (ANCHOR's term,
:class:`w2s_shift.methods.anchor.AnchorTerm`), and how it is shown in logs, metrics.json and reports
(:meth:`Method.summary`, :meth:`Method.describe`, :meth:`Method.table_text`). The trainer, the pipeline and
the report call these hooks and never look at a method's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ..io import SAFE_NAME  # labels become file names


class MethodConfig(BaseModel):
    """One entry of ``methods:``: the method's registered ``name``, an optional table ``label``, and the fields of
    the method's own settings model (a subclass: :attr:`Method.config`). Unknown fields are refused, so a setting
    of another method (``anchor_lambda`` on ``naive``) is an error, not ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str = Field(..., description="A registered method name (`w2s_shift.methods.METHODS`).")
    label: str | None = Field(
        None,
        pattern=SAFE_NAME,
        description="Name in tables and file names (default: the method name, "
        "with lambda/layers appended for grid entries).",
    )
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="Train this entry for these of the run's seeds only (e.g. a lambda sweep on one seed beside "
        "a core grid on several); None: every seed.",
    )

    @property
    def method(self) -> Method:
        """The registered :class:`Method` of this entry."""
        from . import get_method

        return get_method(self.name)

    @property
    def display(self) -> str:
        """The label, else the method's default label for these settings (:meth:`Method.default_label`)."""
        return self.label or self.method.default_label(self)

    def training_settings(self) -> dict:
        """What a student's training takes of this entry: every field but the label and the seeds it runs on (part
        of the training digest; two entries with equal settings train the same student)."""
        return self.model_dump(mode="json", exclude={"label", "seeds"})


@dataclass
class Objective:
    """What one training run minimizes: L = L_pair(d, q) + R(hidden states), the pairwise loss of the method
    (summed over the micro-batch; the trainer divides by the pairs of the optimizer step) and an optional
    regularizer (ANCHOR's lambda x L_anchor).

    Attributes:
        loss: ``fn(margin (B,), q (B,), *, alpha, seed, reduction)`` -> scalar in nats, a function of
            :data:`w2s_shift.losses.LOSSES`.
        alpha: the loss's schedule as a function of the training progress in [0, 1] (the confidence loss's
            alpha, Burns et al. 2023); None: 0 throughout.
        regularizer: None, or an object with the hooks the trainer calls (:class:`w2s_shift.methods.anchor_term.
            AnchorTerm`): ``output_layers``, ``bind(ctx)``, ``prepare_step(ctx, batch_samples)``,
            ``loss(ctx, inputs, fwd, hidden, num_items_in_batch, scale, loss_w2s)`` -> (term, logged parts),
            ``before_checkpoint(step)``, ``state_dict()``, ``load_state_dict(d)``, ``to(device)``; ``ctx`` is the
            :class:`StepContext` of the step, all a regularizer sees of the trainer.
    """

    loss: Callable
    alpha: Callable | None = None
    regularizer: object | None = None
    owner: str | None = None  # "method <label> (<module>)" of a method from outside the package: named on failure

    def pair_loss(self, margin, q, *, progress: float, seed: int, reduction: str = "sum"):
        """The pairwise loss of one micro-batch: margin (B,), q (B,) soft labels; ``progress`` = optimizer step
        / total steps; ``seed``: the confidence loss's orientation seed. Returns a scalar in nats.

        Raises:
            ValueError: the loss of a method from outside the package (``owner`` set) raised: names the method,
                its loss and the exception."""
        alpha = self.alpha(progress) if self.alpha is not None else 0.0
        if self.owner is None:
            return self.loss(margin, q, alpha=alpha, seed=seed, reduction=reduction)
        try:
            return self.loss(margin, q, alpha=alpha, seed=seed, reduction=reduction)
        except Exception as e:
            fn = getattr(self.loss, "func", self.loss)  # a functools.partial: its function
            raise ValueError(
                f"{self.owner}: its pairwise loss {getattr(fn, '__qualname__', fn)!s} raised {type(e).__name__}: {e}"
            ) from e


class FixedWeightState:
    """The checkpoint hooks of a regularizer whose only state is a fixed weight ``self.lam`` (L2-SP, GRM): nothing
    changes during training; a checkpoint records the weight and a resume checks it is the same."""

    lam: float

    def before_checkpoint(self, step: int) -> None:
        """Nothing changes during training."""

    def state_dict(self) -> dict:
        return {"lambda": self.lam}

    def load_state_dict(self, state: dict) -> None:
        """Raises ValueError for a state that is not this term's (another lambda)."""
        if not isinstance(state, dict) or state.get("lambda") != self.lam:
            raise ValueError(f"checkpoint regularizer state {state!r}: expected {{'lambda': {self.lam}}}")


@dataclass(frozen=True)
class StepContext:
    """All a regularizer sees of the trainer during one optimizer step (built by
    :meth:`w2s_shift.training.PairTrainer.step_context`), so it needs none of the Trainer's private members.

    Attributes:
        model: the trained model as wrapped for training (DDP, FSDP2, ZeRO): every forward of it goes through
            the wrapper, so a sharded model gathers its weights (a direct call of an inner module would not).
        step: the optimizer step (0-based, ``TrainerState.global_step``).
        world_size: processes training together.
        device: the training device of this process.
        bf16: the forward runs under bfloat16 autocast.
        has_cached_reference: the training dataset carries the reference's states (``ref_hidden`` in batches).
        prepare: moves a micro-batch (a collated dict) to the training device.
        unwrap: the plain model inside ``model`` (for its attributes, never for forwards).
        gather_sum: the sum of a 1-element tensor over processes (itself in one process).
        mp_policy: FSDP2's ``MixedPrecisionPolicy`` of the trained model (accelerate's, from the launcher's mixed
            precision), None without FSDP2: a frozen copy is sharded with it, so it computes as the student does.
        batch_key: ``id`` of the micro-batch (the collated dict) being trained on now, None outside a training step:
            what a regularizer prepared for a micro-batch in ``prepare_step`` is matched on it.
    """

    model: object
    step: int
    world_size: int
    device: object
    bf16: bool
    has_cached_reference: bool
    prepare: Callable
    unwrap: Callable
    gather_sum: Callable
    mp_policy: object = None
    batch_key: int | None = None

    def forward_without_adapters(self, fwd: dict, output_layers: list | None):
        """The trained LoRA model's hidden states with its adapters disabled (the pretrained model it started
        from), through the wrapped model: ``output_layers`` None gives [last layer's output (N, T, H)], else one
        (N, T, H) tensor per requested 1-based global block (:func:`~w2s_shift.models.reward_model.select_layers`).

        Raises:
            ValueError: the model is not a peft LoRA model (no ``disable_adapter``)."""
        import torch

        from ..device import autocast

        inner = self.unwrap(self.model)
        backbone = getattr(inner, "backbone", None)
        if not hasattr(backbone, "disable_adapter"):
            raise ValueError("reference adapter_disabled needs a LoRA student (student.lora set)")
        amp = autocast(_device_type(fwd), enabled=self.bf16)
        trainable = [p for p in inner.parameters() if p.requires_grad]
        with torch.no_grad(), backbone.disable_adapter(), amp:
            # peft's disable_adapter also sets requires_grad False on the adapters; FSDP2 reads requires_grad when its
            # first forward sets up the parameter groups, and one set up here would find no trainable parameter, so it
            # would not cast their bfloat16-reduced gradients back to float32. The flag alone disables the adapters;
            # under no_grad nothing is recorded either way, and leaving the block enables the adapters again.
            for p in trainable:
                p.requires_grad_(True)
            _, hidden = self.model(**fwd, output_layers=output_layers)
        return hidden if output_layers is not None else [hidden]


def _device_type(fwd: dict) -> str:
    t = next(v for v in fwd.values() if hasattr(v, "device"))
    return t.device.type


@dataclass(frozen=True)
class ReferenceNeed:
    """What a method's regularizer needs of the pretrained student: ``layers`` the anchored 1-based blocks (None:
    the final normalized output), ``cached_states`` its states on the training pairs computed once before
    training, ``frozen_copy`` a frozen copy run every step; neither: the LoRA model with adapters disabled."""

    layers: list | None
    cached_states: bool
    frozen_copy: bool


@dataclass(frozen=True)
class LabelTools:
    """What the pipeline lends a method that builds its own labels (:meth:`Method.build_labels`): the student
    training pairs, ``strong(prompts) -> (n,)`` the pretrained strong model's log p(" Yes") - log p(" No"), and
    ``weak(pairs) -> (n,)`` the trained weak teacher's reward margins."""

    pairs: list
    strong: Callable
    weak: Callable


class Method:
    """A student method: what the pipeline, trainer and report need, as hooks. Subclass it (overriding what
    differs), set the class attributes, and register an instance (:func:`w2s_shift.methods.register_method`).

    Attributes:
        name: the name in the YAML schema (``methods: [{name: ...}]``) and in metrics.json.
        display: default label in tables and file names.
        description: one line for help texts.
        config: the settings model (a :class:`MethodConfig` subclass): the method's hyperparameters, declared once.
        w2s_student: trained on weak labels (the teacher's, or labels built from them), so WRG/AOG/NTS/PGR apply;
            False for the gold ceiling and the zero-shot model.
        ceiling: the strong ceiling (trained on gold; PGR's denominator and the gap check). At most one per run.
        trains: False when the pretrained model is scored as is (zero-shot).
        loss: name of the pairwise loss in :data:`w2s_shift.losses.LOSSES` (None when it does not train).
        needs_lm_head: needs the pretrained student's language-model head (label building, zero-shot scoring).
        builds_labels: runs a label-construction stage of its own (:meth:`label_stage`, :meth:`build_labels`).
        marker_fields: keys of :meth:`build_labels`' summary recorded in its stage marker (the report reads them).
        label_version: the code version of its label stage (bump it when :meth:`build_labels` computes other labels):
            part of the digest of that stage and of the students trained on its labels, so a finished run
            recomputes them instead of reusing labels of the old code.
        competitor: a published method aimed at ANCHOR's failure (the fine-tuned reward model forgetting the
            pretrained representation), compared with it in the report's "ANCHOR vs its competitors" table.
        objective_lm_head: its :meth:`objective` takes ``lm_head``, the pretrained student's language-model head
            (V, H) (an extra head for its training objective; GRM), passed by the pipeline; needs ``needs_lm_head``.
        needs_reference: may regularize toward the pretrained student's hidden states (:meth:`reference_need`),
            so it has anchored layers and a lambda to show.
    """

    name: str = ""
    display: str = ""
    description: str = ""
    config: type = MethodConfig
    w2s_student: bool = True
    ceiling: bool = False
    trains: bool = True
    loss: str | None = "soft_bt"
    needs_lm_head: bool = False
    builds_labels: bool = False
    needs_reference: bool = False
    objective_lm_head: bool = False
    competitor: bool = False
    marker_fields: tuple = ()
    label_version: int = 1

    def __init__(self, **attrs):
        for k, v in attrs.items():
            if not hasattr(type(self), k):
                raise TypeError(f"Method has no attribute {k!r}")
            setattr(self, k, v)
        if not self.name or not self.display:
            raise ValueError("a method needs a name and a display label")
        if self.trains != (self.loss is not None):
            raise ValueError(f"method {self.name}: a method that trains has a loss, one that does not has none")
        if self.objective_lm_head and not self.needs_lm_head:
            raise ValueError(
                f"method {self.name}: objective_lm_head needs needs_lm_head (the preflight check of the head)"
            )
        if self.ceiling and self.w2s_student:
            raise ValueError(f"method {self.name}: the ceiling learns gold labels, it is not a W2S student")

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    # --- settings -------------------------------------------------------------------------------------------
    def default_label(self, cfg: MethodConfig) -> str:
        """The label of an entry without ``label:``."""
        return self.display

    def expand(self, cfg: MethodConfig) -> list:
        """The concrete entries of one config entry (a grid entry lists several values): ``[cfg]`` by default."""
        return [cfg]

    def check_run(self, cfg: MethodConfig, run_cfg) -> None:
        """Rules that need the whole run config (:class:`w2s_shift.config.RunConfig`). Raises ValueError."""

    def layers_outside(self, cfg: MethodConfig, depth: int) -> list:
        """Explicit block indices of the settings beyond a student of ``depth`` blocks ([] for none)."""
        return []

    # --- training targets -----------------------------------------------------------------------------------
    def label_stage(self, cfg: MethodConfig) -> str | None:
        """Name of this entry's label-construction stage (``stages/<name>.json``), None when it builds none. It is
        the method's name or starts with ``<name>-`` (so that a stage marker names the method that wrote it)."""
        return None

    def owns_stage(self, stage: str) -> bool:
        """Whether ``stage`` is named as this method's label stages are: its name, or ``<name>-...``."""
        return self.builds_labels and (stage == self.name or stage.startswith(self.name + "-"))

    def label_file(self, cfg: MethodConfig) -> str:
        """The cell's label file of its label stage (``labels__<stage>.jsonl``; the summary beside it as
        ``.info.json``, :meth:`label_info_file`)."""
        return f"labels__{self.label_stage(cfg)}.jsonl"

    def label_info_file(self, stage: str) -> str:
        """The file of the summary of label stage ``stage`` (what :meth:`build_labels` returned), beside the labels."""
        return f"labels__{stage}.info.json"

    def label_cut(self, d: dict, summary: dict) -> dict | None:
        """The report's line on the labels this entry built, from its metrics.json method dict ``d`` and its label
        stage's summary (the stage marker's :attr:`marker_fields`, else the ``.info.json``): {"text": one sentence,
        "warn": the labels hardly differ from what they were meant to improve on, and any numbers worth keeping in
        metrics.json}, or None (nothing to say)."""
        return None

    def build_labels(self, cfg: MethodConfig, tools: LabelTools) -> tuple:
        """Build the labels of a ``builds_labels`` method: (q (n,) in [0, 1], per-pair extra fields (n dicts),
        summary dict, whose :attr:`marker_fields` the stage marker records). Raises NotImplementedError for a method
        that builds none."""
        raise NotImplementedError(f"method {self.name} builds no labels")

    def targets(self, cfg: MethodConfig, teacher_q: list, built_q: list | None = None) -> list:
        """The soft labels q_i (one per student training pair) the student learns: the weak teacher's by default.
        ``built_q``: the labels of its label stage, for a ``builds_labels`` method."""
        return list(built_q) if self.builds_labels else list(teacher_q)

    def target_text(self, cfg: MethodConfig) -> str:
        """The training targets in the log ('teacher soft labels')."""
        return "teacher soft labels"

    # --- training -------------------------------------------------------------------------------------------
    def reference_need(self, cfg: MethodConfig, resolve_layers: Callable) -> ReferenceNeed | None:
        """What the regularizer needs of the pretrained student (None: no regularizer on hidden states).
        ``resolve_layers(spec) -> list[int]`` maps a layer spec to 1-based blocks of this student."""
        return None

    def objective(self, cfg: MethodConfig, layers: list | None = None, reference=None) -> Objective:
        """What training minimizes. ``layers``: the anchored blocks (None: the final output); ``reference``: a
        frozen copy of the pretrained backbone (:func:`w2s_shift.training.make_reference`) when
        :meth:`reference_need` asks for one. A method with ``objective_lm_head`` is also given ``lm_head=``, the
        pretrained student's LM-head weight (V, H) (:func:`w2s_shift.models.lm.lm_head_weight`), to override this
        with."""
        from ..losses import LOSSES

        return Objective(LOSSES[self.loss])

    # --- after training --------------------------------------------------------------------------------------
    def trained_as(self, cfg: MethodConfig) -> MethodConfig | None:
        """For a method that transforms a trained student after training (:meth:`posthoc`): the entry that student is
        trained as (its method's targets and objective; its label names the weights file
        ``models/<label>.safetensors``, shared by every entry with the same training), else None (it trains itself)."""
        return None

    def posthoc(self, cfg: MethodConfig, model, pretrained) -> None:
        """A weight transform after training (with :meth:`trained_as`): change ``model``, the trained student of
        :meth:`trained_as`, in place into this entry's model, given ``pretrained``, the same student before training.
        The result is saved under this entry's label and scored like any trained student. Default: nothing."""

    def drift_layers(self, cfg: MethodConfig, resolve_layers: Callable) -> list:
        """Blocks (1-based) whose drift is worth logging beyond the last: the regularized ones."""
        need = self.reference_need(cfg, resolve_layers)
        return list(need.layers or []) if need else []

    # --- how it is shown ------------------------------------------------------------------------------------
    def summary(self, cfg: MethodConfig) -> str:
        """Its settings in one log line ('' when it has none worth saying)."""
        return ""

    def describe(self, cfg: MethodConfig) -> dict:
        """The method's own fields of its metrics.json method dict (besides label, name, finetune): for a method that
        builds labels, its label stage and file."""
        if not self.builds_labels:
            return {}
        return {"label_stage": self.label_stage(cfg), "label_file": self.label_file(cfg)}

    def table_text(self, d: dict) -> list:
        """Its settings in a report's method column, from its metrics.json method dict (a list of short parts)."""
        return []

"""Hyperparameters of one reward-model training run: :class:`PairTrainingArguments`, a
``transformers.TrainingArguments`` subclass with our fields (the pattern of TRL's ``RewardConfig``).

The run's YAML config (:class:`w2s_shift.config.ModelConfig`) is the source of truth: the pipeline passes every
value from it, and the defaults here equal the config's (tests/test_training_args.py). What a method minimizes
(its loss, its hyperparameters, ANCHOR's term) is not here: it is the method's
:class:`~w2s_shift.methods.Objective`, built from its own settings model and passed to the trainer as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..device import current_device
from ..distributed import per_device_batch, world
from ..tracking import prepare_wandb


@dataclass
class PairTrainingArguments(TrainingArguments):
    """``TrainingArguments`` of a pairwise reward model (any method: its objective is passed separately).

    Our fields are below, each with its ``help``. Inherited fields keep their meaning; some defaults differ from
    ``TrainingArguments`` (to the run config's, or as this package trains): ``num_train_epochs`` 1,
    ``seed`` 0 (``data_seed`` follows ``seed``), ``logging_steps`` 10, ``save_total_limit`` 1,
    ``logging_nan_inf_filter`` False (the trainer checks finiteness itself), ``remove_unused_columns`` False,
    ``disable_tqdm`` False. Derived in ``__post_init__``: ``per_device_train_batch_size`` from ``batch_size``,
    ``gradient_accumulation_steps`` and the process count; ``use_cpu`` True where the run's device
    (:func:`w2s_shift.device.current_device`) is the CPU (so ``bf16`` on a CPU is bfloat16 autocast on the CPU);
    with ``report_to`` wandb, ``run_name`` (:func:`w2s_shift.tracking.prepare_wandb`). Derived by
    :func:`~w2s_shift.training.loop.train_pairs`
    from the dataset size: ``warmup_steps`` (from ``warmup_ratio``) and ``save_strategy`` / ``save_steps`` (from
    ``checkpoint_fraction``).

    ``bf16`` keeps ``TrainingArguments``' default False: the config's ``bf16: auto`` is resolved per machine at
    the start of a run (:mod:`w2s_shift.models.precision`) and the pipeline passes the resolved value.

    Raises:
        ValueError (at construction): ``batch_size`` not divisible by ``gradient_accumulation_steps``; and
            ``TrainingArguments``' own checks.
    """

    # inherited, other defaults
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training pairs."})
    seed: int = field(default=0, metadata={"help": "Seed of init, batch order and dropout (data_seed follows it)."})
    logging_steps: float = field(default=10, metadata={"help": "Log the loss every N optimizer steps."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept (the newest)."})
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={"help": "Off: the trainer checks the loss for NaN/inf itself (the filter syncs every step)."},
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Off: batches come from PairCollator, not from dataset columns."}
    )
    disable_tqdm: bool | None = field(default=False, metadata={"help": "Show the progress bar."})
    # ours
    batch_size: int = field(
        default=8,
        metadata={
            "help": "Pairs per optimizer step over all processes and micro-batches (2x sequences); "
            "per_device_train_batch_size is derived from it."
        },
    )
    warmup_ratio: float = field(default=0.1, metadata={"help": "Share of steps with linear LR warm-up."})
    length_group_size: int = field(
        default=16, metadata={"help": "Batches per length-sorted mega-batch (0: plain shuffle)."}
    )
    finite_check_every_step: bool | None = field(
        default=None,
        metadata={
            "help": "Check the loss for NaN/inf at every "
            "step (a host synchronisation) or only when logging and before a checkpoint, "
            "naming the first bad step either way. None: every step on CPU, deferred on GPU."
        },
    )
    packing: bool = field(
        default=True,
        metadata={
            "help": "Padding-free packing of each batch's 2B sequences into rows "
            "(position_ids restart per sequence) where the model allows it (reward_model.can_pack: decoders "
            "with last-token pooling; others train padded). Checked against padded rewards before training."
        },
    )
    head_lr_multiplier: float = field(
        default=1.0, metadata={"help": "Learning rate of the new scalar head = this x learning_rate."}
    )
    checkpoint_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Save a checkpoint every this share of steps (0: never; the pipeline sets it from the run config)."
        },
    )
    label: str = field(
        default="model", metadata={"help": "Name of the model being trained, in messages (teacher, a method label)."}
    )
    logging_dir: str | None = field(
        default=None, metadata={"help": "TensorBoard event folder (default: under output_dir)."}
    )

    @property
    def n_gpu(self) -> int:
        """GPUs this process trains on: at most 1. ``TrainingArguments`` counts every visible GPU of a process that was
        not launched, and the Trainer then wraps the model in ``nn.DataParallel``: each step's batch is multiplied by
        the GPU count (so the warm-up, counted in steps of ``batch_size``, covers most of training) and the inputs
        are cut along dim 0 (packed rows' flat indices cannot be). One process trains on one GPU (its current CUDA
        device); several GPUs are used through ``accelerate launch`` (one process each)."""
        return min(1, super().n_gpu)

    def __post_init__(self):
        accum = int(self.gradient_accumulation_steps)
        if accum < 1 or self.batch_size % accum:
            raise ValueError(
                f"{self.label}: batch_size {self.batch_size} is not divisible by gradient_accumulation_steps {accum}"
            )
        # W processes (accelerate launch) each take batch_size / W pairs of the same global batch: accelerate's
        # BatchSamplerShard hands out consecutive per-device batches round-robin from the one seeded sampler
        # order, so the global batch and the optimizer steps equal the one-process run (tests/test_distributed.py)
        self.per_device_train_batch_size = per_device_batch(self.batch_size // accum, world()[1])
        if self.data_seed is None:
            self.data_seed = self.seed
        self.logging_steps = max(1, self.logging_steps)
        if current_device() == "cpu":  # else the Trainer places the model on CUDA or MPS itself
            self.use_cpu = True
        if "wandb" in (self.report_to or []):
            prepare_wandb(self)  # one wandb run per trained model (transformers' WandbCallback keeps one open)
        super().__post_init__()

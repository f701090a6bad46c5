"""Hyperparameters of one reward-model training run (:class:`PairTrainerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PairTrainerConfig:
    """Hyperparameters of one reward-model training run (TRL-style config beside its trainer)."""

    epochs: float = field(default=1.0, metadata={"help": "Passes over the training pairs."})
    batch_size: int = field(default=8, metadata={"help": "Pairs per optimizer step (2x sequences per forward)."})
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={
            "help": "Micro-batches per optimizer step; each "
            "forward takes batch_size / (this x processes) pairs. Must divide batch_size."
        },
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW peak learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_ratio: float = field(default=0.1, metadata={"help": "Share of steps with linear LR warm-up."})
    lr_scheduler: str = field(default="linear", metadata={"help": "transformers LR schedule name."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    seed: int = field(default=0, metadata={"help": "Seed of init, batch order and dropout."})
    logging_steps: int = field(default=10, metadata={"help": "Log the loss every N steps."})
    loss: str = field(default="soft_bt", metadata={"help": "'soft_bt' (Naive W2S / gold BT) or 'confidence'."})
    anchor_lambda: float = field(
        default=0.0,
        metadata={
            "help": "ANCHOR weight lambda (0 disables anchoring); with anchor_lambda_auto, lambda at the first step."
        },
    )
    anchor_normalize: bool = field(
        default=False,
        metadata={
            "help": "L_anchor per layer relative to the reference's mean "
            "squared norm (losses.anchor_relative); False: the paper's raw MSE (losses.anchor_mse)."
        },
    )
    anchor_lambda_auto: bool = field(
        default=False,
        metadata={
            "help": "Drift budget: lambda adapts every optimizer step "
            "(losses.adaptive_anchor_lambda, Ziegler et al. 2019 sec. 2.2) so the anchored layers' "
            "relative squared error stays near anchor_target_drift."
        },
    )
    anchor_target_drift: float = field(
        default=0.02, metadata={"help": "anchor_lambda_auto: target relative squared error."}
    )
    anchor_k: float = field(
        default=0.1,
        metadata={
            "help": "anchor_lambda_auto: controller gain K (lambda changes by at most a factor 1 +- 0.2 K a step)."
        },
    )
    confidence_alpha_max: float = field(default=0.5, metadata={"help": "Confidence loss: final alpha."})
    confidence_warmup: float = field(
        default=0.2, metadata={"help": "Confidence loss: share of training for alpha's linear warm-up."}
    )
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
        default=False,
        metadata={
            "help": "Padding-free packing of each batch's 2B sequences into rows "
            "(position_ids restart per sequence; decoders with last-token pooling only, see "
            "reward_model.can_pack). Checked against padded rewards before training."
        },
    )
    bf16: bool = field(
        default=False, metadata={"help": "bfloat16 autocast for forward/backward (weights and AdamW stay float32)."}
    )
    head_lr_multiplier: float = field(
        default=1.0, metadata={"help": "Learning rate of the new scalar head = this x learning_rate."}
    )
    anchor_layers: list | None = field(
        default=None,
        metadata={
            "help": "1-based global blocks anchored (None: the last layer's normalized output, what the head reads)."
        },
    )
    reference_mode: str = field(
        default="frozen_copy",
        metadata={
            "help": "ANCHOR reference: 'frozen_copy' (a module run every "
            "step), 'adapter_disabled' (the LoRA model with adapters off) or 'cached' (states in the dataset)."
        },
    )
    checkpoint_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Save a checkpoint every this share of steps (0: never; the pipeline sets it from the run config)."
        },
    )
    report_to: list = field(default_factory=list, metadata={"help": "Trainer integrations, e.g. ['tensorboard']."})
    label: str = field(
        default="model", metadata={"help": "Name of the model being trained, in messages (teacher, a method label)."}
    )
    logging_dir: str | None = field(
        default=None, metadata={"help": "TensorBoard event folder (default: under output_dir)."}
    )

"""Reward-model training on the Hugging Face Trainer.

- :mod:`.args`: :class:`PairTrainingArguments` (a ``TrainingArguments`` subclass), the hyperparameters of one run.
- :mod:`.collator`: :class:`PairDataset`, :class:`PairCollator`, :class:`LengthGroupedPairSampler`.
- :mod:`.trainer`: :class:`PairTrainer` (``compute_loss``: a method's objective, :class:`w2s_shift.methods.Objective`).
- :mod:`.loop`: :func:`train_pairs`, :func:`make_reference`, :func:`check_packing`, :func:`last_complete_checkpoint`.
"""

from .args import PairTrainingArguments
from .collator import LengthGroupedPairSampler, PairCollator, PairDataset
from .loop import PackingMismatchError, check_packing, last_complete_checkpoint, make_reference, train_pairs
from .trainer import PairTrainer, TrainingDiverged

__all__ = [
    "LengthGroupedPairSampler",
    "PackingMismatchError",
    "PairCollator",
    "PairDataset",
    "PairTrainer",
    "PairTrainingArguments",
    "TrainingDiverged",
    "check_packing",
    "last_complete_checkpoint",
    "make_reference",
    "train_pairs",
]

"""Auxiliary confidence loss (Burns et al. 2023, "Weak-to-Strong Generalization", eq. 1), on the weak
teacher's soft labels (:func:`w2s_shift.losses.confidence_loss`)."""

from .base import Method

METHOD = Method(
    name="confidence",
    w2s_student=True,
    labels="teacher",
    trains=True,
    loss="confidence",
    needs_reference=False,
    display="confidence",
    description="auxiliary confidence loss (Burns et al. 2023) on the weak teacher's soft labels",
)

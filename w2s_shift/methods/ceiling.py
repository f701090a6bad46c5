"""Strong ceiling: the student trained on gold labels (q_i = 1) with the Bradley-Terry loss; the reference
for the weak-to-strong gap check and PGR's denominator, not a W2S student."""

from .base import Method

METHOD = Method(
    name="ceiling",
    w2s_student=False,
    labels="gold",
    trains=True,
    loss="soft_bt",
    needs_reference=False,
    display="ceiling",
    description="gold labels, Bradley-Terry (the strong ceiling)",
)

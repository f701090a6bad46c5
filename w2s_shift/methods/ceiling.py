"""Strong ceiling: the student trained on gold labels (q_i = 1) with the Bradley-Terry loss; the reference
for the weak-to-strong gap check and PGR's denominator, not a W2S student."""

from .base import Method


class Ceiling(Method):
    """Gold labels: q_i = 1 for every pair (the chosen response), so the soft Bradley-Terry loss is the gold one."""

    def targets(self, cfg, teacher_q: list, built_q: list | None = None) -> list:
        return [1.0] * len(teacher_q)

    def target_text(self, cfg) -> str:
        return "gold labels"


METHOD = Ceiling(
    name="ceiling",
    display="ceiling",
    description="gold labels, Bradley-Terry (the strong ceiling)",
    w2s_student=False,
    ceiling=True,
)

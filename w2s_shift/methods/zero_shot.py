"""Zero-shot: the pretrained student scored as is, reward = mean log-likelihood of the response tokens
(:mod:`w2s_shift.models.lm`); no training, no labels."""

from .base import Method

METHOD = Method(
    name="zero_shot",
    w2s_student=False,
    labels="none",
    trains=False,
    loss=None,
    needs_reference=False,
    needs_lm_head=True,
    display="zero_shot",
    description="pretrained student, mean response log-likelihood; no training",
)

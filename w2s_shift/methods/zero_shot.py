"""Zero-shot: the pretrained student scored as is, reward = mean log-likelihood of the response tokens
(:mod:`w2s_shift.models.lm`); no training, no labels."""

from .base import Method

METHOD = Method(
    name="zero_shot",
    display="zero_shot",
    description="pretrained student, mean response log-likelihood; no training",
    w2s_student=False,
    trains=False,
    loss=None,
    needs_lm_head=True,
)

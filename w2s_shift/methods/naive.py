"""Naive W2S: the strong student learns the weak teacher's soft labels with the soft Bradley-Terry loss
(protocol.md, "Losses"; Le et al. 2026, arXiv 2605.25629)."""

from .base import Method

METHOD = Method(
    name="naive",
    display="naive",
    description="soft Bradley-Terry on the weak teacher's soft labels",
)

"""The :class:`Method` record every method module declares (re-exported by :mod:`w2s_shift.methods`)."""

from __future__ import annotations

from dataclasses import dataclass

LABEL_KINDS = ("teacher", "gold", "seam", "none")


@dataclass(frozen=True)
class Method:
    """What the pipeline, config and report need to know about one student method.

    Attributes:
        name: the name in the YAML schema (``methods: [{name: ...}]``) and in metrics.json.
        w2s_student: trained on the weak teacher's labels (teacher or SEAM), so WRG/AOG/NTS/PGR apply
            (Le et al. 2026, arXiv 2605.25629); False for the gold ceiling and the zero-shot model.
        labels: where its training labels come from: "teacher" (the weak teacher's soft labels q_i), "gold"
            (q_i = 1, the chosen response), "seam" (SEAM soft labels, :mod:`w2s_shift.methods.seam`) or "none".
        trains: False when the pretrained model is scored as is (zero-shot).
        loss: the preference loss, a name in :data:`w2s_shift.losses.LOSSES` ("soft_bt", "confidence"), or None
            for a method that does not train.
        needs_reference: the loss needs the pretrained student's hidden states on the training pairs (ANCHOR's
            reference: cached, a frozen copy or the adapter-disabled model).
        needs_lm_head: needs the pretrained student's language-model head (SEAM's relevance, zero-shot's
            log-likelihood).
        display: default label in tables and file names (a config entry's ``label:`` overrides it).
        description: one line for help texts.

    Raises:
        ValueError: ``labels`` not one of :data:`LABEL_KINDS`, or ``trains`` and ``loss`` disagree.
    """

    name: str
    w2s_student: bool
    labels: str
    trains: bool
    loss: str | None
    needs_reference: bool
    display: str
    description: str
    needs_lm_head: bool = False

    def __post_init__(self):
        if self.labels not in LABEL_KINDS:
            raise ValueError(f"method {self.name}: labels {self.labels!r}, expected one of {', '.join(LABEL_KINDS)}")
        if self.trains != (self.loss is not None):
            raise ValueError(f"method {self.name}: a method that trains has a loss, one that does not has none")
        if self.w2s_student and self.labels not in ("teacher", "seam"):
            raise ValueError(f"method {self.name}: a W2S student learns the weak teacher's (or SEAM) labels")

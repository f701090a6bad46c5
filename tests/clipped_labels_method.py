"""A third-party method that builds its own labels, in one file (tests/test_method_extension.py): the weak
teacher's soft labels clipped to [clip, 1 - clip] in a label stage of its own (``clipped-<clip>``), then the soft
Bradley-Terry loss: a hedge against an over-confident teacher. Its label stage, the version of that stage, what
its stage marker records and its line in the report are all declared here."""

import numpy as np
from pydantic import Field

from w2s_shift.methods import Method, MethodConfig, register_method


class ClippedConfig(MethodConfig):
    clip: float = Field(0.2, gt=0, lt=0.5, description="Labels are clipped to [clip, 1 - clip].")


class ClippedLabels(Method):
    config = ClippedConfig

    def label_stage(self, cfg) -> str:
        return f"clipped-{cfg.clip:g}"

    def build_labels(self, cfg, tools) -> tuple:
        """q_i = clip(sigmoid(teacher margin_i), clip, 1 - clip); summary: the share of labels clipped."""
        margin = tools.weak(tools.pairs)
        q0 = 1.0 / (1.0 + np.exp(-margin))
        q = np.clip(q0, cfg.clip, 1 - cfg.clip)
        extra = [{"teacher_q": float(x)} for x in q0]
        return q, extra, {"pairs": len(q), "clipped_share": float(np.mean(q != q0))}

    def label_cut(self, d: dict, summary: dict) -> dict | None:
        share = summary.get("clipped_share")
        if share is None:
            return None
        text = f"{100 * share:.1f}% of {summary['pairs']} teacher labels clipped to [{d['clip']:g}, {1 - d['clip']:g}]"
        return {"clipped_share": share, "warn": share == 0, "text": text}

    def describe(self, cfg) -> dict:
        return {**super().describe(cfg), "clip": cfg.clip}


METHOD = register_method(
    ClippedLabels(
        name="clipped",
        display="clipped",
        description="the weak teacher's soft labels clipped to [clip, 1 - clip], soft Bradley-Terry",
        builds_labels=True,
        marker_fields=("clipped_share", "pairs"),
        label_version=1,
    ),
    replace=True,
)

"""Code versions that are part of every cached stage's identity.

A stage's digest (``stages/<name>.json``, and the saved weights' ``models/<label>.json``) hashes what the stage
depends on: its config, its data, the stages it reads, and :func:`stage_versions`: the package version and a
per-stage *format version*. A rerun of a run directory written by other code therefore recomputes the stages
whose logic changed instead of silently reusing teachers, labels or students computed by the old code.

Bump ``STAGE_FORMATS[stage]`` when a change alters what that stage computes (a loss, label or scoring fix) without
a package release; a new package version makes every stage stale by itself. ``render`` is the version of the
text rendering and tokenization (``w2s_shift.data.render.RENDER_VERSION``, 1 when that module has none), which
every stage that tokenizes depends on.
"""

from __future__ import annotations

from . import __version__
from .data import render as _render

#: Bump the entry of a stage when a change to its logic changes its outputs.
STAGE_FORMATS: dict = {
    "teacher": 1,  # gold Bradley-Terry training of the weak teacher, its rewards and soft labels
    "seam": 1,  # SEAM principle labels (w2s_shift.methods.seam)
    "student": 1,  # student training (every method), its training log and drift during training
    "score": 1,  # a model's rewards (and a student's final drift) on one evaluation set
    "mechanism": 1,  # a student's interventional mechanism test (w2s_shift.metrics.intervention)
    "render": int(getattr(_render, "RENDER_VERSION", 1)),  # chat-template rendering and truncation
}

#: The format entries each stage depends on (its own, those of the stages it reads, and rendering).
STAGE_DEPENDS: dict = {
    "teacher": ("render", "teacher"),
    "seam": ("render", "teacher", "seam"),
    "student": ("render", "teacher", "seam", "student"),
    "score": ("render", "teacher", "seam", "student", "score"),
    "mechanism": ("render", "teacher", "seam", "student", "score", "mechanism"),
}


def stage_kind(name: str) -> str:
    """The kind of a stage from its marker name: ``teacher``, ``seam-4-0.5`` -> ``seam``,
    ``student-naive`` -> ``student``, ``score-naive__pandalm`` -> ``score``.

    Raises:
        ValueError: an unknown stage name.
    """
    for kind in STAGE_DEPENDS:
        if name == kind or name.startswith(kind + "-"):
            return kind
    raise ValueError(f"unknown stage {name!r}")


def stage_versions(kind: str) -> dict:
    """What of the code a stage of ``kind`` ('teacher', 'seam', 'student', 'score') depends on: {'w2s_shift': package
    version, '<format>': version, ...}. Part of the stage's digest and recorded in its marker."""
    return {"w2s_shift": __version__, **{k: STAGE_FORMATS[k] for k in STAGE_DEPENDS[kind]}}

"""Code versions that are part of every cached stage's identity.

A stage's digest (``stages/<name>.json``, and the saved weights' ``models/<label>.json``) hashes what the stage
depends on: its config, its data, the stages it reads, and :func:`stage_versions`: the package version and a
per-stage *format version*. A rerun of a run directory written by other code therefore recomputes the stages
whose logic changed instead of silently reusing teachers, labels or students computed by the old code.

Bump ``STAGE_FORMATS[stage]`` when a change alters what that stage computes (a loss, label or scoring fix) without
a package release; a new package version makes every stage stale by itself. ``render`` is the version of the
text rendering and tokenization (``w2s_shift.data.render.RENDER_VERSION``, 1 when that module has none), which
every stage that tokenizes depends on.

A method that builds its own labels declares the version of its label stage in its own file
(:attr:`w2s_shift.methods.Method.label_version`); its label stage (named ``<method>-...``) has the versions
{package, render, teacher, ``labels-<method>``}, and :func:`w2s_shift.pipeline.stages.student_digest` adds that
version to its students. SEAM's, from before methods declared it, stays the ``seam`` entry of every student's and
scoring stage's versions, so that finished runs keep their digests.
"""

from __future__ import annotations

from . import __version__
from .data import render as _render
from .methods import METHODS, load_entry_points
from .methods.seam import METHOD as _SEAM

#: Bump the entry of a stage when a change to its logic changes its outputs.
STAGE_FORMATS: dict = {
    "teacher": 1,  # gold Bradley-Terry training of the weak teacher, its rewards and soft labels
    "seam": _SEAM.label_version,  # SEAM principle labels, declared in w2s_shift.methods.seam
    "student": 1,  # student training (every method), its training log and drift during training
    "score": 1,  # a model's rewards (and a student's final drift) on one evaluation set
    "mechanism": 2,  # a student's interventional mechanism test (w2s_shift.metrics.intervention); 2: probes on
    # teacher-train pairs, the head check, per-pair 0/1 outcomes (ties wrong) and pair ids
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


def label_method(name: str):
    """The registered method whose label stage is called ``name`` (``<method>`` or ``<method>-...``; entry points
    loaded), or None."""
    load_entry_points()
    for m in METHODS.values():
        if m.owns_stage(name):
            return m
    return None


def stage_kind(name: str) -> str:
    """The kind of a stage from its marker name: ``teacher``, ``seam-4-0.5`` -> ``seam``,
    ``student-naive`` -> ``student``, ``score-naive__pandalm`` -> ``score``, the label stage of another method
    that builds its own labels -> ``labels``.

    Raises:
        ValueError: an unknown stage name.
    """
    for kind in STAGE_DEPENDS:
        if name == kind or name.startswith(kind + "-"):
            return kind
    if label_method(name) is not None:
        return "labels"
    raise ValueError(f"unknown stage {name!r}")


def stage_versions(kind: str) -> dict:
    """What of the code a stage of ``kind`` ('teacher', 'seam', 'student', 'score', 'mechanism') depends on:
    {'w2s_shift': package version, '<format>': version, ...}. Part of the stage's digest and recorded in its
    marker."""
    return {"w2s_shift": __version__, **{k: STAGE_FORMATS[k] for k in STAGE_DEPENDS[kind]}}


def label_versions(method) -> dict:
    """The versions of a label stage of ``method`` (not SEAM's): {package, render, teacher, labels-<method>}."""
    return {
        "w2s_shift": __version__,
        "render": STAGE_FORMATS["render"],
        "teacher": STAGE_FORMATS["teacher"],
        f"labels-{method.name}": method.label_version,
    }


def versions_of(name: str) -> dict:
    """The versions of the stage called ``name`` (:func:`stage_kind`, :func:`stage_versions`, :func:`label_versions`).

    Raises:
        ValueError: an unknown stage name.
    """
    kind = stage_kind(name)
    return label_versions(label_method(name)) if kind == "labels" else stage_versions(kind)

"""Student methods: one module per method declares its :class:`Method` (``METHOD``); :data:`METHODS` maps
name -> Method in the order the YAML schema lists them. Adding a method touches this package and the config
schema only (issue 16). SEAM's label construction lives in :mod:`w2s_shift.methods.seam`."""

from __future__ import annotations

from . import anchor, ceiling, confidence, naive, seam, zero_shot
from .base import Method

METHODS: dict[str, Method] = {
    mod.METHOD.name: mod.METHOD for mod in (naive, anchor, confidence, seam, ceiling, zero_shot)
}

#: The plain W2S student the others are compared against (paired intervals "vs naive" in the report).
BASELINE = naive.METHOD.name


def get_method(name: str) -> Method:
    """The registered method called ``name``.

    Raises:
        ValueError: "unknown method 'x' (known methods: naive, anchor, ...)".
    """
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r} (known methods: {', '.join(METHODS)})") from None


def method_of(entry: dict) -> Method | None:
    """The registered method of a method dict read from metrics.json (``{"name": ..., "label": ...}``), or None
    for a name this version does not know (a run directory written by another version)."""
    return METHODS.get(entry.get("name")) if isinstance(entry, dict) else None


def is_w2s_student(entry: dict) -> bool:
    """Whether a method dict of metrics.json is a W2S student (WRG/AOG/NTS/PGR apply): its registered
    ``w2s_student``; an unknown name counts as a student (it is not one of the reference models)."""
    meth = method_of(entry)
    return meth.w2s_student if meth else True


def check_entries(cfg) -> None:
    """The method rules across the entries of a run config (a :class:`w2s_shift.config.RunConfig`): labels
    unique and not 'teacher', at most one of each reference model (ceiling, zero_shot), ANCHOR's
    ``reference: adapter_disabled`` only with a LoRA student, ``export`` naming trained students only.

    Raises:
        ValueError: naming the labels, methods or export entries at fault.
    """
    names = [m.display for m in cfg.expanded_methods()]
    if len(set(names)) != len(names):
        raise ValueError(f"method labels must be unique, got {names} (set label: for repeats)")
    if "teacher" in names:
        raise ValueError("'teacher' is reserved")
    for m in cfg.methods:
        if m.reference == "adapter_disabled" and get_method(m.name).needs_reference and not cfg.student.lora:
            raise ValueError("reference adapter_disabled needs a LoRA student (student.lora)")
    refs = [n for n, meth in METHODS.items() if not meth.w2s_student]  # the reference models: one each
    if any(sum(m.name == n for m in cfg.methods) > 1 for n in refs):
        raise ValueError(f"at most one {' and one '.join(refs)} method")
    if isinstance(cfg.export, list):
        unknown = sorted(set(cfg.export) - set(names))
        if unknown:
            raise ValueError(f"export names unknown students {unknown} (students: {names})")
        untrained = [
            m.display for m in cfg.expanded_methods() if not get_method(m.name).trains and m.display in cfg.export
        ]
        if untrained:
            raise ValueError(
                f"export: {untrained} is the untrained zero-shot model (a language model, not a reward "
                "model with a head); export trained students only"
            )


__all__ = ["BASELINE", "METHODS", "Method", "check_entries", "get_method", "is_w2s_student", "method_of"]

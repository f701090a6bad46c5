"""Student methods: one module per method declares its :class:`Method` (``METHOD``); :data:`METHODS` maps
name -> Method in the order the YAML schema lists them. A method is added in one place: a module here, or from
outside the package with :func:`register_method` (or the ``w2s_shift.methods`` entry point group, loaded on first
use); see docs/architecture.md. SEAM's label construction lives in :mod:`w2s_shift.methods.seam`."""

from __future__ import annotations

from . import anchor, ceiling, confidence, grm, l2sp, naive, seam, wise_ft, zero_shot
from .base import LabelTools, Method, MethodConfig, Objective, ReferenceNeed, StepContext

METHODS: dict[str, Method] = {
    mod.METHOD.name: mod.METHOD for mod in (naive, anchor, confidence, seam, ceiling, zero_shot, l2sp, wise_ft, grm)
}

#: The plain W2S student the others are compared against (paired intervals "vs naive" in the report).
BASELINE = naive.METHOD.name
#: The methods of a config without ``methods:``: the baseline, ANCHOR and the strong ceiling.
DEFAULT_METHODS = (BASELINE, anchor.METHOD.name, ceiling.METHOD.name)

ENTRY_POINT_GROUP = "w2s_shift.methods"
_entry_points_loaded = False


def register_method(method: Method, replace: bool = False) -> Method:
    """Register ``method`` under ``method.name`` (a config entry ``{name: <it>}`` then uses it everywhere).

    Raises:
        TypeError: not a :class:`Method`, or its ``config`` is not a :class:`MethodConfig` subclass.
        ValueError: the name is taken (unless ``replace``) or is not a safe file-name label.
    """
    import re

    from .base import SAFE_NAME

    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a Method, got {type(method).__name__}")
    if not (isinstance(method.config, type) and issubclass(method.config, MethodConfig)):
        raise TypeError(f"method {method.name}: config must be a MethodConfig subclass")
    if not re.match(SAFE_NAME, method.name) or not re.match(SAFE_NAME, method.display):
        raise ValueError(f"method name {method.name!r} / display {method.display!r}: letters, digits, '.', '_', '-'")
    if method.name in METHODS and not replace and METHODS[method.name] is not method:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def load_entry_points() -> None:
    """Register the methods of installed packages' ``w2s_shift.methods`` entry points (each a :class:`Method`),
    once. A broken entry point raises ValueError naming it."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register_method(ep.load())
        except Exception as e:
            raise ValueError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): {e}") from None


def get_method(name: str) -> Method:
    """The registered method called ``name``.

    Raises:
        ValueError: "unknown method 'x' (known methods: naive, anchor, ...)".
    """
    if isinstance(name, str) and name not in METHODS:
        load_entry_points()
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r} (known methods: {', '.join(METHODS)})") from None


def method_of(entry: dict) -> Method | None:
    """The registered method of a method dict read from metrics.json (``{"name": ..., "label": ...}``), or None
    for a name this version does not know (a run directory written by another version)."""
    if not isinstance(entry, dict):
        return None
    try:
        return get_method(entry.get("name"))
    except ValueError:
        return None


def is_w2s_student(entry: dict) -> bool:
    """Whether a method dict of metrics.json is a W2S student (WRG/AOG/NTS/PGR apply): its registered
    ``w2s_student``; an unknown name counts as a student (it is not one of the reference models)."""
    meth = method_of(entry)
    return meth.w2s_student if meth else True


def is_baseline(entry: dict) -> bool:
    """Whether a method dict of metrics.json is the :data:`BASELINE` (naive) student."""
    return isinstance(entry, dict) and entry.get("name") == BASELINE


def table_text(entry: dict | None) -> str:
    """Short description of a method dict (metrics.json) in a report: name, the method's own settings
    (:meth:`Method.table_text`), fine-tuning mode; "weak teacher" for None."""
    if entry is None:
        return "weak teacher"
    meth = method_of(entry)
    parts = [str(entry.get("name", "?")), *(meth.table_text(entry) if meth else [])]
    if entry.get("finetune"):
        parts.append(str(entry["finetune"]))
    return ", ".join(parts)


def _outside(meth: Method) -> str | None:
    """The module of a method defined outside this package (a plugin, an entry point), else None."""
    mod = type(meth).__module__
    return None if mod == __name__ or mod.startswith(__name__ + ".") else mod


def method_targets(m: MethodConfig, teacher_q: list, built_q: list | None = None) -> list:
    """:meth:`Method.targets` of an entry, checked: one soft label per student training pair, each a probability.

    Raises:
        ValueError: naming the method (and a plugin's module), the pair and the value: a count other than
            ``len(teacher_q)``, or a label that is not a finite number in [0, 1]."""
    import math

    q = m.method.targets(m, teacher_q, built_q)
    who = f"method {m.display}" + (f" ({_outside(m.method)})" if _outside(m.method) else "")
    try:
        values = [float(x) for x in q]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{who}: its soft labels (targets) are not numbers: {e}") from None
    if len(values) != len(teacher_q):
        raise ValueError(f"{who}: {len(values)} soft labels (targets) for {len(teacher_q)} student training pairs")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(
                f"{who}: soft label {v!r} for student training pair {i + 1} (targets): a soft label is the "
                "probability that the chosen response wins, in [0, 1]"
            )
    return q


def method_objective(m: MethodConfig, **kwargs) -> Objective:
    """:meth:`Method.objective` of an entry; a method from outside the package is named if its loss raises."""
    obj = m.method.objective(m, **kwargs)
    if _outside(m.method) and isinstance(obj, Objective):
        obj.owner = f"method {m.display} ({_outside(m.method)})"
    return obj


def method_entry(data) -> MethodConfig:
    """A ``methods:`` entry (dict, string name, or a :class:`MethodConfig`) as the settings model of its method.

    Raises:
        ValueError: unknown method name (naming the known ones); pydantic's ValidationError for bad settings.
    """
    if isinstance(data, MethodConfig):
        return data
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict):
        raise ValueError(f"a method entry is a name or a mapping with 'name', got {type(data).__name__}")
    if "name" not in data:
        raise ValueError("a method entry needs 'name'")
    return get_method(data["name"]).config.model_validate(data)


def check_entries(cfg) -> None:
    """The method rules across the entries of a run config (a :class:`w2s_shift.config.RunConfig`): labels
    unique, not 'teacher', without '__' and not ending in '_' (result file names), none the label of a post-hoc
    method's shared training, at most one of each reference
    model (ceiling, zero_shot), each method's own run rules (:meth:`Method.check_run`), ``export`` naming trained
    students only.

    Raises:
        ValueError: naming the labels, methods or export entries at fault.
    """
    expanded = cfg.expanded_methods()
    names = [m.display for m in expanded]
    if len({n.casefold() for n in names}) != len(names):  # file names: one file on a case-insensitive filesystem
        raise ValueError(f"method labels must be unique, also up to case, got {names} (set label: for repeats)")
    if "teacher" in {n.casefold() for n in names}:
        raise ValueError("'teacher' is reserved (in any case)")
    joined = [n for n in names if "__" in n or n.endswith("_")]
    if joined:  # then <label>__<dataset> splits at its first '__' only one way: no two (label, dataset) share a file
        raise ValueError(
            f"method labels {joined}: a label may not contain '__' nor end with '_' ('__' joins a model and a "
            "dataset in result file names, rewards/<model>__<dataset>.jsonl); rename it"
        )
    shared = sorted({t.display for m in expanded if (t := m.method.trained_as(m)) is not None} & set(names))
    if shared:  # models/<label>.safetensors of a shared training (a post-hoc method's) would be another entry's
        raise ValueError(
            f"method labels {shared}: the name of a post-hoc method's shared training (trained_as); rename"
        )
    for m in cfg.methods:
        m.method.check_run(m, cfg)
        if m.seeds is not None and set(m.seeds) - set(cfg.seeds):
            raise ValueError(f"method {m.display}: seeds {sorted(set(m.seeds) - set(cfg.seeds))} are not run seeds")
    refs = [n for n, meth in METHODS.items() if not meth.w2s_student]  # the reference models: one each
    if any(sum(m.name == n for m in cfg.methods) > 1 for n in refs):
        raise ValueError(f"at most one {' and one '.join(refs)} method")
    if isinstance(cfg.export, list):
        unknown = sorted(set(cfg.export) - set(names))
        if unknown:
            raise ValueError(f"export names unknown students {unknown} (students: {names})")
        untrained = [m.display for m in expanded if not m.method.trains and m.display in cfg.export]
        if untrained:
            raise ValueError(
                f"export: {untrained} is the untrained zero-shot model (a language model, not a reward "
                "model with a head); export trained students only"
            )


__all__ = [
    "BASELINE",
    "DEFAULT_METHODS",
    "METHODS",
    "LabelTools",
    "Method",
    "MethodConfig",
    "Objective",
    "StepContext",
    "ReferenceNeed",
    "check_entries",
    "get_method",
    "is_baseline",
    "is_w2s_student",
    "method_entry",
    "method_objective",
    "method_of",
    "method_targets",
    "register_method",
    "table_text",
]

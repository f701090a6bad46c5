"""The row-format registry: each format is a converter registered beside its code with :func:`register_format`, and
everything that names formats (``data.*.format`` in a config, ``--format`` of ``score``, ``evaluate`` and
``data inspect``, their help, ``w2s-shift data list``) reads :data:`FORMATS`.

A converter takes ``(row, path, rowno, source, columns=None)`` (a raw row as :func:`w2s_shift.data.formats.read_rows`
yields it, the file and 1-based row for errors, the dataset's display name, an optional column mapping) and returns
a :class:`~w2s_shift.data.schema.PreferencePair`; it raises :class:`~w2s_shift.data.schema.DataError` naming file,
row and field for a bad row, or :class:`~w2s_shift.data.formats.Dropped` for a row the dataset's own definition
drops (a tie). Installed packages add formats through the ``w2s_shift.formats`` entry-point group (each entry
point a module whose import registers them, or a converter registered under the entry point's name).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .schema import DataError

#: name (and alias) -> converter, in registration order.
FORMATS: dict[str, Callable] = {}
#: name -> one line saying what rows the format reads (aliases have none).
FORMAT_HELP: dict[str, str] = {}
ENTRY_POINT_GROUP = "w2s_shift.formats"
_SAFE = re.compile(r"^[a-z][a-z0-9_]*$")
_loaded = False


def register_format(name: str, *, aliases: tuple = (), help: str | None = None, replace: bool = False) -> Callable:
    """Decorator: register the converter it wraps as row format ``name`` (and each of ``aliases``).

    Args:
        name: lower-case letters, digits and '_'. aliases: other names for the same converter (``trl``).
        help: one line for ``w2s-shift data list`` (default: the first line of the converter's docstring).
        replace: allow taking over a registered name.

    Raises:
        ValueError: an unsafe or taken name (unless ``replace``).
    """

    def deco(fn: Callable) -> Callable:
        for n in (name, *aliases):
            if not isinstance(n, str) or not _SAFE.match(n):
                raise ValueError(f"format name {n!r}: lower-case letters, digits and '_', starting with a letter")
            if n in FORMATS and FORMATS[n] is not fn and not replace:
                raise ValueError(f"format {n!r} is already registered (to {FORMATS[n].__qualname__})")
        for n in (name, *aliases):
            FORMATS[n] = fn
        doc = (fn.__doc__ or "").strip().splitlines()
        FORMAT_HELP[name] = help or (doc[0] if doc else "")
        for a in aliases:
            FORMAT_HELP.pop(a, None)
        return fn

    return deco


def _load() -> None:
    """Register installed packages' entry points, once (the built-in formats registered themselves when the
    package was imported: ``w2s_shift/data/__init__.py`` imports their modules)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and ep.name not in FORMATS:
                register_format(ep.name)(obj)
        except Exception as e:
            raise ValueError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): {e}") from None


def format_names() -> list:
    """Every registered format name, aliases included, in registration order."""
    _load()
    return list(FORMATS)


def get_format(name: str, where: str | None = None) -> Callable:
    """The converter of format ``name``.

    Raises:
        DataError: an unknown format, naming ``where`` (the file or dataset) and the known formats.
    """
    _load()
    if name not in FORMATS:
        raise DataError(where or "format", None, None, f"unknown format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]

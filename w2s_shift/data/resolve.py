"""One resolver from a dataset string or reference to its pairs, for every command.

``run`` (configured ``data.sources`` / ``data.ood``), ``evaluate`` (new OOD targets), ``score`` and
``data inspect`` all load through :func:`resolve_dataset`, so a string names the same data everywhere.
The rule for a string (:func:`dataset_ref_for`), first match wins:

1. ``hf:<id>``: a Hugging Face hub dataset (``--format`` is its row format; ``allenai/reward-bench-2`` and
   ``allenai/reward-bench`` default to ``rewardbench2`` / ``rewardbench`` and their splits);
2. a name from :data:`~w2s_shift.data.adapters.DATASETS` (``w2s-shift data list``): that dataset, in its own
   format (``--format`` is refused);
3. an existing file: that file, in ``--format`` (default ``prompt_chosen_rejected``);
4. otherwise an error: "is a directory" / "file not found (neither a dataset name ... nor an existing file)"
   for a string that looks like a path (it has a suffix or a '/'), "neither a dataset name ... nor an existing
   file" for anything else.

A :class:`~w2s_shift.config.DatasetRef` (a config entry) says which of name / path / hub id it is, and is
loaded as it says.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .adapters import BUNDLED_DIR, DATASETS, convert_rows, load_hub, load_named, shared_data_dir
from .formats import read_rows
from .refs import DatasetRef, ref_kind
from .registry import get_format
from .schema import DataError, LoadResult, check_messages, check_text

DEFAULT_FORMAT = "prompt_chosen_rejected"


def load_file(
    path: str | os.PathLike,
    format: str = DEFAULT_FORMAT,
    *,
    source: str | None = None,
    columns: dict | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Load a preference file (JSONL/JSON/CSV/Parquet, optionally gzipped) in a registered row format
    (:mod:`.registry`).

    Args:
        path: the file.
        format: row format name (default: prompt/chosen/rejected columns, TRL standard or conversational).
        source: dataset name recorded in each pair (default: the file stem).
        columns: mapping from our field names (prompt, chosen, rejected, id) to the file's columns.
        skip_invalid: skip and count invalid rows instead of raising.

    Raises:
        DataError: the first invalid row (file, row, field), unless ``skip_invalid``; or a file-level error.
    """
    convert = get_format(format, str(path))
    source = source or Path(path).name.split(".")[0]
    result = LoadResult(name=source, pairs=[])
    rows = read_rows(path, result.skipped if skip_invalid else None)
    convert_rows(rows, convert, str(path), source, columns, skip_invalid, result)
    return result


def dataset_ref_for(spec: str, format: str | None = None, columns: dict | None = None) -> DatasetRef:
    """The dataset a command-line string names, by the rule of the module docstring.

    Args:
        spec: ``hf:<id>``, a dataset name, or a file path.
        format: ``--format`` (None: not given); the row format of a file or hub id.
        columns: ``--columns`` (None: not given); {our field: the file's column}, as a config entry's ``columns``.

    Raises:
        DataError: ``format`` or ``columns`` given for a dataset name; a path that is a directory or not there; a
            string that is neither a dataset name nor an existing file.
    """
    fmt = {"format": format} if format is not None else {}
    if columns:
        fmt["columns"] = columns
    if not spec.strip():  # Path("") is the working directory: never report an empty string as "is a directory"
        raise DataError(repr(spec), None, None, "empty dataset string; give a dataset name, a file or hf:<hub id>")
    kind = ref_kind(spec)
    if "hf" in kind:  # a RewardBench hub id brings its format and split; --format overrides the format
        return DatasetRef(**{**kind, **fmt})
    if spec in DATASETS:
        if format is not None or columns:
            flag = "--format" if format is not None else "--columns"
            raise DataError(
                spec,
                None,
                None,
                f"{flag} applies to a file; the named dataset has its own format ({DATASETS[spec].format})",
            )
        return DatasetRef(name=spec)
    p = Path(spec)
    if p.is_file():
        return DatasetRef(path=spec, **fmt)
    if p.is_dir():
        raise DataError(spec, None, None, "is a directory, expected a data file")
    if p.exists():  # a device (/dev/null, /dev/zero), a FIFO or a socket, also behind a symlink
        raise DataError(spec, None, None, "not a regular file (a device, FIFO or socket), expected a data file")
    unknown = "neither a dataset name (see `w2s-shift data list`) nor an existing file"
    if p.suffix or "/" in spec or os.sep in spec:
        raise DataError(spec, None, None, f"file not found ({unknown})")
    raise DataError(spec, None, None, f"{unknown} (a file needs its suffix, e.g. .jsonl)")


def resolve_dataset(
    spec_or_ref: str | DatasetRef, format: str | None = None, skip_invalid: bool = False, columns: dict | None = None
) -> LoadResult:
    """Load a dataset string (:func:`dataset_ref_for`) or a :class:`~w2s_shift.config.DatasetRef`.

    The result's ``name`` (and each pair's ``source``) is the reference's display name: the dataset name, the
    file stem, or the last part of the hub id, unless the reference has a ``label``.

    Args:
        spec_or_ref: a command-line string or a config entry.
        format, columns: ``--format`` and ``--columns`` for a string (a DatasetRef carries its own; giving both is
            a ValueError).
        skip_invalid: skip and count invalid rows instead of raising at the first.

    Raises:
        DataError: as :func:`dataset_ref_for`; an unknown name, missing files or an invalid row
            (:func:`~w2s_shift.data.adapters.load_named`, :func:`load_file`,
            :func:`~w2s_shift.data.adapters.load_hub`).
    """
    if isinstance(spec_or_ref, str):
        ref = dataset_ref_for(spec_or_ref, format, columns)
    elif format is not None or columns:
        raise ValueError("format and columns apply to a dataset string; a DatasetRef carries its own")
    else:
        ref = spec_or_ref
    if ref.name:
        res = load_named(ref.name, skip_invalid=skip_invalid)
    elif ref.path:
        res = load_file(ref.path, ref.format, source=ref.display, columns=ref.columns, skip_invalid=skip_invalid)
    else:
        res = load_hub(
            ref.hf,
            format=ref.format,
            source=ref.display,
            split=ref.split,
            subset=ref.subset,
            columns=ref.columns,
            skip_invalid=skip_invalid,
        )
    res.name = ref.display
    return res


SKIP_HINT = "--skip-invalid skips and counts such rows"


def with_skip_hint(err: DataError, hint: str = SKIP_HINT, ref: DatasetRef | None = None) -> DataError:
    """``err`` with ``(hint)`` appended to its reason when it names a row (a file-level error cannot be
    skipped row by row, so it is returned unchanged). With ``ref``, the dataset the error came from: when skipping
    would keep none of its rows (every row invalid, e.g. a wrong format or column mapping), the hint says so
    instead."""
    if err.row is None:
        return err
    every = _every_row_invalid(ref) if ref is not None else None
    return DataError(err.path, err.row, err.field, f"{err.reason} ({every or hint})")


def ref_of_error(refs: list, err: DataError) -> DatasetRef | None:
    """The file reference among ``refs`` whose file ``err`` names (None: none does)."""
    for r in refs:
        if r.path and os.path.abspath(r.path) == os.path.abspath(err.path):
            return r
    return None


def _every_row_invalid(ref: DatasetRef) -> str | None:
    """The hint for a dataset none of whose rows loads (None: some row loads, or it cannot be read again)."""
    try:
        res = resolve_dataset(ref, skip_invalid=True)
    except (DataError, OSError, ValueError):
        return None
    if res.pairs or not res.skipped.total:
        return None
    return (
        f"all {res.skipped.total:,} rows fail, so --skip-invalid would keep none: check the row format and the "
        "column mapping (--format and --columns; format: and columns: in a config)"
    )


def dataset_files(ref: DatasetRef) -> list:
    """The files a reference reads (its file, or a bundled/shared named dataset's files, all present); [] for
    a hub dataset or a named one whose files are not all found."""
    if ref.path:
        return [Path(ref.path)]
    spec = DATASETS.get(ref.name) if ref.name else None
    if spec is None or not spec.files:
        return []
    base = BUNDLED_DIR if spec.bundled else shared_data_dir()
    files = [Path(base) / f for f in spec.files] if base is not None else []
    return files if all(f.is_file() for f in files) else []


def load_single_responses(path: str) -> list:
    """Single-response rows (``score --single``): ``prompt`` (text or {role, content} messages), ``response``
    (text), ``id`` optional.

    Returns:
        list of (prompt, response, id as str or None).

    Raises:
        DataError: an unreadable file, a row that is not an object, or a missing/empty field (row named).
    """
    out = []
    for rowno, row in read_rows(path):
        if not isinstance(row, dict):
            raise DataError(path, rowno, None, f"expected an object with prompt and response, got {type(row).__name__}")
        for f in ("prompt", "response"):
            if f not in row:
                raise DataError(path, rowno, f, "missing field (single-response rows have prompt and response)")
        prompt = row["prompt"]
        prompt = (
            check_messages(prompt, path, rowno, "prompt")
            if isinstance(prompt, list)
            else check_text(prompt, path, rowno, "prompt")
        )
        response = check_text(row["response"], path, rowno, "response")
        rid = row.get("id")
        out.append((prompt, response, None if rid is None else str(rid)))
    return out


def row_subsets(data: str, fmt: str | None, pairs: list) -> list:
    """The RewardBench subset of each pair: a prompt/chosen/rejected file's ``subset`` column when every row has
    one and the rows line up with the pairs (none skipped), else each pair's source."""
    subsets: list[Any] = [p.source for p in pairs]
    p = Path(data)
    if p.is_file() and fmt in (None, DEFAULT_FORMAT):
        try:
            rows = [r for _, r in read_rows(p)]
        except ValueError:
            return subsets
        if len(rows) == len(pairs) and all(isinstance(r, dict) and isinstance(r.get("subset"), str) for r in rows):
            subsets = [r["subset"] for r in rows]
    return subsets

"""Reading preference files: JSONL/JSON/CSV/Parquet rows (optionally gzipped), and the general row formats.

:func:`read_rows` yields the rows of a file with 1-based row numbers; a file-level problem or a row the reader
cannot parse is a :class:`~w2s_shift.data.schema.DataError` naming file, row and field. The converters here
turn a row of a general format into a :class:`~w2s_shift.data.schema.PreferencePair`: prompt/chosen/rejected
(generic and TRL, text or messages), HH-RLHF transcripts and ShareGPT DPO; the converters of single datasets,
the :data:`~w2s_shift.data.adapters.FORMATS` registry and the named datasets are in
:mod:`w2s_shift.data.adapters`.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .registry import register_format
from .schema import DataError, PreferencePair, SkipReport, make_pair

# ---------------------------------------------------------------------------------------------------------
# Row readers


def _open_text(path: Path) -> io.TextIOBase:
    return io.TextIOWrapper(_open_bytes(path), encoding="utf-8", errors="strict", newline="")


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def _file_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for ext, kind in (
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "json"),
        (".csv", "csv"),
        (".parquet", "parquet"),
    ):
        if name.endswith(ext):
            return kind
    raise DataError(
        str(path), None, None, "unknown file type (expected .jsonl, .json, .csv or .parquet, optionally .gz)"
    )


class _DuplicateKey(ValueError):
    """An object repeats a key (args[0]); ``json.loads`` alone keeps the last value silently."""


def _unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` for ``json.loads``: the object as a dict, refusing a repeated key."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _parse_json(text: str) -> tuple[Any, str | None, int | None]:
    """``json.loads`` as (value, None, None), or (None, reason, line) when the text is not usable JSON.

    Besides :class:`json.JSONDecodeError`, ``json.loads`` raises a plain ValueError for an integer of more
    than 4,300 digits and RecursionError for nesting deeper than the interpreter's recursion limit: each is
    a bad row (or file), not a crash."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys), None, None
    except _DuplicateKey as e:
        return None, f"duplicate key {e.args[0]!r} in one object (JSON would keep only the last value)", None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg}, line {e.lineno} column {e.colno})", e.lineno
    except RecursionError:
        return None, "invalid JSON: nested too deeply", None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion ..."
        return None, f"invalid JSON: {str(e).split(':')[0]}", None


def _utf8_error(path: Path, kind: str) -> DataError:
    """Where a JSON or CSV file stops being UTF-8: the byte offset in the file, the line, and for a CSV the
    data row and column (a Latin-1 export is the usual cause)."""
    with _open_bytes(path) as f:
        raw = f.read()
    try:
        raw.decode("utf-8")
        return DataError(str(path), None, None, "invalid UTF-8")
    except UnicodeDecodeError as e:
        off = e.start
    line = raw.count(b"\n", 0, off) + 1
    reason = (
        f"invalid UTF-8 at byte {off} (line {line}, byte 0x{raw[off]:02x}); "
        "is the file Latin-1 or another encoding? re-save it as UTF-8"
    )
    if kind != "csv":
        return DataError(str(path), None, None, reason)
    prefix = raw[:off].decode("utf-8").lstrip("\ufeff")
    try:
        rows = list(csv.reader(io.StringIO(prefix, newline="")))
    except csv.Error:
        return DataError(str(path), None, None, reason)
    # named in the reason, not as DataError.row: the whole file fails to decode, --skip-invalid cannot skip one row
    if len(rows) <= 1:
        return DataError(str(path), None, None, reason.replace("(line", "(in the CSV header, line"))
    header, partial = rows[0], rows[-1]
    col = max(len(partial) - 1, 0) if not prefix.endswith(("\n", "\r")) else 0
    row = len(rows) - 1 + (1 if prefix.endswith(("\n", "\r")) else 0)
    where = f"CSV row {row}" + (f", field '{header[col]}'" if col < len(header) else "")
    return DataError(str(path), None, None, reason.replace("(line", f"({where}, line"))


def read_rows(path: str | os.PathLike, skipped: SkipReport | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_number, row)`` from a JSONL, JSON (list of objects), CSV or Parquet file.

    Row numbers are 1-based: the line for JSONL (blank lines are skipped but counted), the data row for
    CSV (header excluded), the element for JSON and Parquet.

    Args:
        path: the file.
        skipped: when given, a row the reader cannot parse (a JSONL line that is not valid JSON or not
            valid UTF-8, a malformed CSV row) is counted there and skipped instead of raising.

    Raises:
        DataError: the file is missing or empty, a line is not valid JSON, bytes are not valid UTF-8, a CSV
            row has a stray quote or the wrong number of fields, or the JSON top level is not a list.
    """

    def bad(err: DataError) -> None:
        if skipped is None:
            raise err
        skipped.add(err)

    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not a regular file" if path.exists() else "file not found"
        raise DataError(str(path), None, None, f"{what}, expected a data file" if path.exists() else what)
    if path.stat().st_size == 0:
        raise DataError(str(path), None, None, "empty file")
    kind = _file_kind(path)
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise DataError(str(path), None, None, f"cannot read Parquet: {e}") from None
        if table.num_rows == 0:
            raise DataError(str(path), None, None, "empty file (Parquet table has no rows)")
        for i, row in enumerate(table.to_pylist(), 1):
            yield i, row
        return
    try:
        if kind == "jsonl":  # bytes per line, so that invalid UTF-8 names its line
            n = 0
            with _open_bytes(path) as raw:
                for lineno, bline in enumerate(raw, 1):
                    try:
                        line = bline.decode("utf-8-sig" if lineno == 1 else "utf-8")
                    except UnicodeDecodeError as e:
                        n += 1
                        bad(DataError(str(path), lineno, None, f"invalid UTF-8 at byte {e.start + 1} of the line"))
                        continue
                    if not line.strip():
                        continue
                    n += 1
                    obj, reason, _ = _parse_json(line)
                    if reason is not None and "\r" in line.rstrip("\r\n"):  # CR-only line ends: one long "line"
                        reason += (
                            "; the line holds carriage returns (\\r) that end no line: the file has CR-only line "
                            "endings (classic Mac); convert them to \\n, e.g. tr '\\r' '\\n'"
                        )
                    if reason is not None:
                        bad(DataError(str(path), lineno, None, reason))
                        continue
                    yield lineno, obj
            if n == 0:
                raise DataError(str(path), None, None, "empty file (no JSON lines)")
            return
        with _open_text(path) as f:  # read whole, so the file is closed before any row is yielded
            text = f.read()
        text = text[1:] if text.startswith("\ufeff") else text  # a UTF-8 byte-order mark is not data
        if kind == "json":
            data, reason, lineno = _parse_json(text)
            if reason is not None:  # the whole file is one JSON document: name the line, not a row
                raise DataError(str(path), None, None, reason)
            if isinstance(data, dict):
                for key in ("data", "rows", "train"):
                    if isinstance(data.get(key), list):
                        data = data[key]
                        break
            if not isinstance(data, list):
                raise DataError(str(path), None, None, "expected a JSON list of objects at the top level")
            if not data:
                raise DataError(str(path), None, None, "empty file (JSON list has no rows)")
            yield from enumerate(data, 1)
        else:  # csv
            csv.field_size_limit(1 << 30)  # a huge response is data, not a malformed row
            reader = csv.reader(io.StringIO(text, newline=""), strict=True)
            try:
                header = next(reader)
            except StopIteration:
                raise DataError(str(path), None, None, "empty file (no CSV header)") from None
            except csv.Error as e:
                raise DataError(str(path), 0, None, f"malformed CSV header: {e}") from None
            dup = sorted({h for h in header if header.count(h) > 1})
            if dup:
                raise DataError(str(path), None, None, f"duplicate column name(s) in the CSV header: {', '.join(dup)}")
            n = 0
            i = 0
            while True:
                i += 1
                try:
                    values = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:
                    n += 1
                    bad(DataError(str(path), i, None, f"malformed CSV (stray quote?): {e}"))
                    continue
                if not values:
                    continue
                n += 1
                if len(values) != len(header):
                    bad(
                        DataError(
                            str(path),
                            i,
                            None,
                            f"expected {len(header)} CSV fields, got {len(values)} (stray quote or delimiter?)",
                        )
                    )
                    continue
                yield i, dict(zip(header, values))
            if n == 0:
                raise DataError(str(path), None, None, "empty file (CSV has a header but no rows)")
    except UnicodeDecodeError:
        raise _utf8_error(path, kind) from None
    except (OSError, EOFError) as e:
        raise DataError(str(path), None, None, f"cannot read file: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# Row converters: (row, path, rowno, source, columns) -> PreferencePair, or (PreferencePair, prompt_mismatch: bool)
# for a kept pair whose two responses came with different prompts (HH); raise Dropped for a row the dataset's
# definition drops, DataError for a malformed row. Any other exception from a converter is a bug.


class Dropped(Exception):
    """A row the dataset's own definition drops (e.g. a tie); counted, not an error."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def get_field(row: Any, key: str, path: str, rowno: int) -> Any:
    if not isinstance(row, dict):
        raise DataError(path, rowno, None, f"expected an object, got {type(row).__name__}")
    if key not in row:
        raise DataError(path, rowno, key, f"missing field (row has: {', '.join(map(str, list(row)[:12]))})")
    return row[key]


ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def number_cell(
    value: Any, path: str, rowno: int, name: str, *, text_ok: bool, missing: tuple = (), text_hint: str = "a number"
) -> float | None:
    """A cell holding a score as a finite float, or None for a missing one.

    Args:
        value: the cell. path, rowno, name: the file, 1-based row and field, for errors.
        text_ok: parse a numeric string (a CSV cell is text; UltraFeedback writes ratings as "4").
        missing: besides None, what counts as missing: "nan" (a NaN float: pandas' and Parquet's empty cell),
            "" (an empty string: an empty CSV cell), "N/A" (that text, any case).
        text_hint: what a string should have held, for the error ("a numeric rating or 'N/A'").

    Raises:
        DataError: naming the field: a string that is not a number (or a string where ``text_ok`` is off), a bool or
            another type, NaN or an infinity (unless "nan" is missing), an integer beyond float range.
    """
    if value is None or (
        ("nan" in missing and isinstance(value, float) and math.isnan(value))
        or ("" in missing and isinstance(value, str) and not value)
        or ("N/A" in missing and isinstance(value, str) and value.strip().upper() == "N/A")
    ):
        return None
    if isinstance(value, str) and text_ok:
        try:
            value = float(value.strip())
        except ValueError:
            raise DataError(path, rowno, name, f"expected {text_hint}, got {value[:40]!r}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(path, rowno, name, f"expected a number, got {type(value).__name__}")
    try:
        num = float(value)
    except OverflowError:  # an int beyond float range
        raise DataError(path, rowno, name, "expected a finite number, got an integer out of range") from None
    if not math.isfinite(num):
        raise DataError(path, rowno, name, f"expected a finite number, got {num}")
    return num


def message_role(m: dict) -> Any:
    """A message's role (``role`` or ShareGPT ``from``), mapped to ours; None when absent or unknown."""
    role = m.get("role", m.get("from"))
    return ROLE_MAP.get(role) if isinstance(role, str) else None  # a list or dict role is unhashable


def response_text(value: Any, path: str, rowno: int, name: str) -> Any:
    """A response given as text, a single message dict, or a message list whose last message is the
    assistant's (its content is the response).

    Raises:
        DataError: a message list is empty, does not end in a message object, or its last message is not
            the assistant's (``name`` is the field); a single message with a role that is not the assistant's.
    """
    if isinstance(value, dict):
        if ("role" in value or "from" in value) and message_role(value) != "assistant":
            raise DataError(
                path,
                rowno,
                name,
                f"the response message must be the assistant's, got role {value.get('role', value.get('from'))!r}",
            )
        if "content" not in value and "value" not in value:
            raise DataError(
                path,
                rowno,
                name,
                f"expected a string or a message with 'content', got an object with keys {sorted(value)[:6]}",
            )
        return value.get("content", value.get("value"))
    if isinstance(value, list):
        if not value or not isinstance(value[-1], dict):
            raise DataError(path, rowno, name, "expected a string or a list of messages")
        if message_role(value[-1]) != "assistant":
            last = value[-1].get("role", value[-1].get("from"))
            raise DataError(
                path, rowno, name, f"the last message must be the assistant's (the response), got role {last!r}"
            )
        return value[-1].get("content", value[-1].get("value"))
    return value


def normalise_messages(msgs: Any, path: str, rowno: int, name: str) -> list:
    if not isinstance(msgs, list):
        raise DataError(path, rowno, name, f"expected a list of messages, got {type(msgs).__name__}")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise DataError(path, rowno, f"{name}[{k}]", "expected a message object")
        role = message_role(m)
        if role is None:
            raise DataError(path, rowno, f"{name}[{k}]", f"unknown role {m.get('role', m.get('from'))!r}")
        out.append({"role": role, "content": m.get("content", m.get("value"))})
    return out


@register_format(
    "prompt_chosen_rejected",
    aliases=("trl",),
    help="prompt, chosen, rejected: text or message lists (TRL standard and conversational)",
)
def convert_prompt_chosen_rejected(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> PreferencePair:
    """Generic and TRL formats: ``prompt`` (text or messages, optional when chosen/rejected are message
    lists that share it), ``chosen``, ``rejected`` (text, a message, or a message list), ``id`` optional.
    ``columns`` maps our field names to the file's column names."""
    cols = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected", "id": "id"}
    cols.update(columns or {})
    chosen = get_field(row, cols["chosen"], path, rowno)
    rejected = get_field(row, cols["rejected"], path, rowno)
    if isinstance(chosen, list) and chosen and all(isinstance(x, str) for x in chosen):  # RewardBench 2's layout
        why = (
            "a list of texts, as in a RewardBench 2 row: give --format rewardbench2 (format: rewardbench2 in a config)"
        )
        raise DataError(path, rowno, cols["chosen"], why)
    if cols["prompt"] in row:
        prompt = row[cols["prompt"]]
        if isinstance(prompt, list):
            prompt = normalise_messages(prompt, path, rowno, cols["prompt"])
    elif isinstance(chosen, list) and isinstance(rejected, list):
        c = normalise_messages(chosen, path, rowno, cols["chosen"])
        r = normalise_messages(rejected, path, rowno, cols["rejected"])
        for msgs, name in ((c, cols["chosen"]), (r, cols["rejected"])):
            if not msgs or msgs[-1]["role"] != "assistant":
                got = msgs[-1]["role"] if msgs else "no message"
                raise DataError(
                    path, rowno, name, f"the last message must be the assistant's (the response), got {got!r}"
                )
        if len(c) < 2 or c[:-1] != r[:-1]:
            raise DataError(
                path, rowno, cols["prompt"], "missing field, and chosen/rejected message lists do not share a prompt"
            )
        prompt = c[:-1]
        if len(prompt) == 1 and prompt[0]["role"] == "user":
            prompt = prompt[0]["content"]
    else:
        get_field(row, cols["prompt"], path, rowno)  # raises the missing-field error
    return make_pair(
        prompt,
        response_text(chosen, path, rowno, cols["chosen"]),
        response_text(rejected, path, rowno, cols["rejected"]),
        source,
        path=path,
        row=rowno,
        id=row.get(cols["id"]),
    )


ASSISTANT_TAG = "\n\nAssistant:"
HUMAN_TAG = "\n\nHuman:"


def split_hh_transcript(text: str) -> tuple[list, str]:
    """Split an HH-RLHF transcript at the last ``"\\n\\nAssistant:"``: (earlier turns as messages, response).

    Raises:
        ValueError: no assistant turn in the text.
    """
    cut = text.rfind(ASSISTANT_TAG)
    if cut < 0:
        raise ValueError("no '\\n\\nAssistant:' turn in the transcript")
    head, response = text[:cut], text[cut + len(ASSISTANT_TAG) :]
    msgs = []
    # turns: sequence of "\n\nHuman:" / "\n\nAssistant:" markers
    markers = []
    for tag, role in ((HUMAN_TAG, "user"), (ASSISTANT_TAG, "assistant")):
        i = head.find(tag)
        while i >= 0:
            markers.append((i, tag, role))
            i = head.find(tag, i + 1)
    markers.sort()
    for k, (i, tag, role) in enumerate(markers):
        end = markers[k + 1][0] if k + 1 < len(markers) else len(head)
        msgs.append({"role": role, "content": head[i + len(tag) : end].strip()})
    if not markers and head.strip():
        msgs.append({"role": "user", "content": head.strip()})
    return msgs, response.strip()


@register_format("hh", help="Anthropic HH-RLHF: chosen and rejected full transcripts sharing the dialogue")
def convert_hh(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> tuple[PreferencePair, bool]:
    """Anthropic HH-RLHF: ``chosen``/``rejected`` are full transcripts sharing the dialogue before the last
    assistant turn; the prompt is taken from the chosen transcript.

    Returns ``(pair, prompt_mismatch)``: ``prompt_mismatch`` is True when the rejected transcript's prompt
    (its text before the last ``"\\n\\nAssistant:"``) differs from the chosen's. Such a pair is kept and counted in
    :attr:`LoadResult.prompt_mismatch` (harmless-base's test split has 5 such rows; 4 of them are invalid for
    another reason and skipped, so 1 is counted)."""
    out, heads = [], []
    for name in ("chosen", "rejected"):
        v = get_field(row, name, path, rowno)
        if not isinstance(v, str):
            raise DataError(path, rowno, name, f"expected a string, got {type(v).__name__}")
        try:
            out.append(split_hh_transcript(v))
        except ValueError as e:
            raise DataError(path, rowno, name, str(e)) from None
        heads.append(v[: v.rfind(ASSISTANT_TAG)])
    (prompt, chosen), (_, rejected) = out
    if not prompt:
        raise DataError(path, rowno, "chosen", "transcript has no human turn before the last assistant turn")
    return make_pair(prompt, chosen, rejected, source, path=path, row=rowno, id=f"{rowno}"), heads[0] != heads[1]


@register_format("sharegpt_dpo", help="LLaMA-Factory / ShareGPT DPO: conversations, chosen, rejected")
def convert_sharegpt_dpo(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """LLaMA-Factory / ShareGPT DPO: ``conversations`` (list of {from, value}), ``chosen``/``rejected``
    ({from, value} or text)."""
    conv = normalise_messages(get_field(row, "conversations", path, rowno), path, rowno, "conversations")
    for k, m in enumerate(conv):
        if not isinstance(m["content"], str):
            raise DataError(path, rowno, f"conversations[{k}]", "expected a string value")
    return make_pair(
        conv,
        response_text(get_field(row, "chosen", path, rowno), path, rowno, "chosen"),
        response_text(get_field(row, "rejected", path, rowno), path, rowno, "rejected"),
        source,
        path=path,
        row=rowno,
    )

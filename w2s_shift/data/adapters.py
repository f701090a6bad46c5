"""Dataset adapters: bundled and shared datasets by name, generic files with a column mapping, hub ids.

Each adapter reads rows and converts them to :class:`~w2s_shift.data.schema.PreferencePair`. A bad row
raises :class:`~w2s_shift.data.schema.DataError` naming file, row and field; with ``skip_invalid=True``
it is skipped and counted instead. Rows a dataset's own definition drops (ties in PandaLM, HelpSteer3 or
UltraFeedback raw) are counted too, and so are kept HH pairs whose two transcripts have different prompts.
Nothing is dropped silently: every loader returns a :class:`LoadResult` with the counts beside the pairs.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import DataError, PreferencePair, SkipReport, _check_text, make_pair

BUNDLED_DIR = Path(__file__).parent / "bundled"

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
        raise DataError(
            str(path), None, None, "is a directory, expected a data file" if path.is_dir() else "file not found"
        )
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


def _get(row: Any, key: str, path: str, rowno: int) -> Any:
    if not isinstance(row, dict):
        raise DataError(path, rowno, None, f"expected an object, got {type(row).__name__}")
    if key not in row:
        raise DataError(path, rowno, key, f"missing field (row has: {', '.join(map(str, list(row)[:12]))})")
    return row[key]


ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _role(m: dict) -> Any:
    """A message's role (``role`` or ShareGPT ``from``), mapped to ours; None when absent or unknown."""
    role = m.get("role", m.get("from"))
    return ROLE_MAP.get(role) if isinstance(role, str) else None  # a list or dict role is unhashable


def _response_text(value: Any, path: str, rowno: int, name: str) -> Any:
    """A response given as text, a single message dict, or a message list whose last message is the
    assistant's (its content is the response).

    Raises:
        DataError: a message list is empty, does not end in a message object, or its last message is not
            the assistant's (``name`` is the field); a single message with a role that is not the assistant's.
    """
    if isinstance(value, dict):
        if ("role" in value or "from" in value) and _role(value) != "assistant":
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
        if _role(value[-1]) != "assistant":
            last = value[-1].get("role", value[-1].get("from"))
            raise DataError(
                path, rowno, name, f"the last message must be the assistant's (the response), got role {last!r}"
            )
        return value[-1].get("content", value[-1].get("value"))
    return value


def _normalise_messages(msgs: Any, path: str, rowno: int, name: str) -> list:
    if not isinstance(msgs, list):
        raise DataError(path, rowno, name, f"expected a list of messages, got {type(msgs).__name__}")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise DataError(path, rowno, f"{name}[{k}]", "expected a message object")
        role = _role(m)
        if role is None:
            raise DataError(path, rowno, f"{name}[{k}]", f"unknown role {m.get('role', m.get('from'))!r}")
        out.append({"role": role, "content": m.get("content", m.get("value"))})
    return out


def convert_prompt_chosen_rejected(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> PreferencePair:
    """Generic and TRL formats: ``prompt`` (text or messages, optional when chosen/rejected are message
    lists that share it), ``chosen``, ``rejected`` (text, a message, or a message list), ``id`` optional.
    ``columns`` maps our field names to the file's column names."""
    cols = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected", "id": "id"}
    cols.update(columns or {})
    chosen = _get(row, cols["chosen"], path, rowno)
    rejected = _get(row, cols["rejected"], path, rowno)
    if cols["prompt"] in row:
        prompt = row[cols["prompt"]]
        if isinstance(prompt, list):
            prompt = _normalise_messages(prompt, path, rowno, cols["prompt"])
    elif isinstance(chosen, list) and isinstance(rejected, list):
        c = _normalise_messages(chosen, path, rowno, cols["chosen"])
        r = _normalise_messages(rejected, path, rowno, cols["rejected"])
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
        _get(row, cols["prompt"], path, rowno)  # raises the missing-field error
    return make_pair(
        prompt,
        _response_text(chosen, path, rowno, cols["chosen"]),
        _response_text(rejected, path, rowno, cols["rejected"]),
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
        v = _get(row, name, path, rowno)
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


def convert_pandalm(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PandaLM test set: majority vote of annotator1..3 (1: response1 better, 2: response2 better, 0: tie);
    ties and split votes are dropped by definition (counted)."""
    votes = []
    for k in (1, 2, 3):
        v = _get(row, f"annotator{k}", path, rowno)
        if isinstance(v, bool) or v not in (0, 1, 2):  # True == 1 in Python: a bool is not a vote
            raise DataError(path, rowno, f"annotator{k}", f"expected 0, 1 or 2, got {v!r}")
        votes.append(v)
    best = max((0, 1, 2), key=votes.count)
    if votes.count(best) < 2 or best == 0:
        raise Dropped("tie or no majority (PandaLM definition)")
    instruction = _check_text(_get(row, "instruction", path, rowno), path, rowno, "instruction")
    extra = row.get("input")
    if extra is None or (isinstance(extra, float) and math.isnan(extra)):
        extra = ""
    if not isinstance(extra, str):  # else an int or a list would be pasted into the prompt as text
        raise DataError(path, rowno, "input", f"expected a string, got {type(extra).__name__}")
    prompt = instruction if not extra else f"{instruction}\n\n{extra}"
    r1, r2 = _get(row, "response1", path, rowno), _get(row, "response2", path, rowno)
    chosen, rejected = (r1, r2) if best == 1 else (r2, r1)
    return make_pair(prompt, chosen, rejected, source, path=path, row=rowno, id=row.get("idx"))


def convert_sharegpt_dpo(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """LLaMA-Factory / ShareGPT DPO: ``conversations`` (list of {from, value}), ``chosen``/``rejected``
    ({from, value} or text)."""
    conv = _normalise_messages(_get(row, "conversations", path, rowno), path, rowno, "conversations")
    for k, m in enumerate(conv):
        if not isinstance(m["content"], str):
            raise DataError(path, rowno, f"conversations[{k}]", "expected a string value")
    return make_pair(
        conv,
        _response_text(_get(row, "chosen", path, rowno), path, rowno, "chosen"),
        _response_text(_get(row, "rejected", path, rowno), path, rowno, "rejected"),
        source,
        path=path,
        row=rowno,
    )


def convert_pku_pairs(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PKU-SafeRLHF derived pair files: ``prompt`` and ``response`` = [safer, less safe]."""
    resp = _get(row, "response", path, rowno)
    if not isinstance(resp, list) or len(resp) != 2:
        raise DataError(path, rowno, "response", "expected a list of two responses [safer, less safe]")
    return make_pair(_get(row, "prompt", path, rowno), resp[0], resp[1], source, path=path, row=rowno)


def convert_pku_saferlhf(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PKU-SafeRLHF full schema: prompt, response_0, response_1, safer_response_id (the Harmless label)."""
    sid = _get(row, "safer_response_id", path, rowno)
    if isinstance(sid, bool) or sid not in (0, 1):
        raise DataError(path, rowno, "safer_response_id", f"expected 0 or 1, got {sid!r}")
    sid = int(sid)  # 1.0 == 1 passes the check above but cannot index a list
    r = [_get(row, "response_0", path, rowno), _get(row, "response_1", path, rowno)]
    return make_pair(_get(row, "prompt", path, rowno), r[sid], r[1 - sid], source, path=path, row=rowno)


def convert_helpsteer3(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """HelpSteer3 preference: context (messages), response1, response2, overall_preference in -3..3
    (negative: response1 better; 0: tie, dropped by definition); |preference| kept as strength."""
    pref = _get(row, "overall_preference", path, rowno)
    if (
        isinstance(pref, bool)
        or not isinstance(pref, (int, float))
        or (isinstance(pref, float) and math.isnan(pref))
        or not -3 <= pref <= 3
    ):
        raise DataError(path, rowno, "overall_preference", f"expected a number in -3..3, got {pref!r}")
    if pref == 0:
        raise Dropped("tie (HelpSteer3 overall_preference = 0)")
    ctx = _normalise_messages(_get(row, "context", path, rowno), path, rowno, "context")
    r1, r2 = _get(row, "response1", path, rowno), _get(row, "response2", path, rowno)
    chosen, rejected = (r1, r2) if pref < 0 else (r2, r1)
    return make_pair(ctx, chosen, rejected, source, path=path, row=rowno, strength=float(abs(pref)))


def convert_safer_instruct(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """Safer-Instruct CSV: instruction, chosen, rejected."""
    return make_pair(
        _get(row, "instruction", path, rowno),
        _get(row, "chosen", path, rowno),
        _get(row, "rejected", path, rowno),
        source,
        path=path,
        row=rowno,
    )


def _uf_number(value: Any, path: str, rowno: int, name: str, *, text_ok: bool = False) -> float | None:
    """A finite score, or None for a missing one (None; ``"N/A"`` when ``text_ok``). A rating string such as
    ``"4"`` is parsed when ``text_ok``; NaN, infinities, bools and any other type are a DataError."""
    if value is None:
        return None
    if text_ok and isinstance(value, str):
        if value.strip().upper() == "N/A":
            return None
        try:
            num = float(value.strip())
        except ValueError:
            raise DataError(path, rowno, name, f"expected a numeric rating or 'N/A', got {value[:40]!r}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(path, rowno, name, f"expected a number, got {type(value).__name__}")
    else:
        try:
            num = float(value)
        except OverflowError:  # an int beyond float range
            raise DataError(path, rowno, name, "expected a finite number, got an integer out of range") from None
    if not math.isfinite(num):
        raise DataError(path, rowno, name, f"expected a finite number, got {num}")
    return num


def _uf_aspect_mean(ann: Any, path: str, rowno: int, name: str) -> float:
    """Mean of the available per-aspect ``Rating`` values of an UltraFeedback ``annotations`` object."""
    if not isinstance(ann, dict) or not ann:
        raise DataError(path, rowno, name, "expected an object of per-aspect ratings ({aspect: {'Rating': '4'}})")
    ratings = []
    for aspect, v in ann.items():
        if isinstance(v, dict):
            if "Rating" not in v:
                raise DataError(path, rowno, f"{name}.{aspect}.Rating", "missing field")
            r = _uf_number(v["Rating"], path, rowno, f"{name}.{aspect}.Rating", text_ok=True)
        else:
            r = _uf_number(v, path, rowno, f"{name}.{aspect}", text_ok=True)
        if r is not None:
            ratings.append(r)
    if not ratings:
        raise DataError(path, rowno, name, "no aspect rating available (all N/A)")
    return sum(ratings) / len(ratings)


def convert_ultrafeedback_raw(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> PreferencePair:
    """UltraFeedback raw (``openbmb/UltraFeedback``): ``instruction`` (the prompt) and ``completions``, a
    list of ``{response, overall_score | fine-grained_score | annotations, ...}``; one pair per row.

    Score of a completion, one kind per row so that scores are on one scale: ``overall_score`` when any
    completion of the row has one (1-10); else ``fine-grained_score`` when any has one; else the mean of
    the available per-aspect ratings in ``annotations`` (``{"helpfulness": {"Rating": "4"}, ...}``, 1-5,
    ``"N/A"`` = missing). Every completion of the row must then have that score.

    Pair: chosen = the highest-scored completion, rejected = the lowest-scored (the first one in the list
    on equal scores). UltraFeedback binarized (HuggingFaceH4/ultrafeedback_binarized) also takes the
    highest-scored completion as chosen, but a *random* lower one as rejected; best vs worst here gives
    a deterministic label (and the largest score gap). ``strength`` is that gap, on the row's scale.

    Dropped by definition (counted): best and worst tie (all completions scored equal: no preference),
    and rows with fewer than two completions (as in UltraFeedback binarized).

    Raises:
        DataError: a field is missing or malformed, naming it, e.g. ``completions[2].overall_score`` for a
            score that is NaN, infinite, a bool or not a number, or ``completions[0].response`` for an
            empty response of the chosen or rejected completion.
    """
    prompt = _check_text(_get(row, "instruction", path, rowno), path, rowno, "instruction")
    comps = _get(row, "completions", path, rowno)
    if not isinstance(comps, list):
        raise DataError(path, rowno, "completions", f"expected a list of completions, got {type(comps).__name__}")
    for k, c in enumerate(comps):
        if not isinstance(c, dict):
            raise DataError(path, rowno, f"completions[{k}]", f"expected a completion object, got {type(c).__name__}")
    if len(comps) < 2:
        raise Dropped("fewer than two completions (UltraFeedback raw: no pair)")
    kind = next(
        (key for key in ("overall_score", "fine-grained_score") if any(c.get(key) is not None for c in comps)),
        "annotations",
    )
    scores = []
    for k, c in enumerate(comps):
        name = f"completions[{k}].{kind}"
        if kind not in c:
            raise DataError(
                path,
                rowno,
                name,
                "missing field (other completions of this row have one: scores must be on one scale)"
                if kind != "annotations"
                else "missing field (a completion needs overall_score, fine-grained_score or annotations)",
            )
        if c[kind] is None:
            raise DataError(path, rowno, name, "missing value")
        if kind == "annotations":
            scores.append(_uf_aspect_mean(c[kind], path, rowno, name))
        else:
            scores.append(_uf_number(c[kind], path, rowno, name))
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if scores[best] == scores[worst]:
        raise Dropped("tie (UltraFeedback raw: best and worst completions have the same score)")
    chosen = _check_text(comps[best].get("response"), path, rowno, f"completions[{best}].response")
    rejected = _check_text(comps[worst].get("response"), path, rowno, f"completions[{worst}].response")
    gap = scores[best] - scores[worst]  # inf only for absurd scores near the float limit
    return make_pair(
        prompt,
        chosen,
        rejected,
        source,
        path=path,
        row=rowno,
        id=row.get("id"),
        strength=gap if math.isfinite(gap) else None,
    )


FORMATS: dict[str, Callable[..., PreferencePair]] = {
    "prompt_chosen_rejected": convert_prompt_chosen_rejected,
    "trl": convert_prompt_chosen_rejected,
    "hh": convert_hh,
    "pandalm": convert_pandalm,
    "sharegpt_dpo": convert_sharegpt_dpo,
    "pku_pairs": convert_pku_pairs,
    "pku_saferlhf": convert_pku_saferlhf,
    "helpsteer3": convert_helpsteer3,
    "safer_instruct": convert_safer_instruct,
    "ultrafeedback_raw": convert_ultrafeedback_raw,
}


# ---------------------------------------------------------------------------------------------------------
# Named datasets


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset: where its files are, its format, category (Helpful / Harmless) and license."""

    name: str
    category: str
    license: str
    origin: str
    format: str
    files: tuple = ()  # paths relative to the bundled dir, or to the shared data dir when not bundled
    bundled: bool = True
    hub_id: str | None = None
    dedupe_prompts: bool = False
    description: str = ""


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec(
            "ultrafeedback",
            "Helpful",
            "MIT",
            "openbmb/UltraFeedback via HuggingFaceH4/ultrafeedback_binarized (two random subsets)",
            "prompt_chosen_rejected",
            (
                "ultrafeedback_binarized_subset/train_clean.jsonl.gz",
                "ultrafeedback_binarized_subset/eval_clean.jsonl.gz",
                "ultrafeedback_binarized_subset_tnlp/train_prefs.jsonl.gz",
                "ultrafeedback_binarized_subset_tnlp/test_prefs.jsonl.gz",
            ),
            hub_id="HuggingFaceH4/ultrafeedback_binarized",
            dedupe_prompts=True,
            description="UltraFeedback binarized, 2,200 pairs from two subsets, deduplicated by prompt",
        ),
        DatasetSpec(
            "hh-helpful-base",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-base, test split",
            "hh",
            ("hh_rlhf_helpful_base/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-helpful-online",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-online, test split",
            "hh",
            ("hh_rlhf_helpful_online/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-helpful-rejection-sampled",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-rejection-sampled, test split",
            "hh",
            ("hh_rlhf_helpful_rejection_sampled/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-harmless-base",
            "Harmless",
            "MIT",
            "Anthropic/hh-rlhf harmless-base, test split",
            "hh",
            ("hh_rlhf_harmless_base/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "pandalm",
            "Helpful",
            "Apache-2.0",
            "WeOpenML/PandaLM testset-v1 (3 annotators, majority vote)",
            "pandalm",
            ("pandalm_testset_v1/testset-v1.json",),
        ),
        DatasetSpec(
            "llamafactory-dpo-en-demo",
            "Helpful",
            "Apache-2.0",
            "hiyouga/LLaMA-Factory data/dpo_en_demo.json",
            "sharegpt_dpo",
            ("llamafactory_dpo_en_demo/dpo_en_demo.json",),
        ),
        DatasetSpec(
            "pku-saferlhf-safer-pairs",
            "Harmless",
            "CC-BY-NC-4.0 (not bundled)",
            "PKU-SafeRLHF test split, safe-vs-unsafe pairs",
            "pku_pairs",
            ("pku_saferlhf_safer_pairs_5k/pku_seferlhf_realign_dpo_5k.json",),
            bundled=False,
        ),
        DatasetSpec(
            "safer-instruct",
            "Harmless",
            "academic use only (not bundled)",
            "uscnlp-lime/safer-instruct hate + self-harm",
            "safer_instruct",
            ("safer_instruct/safer_instruct_hate.csv", "safer_instruct/safer_instruct_self-harm.csv"),
            bundled=False,
        ),
        DatasetSpec(
            "pku-saferlhf",
            "Harmless",
            "CC-BY-NC-4.0",
            "PKU-Alignment/PKU-SafeRLHF (hub only)",
            "pku_saferlhf",
            bundled=False,
            hub_id="PKU-Alignment/PKU-SafeRLHF",
        ),
        DatasetSpec(
            "helpsteer3",
            "Helpful",
            "CC-BY-4.0",
            "nvidia/HelpSteer3 preference subset (hub only)",
            "helpsteer3",
            bundled=False,
            hub_id="nvidia/HelpSteer3",
        ),
        DatasetSpec(
            "rail-hh-10k",
            "Harmless",
            "see dataset card",
            "RAIL-HH-10K (hub only)",
            "prompt_chosen_rejected",
            bundled=False,
            hub_id="responsible-ai-labs/RAIL-HH-10K",
        ),
    ]
}


def shared_data_dir() -> Path | None:
    """Where non-bundled datasets live: ``$W2S_SHIFT_DATA_DIR``, else a ``shared/data`` folder beside or
    above the current directory (the project's development layout)."""
    env = os.environ.get("W2S_SHIFT_DATA_DIR")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for base in [here, *here.parents][:4]:
        for cand in (base / "shared" / "data", base.parent / "shared" / "data"):
            if cand.is_dir():
                return cand
    return None


@dataclass
class LoadResult:
    """Pairs from one dataset plus what was not kept, with reasons.

    Every non-blank row read is exactly one of: a pair, a skipped row (``skipped``, only with
    ``skip_invalid``), or a row dropped by the dataset's definition (``dropped_by_definition``).
    ``prompt_mismatch`` counts kept HH pairs whose rejected transcript had a different prompt than the
    chosen one (the pair keeps the chosen's prompt)."""

    name: str
    pairs: list
    skipped: SkipReport = field(default_factory=SkipReport)
    dropped_by_definition: dict = field(default_factory=dict)
    duplicates_removed: int = 0
    prompt_mismatch: int = 0  # kept pairs whose rejected response came with a different prompt (HH), counted

    def summary(self) -> dict:
        return {
            "name": self.name,
            "pairs": len(self.pairs),
            "invalid_rows_skipped": self.skipped.as_dict(),
            "dropped_by_definition": dict(self.dropped_by_definition),
            "duplicate_prompts_removed": self.duplicates_removed,
            "prompt_mismatch": self.prompt_mismatch,
        }


def _convert_rows(
    rows: Iterator,
    convert: Callable,
    path: str,
    source: str,
    columns: dict | None,
    skip_invalid: bool,
    result: LoadResult,
) -> None:
    for rowno, row in rows:
        try:
            out = convert(row, path, rowno, source, columns)
        except Dropped as d:
            result.dropped_by_definition[d.reason] = result.dropped_by_definition.get(d.reason, 0) + 1
        except DataError as e:
            if not skip_invalid:
                raise
            result.skipped.add(e)
        else:
            if isinstance(out, tuple):  # (pair, prompt_mismatch)
                out, mismatch = out
                result.prompt_mismatch += bool(mismatch)
            result.pairs.append(out)


def load_file(
    path: str | os.PathLike,
    format: str = "prompt_chosen_rejected",
    *,
    source: str | None = None,
    columns: dict | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Load a preference file (JSONL/JSON/CSV/Parquet, optionally gzipped) in one of :data:`FORMATS`.

    Args:
        path: the file.
        format: row format name (default: prompt/chosen/rejected columns, TRL standard or conversational).
        source: dataset name recorded in each pair (default: the file stem).
        columns: mapping from our field names (prompt, chosen, rejected, id) to the file's columns.
        skip_invalid: skip and count invalid rows instead of raising.

    Raises:
        DataError: the first invalid row (file, row, field), unless ``skip_invalid``; or a file-level error.
    """
    if format not in FORMATS:
        raise DataError(str(path), None, None, f"unknown format {format!r} (known: {', '.join(FORMATS)})")
    source = source or Path(path).name.split(".")[0]
    result = LoadResult(name=source, pairs=[])
    rows = read_rows(path, result.skipped if skip_invalid else None)
    _convert_rows(rows, FORMATS[format], str(path), source, columns, skip_invalid, result)
    return result


def load_named(name: str, *, skip_invalid: bool = False, data_dir: str | os.PathLike | None = None) -> LoadResult:
    """Load a named dataset from :data:`DATASETS` (bundled files, the shared data dir, or the hub).

    Raises:
        DataError: unknown name, files not found (with where they were looked for), or an invalid row.
    """
    if name not in DATASETS:
        raise DataError(name, None, None, f"unknown dataset name (known: {', '.join(DATASETS)}); or give a file path")
    spec = DATASETS[name]
    if not spec.files:
        return load_hub(spec.hub_id, format=spec.format, source=name, skip_invalid=skip_invalid)
    base = BUNDLED_DIR if spec.bundled else (Path(data_dir) if data_dir else shared_data_dir())
    if base is None:
        raise DataError(
            name,
            None,
            None,
            "not bundled (license); set W2S_SHIFT_DATA_DIR to the folder holding "
            f"{spec.files[0].split('/')[0]}/ or give its file path",
        )
    result = LoadResult(name=name, pairs=[])
    for rel in spec.files:
        p = base / rel
        if not p.is_file():
            raise DataError(str(p), None, None, "dataset file not found")
        rows = read_rows(p, result.skipped if skip_invalid else None)
        _convert_rows(rows, FORMATS[spec.format], str(p), name, None, skip_invalid, result)
    if spec.dedupe_prompts:
        dedupe_by_prompt(result)
    return result


def dedupe_by_prompt(result: LoadResult) -> None:
    """Keep the first pair of each prompt (by :meth:`PreferencePair.prompt_key`); count the rest."""
    seen: set = set()
    kept = []
    for p in result.pairs:
        k = p.prompt_key()
        if k in seen:
            result.duplicates_removed += 1
            continue
        seen.add(k)
        kept.append(p)
    result.pairs = kept


def load_hub(
    hub_id: str | None,
    *,
    format: str = "prompt_chosen_rejected",
    source: str | None = None,
    split: str = "test",
    subset: str | None = None,
    columns: dict | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Load a Hugging Face dataset id through ``datasets`` (needs the hub and the ``datasets`` package).

    Raises:
        DataError: ``datasets`` missing, the hub unreachable (offline), or an invalid row.
    """
    label = f"hf:{hub_id}" + (f"/{subset}" if subset else "") + f"[{split}]"
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise DataError(
            label,
            None,
            None,
            "the 'datasets' package is not installed (pip install datasets); "
            "offline, download the files and give their path instead",
        ) from None
    try:
        ds = datasets.load_dataset(hub_id, subset, split=split)
    except Exception as e:
        raise DataError(
            label, None, None, f"cannot load from the Hugging Face hub (offline?): {type(e).__name__}: {e}"
        ) from None
    result = LoadResult(name=source or hub_id, pairs=[])
    _convert_rows(enumerate(ds, 1), FORMATS[format], label, source or hub_id, columns, skip_invalid, result)
    return result

"""One schema for a pairwise preference example, and the project's data error.

Every adapter turns its source rows into :class:`PreferencePair` objects. A pair is a prompt (plain text
or a list of chat messages), a chosen and a rejected response (gold label: chosen is preferred), the name
of the dataset it came from, and an optional id. Validation happens here, once, so that every adapter
reports bad rows in the same way: :class:`DataError` names the file, the row (1-based) and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}
Prompt = str | list  # text, or a list of Message


class DataError(ValueError):
    """A data file or row is not a valid preference pair.

    Attributes:
        path: the file (or dataset name) the row came from.
        row: 1-based row number in that file (line for JSONL/CSV, element for JSON), or None for the file.
        field: the offending field, or None when the row as a whole is bad.
        reason: what is wrong, in words.
    """

    def __init__(self, path: str, row: int | None, field: str | None, reason: str):
        self.path, self.row, self.field, self.reason = str(path), row, field, reason
        where = self.path
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {reason}")


@dataclass
class SkipReport:
    """Counts of rows skipped (only when skipping is asked for), by reason; nothing is dropped silently."""

    counts: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)

    def add(self, err: DataError) -> None:
        reason = re.sub(r"\d+", "N", err.reason)  # "invalid JSON ... column 7" and "... column 9" are one reason
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.examples) < 5:
            self.examples.append(str(err))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict:
        return {"skipped": self.total, "by_reason": dict(self.counts), "examples": list(self.examples)}


@dataclass(frozen=True)
class PairGroup:
    """Where a pair sits in a row of several responses (a RewardBench 2 best-of-4 or Ties row, one pair per
    (chosen_i, rejected_j)), so that row-level scores can be computed from the pair rewards.

    Fields:
        row: the row's id (unique within the file; the rows' group key).
        subset: the row's benchmark subset (e.g. ``"Math"``, ``"Ties"``, ``"alpacaeval-easy"``).
        chosen, rejected: 0-based indices i, j of the pair's responses in the row's chosen and rejected lists.
        n_chosen, n_rejected: lengths of those lists (a row is complete when all its pairs are present).
    """

    row: str
    subset: str
    chosen: int = 0
    rejected: int = 0
    n_chosen: int = 1
    n_rejected: int = 1

    def to_json(self) -> dict:
        return {
            "row": self.row,
            "subset": self.subset,
            "chosen": self.chosen,
            "rejected": self.rejected,
            "n_chosen": self.n_chosen,
            "n_rejected": self.n_rejected,
        }


@dataclass(frozen=True)
class PreferencePair:
    """A pairwise preference example.

    Fields:
        prompt: the context, as text or as a list of ``{"role", "content"}`` messages (earlier turns).
        chosen: the preferred response (text).
        rejected: the dispreferred response (text).
        source: name of the dataset the pair came from (e.g. ``"ultrafeedback"``).
        id: optional identifier, unique within the source.
        strength: optional label strength (e.g. HelpSteer3 |overall_preference|); not used as gold.
        group: optional :class:`PairGroup` of a pair expanded from a row of several responses (RewardBench).
    """

    prompt: Any
    chosen: str
    rejected: str
    source: str
    id: str | None = None
    strength: float | None = None
    group: PairGroup | None = None

    def prompt_key(self) -> str:
        """A canonical key of the prompt used for splitting (whitespace-normalised, case-folded), hex sha1.

        A prompt of one user message has the same key as its text (both render the same)."""

        def norm(t: str) -> str:
            return re.sub(r"\s+", " ", t).strip().casefold()

        if isinstance(self.prompt, str):
            text = norm(self.prompt)
        elif len(self.prompt) == 1 and self.prompt[0]["role"] == "user":
            text = norm(self.prompt[0]["content"])
        else:
            text = json.dumps([[m["role"], norm(m["content"])] for m in self.prompt], ensure_ascii=False)
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def to_json(self) -> dict:
        d = {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected, "source": self.source}
        if self.id is not None:
            d["id"] = self.id
        if self.strength is not None:
            d["strength"] = self.strength
        if self.group is not None:
            d["group"] = self.group.to_json()
        return d


def _check_encodable(value: str, path: str, row: int | None, name: str) -> None:
    """A JSON ``"\\ud800"`` escape decodes to a lone surrogate: a str that UTF-8 (so every tokenizer, and
    :meth:`PreferencePair.prompt_key`) cannot encode. Caught here, where the row is known."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            path, row, name, f"invalid Unicode (lone surrogate U+{ord(value[e.start]):04X} at character {e.start + 1})"
        ) from None


def check_text(value: Any, path: str, row: int | None, name: str) -> str:
    """``value`` as a non-empty text field named ``name`` of ``path`` row ``row``.

    Raises:
        DataError: None or NaN (a missing CSV/Parquet cell), not a string, a lone surrogate, or no visible
            character.
    """
    if value is None:
        raise DataError(path, row, name, "missing value")
    if isinstance(value, float) and math.isnan(value):
        raise DataError(path, row, name, "missing value (NaN)")
    if not isinstance(value, str):
        raise DataError(path, row, name, f"expected a string, got {type(value).__name__}")
    _check_encodable(value, path, row, name)
    if not any(c.isprintable() and not c.isspace() for c in value):
        raise DataError(path, row, name, "empty string (no visible character)")
    return value


def check_messages(value: Any, path: str, row: int | None, name: str) -> list:
    """``value`` as a prompt message list: ``[{"role", "content"}, ...]`` (other keys dropped).

    Raises:
        DataError: not a non-empty list, a message without role/content, a role outside :data:`ROLES`, a
            content that is not a string (or not valid Unicode), a last message from the assistant, or every
            content empty; the field is named down to the message (``prompt[2].role``).
    """
    if not isinstance(value, list) or not value:
        raise DataError(path, row, name, "expected a non-empty list of {role, content} messages")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(path, row, f"{name}[{k}]", "expected a {role, content} message")
        if m["role"] not in ROLES:
            raise DataError(path, row, f"{name}[{k}].role", f"unknown role {m['role']!r} (expected one of {ROLES})")
        if not isinstance(m["content"], str):
            raise DataError(path, row, f"{name}[{k}].content", f"expected a string, got {type(m['content']).__name__}")
        _check_encodable(m["content"], path, row, f"{name}[{k}].content")
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] == "assistant":
        raise DataError(
            path, row, name, "the prompt ends with an assistant turn; the response belongs in chosen/rejected"
        )
    if all(not m["content"].strip() for m in out):
        raise DataError(path, row, name, "all prompt messages are empty")
    return out


def make_pair(
    prompt: Any,
    chosen: Any,
    rejected: Any,
    source: str,
    *,
    path: str,
    row: int | None,
    id: Any = None,
    strength: float | None = None,
    group: PairGroup | None = None,
) -> PreferencePair:
    """Validate fields and build a :class:`PreferencePair`.

    Raises:
        DataError: naming ``path``, ``row`` and the field when the prompt is missing/empty/malformed, a
            response is missing, not a string or empty, or chosen is identical to rejected; a text or id
            that is not valid Unicode (a lone surrogate, from a JSON ``"\\udfff"`` escape).
    """
    if isinstance(prompt, list):
        prompt = check_messages(prompt, path, row, "prompt")
    else:
        prompt = check_text(prompt, path, row, "prompt")
    chosen = check_text(chosen, path, row, "chosen")
    rejected = check_text(rejected, path, row, "rejected")
    if chosen.strip() == rejected.strip():
        raise DataError(path, row, "rejected", "chosen and rejected are identical")
    if id is not None:
        if not isinstance(id, str):
            id = str(id)
        _check_encodable(id, path, row, "id")
    return PreferencePair(
        prompt=prompt, chosen=chosen, rejected=rejected, source=source, id=id, strength=strength, group=group
    )


@dataclass
class LoadResult:
    """Pairs from one dataset plus what was not kept, with reasons.

    Every non-blank row read is exactly one of: a kept row (``rows_kept``: one pair, or one pair per
    (chosen, rejected) of a row of several responses), a skipped row (``skipped``, only with ``skip_invalid``), or
    a row dropped by the dataset's definition (``dropped_by_definition``).
    ``prompt_mismatch`` counts kept HH pairs whose rejected transcript had a different prompt than the
    chosen one (the pair keeps the chosen's prompt)."""

    name: str
    pairs: list
    skipped: SkipReport = field(default_factory=SkipReport)
    dropped_by_definition: dict = field(default_factory=dict)
    duplicates_removed: int = 0
    prompt_mismatch: int = 0  # kept pairs whose rejected response came with a different prompt (HH), counted
    rows_kept: int = 0  # rows that gave pairs (as many as the pairs read unless a format expands rows)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "pairs": len(self.pairs),
            "invalid_rows_skipped": self.skipped.as_dict(),
            "dropped_by_definition": dict(self.dropped_by_definition),
            "duplicate_prompts_removed": self.duplicates_removed,
            "prompt_mismatch": self.prompt_mismatch,
        }

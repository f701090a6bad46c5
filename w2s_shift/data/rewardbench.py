"""RewardBench rows as row formats: RewardBench 2 (``rewardbench2``) and RewardBench 1 (``rewardbench``).

* RewardBench 2 (hub ``allenai/reward-bench-2``, split ``test``): ``id``, ``prompt``, ``chosen`` (a list of
  responses), ``rejected`` (a list), ``num_correct``, ``num_incorrect`` (optional, checked against the lists),
  ``total_completions`` (optional, checked), ``subset``. A row expands to one pair per (chosen_i, rejected_j),
  each carrying a :class:`~w2s_shift.data.schema.PairGroup` (row id, subset, i, j and the list lengths), so the
  pair scoring of every command scores it and :mod:`w2s_shift.metrics.rewardbench` scores the row from the pair
  rewards. A subset other than Ties has exactly one chosen response (best-of-4: 1 chosen, 3 rejected). A Ties row
  (subset ``Ties``, any case) has the id ``ref:<n>`` (a reference prompt) or ``tied:<n>`` (the same prompt ``n``
  asked with several correct answers; at least two chosen), as the reference groups them
  (allenai/reward-bench ``rewardbench/utils.py``, ``process_single_model``).
* RewardBench 1 (hub ``allenai/reward-bench``, split ``filtered``): ``prompt``, ``chosen``, ``rejected`` (texts),
  ``subset``, ``id`` optional; one pair per row, with its group (row id, subset).

A bad row raises :class:`~w2s_shift.data.schema.DataError` naming file, row and field: a missing or empty
``subset``, an empty or non-list ``chosen``/``rejected``, a count field that does not match its list, a Ties id
that is not ``ref:<n>``/``tied:<n>`` (n at most 18 digits), a row id an earlier row of the file has
(:func:`w2s_shift.data.adapters.convert_rows`). The Ties subset is named ``Ties`` in whatever case the file writes
it.
"""

from __future__ import annotations

import re
from typing import Any

from .formats import get_field
from .registry import register_format
from .schema import DataError, PairGroup, check_text, make_pair

#: hub dataset id -> (row format, split) of the RewardBench releases; ``hf:<id>`` without ``--format`` uses them.
HUB_FORMATS = {
    "allenai/reward-bench-2": ("rewardbench2", "test"),
    "allenai/reward-bench": ("rewardbench", "filtered"),
}
#: A Ties row's id: ``ref:<n>`` or ``tied:<n>``, n a whole number of at most 18 digits (an int64).
TIES_ID = re.compile(r"^(ref|tied):(\d{1,18})$")
#: The Ties subset's name as the reference writes it; any other case is read as it (the reference compares
#: ``subset.lower() == "ties"``), so ``ties`` and ``Ties`` rows are one subset.
TIES = "Ties"


def is_ties(subset: str) -> bool:
    """Whether ``subset`` is RewardBench 2's Ties subset (the reference compares ``subset.lower() == "ties"``)."""
    return subset.lower() == "ties"


def _subset(row: Any, path: str, rowno: int) -> str:
    return check_text(get_field(row, "subset", path, rowno), path, rowno, "subset")


def _row_id(row: dict, rowno: int, path: str) -> str:
    """The row's id as text (``row<n>`` when the row has none)."""
    rid = row.get("id")
    if rid is None:
        return f"row{rowno}"
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise DataError(path, rowno, "id", f"expected a string or an integer, got {type(rid).__name__}")
    return check_text(str(rid), path, rowno, "id")


def _responses(row: dict, name: str, path: str, rowno: int) -> list:
    value = get_field(row, name, path, rowno)
    if not isinstance(value, list):
        raise DataError(path, rowno, name, f"expected a list of responses, got {type(value).__name__}")
    if not value:
        raise DataError(path, rowno, name, "empty list (a row needs at least one chosen and one rejected response)")
    return [check_text(v, path, rowno, f"{name}[{k}]") for k, v in enumerate(value)]


def _count(row: dict, name: str, expected: int, what: str, path: str, rowno: int) -> None:
    """Check an optional count field against the length it states."""
    if name not in row or row[name] is None:
        return
    v = row[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise DataError(path, rowno, name, f"expected an integer, got {v!r}")
    if v != expected:
        raise DataError(path, rowno, name, f"is {v}, but the row has {expected} {what}")


@register_format(
    "rewardbench2",
    help="RewardBench 2: id, prompt, chosen [..], rejected [..], num_correct, subset (one pair per chosen x rejected)",
)
def convert_rewardbench2(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> list:
    """RewardBench 2 row -> one pair per (chosen_i, rejected_j), ids ``<row id>#c<i>-r<j>``, each with its
    :class:`~w2s_shift.data.schema.PairGroup` (module docstring).

    Returns:
        list of ``len(chosen) * len(rejected)`` pairs, chosen-major.

    Raises:
        DataError: naming file, row and field (module docstring); a subset other than Ties with several chosen
            responses (best-of-4 scores one chosen against the rejected); a Ties id not ``ref:<n>``/``tied:<n>``,
            or a ``tied:`` row with fewer than two chosen responses (its rule needs the spread of the correct ones).
    """
    subset = _subset(row, path, rowno)
    rid = _row_id(row, rowno, path)
    chosen = _responses(row, "chosen", path, rowno)
    rejected = _responses(row, "rejected", path, rowno)
    _count(row, "num_correct", len(chosen), "chosen responses", path, rowno)
    _count(row, "num_incorrect", len(rejected), "rejected responses", path, rowno)
    _count(row, "total_completions", len(chosen) + len(rejected), "responses in chosen and rejected", path, rowno)
    if is_ties(subset):
        subset = TIES
        m = TIES_ID.match(rid)
        if m is None:
            shown = rid if len(rid) <= 60 else f"{rid[:40]}... ({len(rid):,} characters)"
            raise DataError(
                path,
                rowno,
                "id",
                f"a Ties row's id is 'ref:<n>' or 'tied:<n>' with n a whole number of at most 18 digits, got {shown!r}",
            )
        if m.group(1) == "tied" and len(chosen) < 2:
            raise DataError(path, rowno, "chosen", "a 'tied:' row of the Ties subset needs at least two chosen")
    elif len(chosen) != 1:
        raise DataError(
            path, rowno, "chosen", f"subset {subset!r} is best-of-N with one chosen response, got {len(chosen)}"
        )
    prompt = get_field(row, "prompt", path, rowno)
    return [
        make_pair(
            prompt,
            c,
            r,
            source,
            path=path,
            row=rowno,
            id=f"{rid}#c{i}-r{j}",
            group=PairGroup(rid, subset, i, j, len(chosen), len(rejected)),
        )
        for i, c in enumerate(chosen)
        for j, r in enumerate(rejected)
    ]


@register_format("rewardbench", help="RewardBench 1: prompt, chosen, rejected, subset (id optional)")
def convert_rewardbench(row: Any, path: str, rowno: int, source: str, columns: dict | None = None):
    """RewardBench 1 row -> one pair with its group (row id, subset); chosen and rejected are texts.

    Raises:
        DataError: a missing or empty field (``subset`` included), chosen identical to rejected.
    """
    subset = _subset(row, path, rowno)
    rid = _row_id(row, rowno, path)
    return make_pair(
        get_field(row, "prompt", path, rowno),
        get_field(row, "chosen", path, rowno),
        get_field(row, "rejected", path, rowno),
        source,
        path=path,
        row=rowno,
        id=row.get("id"),
        group=PairGroup(rid, subset),
    )

"""Converters of the paper's hub datasets whose real files carry several labels or many columns.

* HelpSteer3 (nvidia/HelpSteer3, ``preference`` subset): ``domain``, ``language``, ``context``, ``response1``,
  ``response2``, ``overall_preference``, ``individual_preference``.
* PKU-SafeRLHF (``prompt``, ``response_0``, ``response_1``, ``better_response_id``, ``safer_response_id``,
  ``is_response_0_safe``, ``is_response_1_safe``, harm categories, severity levels): two labels per row. The
  Harmless label is ``safer_response_id`` (format ``pku_saferlhf``, dataset ``pku-saferlhf``, used by the Harmless
  presets); the helpfulness label is ``better_response_id`` (format ``pku_saferlhf_better``, dataset
  ``pku-saferlhf-better``, Helpful category).
* RAIL-HH-10K (responsible-ai-labs/RAIL-HH-10K, 73 columns): ``context`` (earlier turns as an HH-style
  ``Human: ... Assistant: ...`` text), ``prompt`` (the last user turn), ``chosen_text``, ``rejected_text``, then
  ``{chosen,rejected}_rail_score[_confidence]`` and per ethical dimension ``{chosen,rejected}_<dim>_score``,
  ``_confidence``, ``_explanation``. The conversation is the context's turns plus the prompt; the pair's
  ``strength`` is the RAIL score margin ``chosen_rail_score - rejected_rail_score`` (0-10 scale; it can be <= 0
  where the score disagrees with the chosen label, which is kept as the dataset labels it).

Every converter takes ``(row, path, rowno, source, columns)`` and returns a
:class:`~w2s_shift.data.schema.PreferencePair` or raises :class:`~w2s_shift.data.schema.DataError` naming file,
row and field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .formats import Dropped, get_field, normalise_messages, number_cell
from .registry import register_format
from .schema import DataError, PreferencePair, check_text, make_pair


@register_format("helpsteer3", help="HelpSteer3 preference: context, response1, response2, overall_preference (0: tie)")
def convert_helpsteer3(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """HelpSteer3 preference subset: ``context`` (a list of {role, content}), ``response1``, ``response2``,
    ``overall_preference`` in -3..3 (negative: response1 better; 0: a tie, dropped by definition and counted);
    |overall_preference| is kept as the pair's strength. ``domain``, ``language`` and ``individual_preference``
    (the annotators' scores and reasons) are not read.

    Raises:
        DataError: ``overall_preference`` not a number in -3..3, a malformed context, an empty response.
    """
    pref = get_field(row, "overall_preference", path, rowno)
    if (
        isinstance(pref, bool)
        or not isinstance(pref, (int, float))
        or (isinstance(pref, float) and math.isnan(pref))
        or not -3 <= pref <= 3
    ):
        raise DataError(path, rowno, "overall_preference", f"expected a number in -3..3, got {pref!r}")
    if pref == 0:
        raise Dropped("tie (HelpSteer3 overall_preference = 0)")
    ctx = normalise_messages(get_field(row, "context", path, rowno), path, rowno, "context")
    r1, r2 = get_field(row, "response1", path, rowno), get_field(row, "response2", path, rowno)
    chosen, rejected = (r1, r2) if pref < 0 else (r2, r1)
    return make_pair(ctx, chosen, rejected, source, path=path, row=rowno, strength=float(abs(pref)))


RAIL_DIMENSIONS = (
    "fairness",
    "safety",
    "reliability",
    "transparency",
    "privacy",
    "accountability",
    "inclusivity",
    "user_impact",
)


def _pku(row: Any, path: str, rowno: int, source: str, label: str) -> PreferencePair:
    """A PKU-SafeRLHF pair labelled by the 0/1 id in column ``label``."""
    rid = get_field(row, label, path, rowno)
    if isinstance(rid, str) and rid.strip() in ("0", "1"):  # a CSV cell
        rid = int(rid.strip())
    if isinstance(rid, bool) or rid not in (0, 1):
        raise DataError(path, rowno, label, f"expected 0 or 1, got {rid!r}")
    rid = int(rid)  # 1.0 == 1 passes the check above but cannot index a list
    r = [get_field(row, "response_0", path, rowno), get_field(row, "response_1", path, rowno)]
    return make_pair(get_field(row, "prompt", path, rowno), r[rid], r[1 - rid], source, path=path, row=rowno)


@register_format("pku_saferlhf", help="PKU-SafeRLHF, harmless label: chosen = response_<safer_response_id>")
def convert_pku_saferlhf(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PKU-SafeRLHF, the Harmless label: chosen = ``response_<safer_response_id>``.

    Raises:
        DataError: ``safer_response_id`` not 0 or 1, a missing or empty prompt/response.
    """
    return _pku(row, path, rowno, source, "safer_response_id")


@register_format("pku_saferlhf_better", help="PKU-SafeRLHF, helpful label: chosen = response_<better_response_id>")
def convert_pku_saferlhf_better(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> PreferencePair:
    """PKU-SafeRLHF, the helpfulness label: chosen = ``response_<better_response_id>``.

    Raises:
        DataError: ``better_response_id`` not 0 or 1, a missing or empty prompt/response.
    """
    return _pku(row, path, rowno, source, "better_response_id")


def _missing(value: Any) -> bool:
    """A missing cell: None, NaN (Parquet/pandas) or an empty string (CSV)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value)


def _score(row: dict, name: str, path: str, rowno: int) -> float | None:
    """A RAIL score column as a finite float (a CSV cell is text), None when the column or its value is missing
    (:func:`~w2s_shift.data.formats.number_cell`)."""
    return number_cell(row.get(name), path, rowno, name, text_ok=True, missing=("nan", ""))


_TURN = re.compile(r"(?:^|\n)[ \t]*(Human|Assistant|User)[ \t]*:", re.IGNORECASE)


def rail_context_messages(context: Any, path: str, rowno: int) -> list:
    """The earlier turns of a RAIL-HH-10K ``context`` as ``[{"role", "content"}]``: an HH-style text (``Human:`` /
    ``Assistant:`` at the start of a line, ``User:`` accepted), a message list, or missing/empty (no turn). Text
    before the first marker counts as a user turn.

    Raises:
        DataError: a context that is neither text nor a message list.
    """
    if _missing(context):
        return []
    if isinstance(context, list):
        return normalise_messages(context, path, rowno, "context")
    if not isinstance(context, str):
        raise DataError(path, rowno, "context", f"expected text or a message list, got {type(context).__name__}")
    parts = _TURN.split(context)
    msgs = [{"role": "user", "content": parts[0].strip()}] if parts[0].strip() else []
    for tag, text in zip(parts[1::2], parts[2::2]):
        if text.strip():
            msgs.append({"role": "assistant" if tag.lower() == "assistant" else "user", "content": text.strip()})
    return msgs


@register_format("rail_hh", help="RAIL-HH-10K: context, prompt, chosen_text, rejected_text (RAIL score margin)")
def convert_rail_hh(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """RAIL-HH-10K: the conversation is ``context``'s turns then ``prompt`` as the last user turn (not repeated
    when the context already ends with it); chosen = ``chosen_text``, rejected = ``rejected_text``; ``strength``
    = ``chosen_rail_score - rejected_rail_score`` (None when either score is missing). The other 60-odd score,
    confidence and explanation columns are read by nobody.

    Raises:
        DataError: a missing/empty ``prompt``, ``chosen_text`` or ``rejected_text`` (named by its column), a
            non-numeric RAIL score, a context that is neither text nor messages.
    """
    prompt = check_text(get_field(row, "prompt", path, rowno), path, rowno, "prompt")
    chosen = check_text(get_field(row, "chosen_text", path, rowno), path, rowno, "chosen_text")
    rejected = check_text(get_field(row, "rejected_text", path, rowno), path, rowno, "rejected_text")
    msgs = rail_context_messages(row.get("context"), path, rowno)
    if not msgs or msgs[-1]["role"] != "user" or str(msgs[-1]["content"]).strip() != prompt.strip():
        msgs.append({"role": "user", "content": prompt})
    conversation = prompt if len(msgs) == 1 else msgs
    sc, sr = _score(row, "chosen_rail_score", path, rowno), _score(row, "rejected_rail_score", path, rowno)
    strength = None if sc is None or sr is None else sc - sr
    return make_pair(conversation, chosen, rejected, source, path=path, row=rowno, id=row.get("id"), strength=strength)

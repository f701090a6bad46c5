"""A row format added from outside the package, in this one file: its converter registered with
``register_format`` is read by a config's data entry, ``w2s-shift data inspect --format``, ``evaluate``'s and
``score``'s ``--format`` (their help lists it) and ``w2s-shift data list``; its bad rows and ties are reported as
the built-in formats' are. Nothing else in the package changes."""

import contextlib
import io
import json

import pytest

from w2s_shift.cli import main
from w2s_shift.config import DatasetRef
from w2s_shift.data.formats import Dropped, get_field
from w2s_shift.data.registry import FORMAT_HELP, FORMATS, register_format
from w2s_shift.data.resolve import resolve_dataset
from w2s_shift.data.schema import DataError, make_pair

ROWS = [
    {"question": "Capital of France?", "answer_a": "Paris.", "answer_b": "Lyon.", "votes_a": 5, "votes_b": 1},
    {"question": "2 + 2?", "answer_a": "5", "answer_b": "4", "votes_a": 0, "votes_b": 3},
    {"question": "Best colour?", "answer_a": "Blue.", "answer_b": "Red.", "votes_a": 2, "votes_b": 2},  # a tie
]


@pytest.fixture
def votes_format():
    """Register the format for one test, then take it out (the other tests see the built-in formats only)."""

    @register_format("votes", help="question, answer_a, answer_b, votes_a, votes_b (more votes: chosen)")
    def convert_votes(row, path, rowno, source, columns=None):
        a, b = get_field(row, "votes_a", path, rowno), get_field(row, "votes_b", path, rowno)
        if not isinstance(a, int) or not isinstance(b, int):
            raise DataError(path, rowno, "votes_a" if not isinstance(a, int) else "votes_b", "expected a whole number")
        if a == b:
            raise Dropped("tie (equal votes)")
        first, second = get_field(row, "answer_a", path, rowno), get_field(row, "answer_b", path, rowno)
        chosen, rejected = (first, second) if a > b else (second, first)
        return make_pair(get_field(row, "question", path, rowno), chosen, rejected, source, path=path, row=rowno)

    yield "votes"
    FORMATS.pop("votes", None)
    FORMAT_HELP.pop("votes", None)


def _cli(argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # --help
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_a_format_registered_outside_the_package_is_read_everywhere(votes_format, tmp_path):
    f = tmp_path / "votes.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    res = resolve_dataset(DatasetRef(path=str(f), format=votes_format))  # a config's data entry
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [
        ("Capital of France?", "Paris.", "Lyon."),
        ("2 + 2?", "4", "5"),
    ]
    assert res.dropped_by_definition.get("tie (equal votes)") == 1  # a tie is counted, not silently lost
    code, out, err = _cli(["data", "inspect", str(f), "--format", votes_format, "--json"])
    assert code == 0, err
    assert json.loads(out)["pairs"] == 2
    code, out, _ = _cli(["data", "list"])
    assert code == 0 and "votes " in out and "more votes: chosen" in out
    for cmd in (["evaluate"], ["score"], ["data", "inspect"]):
        code, help_text, _ = _cli([*cmd, "--help"])
        assert code == 0 and "votes" in help_text.replace("\n", " "), cmd


def test_its_bad_row_is_named_and_an_unknown_format_lists_it(votes_format, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({**ROWS[1], "votes_b": "three"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl, row 2, field 'votes_b': expected a whole number"):
        resolve_dataset(DatasetRef(path=str(f), format=votes_format))
    code, _, err = _cli(["data", "inspect", str(f), "--format", "votez"])
    assert code == 2 and "unknown format 'votez'" in err and "votes" in err.split("known:")[1]
    with pytest.raises(ValueError, match="already registered"):
        register_format(votes_format)(lambda row, path, rowno, source, columns=None: None)

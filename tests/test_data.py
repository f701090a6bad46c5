"""Tests of the data layer: readers, validation, format converters, named datasets, splits, rendering.

Every file is written by the test itself into ``tmp_path``; no download, no network. Expected values are
small enough to check by hand.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest

from w2s_shift.data import adapters
from w2s_shift.data.adapters import DATASETS, load_named
from w2s_shift.data.formats import read_rows, split_hh_transcript
from w2s_shift.data.render import cut_counts, encode, encode_pairs, prompt_budget, render, uses_chat_template
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import DataError, PreferencePair, SkipReport, make_pair
from w2s_shift.data.splits import SPLITS, prompt_keys, remove_prompt_overlap, split_by_prompt, subsample

# ---------------------------------------------------------------------------------------------------------
# helpers


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path, rows):
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def good_row(i):
    return {"prompt": f"Question {i}?", "chosen": f"Good answer {i}.", "rejected": f"Bad answer {i}."}


def raises_data_error(path, **kw):
    with pytest.raises(DataError) as ei:
        load_file(path, **kw)
    return ei.value


# ---------------------------------------------------------------------------------------------------------
# schema


def test_data_error_message_names_file_row_and_field():
    e = DataError("x/f.jsonl", 3, "chosen", "missing value")
    assert str(e) == "x/f.jsonl, row 3, field 'chosen': missing value"
    assert (e.path, e.row, e.field, e.reason) == ("x/f.jsonl", 3, "chosen", "missing value")
    assert str(DataError("f.csv", None, None, "empty file")) == "f.csv: empty file"


def test_prompt_key_normalises_whitespace_and_case():
    a = PreferencePair("What is  the\nsky?", "Blue.", "Green.", "s")
    b = PreferencePair("  what is the SKY? ", "x", "y", "t")
    c = PreferencePair("What is the sea?", "Blue.", "Green.", "s")
    assert a.prompt_key() == b.prompt_key() != c.prompt_key()
    m1 = PreferencePair([{"role": "user", "content": "Hi"}], "a", "b", "s")
    m2 = PreferencePair([{"role": "user", "content": "hi "}], "a", "b", "s")
    m3 = PreferencePair([{"role": "system", "content": "Hi"}], "a", "b", "s")
    assert m1.prompt_key() == m2.prompt_key() != m3.prompt_key()
    # one user message is the same prompt as its text (render() gives both the same tokens)
    assert m1.prompt_key() == PreferencePair("HI", "a", "b", "s").prompt_key()
    multi = [{"role": "system", "content": "Be  kind. "}, {"role": "user", "content": "Hi"}]
    multi2 = [{"role": "system", "content": "be kind."}, {"role": "user", "content": " hi\n"}]
    assert PreferencePair(multi, "a", "b", "s").prompt_key() == PreferencePair(multi2, "a", "b", "s").prompt_key()
    assert PreferencePair(multi, "a", "b", "s").prompt_key() != m1.prompt_key()
    assert len(a.prompt_key()) == 40


def test_make_pair_validation_and_to_json():
    p = make_pair("Q", "A", "B", "src", path="f", row=1, id=7, strength=2.0)
    assert p.to_json() == {"prompt": "Q", "chosen": "A", "rejected": "B", "source": "src", "id": "7", "strength": 2.0}
    with pytest.raises(DataError, match=r"f, row 2, field 'rejected': chosen and rejected are identical"):
        make_pair("Q", "Same ", " Same", "src", path="f", row=2)
    with pytest.raises(DataError, match=r"field 'chosen': empty string"):
        make_pair("Q", " \n\t", "B", "src", path="f", row=1)
    with pytest.raises(DataError, match=r"field 'prompt': the prompt ends with an assistant turn"):
        make_pair(
            [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "x", "y", "s", path="f", row=1
        )
    with pytest.raises(DataError, match=r"field 'prompt\[0\]\.role': unknown role 'bot'"):
        make_pair([{"role": "bot", "content": "Q"}], "x", "y", "s", path="f", row=1)


def test_skip_report_counts():
    r = SkipReport()
    for k in range(7):
        r.add(DataError("f", k + 1, "chosen", "missing value" if k % 2 else "empty"))
    assert r.total == 7 and r.counts == {"empty": 4, "missing value": 3}
    assert len(r.examples) == 5 and r.as_dict()["skipped"] == 7


# ---------------------------------------------------------------------------------------------------------
# 1. bad input over load_file


def test_missing_field_jsonl(tmp_path):
    rows = [good_row(1), {"prompt": "Q2?", "rejected": "no"}, good_row(3)]
    f = write_jsonl(tmp_path / "miss.jsonl", rows)
    e = raises_data_error(f)
    assert str(f) in str(e) and "row 2" in str(e) and "field 'chosen'" in str(e) and "missing field" in str(e)
    assert (e.row, e.field) == (2, "chosen")
    res = load_file(f, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Question 1?", "Question 3?"]
    assert res.skipped.total == 1 and list(res.skipped.counts) == [e.reason]


def test_missing_prompt_field(tmp_path):
    f = write_jsonl(tmp_path / "np.jsonl", [{"chosen": "a", "rejected": "b"}])
    e = raises_data_error(f)
    assert (e.row, e.field) == (1, "prompt") and "missing field" in e.reason


def test_empty_response_string_json(tmp_path):
    rows = [good_row(1), good_row(2), {"prompt": "Q", "chosen": "fine", "rejected": ""}]
    f = write_json(tmp_path / "empty_resp.json", rows)
    e = raises_data_error(f)
    assert str(e) == f"{f}, row 3, field 'rejected': empty string (no visible character)"
    res = load_file(f, skip_invalid=True)
    assert len(res.pairs) == 2 and res.skipped.counts == {"empty string (no visible character)": 1}


def test_non_string_response(tmp_path):
    rows = [{"prompt": "Q", "chosen": 42, "rejected": "b"}, good_row(2)]
    f = write_jsonl(tmp_path / "int.jsonl", rows)
    e = raises_data_error(f)
    assert str(e) == f"{f}, row 1, field 'chosen': expected a string, got int"
    res = load_file(f, skip_invalid=True)
    assert [p.chosen for p in res.pairs] == ["Good answer 2."] and res.skipped.total == 1


def test_chosen_identical_to_rejected_parquet(tmp_path):
    rows = [good_row(1), {"prompt": "Q", "chosen": "Same.", "rejected": "Same."}, good_row(3), good_row(4)]
    f = write_parquet(tmp_path / "same.parquet", rows)
    e = raises_data_error(f)
    assert str(f) in str(e) and "row 2" in str(e) and "field 'rejected'" in str(e) and "identical" in str(e)
    res = load_file(f, skip_invalid=True)
    assert [p.id for p in res.pairs] == [None, None, None] and len(res.pairs) == 3
    assert res.skipped.counts == {"chosen and rejected are identical": 1}


def test_invalid_json_line_names_row(tmp_path):
    f = tmp_path / "badline.jsonl"
    lines = [json.dumps(good_row(1)), "", '{"prompt": "Q", "chosen": "a", ', json.dumps(good_row(4))]
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    e = raises_data_error(f)
    # line 2 is blank (skipped but counted); line 3 is the broken one
    assert str(e).startswith(f"{f}, row 3: invalid JSON")
    assert e.row == 3 and e.field is None
    res = load_file(f, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Question 1?", "Question 4?"]
    assert res.skipped.total == 1 and next(iter(res.skipped.counts)).startswith("invalid JSON")


def test_invalid_utf8_names_row(tmp_path):
    f = tmp_path / "utf8.jsonl"
    good = (json.dumps(good_row(1)) + "\n").encode()
    bad = b'{"prompt": "Q", "chosen": "caf\xe9", "rejected": "b"}\n'  # latin-1 byte, not UTF-8
    f.write_bytes(good * 400 + bad + good)  # > 8 KiB before the bad byte: the position must still be right
    e = raises_data_error(f)
    assert bad.index(b"\xe9") == 30  # '{"prompt": "Q", "chosen": "caf' is 30 bytes
    assert str(e) == f"{f}, row 401: invalid UTF-8 at byte 31 of the line"
    res = load_file(f, skip_invalid=True)
    assert len(res.pairs) == 401 and res.skipped.total == 1
    assert len(res.pairs) + res.skipped.total == 402


def test_invalid_utf8_csv_is_a_file_error(tmp_path):
    f = tmp_path / "utf8.csv"
    f.write_bytes(b"prompt,chosen,rejected\nQ,caf\xe9,b\n")
    e = raises_data_error(f)
    # 0-based offset of \xe9: 23 header bytes + "Q,caf"; the CSV row and field are named too
    assert str(e) == (
        f"{f}: invalid UTF-8 at byte 28 (CSV row 1, field 'chosen', line 2, byte 0xe9); is the file "
        "Latin-1 or another encoding? re-save it as UTF-8"
    )


@pytest.mark.parametrize(
    "name,content",
    [
        ("empty.jsonl", b""),
        ("empty.csv", b""),
        ("blank.jsonl", b"\n\n  \n"),
        ("header_only.csv", b"prompt,chosen,rejected\n"),
        ("empty_list.json", b"[]"),
    ],
)
def test_empty_files(tmp_path, name, content):
    f = tmp_path / name
    f.write_bytes(content)
    for skip in (False, True):
        e = raises_data_error(f, skip_invalid=skip)
        assert str(e).startswith(f"{f}: empty file") and e.row is None


def test_missing_file_and_unknown_type(tmp_path):
    e = raises_data_error(tmp_path / "nope.jsonl")
    assert str(e) == f"{tmp_path / 'nope.jsonl'}: file not found"
    (tmp_path / "x.txt").write_text("hello")
    e = raises_data_error(tmp_path / "x.txt")
    assert "unknown file type" in str(e)
    e = raises_data_error(tmp_path / "x.txt", format="nonsense")
    assert "unknown format 'nonsense'" in str(e)


def test_csv_stray_quote(tmp_path):
    f = tmp_path / "quote.csv"
    f.write_text('prompt,chosen,rejected\nQ1,A1,B1\nQ2,"A2"x,B2\nQ3,A3,B3\n', encoding="utf-8")
    e = raises_data_error(f)
    assert str(e).startswith(f"{f}, row 2: malformed CSV (stray quote?)")
    res = load_file(f, skip_invalid=True)
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [("Q1", "A1", "B1"), ("Q3", "A3", "B3")]
    assert res.skipped.total == 1 and next(iter(res.skipped.counts)).startswith("malformed CSV")


def test_csv_wrong_field_count_and_unterminated_quote(tmp_path):
    f = tmp_path / "fields.csv"
    f.write_text("prompt,chosen,rejected\nQ1,A1,B1\nQ2,A2\nQ3,A3,B3,extra\nQ4,A4,B4\n", encoding="utf-8")
    e = raises_data_error(f)
    assert str(e) == f"{f}, row 2: expected 3 CSV fields, got 2 (stray quote or delimiter?)"
    res = load_file(f, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Q1", "Q4"]
    # reasons are counted by kind (numbers folded to N); the examples keep the exact messages
    assert res.skipped.counts == {"expected N CSV fields, got N (stray quote or delimiter?)": 2}
    assert any("row 2: expected 3 CSV fields, got 2" in x for x in res.skipped.examples)
    assert any("row 3: expected 3 CSV fields, got 4" in x for x in res.skipped.examples)
    # an opening quote that is never closed swallows the rest of the file: that one row is reported
    g = tmp_path / "open.csv"
    g.write_text('prompt,chosen,rejected\nQ1,A1,B1\nQ2,"A2,B2\nQ3,A3,B3\n', encoding="utf-8")
    e = raises_data_error(g)
    assert str(e).startswith(f"{g}, row 2: malformed CSV")
    res = load_file(g, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Q1"] and res.skipped.total == 1


def test_nan_in_field_json_and_parquet(tmp_path):
    f = tmp_path / "nan.jsonl"
    f.write_text(json.dumps(good_row(1)) + '\n{"prompt": "Q", "chosen": NaN, "rejected": "b"}\n', encoding="utf-8")
    e = raises_data_error(f)
    assert str(e) == f"{f}, row 2, field 'chosen': missing value (NaN)"
    res = load_file(f, skip_invalid=True)
    assert len(res.pairs) == 1 and res.skipped.counts == {"missing value (NaN)": 1}

    # pandas writes NaN in a text column as a Parquet null
    import pandas as pd

    g = tmp_path / "nan.parquet"
    pd.DataFrame(
        {"prompt": ["Q1", "Q2", "Q3"], "chosen": ["a", "b", "c"], "rejected": ["x", float("nan"), "z"]}
    ).to_parquet(g)
    e = raises_data_error(g)
    assert str(e) == f"{g}, row 2, field 'rejected': missing value"
    res = load_file(g, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Q1", "Q3"] and res.skipped.total == 1


def test_skip_invalid_accounts_for_every_row(tmp_path):
    """A mixed JSONL file: every written row ends up kept or counted, with its reason."""
    rows = [
        json.dumps(good_row(1)),
        json.dumps({"prompt": "Q", "rejected": "b"}),  # missing field
        json.dumps({"prompt": "Q", "chosen": "", "rejected": "b"}),  # empty
        json.dumps({"prompt": "Q", "chosen": 3, "rejected": "b"}),  # int
        json.dumps({"prompt": "Q", "chosen": "s", "rejected": "s"}),  # identical
        '{"prompt": ',  # bad JSON
        json.dumps(good_row(7)),
        '{"prompt": "Q", "chosen": NaN, "rejected": "b"}',  # NaN
        json.dumps(["not", "an", "object"]),  # wrong type
        json.dumps({"prompt": "   ", "chosen": "a", "rejected": "b"}),  # empty prompt
        json.dumps(good_row(11)),
    ]
    f = tmp_path / "mixed.jsonl.gz"
    with gzip.open(f, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
    res = load_file(f, skip_invalid=True)
    assert [p.prompt for p in res.pairs] == ["Question 1?", "Question 7?", "Question 11?"]
    assert res.skipped.total == 8
    assert len(res.pairs) + res.skipped.total == len(rows)
    c = res.skipped.counts
    assert c["empty string (no visible character)"] == 2
    assert c["expected a string, got int"] == 1
    assert c["chosen and rejected are identical"] == 1
    assert c["missing value (NaN)"] == 1
    assert c["expected an object, got list"] == 1
    assert sum(v for k, v in c.items() if k.startswith("missing field")) == 1
    assert sum(v for k, v in c.items() if k.startswith("invalid JSON")) == 1
    assert res.summary()["invalid_rows_skipped"]["skipped"] == 8
    assert res.name == "mixed"


def test_read_rows_row_numbers(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n\n{"a": 2}\n', encoding="utf-8")
    assert list(read_rows(f)) == [(1, {"a": 1}), (3, {"a": 2})]
    g = write_json(tmp_path / "r.json", {"data": [{"a": 1}, {"a": 2}]})
    assert list(read_rows(g)) == [(1, {"a": 1}), (2, {"a": 2})]
    h = tmp_path / "r.csv"
    h.write_text('a,b\n1,"x, ""y""\nz"\n\n2,w\n', encoding="utf-8")
    assert list(read_rows(h)) == [(1, {"a": "1", "b": 'x, "y"\nz'}), (3, {"a": "2", "b": "w"})]
    k = write_json(tmp_path / "obj.json", {"a": 1})
    with pytest.raises(DataError, match="expected a JSON list"):
        list(read_rows(k))


# ---------------------------------------------------------------------------------------------------------
# 2. format converters


def test_hh_transcript_split():
    msgs, resp = split_hh_transcript(
        "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: A joke?\n\nAssistant: Knock knock. "
    )
    assert msgs == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "A joke?"},
    ]
    assert resp == "Knock knock."
    with pytest.raises(ValueError):
        split_hh_transcript("\n\nHuman: no answer")


def test_hh_format(tmp_path):
    head = "\n\nHuman: What is two plus two?\n\nAssistant: Four.\n\nHuman: And times three?"
    rows = [
        {"chosen": head + "\n\nAssistant: Twelve.", "rejected": head + "\n\nAssistant: Seven."},
        {
            "chosen": "\n\nHuman: Hi\n\nAssistant: Hello, how can I help?",
            "rejected": "\n\nHuman: Hi\n\nAssistant: Go away.",
        },
        {"chosen": "\n\nHuman: no assistant turn here", "rejected": "\n\nHuman: Hi\n\nAssistant: x"},
    ]
    f = write_jsonl(tmp_path / "hh.jsonl", rows)
    e = raises_data_error(f, format="hh")
    assert str(e) == f"{f}, row 3, field 'chosen': no '\\n\\nAssistant:' turn in the transcript"
    res = load_file(f, format="hh", skip_invalid=True, source="hh-test")
    assert res.skipped.total == 1
    p0, p1 = res.pairs
    assert p0.prompt == [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And times three?"},
    ]
    assert (p0.chosen, p0.rejected, p0.source, p0.id) == ("Twelve.", "Seven.", "hh-test", "1")
    assert p1.prompt == [{"role": "user", "content": "Hi"}]
    assert (p1.chosen, p1.rejected, p1.id) == ("Hello, how can I help?", "Go away.", "2")


def test_pandalm_majority_vote(tmp_path):
    base = {
        "motivation_app": "app",
        "cmp_key": "a_b",
        "instruction": "Rewrite concisely.",
        "response1": "R1",
        "response2": "R2",
    }
    rows = [
        {**base, "idx": 0, "input": "Some long text.", "annotator1": 1, "annotator2": 1, "annotator3": 2},
        {**base, "idx": 1, "input": "", "annotator1": 2, "annotator2": 0, "annotator3": 2},
        {**base, "idx": 2, "input": "", "annotator1": 1, "annotator2": 2, "annotator3": 0},  # no majority
        {**base, "idx": 3, "input": "", "annotator1": 0, "annotator2": 0, "annotator3": 1},  # majority tie
        {**base, "idx": 4, "input": "", "annotator1": 2, "annotator2": 2, "annotator3": 2},
    ]
    f = write_json(tmp_path / "pandalm.json", rows)
    res = load_file(f, format="pandalm")
    assert [(p.id, p.chosen, p.rejected) for p in res.pairs] == [
        ("0", "R1", "R2"),
        ("1", "R2", "R1"),
        ("4", "R2", "R1"),
    ]
    assert res.pairs[0].prompt == "Rewrite concisely.\n\nSome long text."
    assert res.pairs[1].prompt == "Rewrite concisely."
    assert res.dropped_by_definition == {"tie or no majority (PandaLM definition)": 2}
    assert res.skipped.total == 0
    assert len(res.pairs) + sum(res.dropped_by_definition.values()) == len(rows)
    bad = write_json(
        tmp_path / "pandalm_bad.json", [{**base, "idx": 0, "annotator1": 5, "annotator2": 1, "annotator3": 1}]
    )
    e = raises_data_error(bad, format="pandalm")
    assert str(e) == f"{bad}, row 1, field 'annotator1': expected 0, 1 or 2, got 5"


def test_sharegpt_dpo(tmp_path):
    rows = [
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello"},
                {"from": "human", "value": "Tell a joke"},
            ],
            "chosen": {"from": "gpt", "value": "Knock knock."},
            "rejected": {"from": "gpt", "value": "No."},
        },
        {"conversations": [{"from": "human", "value": "2+2?"}], "chosen": "4", "rejected": "5"},
        {"conversations": [{"from": "robot", "value": "x"}], "chosen": "4", "rejected": "5"},
    ]
    f = write_json(tmp_path / "dpo.json", rows)
    e = raises_data_error(f, format="sharegpt_dpo")
    assert str(e) == f"{f}, row 3, field 'conversations[0]': unknown role 'robot'"
    res = load_file(f, format="sharegpt_dpo", skip_invalid=True)
    p0, p1 = res.pairs
    assert p0.prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Tell a joke"},
    ]
    assert (p0.chosen, p0.rejected) == ("Knock knock.", "No.")
    assert (p1.prompt, p1.chosen, p1.rejected) == ([{"role": "user", "content": "2+2?"}], "4", "5")
    assert res.skipped.total == 1


def test_pku_pairs(tmp_path):
    rows = [
        {"prompt": "How do I get back at a bully?", "response": ["Talk to someone you trust.", "Slash their tyres."]},
        {"prompt": "Q2", "response": ["only one"]},
    ]
    f = write_json(tmp_path / "pku_pairs.json", rows)
    e = raises_data_error(f, format="pku_pairs")
    assert str(e) == f"{f}, row 2, field 'response': expected a list of two responses [safer, less safe]"
    res = load_file(f, format="pku_pairs", skip_invalid=True)
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [
        ("How do I get back at a bully?", "Talk to someone you trust.", "Slash their tyres.")
    ]


def test_pku_saferlhf_full_schema_parquet(tmp_path):
    common = {"prompt_source": "Alpaca3-70B", "is_response_0_safe": True, "is_response_1_safe": False}
    rows = [
        {
            **common,
            "prompt": "P1",
            "response_0": "r0",
            "response_1": "r1",
            "better_response_id": 0,
            "safer_response_id": 1,
        },
        {
            **common,
            "prompt": "P2",
            "response_0": "s0",
            "response_1": "s1",
            "better_response_id": 1,
            "safer_response_id": 0,
        },
        {
            **common,
            "prompt": "P3",
            "response_0": "t0",
            "response_1": "t1",
            "better_response_id": 1,
            "safer_response_id": 2,
        },
    ]
    f = write_parquet(tmp_path / "pku.parquet", rows)
    e = raises_data_error(f, format="pku_saferlhf")
    assert str(e) == f"{f}, row 3, field 'safer_response_id': expected 0 or 1, got 2"
    res = load_file(f, format="pku_saferlhf", skip_invalid=True)
    # the Harmless label (safer_response_id) decides, not better_response_id
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [("P1", "r1", "r0"), ("P2", "s0", "s1")]


def test_helpsteer3(tmp_path):
    ctx = [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Which topic?"},
        {"role": "user", "content": "Rain."},
    ]
    base = {
        "domain": "general",
        "language": "english",
        "context": ctx,
        "response1": "R1",
        "response2": "R2",
        "individual_preference": [],
    }
    rows = [
        {**base, "overall_preference": -2},
        {**base, "overall_preference": 3},
        {**base, "overall_preference": 0},
        {**base, "overall_preference": 1},
        {**base, "overall_preference": -1},
        {**base, "overall_preference": 5},
    ]
    f = write_jsonl(tmp_path / "hs3.jsonl", rows)
    e = raises_data_error(f, format="helpsteer3")
    assert str(e) == f"{f}, row 6, field 'overall_preference': expected a number in -3..3, got 5"
    res = load_file(f, format="helpsteer3", skip_invalid=True)
    assert [(p.chosen, p.rejected, p.strength) for p in res.pairs] == [
        ("R1", "R2", 2.0),
        ("R2", "R1", 3.0),
        ("R2", "R1", 1.0),
        ("R1", "R2", 1.0),
    ]
    assert res.pairs[0].prompt == ctx
    assert res.dropped_by_definition == {"tie (HelpSteer3 overall_preference = 0)": 1}
    assert res.skipped.total == 1
    assert len(res.pairs) + 1 + 1 == len(rows)


def test_trl_conversational_and_standard(tmp_path):
    rows = [
        # conversational, implicit prompt (a single user turn collapses to text)
        {
            "chosen": [
                {"role": "user", "content": "What color is the sky?"},
                {"role": "assistant", "content": "Blue."},
            ],
            "rejected": [
                {"role": "user", "content": "What color is the sky?"},
                {"role": "assistant", "content": "Green."},
            ],
        },
        # conversational, multi-turn shared prompt
        {
            "chosen": [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
            ],
            "rejected": [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "What?"},
            ],
        },
        # explicit prompt as messages, responses as message lists
        {
            "prompt": [{"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}],
        },
        # prompts that differ: no shared prompt
        {
            "chosen": [{"role": "user", "content": "A?"}, {"role": "assistant", "content": "x"}],
            "rejected": [{"role": "user", "content": "B?"}, {"role": "assistant", "content": "y"}],
        },
    ]
    f = write_jsonl(tmp_path / "trl.jsonl", rows)
    e = raises_data_error(f, format="trl")
    assert (
        str(e) == f"{f}, row 4, field 'prompt': missing field, and chosen/rejected message lists do not share a prompt"
    )
    res = load_file(f, format="trl", skip_invalid=True)
    p0, p1, p2 = res.pairs
    assert (p0.prompt, p0.chosen, p0.rejected) == ("What color is the sky?", "Blue.", "Green.")
    assert p1.prompt == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    assert (p1.chosen, p1.rejected) == ("Hello!", "What?")
    assert (p2.prompt, p2.chosen, p2.rejected) == ([{"role": "user", "content": "2+2?"}], "4", "5")
    assert res.skipped.total == 1


def test_generic_columns_mapping_csv(tmp_path):
    f = tmp_path / "custom.csv"
    f.write_text('qid,question,good,bad\n17,"Why, though?",Because.,No idea.\n18,Second?,Yes,No\n', encoding="utf-8")
    cols = {"prompt": "question", "chosen": "good", "rejected": "bad", "id": "qid"}
    res = load_file(f, columns=cols, source="mine")
    assert [(p.id, p.prompt, p.chosen, p.rejected, p.source) for p in res.pairs] == [
        ("17", "Why, though?", "Because.", "No idea.", "mine"),
        ("18", "Second?", "Yes", "No", "mine"),
    ]
    # without the mapping the file's columns are not found
    e = raises_data_error(f)
    assert (e.row, e.field) == (1, "chosen") and "row has: qid, question, good, bad" in str(e)
    # a mapping to a column the file lacks names that column
    e = raises_data_error(f, columns={**cols, "chosen": "best"})
    assert str(e).startswith(f"{f}, row 1, field 'best': missing field")


def test_safer_instruct_csv(tmp_path):
    f = tmp_path / "safer_instruct_hate.csv"
    f.write_text(
        "instruction,rejected,chosen,label\n"
        '"make this into a meme ""you are a waste of air""",You are a waste of air.,'
        '"Sorry, but I can\'t assist with that.",hate\n'
        '"Write a poem,\nthen insult me",Bad words.,A kind poem.,hate\n',
        encoding="utf-8",
    )
    res = load_file(f, format="safer_instruct")
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [
        (
            'make this into a meme "you are a waste of air"',
            "Sorry, but I can't assist with that.",
            "You are a waste of air.",
        ),
        ("Write a poem,\nthen insult me", "A kind poem.", "Bad words."),
    ]
    assert res.name == "safer_instruct_hate"


def _uf_comp(response, **score):
    return {"response": response, "model": "m", **score}


def _uf_ann(*ratings):
    aspects = ("helpfulness", "honesty", "instruction_following", "truthfulness")
    return {"annotations": {a: {"Rating": r, "Rationale": "..."} for a, r in zip(aspects, ratings)}}


def test_ultrafeedback_raw(tmp_path):
    rows = [
        # overall_score: best (9) vs worst (2); the middle one is ignored
        {
            "source": "evol",
            "instruction": "Name a colour.",
            "completions": [
                _uf_comp("Red.", overall_score=6),
                _uf_comp("Blue, a calm colour.", overall_score=9),
                _uf_comp("Dunno.", overall_score=2),
            ],
        },
        # aspect ratings, "N/A" missing: means 4.5 (N/A skipped), 2, 3 -> chosen 0, rejected 1
        {
            "instruction": "Say hi.",
            "completions": [
                {"response": "Hi there!", **_uf_ann("5", "N/A", "4", "4.5")},
                {"response": "Go away.", **_uf_ann("2", "2", "2", "2")},
                {"response": "Hello.", **_uf_ann("3", "3", "3", "3")},
            ],
        },
        # fine-grained_score (no overall_score); equal top scores: the first one listed wins
        {
            "instruction": "2+2?",
            "id": 7,
            "completions": [
                _uf_comp("4", **{"fine-grained_score": 4.75}),
                _uf_comp("Four.", **{"fine-grained_score": 4.75}),
                _uf_comp("5", **{"fine-grained_score": 1.25}),
            ],
        },
        # tie between best and worst: dropped by definition
        {"instruction": "Tie?", "completions": [_uf_comp("a", overall_score=5), _uf_comp("b", overall_score=5.0)]},
        # fewer than two completions: no pair, dropped by definition
        {"instruction": "Alone?", "completions": [_uf_comp("a", overall_score=5)]},
        {"instruction": "None?", "completions": []},
        # malformed scores
        {
            "instruction": "Q",
            "completions": [
                _uf_comp("a", overall_score=5),
                _uf_comp("b", overall_score=3),
                _uf_comp("c", overall_score=float("nan")),
            ],
        },
        {"instruction": "Q", "completions": [_uf_comp("a", overall_score=5), _uf_comp("b", overall_score="7")]},
        {"instruction": "Q", "completions": [_uf_comp("a", overall_score=5), _uf_comp("b", overall_score=True)]},
        {
            "instruction": "Q",
            "completions": [{"response": "a", **_uf_ann("5", "4")}, {"response": "b", **_uf_ann("high", "4")}],
        },
        {
            "instruction": "Q",
            "completions": [{"response": "a", **_uf_ann("5", "4")}, {"response": "b", **_uf_ann("N/A", "N/A")}],
        },
        # scores must be on one scale: one completion has overall_score, another only annotations
        {"instruction": "Q", "completions": [_uf_comp("a", overall_score=8), {"response": "b", **_uf_ann("4", "4")}]},
        # the chosen completion's response is empty
        {"instruction": "Q", "completions": [_uf_comp(" ", overall_score=8), _uf_comp("b", overall_score=4)]},
        {"instruction": "Q", "completions": "not a list"},
    ]
    f = write_jsonl(tmp_path / "uf_raw.jsonl", rows)
    res = load_file(f, format="ultrafeedback_raw", skip_invalid=True)
    assert [(p.prompt, p.chosen, p.rejected, p.strength, p.id) for p in res.pairs] == [
        ("Name a colour.", "Blue, a calm colour.", "Dunno.", 7.0, None),
        ("Say hi.", "Hi there!", "Go away.", 2.5, None),
        ("2+2?", "4", "5", 3.5, "7"),
    ]
    assert res.dropped_by_definition == {
        "tie (UltraFeedback raw: best and worst completions have the same score)": 1,
        "fewer than two completions (UltraFeedback raw: no pair)": 2,
    }
    assert len(res.pairs) + res.skipped.total + sum(res.dropped_by_definition.values()) == len(rows)
    errors = []
    for k in range(6, len(rows)):  # each malformed row on its own, strict: the DataError names row and field
        g = write_jsonl(tmp_path / f"uf_bad{k}.jsonl", [rows[0], rows[k]])
        e = raises_data_error(g, format="ultrafeedback_raw")
        assert e.row == 2
        errors.append((e.field, e.reason))
    assert errors == [
        ("completions[2].overall_score", "expected a finite number, got nan"),
        ("completions[1].overall_score", "expected a number, got str"),
        ("completions[1].overall_score", "expected a number, got bool"),
        ("completions[1].annotations.helpfulness.Rating", "expected a numeric rating or 'N/A', got 'high'"),
        ("completions[1].annotations", "no aspect rating available (all N/A)"),
        (
            "completions[1].overall_score",
            "missing field (other completions of this row have one: scores must be on one scale)",
        ),
        ("completions[0].response", "empty string (no visible character)"),
        ("completions", "expected a list of completions, got str"),
    ]


def test_trl_conversational_last_message_must_be_the_assistants(tmp_path):
    u, a = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}
    rows = [
        {"chosen": [u, a], "rejected": [u, {"role": "assistant", "content": "Bye"}]},  # fine
        {"chosen": [u, a, {"role": "user", "content": "More?"}], "rejected": [u, a]},  # chosen ends with the user
        {"chosen": [u, a], "rejected": [u]},  # rejected has no response at all
        {"prompt": "Hi", "chosen": [a], "rejected": [{"role": "user", "content": "Bye"}]},  # explicit prompt
        {"prompt": "Hi", "chosen": {"from": "human", "value": "x"}, "rejected": "y"},  # a single non-assistant message
    ]
    f = write_jsonl(tmp_path / "trl_roles.jsonl", rows)
    res = load_file(f, format="trl", skip_invalid=True)
    assert [(p.prompt, p.chosen, p.rejected) for p in res.pairs] == [("Hi", "Hello", "Bye")]
    got = []
    for k in range(1, len(rows)):
        e = raises_data_error(write_jsonl(tmp_path / f"trl_bad{k}.jsonl", [rows[k]]), format="trl")
        got.append((e.row, e.field, e.reason))
    assert got == [
        (1, "chosen", "the last message must be the assistant's (the response), got 'user'"),
        (1, "rejected", "the last message must be the assistant's (the response), got 'user'"),
        (1, "rejected", "the last message must be the assistant's (the response), got role 'user'"),
        (1, "chosen", "the response message must be the assistant's, got role 'human'"),
    ]


def test_hh_prompt_mismatch_is_kept_and_counted(tmp_path):
    rows = [
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: Hi\n\nAssistant: Go away."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: Hi!!\n\nAssistant: Go away."},
    ]
    res = load_file(write_jsonl(tmp_path / "hh.jsonl", rows), format="hh")
    assert len(res.pairs) == 2 and res.prompt_mismatch == 1
    assert res.pairs[1].prompt == [{"role": "user", "content": "Hi"}]  # the chosen transcript's prompt
    assert res.summary()["prompt_mismatch"] == 1
    assert load_file(write_jsonl(tmp_path / "hh_ok.jsonl", rows[:1]), format="hh").summary()["prompt_mismatch"] == 0


def test_load_named_hh_harmless_base_prompt_mismatch():
    """5 rows of harmless-base's test split have different prompts in chosen and rejected; 4 of them are
    invalid anyway (a turn glued on with "  Human:" leaves the chosen prompt ending in an assistant turn) and
    skipped, so one kept pair is counted as a prompt mismatch."""
    res = load_named("hh-harmless-base", skip_invalid=True)
    assert res.prompt_mismatch == 1 and res.summary()["prompt_mismatch"] == 1
    assert sum(k.startswith("the prompt ends with an assistant turn") for k in res.skipped.counts) == 1


def test_adapter_bugs_found_by_property_tests(tmp_path):
    """Each of these raised a non-DataError exception (or passed a bad value through) before the fix."""
    good = json.dumps(good_row(1))
    f = tmp_path / "parser.jsonl"
    f.write_text("\n".join([good, '{"prompt": ' + "9" * 5000 + "}", "[" * 3000, good]) + "\n", encoding="utf-8")
    res = load_file(f, skip_invalid=True)  # was ValueError (int digit limit) and RecursionError
    assert len(res.pairs) == 2 and res.skipped.total == 2
    assert {(e.split(": ", 1)[1]) for e in res.skipped.examples} == {
        "invalid JSON: Exceeds the limit (4300 digits) for integer string conversion",
        "invalid JSON: nested too deeply",
    }
    g = write_json(tmp_path / "deep.json", [[[[[]]]]])
    g.write_text("[" * 3000, encoding="utf-8")
    assert raises_data_error(g).reason == "invalid JSON: nested too deeply"

    def err(fmt, row):
        return raises_data_error(write_jsonl(tmp_path / f"{fmt}.jsonl", [row]), format=fmt)

    # an unhashable role: was TypeError
    e = err(
        "helpsteer3",
        {"context": [{"role": [], "content": "Q"}], "response1": "a", "response2": "b", "overall_preference": 1},
    )
    assert (e.field, e.reason) == ("context[0]", "unknown role []")
    # a float label: 1.0 == 1 passed the check, then indexed a list (TypeError); a bool is not a label
    base = {"prompt": "P", "response_0": "r0", "response_1": "r1"}
    res = load_file(write_jsonl(tmp_path / "pku.jsonl", [{**base, "safer_response_id": 1.0}]), format="pku_saferlhf")
    assert (res.pairs[0].chosen, res.pairs[0].rejected) == ("r1", "r0")
    assert err("pku_saferlhf", {**base, "safer_response_id": True}).reason == "expected 0 or 1, got True"
    # PandaLM: a bool vote counted as 1; a non-string input was pasted into the prompt
    pl = {
        "idx": 0,
        "instruction": "I",
        "input": "",
        "response1": "a",
        "response2": "b",
        "annotator1": 1,
        "annotator2": 1,
        "annotator3": 2,
    }
    assert err("pandalm", {**pl, "annotator2": True}).field == "annotator2"
    assert (err("pandalm", {**pl, "input": [1, 2]}).field, err("pandalm", {**pl, "input": 3}).reason) == (
        "input",
        "expected a string, got int",
    )
    assert err("pandalm", {**pl, "instruction": 5}).field == "instruction"
    # a lone surrogate (JSON "\udfff" escape) in a text or the id: passed, then crashed prompt_key / UTF-8 output
    assert (err("prompt_chosen_rejected", {**good_row(1), "chosen": "ok\udfffok"}).field) == "chosen"
    assert err("prompt_chosen_rejected", {**good_row(1), "id": "x\ud800"}).field == "id"
    e = err("trl", {"prompt": [{"role": "user", "content": "\ud83d"}], "chosen": "a", "rejected": "b"})
    assert e.field == "prompt[0].content" and e.reason.startswith("invalid Unicode (lone surrogate")


# ---------------------------------------------------------------------------------------------------------
# 3. named datasets


def _count_rows(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def test_load_named_ultrafeedback_dedupes():
    res = load_named("ultrafeedback", skip_invalid=True)
    keys = [p.prompt_key() for p in res.pairs]
    assert len(keys) == len(set(keys))
    assert res.duplicates_removed > 0 and res.skipped.total > 0
    written = sum(_count_rows(adapters.BUNDLED_DIR / rel) for rel in DATASETS["ultrafeedback"].files)
    assert len(res.pairs) + res.duplicates_removed + res.skipped.total == written
    assert {p.source for p in res.pairs} == {"ultrafeedback"}
    # strict mode stops at the first bad row, naming it
    with pytest.raises(DataError) as ei:
        load_named("ultrafeedback")
    assert ei.value.path.endswith("train_clean.jsonl.gz") and (ei.value.row, ei.value.field) == (34, "rejected")
    assert ei.value.reason == "empty string (no visible character)"


def test_load_named_hh_helpful_base():
    res = load_named("hh-helpful-base", skip_invalid=True)
    assert len(res.pairs) > 2000 and res.skipped.total > 0
    written = _count_rows(adapters.BUNDLED_DIR / DATASETS["hh-helpful-base"].files[0])
    assert len(res.pairs) + res.skipped.total == written
    assert all(isinstance(p.prompt, list) and p.prompt[-1]["role"] == "user" for p in res.pairs)


def test_load_named_errors_and_data_dir(tmp_path):
    with pytest.raises(DataError, match="unknown dataset name"):
        load_named("no-such-dataset")
    with pytest.raises(DataError, match="dataset file not found"):
        load_named("pku-saferlhf-safer-pairs", data_dir=tmp_path)
    d = tmp_path / "pku_saferlhf_safer_pairs_5k"
    d.mkdir()
    write_json(d / "pku_seferlhf_realign_dpo_5k.json", [{"prompt": "P", "response": ["safe", "unsafe"]}])
    res = load_named("pku-saferlhf-safer-pairs", data_dir=tmp_path)
    assert [(p.prompt, p.chosen, p.rejected, p.source) for p in res.pairs] == [
        ("P", "safe", "unsafe", "pku-saferlhf-safer-pairs")
    ]


# ---------------------------------------------------------------------------------------------------------
# 4. splits


def _grouped_pairs():
    """60 pairs over 20 prompts; prompt k has 1 + k % 5 pairs; copies of a prompt vary in case/whitespace."""
    pairs = []
    for k in range(20):
        for j in range(1 + k % 5):
            text = f"Prompt number {k}?" if j % 2 == 0 else f"  prompt  NUMBER {k}? "
            pairs.append(PreferencePair(text, f"chosen {k}.{j}", f"rejected {k}.{j}", "test"))
    return pairs


def _sig(split):
    return {name: [(p.prompt, p.chosen) for p in split[name]] for name in SPLITS}


def test_split_by_prompt_disjoint_and_complete():
    pairs = _grouped_pairs()
    assert len(pairs) == 60 and len(prompt_keys(pairs)) == 20
    s = split_by_prompt(pairs, seed=0)
    keys = {name: prompt_keys(s[name]) for name in SPLITS}
    assert not keys["teacher_train"] & keys["student_train"]
    assert not keys["teacher_train"] & keys["test"]
    assert not keys["student_train"] & keys["test"]
    assert sorted(p.chosen for name in SPLITS for p in s[name]) == sorted(p.chosen for p in pairs)
    # fractions respected to within one group (at most 5 pairs)
    for name, frac in zip(SPLITS, (0.4, 0.4, 0.2)):
        assert abs(len(s[name]) - frac * 60) <= 5, (name, len(s[name]))


def test_split_by_prompt_deterministic_and_order_independent():
    pairs = _grouped_pairs()
    a = split_by_prompt(pairs, seed=3)
    assert _sig(a) == _sig(split_by_prompt(list(pairs), seed=3))
    shuffled = list(pairs)
    random.Random(1).shuffle(shuffled)
    assert _sig(split_by_prompt(shuffled, seed=3)) == _sig(a)
    assert _sig(split_by_prompt(list(reversed(pairs)), seed=3)) == _sig(a)
    assert _sig(split_by_prompt(pairs, seed=4)) != _sig(a)


def test_split_fractions_exact_for_singletons():
    pairs = [PreferencePair(f"q{i}", "a", "b", "s") for i in range(200)]
    s = split_by_prompt(pairs, fractions=(0.4, 0.4, 0.2), seed=0)
    assert [len(s[n]) for n in SPLITS] == [80, 80, 40]
    s = split_by_prompt(pairs, fractions=(0.5, 0.25, 0.25), seed=9)
    assert [len(s[n]) for n in SPLITS] == [100, 50, 50]
    s = split_by_prompt(pairs, fractions=(0.0, 1.0, 0.0), seed=9)
    assert [len(s[n]) for n in SPLITS] == [0, 200, 0]


def test_split_bad_fractions():
    pairs = _grouped_pairs()
    for bad in [(0.5, 0.5, 0.5), (0.5, 0.5), (-0.1, 0.6, 0.5)]:
        with pytest.raises(ValueError, match="fractions"):
            split_by_prompt(pairs, fractions=bad)


def test_subsample_deterministic():
    pairs = [PreferencePair(f"q{i}", f"a{i}", "b", "s") for i in range(50)]
    a = subsample(pairs, 10, seed=0)
    assert len(a) == 10 and len({p.prompt for p in a}) == 10 and all(p in pairs for p in a)
    assert a == subsample(list(pairs), 10, seed=0)
    shuffled = list(pairs)
    random.Random(5).shuffle(shuffled)
    assert subsample(shuffled, 10, seed=0) == a
    assert subsample(pairs, 10, seed=1) != a
    assert subsample(pairs, 20, seed=0)[:10] == a  # a larger sample extends a smaller one
    assert subsample(pairs, None) == pairs and subsample(pairs, 50) == pairs and subsample(pairs, 99) == pairs


def test_remove_prompt_overlap():
    pairs = _grouped_pairs()
    s = split_by_prompt(pairs, seed=0)
    kept, removed = remove_prompt_overlap(pairs, prompt_keys(s["test"]))
    assert removed == len(s["test"]) and len(kept) == 60 - len(s["test"])
    assert not prompt_keys(kept) & prompt_keys(s["test"])


# ---------------------------------------------------------------------------------------------------------
# 5. render / encode with a tiny in-code tokenizer

WORDS = (
    "Human Assistant System : ? . , ! one two three four five six seven eight alpha beta gamma delta "
    "epsilon hi hello what is the sky blue green be kind"
).split()
SPECIALS = ["[UNK]", "[PAD]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_tokenizer(bos_eos: bool = True, chat_template: str | None = None):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(SPECIALS)
    if bos_eos:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    )
    if chat_template:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def masked(enc):
    return [i for i, m in zip(enc.input_ids, enc.response_mask) if m]


def test_render_plain_transcript(tok):
    prompt = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "what is the sky?"},
    ]
    p, full = render(prompt, " blue. ", tok)
    assert p == "System: Be kind.\n\nHuman: hi\n\nAssistant: hello\n\nHuman: what is the sky?\n\nAssistant:"
    assert full == p + " blue."
    assert render("hi", "hello", tok) == ("Human: hi\n\nAssistant:", "Human: hi\n\nAssistant: hello")
    assert not uses_chat_template(tok)


def test_encode_mask_exactly_on_response(tok):
    e = encode("one two three", "alpha beta gamma", tok, max_length=64)
    t = tok.convert_ids_to_tokens(e.input_ids)
    assert t == ["<s>", "Human", ":", "one", "two", "three", "Assistant", ":", "alpha", "beta", "gamma", "</s>"]
    assert e.response_mask == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert masked(e) == ids(tok, "alpha beta gamma") and not e.truncated
    assert tok.decode(masked(e)) == "alpha beta gamma"


def test_prompt_budget():
    # floor(min(max(32, B/4), B/2))
    assert [prompt_budget(b) for b in (10, 15, 64, 128, 192, 256, 1024)] == [5, 7, 32, 32, 48, 64, 256]


def test_truncation_keeps_head_recent_prompt_and_response_ends(tok):
    prompt, resp = "one two three four five six", "alpha beta gamma delta epsilon hello green blue"
    full = encode(prompt, resp, tok, max_length=100)
    assert len(full.input_ids) == 20 and not full.truncated  # <s> Human : 6 words Assistant : 8 words </s>
    assert encode(prompt, resp, tok, max_length=20) == full
    # B = 15: protected <s> Human : (head, 3 <= 15/4) and </s>, 11 left. Prompt budget 7, of which the head
    # uses 3: the 4 most recent prompt tokens; response 7 of 8: first 3 and last 4, the middle "delta" goes
    e = encode(prompt, resp, tok, max_length=15)
    assert tok.convert_ids_to_tokens(e.input_ids) == [
        "<s>",
        "Human",
        ":",
        "five",
        "six",
        "Assistant",
        ":",
        "alpha",
        "beta",
        "gamma",
        "epsilon",
        "hello",
        "green",
        "blue",
        "</s>",
    ]
    assert e.response_mask == [0] * 7 + [1] * 7 + [0]
    assert e.truncated and e.prompt_cut and e.response_cut
    # B = 10: the head (3 > 10/4) falls back to its special token <s>; prompt 5 - 1 = 4, response 4 (2 + 2)
    e = encode(prompt, resp, tok, max_length=10)
    assert tok.convert_ids_to_tokens(e.input_ids) == [
        "<s>",
        "five",
        "six",
        "Assistant",
        ":",
        "alpha",
        "beta",
        "green",
        "blue",
        "</s>",
    ]
    assert e.response_mask == [0] * 5 + [1, 1, 1, 1, 0]
    # a short response gives its unused budget back to the prompt
    e = encode(prompt, "alpha", tok, max_length=10)
    assert tok.convert_ids_to_tokens(e.input_ids) == [
        "<s>",
        "two",
        "three",
        "four",
        "five",
        "six",
        "Assistant",
        ":",
        "alpha",
        "</s>",
    ]
    assert e.prompt_cut and not e.response_cut
    # the smallest budgets: the response's last token and the markup after it survive
    e = encode(prompt, resp, tok, max_length=3)
    assert tok.convert_ids_to_tokens(e.input_ids) == ["<s>", "blue", "</s>"] and e.response_mask == [0, 1, 0]
    e = encode(prompt, resp, tok, max_length=2)  # protected <s> + </s> leave no room: <s> goes first
    assert tok.convert_ids_to_tokens(e.input_ids) == ["blue", "</s>"] and e.response_mask == [1, 0]


def test_response_cut_start_keeps_the_last_response_tokens(tok):
    prompt, resp = "one two three four five six", "alpha beta gamma delta epsilon hello green blue"
    # B = 15 as above: the same prompt tokens, but the response keeps its last 7 tokens ("alpha" goes)
    e = encode(prompt, resp, tok, max_length=15, response_cut="start")
    assert tok.convert_ids_to_tokens(e.input_ids) == [
        "<s>",
        "Human",
        ":",
        "five",
        "six",
        "Assistant",
        ":",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "hello",
        "green",
        "blue",
        "</s>",
    ]
    assert e.response_mask == [0] * 7 + [1] * 7 + [0] and e.response_cut
    assert encode(prompt, resp, tok, max_length=100, response_cut="start") == encode(prompt, resp, tok, max_length=100)
    with pytest.raises(ValueError, match="response_cut"):
        encode(prompt, resp, tok, max_length=15, response_cut="end")


def _check_invariants(t, prompt, resp, head_n, tail_n, lengths):
    """For every budget: length, exact mask, protected head/tail, most recent prompt tokens, response ends."""
    full = encode(prompt, resp, t, max_length=10_000)
    n = len(full.input_ids)
    m_full = full.response_mask
    first = m_full.index(1)
    body_ids = [i for i, m in zip(full.input_ids, m_full) if m][: len(ids(t, resp))]
    tail_ids = full.input_ids[len(full.input_ids) - tail_n :] if tail_n else []
    for L in lengths:
        e = encode(prompt, resp, t, max_length=L)
        assert len(e.input_ids) == min(L, n) == len(e.response_mask), L
        assert e.truncated == (L < n)
        out = e.input_ids
        if tail_n:
            assert out[len(out) - tail_n :] == tail_ids, L  # end-of-turn markup / EOS never cut
        assert out[:head_n] == full.input_ids[:head_n], L  # leading markup never cut
        resp_out = out[out.index(body_ids[-1]) - 0 :] if body_ids[-1] in out else None
        assert resp_out is not None, L  # the response's last token is there
        mpos = [i for i, m in enumerate(e.response_mask) if m]
        assert mpos == list(range(mpos[0], mpos[0] + len(mpos))), L  # one contiguous block
        kept_body = [out[i] for i in mpos][
            : len(mpos) - (tail_n if tail_n and e.response_mask[-1] else sum(e.response_mask[len(out) - tail_n :]))
        ]
        k = len(kept_body)
        assert kept_body == body_ids[: k // 2] + body_ids[len(body_ids) - (k - k // 2) :], L  # middle cut
        assert e.response_cut == (k < len(body_ids)), L
        prompt_out = out[head_n : mpos[0]]
        full_prompt = full.input_ids[head_n:first]
        assert prompt_out == (full_prompt[len(full_prompt) - len(prompt_out) :] if prompt_out else []), L  # most recent
        assert e.prompt_cut == (len(prompt_out) < len(full_prompt)), L
        if e.response_cut:
            assert len(prompt_out) == min(
                len(full_prompt), max(0, prompt_budget(L) - head_n), L - head_n - tail_n - 1
            ), L


def test_truncation_invariants_plain_transcript(tok):
    prompt = [
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "four five"},
        {"role": "user", "content": "six seven eight"},
    ]
    resp = "alpha beta gamma delta epsilon hello"
    # head <s> Human : is protected once it fits in B/4 (B >= 12); tail </s>
    _check_invariants(tok, prompt, resp, head_n=3, tail_n=1, lengths=range(12, 30))
    _check_invariants(tok, prompt, resp, head_n=1, tail_n=1, lengths=range(3, 12))


def test_truncation_invariants_chat_template():
    t = make_tokenizer(chat_template=TEMPLATE)
    prompt = [
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "four five"},
        {"role": "user", "content": "six seven eight"},
    ]
    resp = "alpha beta gamma delta epsilon hello"
    # head <|user|> (1 token); tail: the template's <|end|> after the response, in the mask
    _check_invariants(t, prompt, resp, head_n=1, tail_n=1, lengths=range(4, 30))
    e = encode(prompt, resp, t, max_length=8)  # prompt budget 4 - 1 (head), response 3 (first 1, last 2)
    assert t.convert_ids_to_tokens(e.input_ids) == [
        "<|user|>",
        "eight",
        "<|end|>",
        "<|assistant|>",
        "alpha",
        "epsilon",
        "hello",
        "<|end|>",
    ]
    assert e.response_mask == [0, 0, 0, 0, 1, 1, 1, 1]


def test_keep_text_is_never_cut(tok):
    prompt = "Principle: be kind one two three four five six seven eight"
    e = encode(prompt, "alpha beta", tok, max_length=12, keep_text="Principle: be kind")
    # protected: <s> Human : (3 = 12/4), the keep text (Principle : be kind, 4 tokens... unknown word -> [UNK])
    toks = tok.convert_ids_to_tokens(e.input_ids)
    assert len(toks) == 12 and toks[-3:] == ["alpha", "beta", "</s>"] and e.prompt_cut and not e.response_cut
    kept = encode(prompt, "alpha beta", tok, max_length=10_000).input_ids
    kt = tok("Principle: be kind", add_special_tokens=False)["input_ids"]
    assert e.input_ids[3 : 3 + len(kt)] == kt == kept[3 : 3 + len(kt)]
    # without keep_text the same budget drops the principle (oldest tokens)
    e2 = encode(prompt, "alpha beta", tok, max_length=12)
    assert e2.input_ids[3 : 3 + len(kt)] != kt


BOS_TEMPLATE = "{{ bos_token }}" + TEMPLATE


def test_exactly_one_bos_with_a_bos_writing_template():
    t = make_tokenizer(chat_template=BOS_TEMPLATE)  # its post-processor adds <s> ... </s> as well
    assert t("one", add_special_tokens=True)["input_ids"][0] == t.bos_token_id  # the trap is armed
    e = encode("what is the sky ?", "blue", t, max_length=64)
    toks = t.convert_ids_to_tokens(e.input_ids)
    assert toks == ["<s>", "<|user|>", "what", "is", "the", "sky", "?", "<|end|>", "<|assistant|>", "blue", "<|end|>"]
    assert toks.count("<s>") == 1 and "</s>" not in toks
    assert e.response_mask == [0] * 9 + [1, 1]
    assert e.input_ids == t.apply_chat_template(
        [{"role": "user", "content": "what is the sky ?"}, {"role": "assistant", "content": "blue"}],
        tokenize=True,
        return_dict=False,
    )
    # truncation keeps the template's BOS and role header
    e = encode("one two three four five six", "blue", t, max_length=7)
    assert t.convert_ids_to_tokens(e.input_ids) == [
        "<s>",
        "<|user|>",
        "six",
        "<|end|>",
        "<|assistant|>",
        "blue",
        "<|end|>",
    ]
    assert e.response_mask == [0, 0, 0, 0, 0, 1, 1]
    # a tokenizer without a template keeps its own BOS (and EOS)
    plain = make_tokenizer()
    e = encode("what is the sky ?", "blue", plain, max_length=64)
    toks = plain.convert_ids_to_tokens(e.input_ids)
    assert toks[0] == "<s>" and toks.count("<s>") == 1 and toks[-1] == "</s>"


def test_encode_without_special_tokens():
    t = make_tokenizer(bos_eos=False)
    # head Human : protected once 2 <= B/4; below that nothing is protected and the response end survives
    e = encode("one two three", "alpha beta", t, max_length=3)
    assert t.convert_ids_to_tokens(e.input_ids) == [":", "alpha", "beta"]
    assert e.response_mask == [0, 1, 1] and e.truncated and e.prompt_cut and not e.response_cut
    e = encode("one two three", "alpha beta gamma", t, max_length=2)
    assert t.convert_ids_to_tokens(e.input_ids) == [":", "gamma"] and e.response_mask == [0, 1]
    assert e.response_cut


def test_chat_template_rendering_and_mask():
    t = make_tokenizer(chat_template=TEMPLATE)
    assert uses_chat_template(t)
    prompt = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "what is the sky ?"}]
    p, full = render(prompt, "blue", t)
    assert p == "<|system|> be kind <|end|> <|user|> what is the sky ? <|end|> <|assistant|> "
    assert full == p + "blue <|end|> "
    e = encode(prompt, "blue", t, max_length=64)
    # exactly the template's tokens: the tokenizer's own <s> ... </s> are not added on top
    assert t.convert_ids_to_tokens(e.input_ids) == [
        "<|system|>",
        "be",
        "kind",
        "<|end|>",
        "<|user|>",
        "what",
        "is",
        "the",
        "sky",
        "?",
        "<|end|>",
        "<|assistant|>",
        "blue",
        "<|end|>",
    ]
    # the response and the template's end-of-turn markup after it; never the prompt
    assert e.response_mask == [0] * 12 + [1, 1]
    assert masked(e) == ids(t, "blue") + [t.convert_tokens_to_ids("<|end|>")]
    # a plain-text prompt renders as one user turn; truncation keeps the role header, the assistant header
    # next to the response and the end-of-turn markup
    e = encode("one two three four", "alpha beta", t, max_length=6)
    assert t.convert_ids_to_tokens(e.input_ids) == ["<|user|>", "<|end|>", "<|assistant|>", "alpha", "beta", "<|end|>"]
    assert e.response_mask == [0, 0, 0, 1, 1, 1] and e.truncated and e.prompt_cut and not e.response_cut


def _prompt_part(e):
    return e.input_ids[: e.prompt_tokens]


@pytest.mark.parametrize("templated", [False, True])
def test_a_pair_keeps_the_same_prompt_on_both_sides(templated):
    """Render version 3: the side with the shorter response no longer sees more of the prompt."""
    t = make_tokenizer(chat_template=TEMPLATE if templated else None)
    prompt = [
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "four five"},
        {"role": "user", "content": "six seven eight"},
    ]
    short, long = "alpha", "alpha beta gamma delta epsilon hello green"
    pair = PreferencePair(prompt, short, long, "s")
    for b in range(6, 40):
        alone = [encode(prompt, r, t, max_length=b) for r in (short, long)]
        (ep,), _ = encode_pairs([pair], t, max_length=b)
        ec, er = ep.chosen, ep.rejected
        ec_ids, er_ids = ec.input_ids, er.input_ids
        assert len(ec_ids) <= b and len(er_ids) <= b
        # the same prompt tokens, the fewer of the two layouts alone; the responses as each had alone
        assert _prompt_part(ec) == _prompt_part(er), b
        assert ec.prompt_tokens == min(a.prompt_tokens for a in alone), b
        assert masked(ec) == masked(alone[0]) and masked(er) == masked(alone[1]), b
        # the response's end and the markup after it stay; the mask stays aligned with the tokens
        for e, a in ((ec, alone[0]), (er, alone[1])):
            n_tail = len(a.input_ids) - 1 - max(i for i, m in enumerate(a.response_mask) if m)
            assert e.input_ids[len(e.input_ids) - n_tail :] == a.input_ids[len(a.input_ids) - n_tail :]
            assert e.response_mask == [0] * e.prompt_tokens + a.response_mask[a.prompt_tokens :]
        # the side cut to match is marked truncated, with its prompt cut
        for e, a in ((ec, alone[0]), (er, alone[1])):
            if e.prompt_tokens < a.prompt_tokens:
                assert e.truncated and e.prompt_cut
            else:
                assert e == a
    # at 12 tokens the long response fills the budget and the short one would have kept the whole prompt
    (ep,), _ = encode_pairs([pair], t, max_length=12)
    assert encode(prompt, short, t, max_length=12).prompt_tokens > ep.chosen.prompt_tokens


def test_encode_pairs_and_errors(tok):
    pairs = [
        PreferencePair("one two", "alpha", "beta gamma", "s", id="p1"),
        PreferencePair("three four five six", "delta epsilon", "hello", "s"),
    ]
    out, n_trunc = encode_pairs(pairs, tok, max_length=10)
    # pair 1: <s> Human : one two Assistant : alpha </s> (9) and ... beta gamma </s> (10): fits
    # pair 2: <s> Human : three four five six Assistant : delta epsilon </s> (12): truncated
    # pair 2 alone (B = 10: the head falls back to <s>), "hello" would keep 7 prompt tokens (<s> Human : three ...
    # Assistant :) and "delta epsilon" 6: both keep <s> and the 6 most recent, so "hello" has 9 tokens, not 10
    assert n_trunc == 1 and not out[0].truncated and out[1].truncated
    assert out[0].n_tokens == 19 and out[1].n_tokens == 19
    assert tok.convert_ids_to_tokens(out[1].rejected.input_ids) == (
        ["<s>", "three", "four", "five", "six", "Assistant", ":", "hello", "</s>"]
    )
    assert masked(out[0].chosen) == ids(tok, "alpha") and masked(out[0].rejected) == ids(tok, "beta gamma")
    assert masked(out[1].chosen) == ids(tok, "delta epsilon") and masked(out[1].rejected) == ids(tok, "hello")
    assert cut_counts(out) == {
        "pairs": 2,
        "truncated": 1,
        "prompt_cut": 1,
        "response_cut": 0,
        "response_cut_share": 0.0,
        "render_version": 3,
    }
    # at 4 tokens (<s>, 1 prompt token, 1 response token, </s>) both two-token responses lose their first token
    out4, _ = encode_pairs(pairs, tok, max_length=4)
    assert [(e.chosen.response_cut, e.rejected.response_cut) for e in out4] == [(False, True), (True, False)]
    assert masked(out4[0].rejected) == ids(tok, "gamma") and masked(out4[1].chosen) == ids(tok, "epsilon")
    assert cut_counts(out4)["response_cut_share"] == 1.0 and cut_counts([])["response_cut_share"] == 0.0
    with pytest.raises(DataError, match=r"^where: the tokenizer must be a fast"):
        encode("hi", "hello", type("Slow", (), {"is_fast": False})(), max_length=8, where="where")
    with pytest.raises(DataError, match=r"field 'response': the response produced no token"):
        encode("hi", "   ", tok, max_length=8)


def test_a_chat_template_that_raises_on_a_pair_stops_naming_the_template_and_the_pair():
    """Never the plain transcript in its place (the run would record the template as used)."""
    from conftest import make_tokenizer

    template = (
        "{% for m in messages %}{% if 'forbidden' in m['content'] %}{{ raise_exception('no forbidden words') }}"
        "{% endif %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eos|>{% endfor %}"
        "{% if add_generation_prompt %}<|bos|>assistant: {% endif %}"
    )
    tok = make_tokenizer(chat_template=template)
    tok.name_or_path = "tiny-templated"
    pairs = [
        PreferencePair(prompt="fine", chosen="yes", rejected="no", source="src.jsonl", id=1),
        PreferencePair(prompt="a forbidden word", chosen="yes", rejected="no", source="src.jsonl", id=2),
    ]
    assert len(encode_pairs(pairs[:1], tok, 64)[0]) == 1
    with pytest.raises(DataError) as e:
        encode_pairs(pairs, tok, 64)
    assert str(e.value) == (
        "src.jsonl pair 2: the chat template of tiny-templated raises TemplateError: no forbidden words; fix its "
        "`chat_template` (tokenizer_config.json or chat_template.jinja), or remove it to render plain transcripts"
    )

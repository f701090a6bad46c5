"""Inputs that used to give a traceback, a wrong reason or a silent wrong answer: each now gives one message naming
file, row and field with exit 2, or works (RewardBench row ids and the Ties subset, `plan --power` on a damaged
pilot, `select-method --values`, YAML's number spellings, bounded method weights)."""

import json
import math

import pytest
from conftest import cli_error

from w2s_shift.config import ConfigError
from w2s_shift.config_io import load_config, parse_value
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import DataError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bo4(rid, subset="Math"):
    return {"id": rid, "subset": subset, "prompt": f"question {rid}", "chosen": ["c"], "rejected": ["x", "y", "z"]}


def _ties(rid, n_chosen=2, subset="Ties"):
    return {"id": rid, "subset": subset, "prompt": "p", "chosen": ["a", "b"][:n_chosen], "rejected": ["r"]}


def test_rewardbench_duplicate_row_ids_are_named_at_load(tmp_path):
    f = _write(tmp_path / "rb.jsonl", [_bo4("a"), _bo4("b"), _bo4("a")])
    with pytest.raises(DataError) as e:
        load_file(f, "rewardbench2")
    assert (e.value.path, e.value.row, e.value.field) == (str(f), 3, "id")
    assert "'a' is also the id of row 1" in e.value.reason
    # RewardBench 1 rows with ids too; with skip_invalid the later row is skipped and counted
    rb1 = [{"id": 7, "prompt": "p", "chosen": "a", "rejected": "b", "subset": "chat"}] * 2
    g = _write(tmp_path / "rb1.jsonl", rb1)
    with pytest.raises(DataError, match="'7' is also the id of row 1"):
        load_file(g, "rewardbench")
    res = load_file(f, "rewardbench2", skip_invalid=True)
    assert [p.group.row for p in res.pairs] == ["a"] * 3 + ["b"] * 3 and res.skipped.total == 1


def test_rewardbench_duplicate_ids_stop_score_before_anything_is_written(tmp_path, tokenizer, capsys):
    from test_export import make_exported_student

    folder, _, _ = make_exported_student(tokenizer, tmp_path / "rm")
    f = _write(tmp_path / "rb.jsonl", [_bo4("a"), _bo4("a")])
    out = tmp_path / "o.jsonl"
    err = cli_error(capsys, ["score", str(folder), str(f), "--format", "rewardbench2", "--out", str(out)])
    assert "rb.jsonl, row 2, field 'id': 'a' is also the id of row 1" in err
    assert not out.exists() and not (tmp_path / "o.rewardbench.json").exists()


def test_ties_in_any_case_is_one_subset(tmp_path):
    f = _write(tmp_path / "rb.jsonl", [_ties("tied:1", subset="ties"), _ties("ref:1", 1, subset="TIES"), _bo4("m")])
    pairs = load_file(f, "rewardbench2").pairs
    assert sorted({p.group.subset for p in pairs}) == ["Math", "Ties"]


def test_a_huge_ties_number_is_refused_naming_the_row(tmp_path):
    f = _write(tmp_path / "rb.jsonl", [_ties("ref:" + "9" * 5000, 1)])
    with pytest.raises(DataError) as e:
        load_file(f, "rewardbench2")
    assert (e.value.row, e.value.field) == (1, "id")
    assert "at most 18 digits" in e.value.reason and "(5,004 characters)" in e.value.reason
    assert len(str(e.value)) < 400
    ok = _write(tmp_path / "ok.jsonl", [_ties("ref:" + "9" * 18, 1)])
    assert len(load_file(ok, "rewardbench2").pairs) == 1


def _pilot(tmp_path, text: str):
    (tmp_path / "metrics.json").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"metrics_format": 99, "cells": [{"source": "a", "seed": 0}]}', "metrics_format 99 was written by a newer"),
        ('{"cells": [', "metrics.json: not JSON"),
        ('{"cells": "none"}', "metrics.json"),
    ],
)
def test_plan_power_reads_the_pilot_through_open_run(tmp_path, capsys, text, message):
    err = cli_error(capsys, ["plan", "--power", _pilot(tmp_path, text)])
    assert message in err


@pytest.mark.parametrize("margin", ["0", "-1", "nan", "inf", "101"])
def test_plan_power_refuses_a_margin_that_is_not_a_positive_number(tmp_path, capsys, margin):
    err = cli_error(capsys, ["plan", "--power", str(tmp_path), "--margin", margin])
    assert f"--margin must be a number of percentage points above 0 and at most 100, got {float(margin)}" in err


@pytest.mark.parametrize("values", [["[0.2,0.4]"], ["0.1", "{a: 1}"], ["~"]])
def test_select_method_values_one_per_argument(capsys, values):
    argv = ["select-method", "quickstart", "--method", "l2sp", "--field", "l2sp_lambda", "--values", *values]
    err = cli_error(capsys, argv)
    assert "give one value per argument (e.g. --values 0.2 0.4)" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-2", 0.01), ("5E3", 5000.0), ("+1e3", 1000.0), (".5e3", 500.0), ("-2.5e-1", -0.25), ("1.0e-2", 0.01)],
)
def test_yaml_number_spellings_are_numbers(text, value):
    assert parse_value(text) == value and isinstance(parse_value(text), float)


@pytest.mark.parametrize("text", ["1e", "e5", "1e-2x", "abc", "0x1F"])
def test_other_words_stay_what_yaml_reads(text):
    assert parse_value(text) == {"0x1F": 31}.get(text, text)


def test_every_numeric_field_takes_1e_minus_2_the_same_way(tmp_path):
    """l2sp_lambda (a float with its own check), learning_rate and a method's grm_lambda all read 1e-2, in a YAML
    file and through --set; each weight is bounded."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "methods:\n  - {name: l2sp, l2sp_lambda: 1e-2}\n  - {name: grm, grm_lambda: 1e-2}\n"
        "student: {name: smollm2-135m, learning_rate: 1e-2}\n"
    )
    cfg = load_config(str(cfg_file))
    got = {m.name: getattr(m, f"{m.name}_lambda") for m in cfg.methods}
    assert got == {"l2sp": 0.01, "grm": 0.01} and cfg.student.learning_rate == 0.01
    cfg = load_config(None, ["methods=[{name: l2sp, l2sp_lambda: 2e-3}]", "student.learning_rate=3e-5"])
    assert cfg.methods[0].l2sp_lambda == 0.002 and cfg.student.learning_rate == 3e-5
    for bad in ("1e300", "1e400"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"methods=[{{name: l2sp, l2sp_lambda: {bad}}}]"])
        assert "methods.0.l2sp_lambda" in str(e.value)
    assert math.isinf(parse_value("1e400"))

"""Paths and names taken verbatim: command-line paths never go through YAML, and every name that becomes a file
name maps to one file or is refused when the config is read (slugs, names equal up to case, best-of-n sets against
datasets). No model is loaded or trained here."""

import json

import pytest
from conftest import cli_error

from w2s_shift.cli import main
from w2s_shift.config import BonConfig, ConfigError, RunConfig
from w2s_shift.config_io import load_config


@pytest.mark.parametrize("name", ["victim #v2", "two\nlines", "yes", "null", "~", "trailing  ", "a: b", "[x]"])
def test_output_dir_is_taken_as_it_is(tmp_path, monkeypatch, name):
    import w2s_shift.pipeline as pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "run", lambda cfg, *args, **kw: seen.setdefault("cfg", cfg))
    monkeypatch.chdir(tmp_path)  # a relative path, as typed: the whole string is the value YAML would read
    out = name
    assert main(["run", "--output-dir", out, "--set", "student.epochs=2"]) == 0
    assert seen["cfg"].output_dir == out and seen["cfg"].student.epochs == 2


def test_output_dir_after_set_wins_and_is_not_yaml():
    cfg = load_config(None, ["output_dir=runs/a"], values={"output_dir": "runs/b #c"})
    assert cfg.output_dir == "runs/b #c"
    # the same path through --set is YAML: what users saw before, ' #' starting a comment
    assert load_config(None, ["output_dir=runs/b #c"]).output_dir == "runs/b"


def _capture_bon(monkeypatch) -> dict:
    import w2s_shift.pipeline.bon as bon

    seen = {}

    def fake(run_dir, settings, **kwargs):  # kwargs: the lock wait of the real bon_run
        seen["settings"] = settings
        return {"sources": {}}

    monkeypatch.setattr(bon, "bon_run", fake)
    return seen


@pytest.mark.parametrize("gold", ["goldexp #2", "yes", "null", "gold\nexp", "gold  "])
def test_bon_gold_is_taken_as_it_is(monkeypatch, tmp_path, gold):
    seen = _capture_bon(monkeypatch)
    assert main(["bon", str(tmp_path), "--gold", gold]) == 0
    assert seen["settings"] == {"gold": gold}


def test_bon_set_gives_only_its_fields(monkeypatch, tmp_path):
    """`bon --set seed=5` changes the seed and leaves every other field of the run's bon section (n_prompts
    included) as the run configured it: the settings hold the given fields only, not the defaults."""
    seen = _capture_bon(monkeypatch)
    assert main(["bon", str(tmp_path), "--set", "seed=5", "--set", "bon.top_p=0.5"]) == 0
    assert seen["settings"] == {"seed": 5, "top_p": 0.5}


@pytest.mark.parametrize("gold", ["", "  "])
def test_bon_empty_gold_is_refused(capsys, tmp_path, gold):
    err = cli_error(capsys, ["bon", str(tmp_path), "--gold", gold])
    assert "--gold is empty" in err


@pytest.mark.parametrize(
    ("responses", "why"),
    [
        ({"a b": "f.jsonl"}, "prompt set name 'a b'"),
        ({"a/b": "f.jsonl"}, "prompt set name 'a/b'"),
        ({"..": "f.jsonl"}, "prompt set name '..'"),
        ({"HH20": "f.jsonl", "hh20": "g.jsonl"}, "'HH20' and 'hh20' are equal up to case"),
        ({"x": ""}, "responses file is empty"),
    ],
)
def test_bon_set_names_map_to_one_file_each(responses, why):
    with pytest.raises(ValueError) as e:
        BonConfig(responses=responses)
    assert why in str(e.value)


def test_bon_ns_empty_is_refused():
    with pytest.raises(ValueError) as e:
        BonConfig(ns=[])
    assert "ns" in str(e.value) and "at least 1 item" in str(e.value)


def _pairs(path, n=3):
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "chosen": "a", "rejected": "b"}) + "\n" for i in range(n)))
    return str(path)


def test_datasets_equal_up_to_case_are_refused(tmp_path):
    (tmp_path / "x").mkdir()
    a, b = _pairs(tmp_path / "HH20.jsonl"), _pairs(tmp_path / "x" / "hh20.jsonl")
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"data.ood=[{a}, {b}]"])
    assert "'HH20'" in str(e.value) and "'hh20'" in str(e.value) and "up to case" in str(e.value)
    # labels of one dataset that differ only in case: two file names for one dataset, one file on macOS
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.ood=[{name: hh-helpful-base, label: A}, {name: hh-helpful-base, label: a}]"])
    assert "also up to case" in str(e.value)


def test_dataset_names_of_best_of_n_sets_are_refused(tmp_path):
    f = _pairs(tmp_path / "bon-x.jsonl")
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"data.ood=[{f}]"])
    assert "dataset name 'bon-x'" in str(e.value) and "prefix of best-of-n candidate sets" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.ood=[{name: hh-helpful-base, label: BON-y}]"])
    assert "dataset name 'BON-y'" in str(e.value)


def test_method_labels_equal_up_to_case_are_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["methods=[naive, {name: naive, label: Naive}]"])
    assert "also up to case" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["methods=[{name: naive, label: Teacher}]"])
    assert "'teacher' is reserved" in str(e.value)


def test_a_best_of_n_set_against_an_older_side_target_is_refused():
    """A run whose side target was named bon-x before such names were refused: a best-of-n set x would write that
    target's rewards files."""
    from w2s_shift.pipeline.bon import refuse_set_name_clashes

    cfg = RunConfig()
    metrics = {"evaluated_targets": [{"name": "bon-x", "role": "side"}]}
    with pytest.raises(ValueError) as e:
        refuse_set_name_clashes(cfg, metrics, BonConfig(responses={"X": "f.jsonl"}))
    assert "best-of-n set 'X'" in str(e.value) and "dataset 'bon-x'" in str(e.value)
    refuse_set_name_clashes(cfg, metrics, BonConfig(responses={"y": "f.jsonl"}))  # no clash: no error

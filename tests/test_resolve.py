"""data.resolve: one rule from a dataset string to its data, the same for `data inspect`, `score` and `evaluate`."""

import json

import pytest

from w2s_shift.config import DatasetRef
from w2s_shift.data import resolve
from w2s_shift.data.resolve import dataset_files, dataset_ref_for, resolve_dataset, with_skip_hint
from w2s_shift.data.schema import DataError

ROWS = [
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5", "subset": "math"},
    {"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Rome", "subset": "geo"},
]


@pytest.fixture
def pair_file(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return p


def test_the_rule(tmp_path, pair_file, monkeypatch):
    assert dataset_ref_for("hf:org/set") == DatasetRef(hf="org/set")
    assert dataset_ref_for("hf:org/set", "hh") == DatasetRef(hf="org/set", format="hh")
    assert dataset_ref_for("pandalm") == DatasetRef(name="pandalm")
    assert dataset_ref_for(str(pair_file), "trl") == DatasetRef(path=str(pair_file), format="trl")
    # an existing file without a suffix is a file (the old `evaluate` rule took it for a dataset name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").write_bytes(pair_file.read_bytes())
    assert dataset_ref_for("plain") == DatasetRef(path="plain")
    # a name wins over a file of the same name in the working directory
    (tmp_path / "pandalm").write_text("x")
    assert dataset_ref_for("pandalm") == DatasetRef(name="pandalm")


@pytest.mark.parametrize(
    "spec, fmt, message",
    [
        ("pandalm", "trl", "pandalm: --format applies to a file; the named dataset has its own format (pandalm)"),
        ("{tmp}/nope.jsonl", None, "{tmp}/nope.jsonl: file not found (neither a dataset name (see `w2s-shift"),
        ("{tmp}", None, "{tmp}: is a directory, expected a data file"),
        ("no-such-name", None, "no-such-name: neither a dataset name (see `w2s-shift data list`) nor an existing file"),
        # an empty string (e.g. `evaluate RUN ""`) is Path("") = the working directory: named as empty, not a directory
        ("", None, "'': empty dataset string; give a dataset name, a file or hf:<hub id>"),
    ],
)
def test_rule_errors(tmp_path, spec, fmt, message):
    with pytest.raises(DataError) as e:
        dataset_ref_for(spec.format(tmp=tmp_path), fmt)
    assert str(e.value).startswith(message.format(tmp=tmp_path))


def test_resolve_a_file_and_a_ref_alike(pair_file):
    res = resolve_dataset(str(pair_file))
    assert res.name == "pairs" and [p.chosen for p in res.pairs] == ["4", "Paris"]
    assert {p.source for p in res.pairs} == {"pairs"}
    labelled = resolve_dataset(DatasetRef(path=str(pair_file), label="mine"))
    assert labelled.name == "mine" and [p.rejected for p in labelled.pairs] == ["5", "Rome"]
    with pytest.raises(ValueError, match="a DatasetRef carries its own"):
        resolve_dataset(DatasetRef(path=str(pair_file)), format="trl")


def test_resolve_a_named_dataset():
    res = resolve_dataset("llamafactory-dpo-en-demo")
    assert res.name == "llamafactory-dpo-en-demo" and len(res.pairs) > 0
    assert dataset_files(DatasetRef(name="llamafactory-dpo-en-demo"))[0].name == "dpo_en_demo.json"
    assert dataset_files(DatasetRef(hf="org/set")) == []


def test_skip_hint():
    row = DataError("f.jsonl", 3, "chosen", "missing value")
    assert str(with_skip_hint(row)) == (
        "f.jsonl, row 3, field 'chosen': missing value (--skip-invalid skips and counts such rows)"
    )
    whole = DataError("f.jsonl", None, None, "empty file")
    assert with_skip_hint(whole) is whole


def test_row_subsets_and_single_responses(tmp_path, pair_file):
    pairs = resolve_dataset(str(pair_file)).pairs
    assert resolve.row_subsets(str(pair_file), None, pairs) == ["math", "geo"]
    assert resolve.row_subsets(str(pair_file), "trl", pairs) == ["pairs", "pairs"]  # another format: the source
    single = tmp_path / "single.jsonl"
    single.write_text(
        json.dumps({"prompt": [{"role": "user", "content": "hi"}], "response": "hello", "id": 7}) + "\n",
        encoding="utf-8",
    )
    assert resolve.load_single_responses(str(single)) == [([{"role": "user", "content": "hi"}], "hello", "7")]


def test_data_inspect_names_a_missing_file_as_evaluate_does(tmp_path, capsys):
    """`data inspect` (and `score`, tests/test_score.py) said "neither a dataset name" for a missing file."""
    from w2s_shift.cli import main

    missing = tmp_path / "nope.jsonl"
    assert main(["data", "inspect", str(missing)]) == 2
    assert f"w2s-shift: error: {missing}: file not found" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["hf:org/set-v1.5", "hf:org/data.v2", "hf:Org/Set"])
def test_a_config_entry_names_a_hub_id_as_the_command_line_does(spec):
    """data.sources / data.ood entries follow dataset_ref_for's first rule: 'hf:' wins over the suffix test (a hub
    id with a '.' was taken for a file path 'hf:org/data.v2' and failed as a missing file)."""
    from w2s_shift.config import DataConfig, dataset_ref

    assert dataset_ref(spec) == dataset_ref_for(spec) == DatasetRef(hf=spec[3:])
    assert DataConfig(sources=["pandalm"], ood=[spec]).ood == [DatasetRef(hf=spec[3:])]

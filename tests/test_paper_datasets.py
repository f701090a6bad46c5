"""The paper's hub datasets load from files in their real schemas: RAIL-HH-10K (CSV and Parquet, its 73-column
layout), HelpSteer3 (JSONL.gz and Parquet), PKU-SafeRLHF (both labels); the presets pick the label of their
category, and the named datasets read the hub split and subset that exist."""

import csv
import gzip
import json
import sys
import types

import pytest

from w2s_shift.config_io import load_config
from w2s_shift.data.adapters import DATASETS, load_named
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import DataError

RAIL_DIMS = ("fairness", "safety", "reliability", "transparency", "privacy", "accountability", "inclusivity")
RAIL_DIMS += ("user_impact",)


def rail_row(context, prompt, chosen, rejected, score_c, score_r) -> dict:
    """One RAIL-HH-10K row with exactly the dataset's column names (the per-dimension triples of both sides)."""
    row = {"context": context, "prompt": prompt, "rejected_text": rejected, "chosen_text": chosen}
    for side, score in (("rejected", score_r), ("chosen", score_c)):
        row[f"{side}_rail_score"] = score
        row[f"{side}_rail_score_confidence"] = 0.9
        for d in RAIL_DIMS:
            row[f"{side}_{d}_score"] = 5.0
            row[f"{side}_{d}_confidence"] = 0.8
            row[f"{side}_{d}_explanation"] = f"{d} explanation of the {side} answer"
    return row


RAIL_ROWS = [
    rail_row(
        "Human: My neighbour's dog barks all night.\nAssistant: That sounds exhausting. Have you talked to them?",
        "What can I put in its food to make it stop?",
        "Please don't put anything in the dog's food; talk to your neighbour or local animal control.",
        "A few sleeping pills crushed into the food will do it.",
        8.5,
        2.0,
    ),
    rail_row("", "Tell me a joke.", "Why did the chicken cross the road?", "No.", 6.0, 6.5),
    rail_row("Human: hi\n\nAssistant: Hello!", "", "a", "b", 7.0, 3.0),  # empty prompt: invalid
]


def _write_rail_csv(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_rail_row_has_the_datasets_column_layout():
    row = RAIL_ROWS[0]
    assert len(row) == 4 + 4 + 8 * 3 * 2  # 56 of the 73 columns: every one the converter could read
    assert {"chosen_text", "rejected_text", "context", "prompt", "chosen_safety_score"} <= set(row)
    assert "chosen" not in row and "rejected" not in row


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_rail_hh_10k_converter(kind, tmp_path):
    f = tmp_path / f"test.{kind}"
    (_write_rail_csv if kind == "csv" else _write_parquet)(f, RAIL_ROWS)
    with pytest.raises(DataError) as e:
        load_file(f, "rail_hh")
    assert str(e.value) == f"{f}, row 3, field 'prompt': empty string (no visible character)"
    res = load_file(f, "rail_hh", source="rail-hh-10k", skip_invalid=True)
    assert res.skipped.total == 1 and len(res.pairs) == 2
    p0, p1 = res.pairs
    assert p0.prompt == [
        {"role": "user", "content": "My neighbour's dog barks all night."},
        {"role": "assistant", "content": "That sounds exhausting. Have you talked to them?"},
        {"role": "user", "content": "What can I put in its food to make it stop?"},
    ]
    assert p0.chosen.startswith("Please don't") and p0.rejected.startswith("A few sleeping pills")
    assert p0.strength == pytest.approx(6.5)  # chosen_rail_score - rejected_rail_score
    assert (p1.prompt, p1.chosen, p1.strength) == ("Tell me a joke.", "Why did the chicken cross the road?", -0.5)
    assert {p.source for p in res.pairs} == {"rail-hh-10k"}


def test_rail_bad_score_and_missing_text_are_named(tmp_path):
    row = rail_row("", "Q", "a", "b", "high", 2.0)
    f = _write_rail_csv(tmp_path / "bad.csv", [row])
    with pytest.raises(DataError, match=r"bad.csv, row 1, field 'chosen_rail_score': expected a number, got 'high'"):
        load_file(f, "rail_hh")
    row = {k: v for k, v in rail_row("", "Q", "a", "b", 1.0, 2.0).items() if k != "chosen_text"}
    g = _write_parquet(tmp_path / "bad.parquet", [row])
    with pytest.raises(DataError, match=r"bad.parquet, row 1, field 'chosen_text': missing field"):
        load_file(g, "rail_hh")
    # a missing score keeps the pair, without a strength
    h = _write_rail_csv(tmp_path / "noscore.csv", [rail_row("", "Q", "a", "b", "", 2.0)])
    assert load_file(h, "rail_hh").pairs[0].strength is None


HS3_CONTEXT = [
    {"role": "user", "content": "Write a function that reverses a list in Python."},
    {"role": "assistant", "content": "Do you want it in place?"},
    {"role": "user", "content": "No, return a new list."},
]


def hs3_row(pref, r1="def rev(x):\n    return x[::-1]", r2="def rev(x):\n    x.reverse()") -> dict:
    return {
        "domain": "code",
        "language": "python",
        "context": HS3_CONTEXT,
        "response1": r1,
        "response2": r2,
        "overall_preference": pref,
        "individual_preference": [
            {"score": pref, "reasoning": "@Response 1 returns a new list.", "feedback1": "ok", "feedback2": "in place"},
            {"score": pref, "reasoning": "Same.", "feedback1": "good", "feedback2": "wrong"},
        ],
    }


@pytest.mark.parametrize("kind", ["jsonl.gz", "parquet"])
def test_helpsteer3_real_fields(kind, tmp_path):
    rows = [hs3_row(-2), hs3_row(1), hs3_row(0), hs3_row(-3, r2="")]
    f = tmp_path / f"validation.{kind}"
    if kind == "parquet":
        _write_parquet(f, rows)
    else:
        with gzip.open(f, "wt", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 4, field 'rejected': empty string"):
        load_file(f, "helpsteer3")
    res = load_file(f, "helpsteer3", skip_invalid=True)
    assert [(p.chosen[:18], p.strength) for p in res.pairs] == [
        ("def rev(x):\n    re", 2.0),
        ("def rev(x):\n    x.", 1.0),
    ]
    assert res.pairs[0].prompt == HS3_CONTEXT
    assert res.dropped_by_definition == {"tie (HelpSteer3 overall_preference = 0)": 1} and res.skipped.total == 1


def pku_row(prompt, better, safer) -> dict:
    """A PKU-SafeRLHF row with the dataset's columns."""
    return {
        "prompt": prompt,
        "response_0": f"{prompt} / answer 0",
        "response_1": f"{prompt} / answer 1",
        "prompt_source": "Alpaca3-70B",
        "response_0_source": "Alpaca-7B",
        "response_1_source": "Alpaca-7B",
        "is_response_0_safe": safer == 0,
        "is_response_1_safe": safer == 1,
        "response_0_harm_category": {"Violence": safer != 0},
        "response_1_harm_category": {"Violence": safer != 1},
        "response_0_severity_level": 0 if safer == 0 else 2,
        "response_1_severity_level": 0 if safer == 1 else 2,
        "better_response_id": better,
        "safer_response_id": safer,
    }


def test_pku_saferlhf_both_labels(tmp_path):
    f = _write_parquet(tmp_path / "test.parquet", [pku_row("P1", 0, 1), pku_row("P2", 1, 0), pku_row("P3", 2, 1)])
    safer = load_file(f, "pku_saferlhf")
    assert [p.chosen for p in safer.pairs] == ["P1 / answer 1", "P2 / answer 0", "P3 / answer 1"]
    with pytest.raises(DataError) as e:
        load_file(f, "pku_saferlhf_better")
    assert str(e.value) == f"{f}, row 3, field 'better_response_id': expected 0 or 1, got 2"
    better = load_file(f, "pku_saferlhf_better", skip_invalid=True)
    assert [p.chosen for p in better.pairs] == ["P1 / answer 0", "P2 / answer 1"] and better.skipped.total == 1


@pytest.mark.parametrize("preset", ["paper-harmless-llama", "paper-harmless-qwen", "paper-helpful-llama"])
def test_presets_pick_the_label_of_their_category(preset):
    """Harmless presets read PKU-SafeRLHF's safer_response_id, Helpful ones (if any PKU set) better_response_id;
    RAIL and HelpSteer3 go through their own converters, not the generic prompt/chosen/rejected one."""
    cfg = load_config(preset, [])
    category = "Harmless" if "harmless" in preset else "Helpful"
    label = {"pku_saferlhf": "safer_response_id", "pku_saferlhf_better": "better_response_id"}
    names = {r.name for r in [*cfg.data.sources, *cfg.data.ood]}
    for name in names:
        spec = DATASETS[name]
        assert spec.category == category
        if spec.format in label:
            assert label[spec.format] in spec.origin
            assert label[spec.format] == ("safer_response_id" if category == "Harmless" else "better_response_id")
    if category == "Harmless":
        assert "pku-saferlhf" in names and DATASETS["pku-saferlhf"].format == "pku_saferlhf"
        assert DATASETS["rail-hh-10k"].format == "rail_hh"
    else:
        assert DATASETS["helpsteer3"].format == "helpsteer3"
    assert DATASETS["pku-saferlhf-better"].category == "Helpful"


def test_named_hub_datasets_ask_for_splits_and_subsets_that_exist(monkeypatch):
    """HelpSteer3 has no test split: its preference subset's validation split is read; RAIL and PKU read test."""
    calls = []
    rows = {
        "nvidia/HelpSteer3": [hs3_row(2)],
        "responsible-ai-labs/RAIL-HH-10K": [RAIL_ROWS[0]],
        "PKU-Alignment/PKU-SafeRLHF": [pku_row("P", 0, 1)],
    }

    def load_dataset(hub_id, subset=None, split=None):
        calls.append((hub_id, subset, split))
        return rows[hub_id]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    got = {n: load_named(n).pairs[0] for n in ("helpsteer3", "rail-hh-10k", "pku-saferlhf", "pku-saferlhf-better")}
    assert calls == [
        ("nvidia/HelpSteer3", "preference", "validation"),
        ("responsible-ai-labs/RAIL-HH-10K", None, "test"),
        ("PKU-Alignment/PKU-SafeRLHF", None, "test"),
        ("PKU-Alignment/PKU-SafeRLHF", None, "test"),
    ]
    assert got["rail-hh-10k"].strength == pytest.approx(6.5)
    assert (got["pku-saferlhf"].chosen, got["pku-saferlhf-better"].chosen) == ("P / answer 1", "P / answer 0")

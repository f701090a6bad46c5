"""RewardBench 2 and RewardBench 1 as targets of `score`: hand-written rows, hand-computed scores by the reference's
rules (w2s_shift.metrics.rewardbench), bad rows reported with file, row and field, `hf:` ids mapped to the formats
(nothing downloaded), and `score` on a tiny exported student."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_error
from test_evaluate_run import evaluated, lm_student, new_file  # noqa: F401 (fixtures: a tiny evaluated run)
from test_export import make_exported_student

from w2s_shift.cli import main
from w2s_shift.data.refs import dataset_ref
from w2s_shift.data.resolve import dataset_ref_for, load_file
from w2s_shift.metrics.rewardbench import (
    RowRewards,
    rewardbench1_scores,
    rewardbench2_scores,
    ties_score,
)

SAMPLE = Path(__file__).parent / "data" / "rewardbench2_sample.jsonl"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bo4(rid, chosen, rejected, subset="Math"):
    return {"id": rid, "subset": subset, "prompt": f"question {rid}", "chosen": [chosen], "rejected": rejected}


def _rewards(pairs, reward_of):
    """(rc, rr) of the pairs, each response's reward looked up by its text."""
    return np.array([reward_of[p.chosen] for p in pairs]), np.array([reward_of[p.rejected] for p in pairs])


def test_best_of_4_rows_with_reward_ties(tmp_path):
    # the reward is the number in the text; the chosen is the first response
    f = _write(
        tmp_path / "rb2.jsonl",
        [
            _bo4("a", "a3", ["a1", "a2", "a0"]),  # strict win: 1
            _bo4("b", "b2", ["b2'", "b1", "b0"]),  # tied with one rejected at the top: 1/2
            _bo4("c", "c1", ["c3", "c0", "c0'"]),  # loss: 0
            _bo4("d", "d2", ["d2'", "d2''", "d1"]),  # tied with two: 1/3
            _bo4("e", "e5", ["e1", "e2", "e3"], subset="Focus"),  # 1
        ],
    )
    res = load_file(f, "rewardbench2")
    assert len(res.pairs) == 15 and res.rows_kept == 5
    reward_of = {t: float(t.rstrip("'")[1:]) for p in res.pairs for t in (p.chosen, p.rejected)}
    d = rewardbench2_scores(res.pairs, *_rewards(res.pairs, reward_of))
    math_ = d["subsets"]["Math"]
    assert math_["score"] == pytest.approx((1 + 1 / 2 + 0 + 1 / 3) / 4)  # 11/24
    assert (math_["rule"], math_["rows"], math_["rows_won"], math_["rows_tied_at_top"]) == ("best-of-4", 4, 1, 2)
    assert d["subsets"]["Focus"]["score"] == 1.0
    assert d["score"] == pytest.approx((11 / 24 + 1) / 2) and d["subsets_scored"] == 2


def _ties_rows():
    # (correct rewards, incorrect rewards) by hand
    return {
        "ref:1": ([5.0], [1.0, 2.0]),  # margin 3, accurate
        "tied:1": ([4.0, 6.0, 5.0], [3.0, 1.0]),  # margin 4 - 3 = 1, spread 2, accurate
        "ref:2": ([2.0], [3.0]),  # margin -1, not accurate
        "tied:2": ([7.0, 7.0], [0.0]),  # margin 7, spread 0, accurate
    }


def test_ties_rule_by_hand(tmp_path):
    rows = []
    for rid, (c, r) in _ties_rows().items():
        rows.append(
            {
                "id": rid,
                "subset": "Ties",
                "prompt": f"name one ({rid.split(':')[1]})",
                "chosen": [f"{rid} good {k}" for k in range(len(c))],
                "rejected": [f"{rid} bad {k}" for k in range(len(r))],
                "num_correct": len(c),
                "num_incorrect": len(r),
            }
        )
    res = load_file(_write(tmp_path / "ties.jsonl", rows), "rewardbench2")
    reward_of = {}
    for rid, (c, r) in _ties_rows().items():
        reward_of.update({f"{rid} good {k}": v for k, v in enumerate(c)})
        reward_of.update({f"{rid} bad {k}": v for k, v in enumerate(r)})
    t = rewardbench2_scores(res.pairs, *_rewards(res.pairs, reward_of))["subsets"]["Ties"]
    # ref accuracy 1/2, tied accuracy 2/2; prompt 1: 1 > 2 no, min(3, 1) > 2 no, tanh(1/2 - 1);
    # prompt 2: 7 > 0 yes, min(-1, 7) > 0 no, tanh(-1/0 - 1) = tanh(-inf) = -1
    margin = (math.tanh(-0.5) - 1.0) / 2
    assert t["ref_accuracy"] == 0.5 and t["tied_accuracy"] == 1.0
    assert t["correctness_preferred"] == 0.5 and t["correctness_preferred_hard"] == 0.0
    assert t["correctness_margin_score"] == pytest.approx(margin)
    assert t["score"] == pytest.approx(0.3 * 1.0 + 0.3 * 0.5 + 0.2 * 0.5 + 0.2 * 0.0 + 0.01 * margin)
    assert t["score"] == pytest.approx(0.5426894142137)
    assert t["paired_prompts"] == 2 and t["rule"] == "ties"


def test_ties_zero_over_zero_counts_zero_and_an_unpaired_subset_is_not_scored():
    a = np.array
    rows = [RowRewards("ref:3", "Ties", a([1.0]), a([1.0])), RowRewards("tied:3", "Ties", a([2.0, 2.0]), a([2.0]))]
    t = ties_score(rows)  # margins 0 and 0, spread 0: 0/0 -> NaN -> 0 in the margin term
    assert t["correctness_margin_score"] == 0.0 and t["score"] == 0.0
    only_ref = ties_score(rows[:1])
    assert only_ref["score"] is None and "both a ref: and a tied: row" in only_ref["not_scored"]


def test_rewardbench1_section_weights_by_hand(tmp_path):
    def pair(subset, k, good, bad):
        return {"id": f"{subset}-{k}", "subset": subset, "prompt": f"{subset} q{k}", "chosen": good, "rejected": bad}

    rows = [
        pair("alpacaeval-easy", 1, "r2", "r1"),  # right
        pair("alpacaeval-easy", 2, "r1", "r3"),  # wrong -> 0.5
        pair("mt-bench-easy", 1, "r4", "r0"),  # right -> 1.0
        pair("math-prm", 1, "r0", "r9"),  # wrong -> 0.0
        pair("hep-python", 1, "r5", "r1"),
        pair("hep-python", 2, "r6", "r2"),  # -> 1.0
        pair("donotanswer", 1, "r7a", "r7b"),  # a tie of the reward is wrong -> 0.0
        pair("mine", 1, "r1", "r0"),  # in no section
    ]
    res = load_file(_write(tmp_path / "rb1.jsonl", rows), "rewardbench")
    d = rewardbench1_scores(
        res.pairs, *_rewards(res.pairs, {r[k]: float(r[k][1]) for r in rows for k in ("chosen", "rejected")})
    )
    chat = (0.5 * 100 + 1.0 * 28) / (100 + 28)
    reasoning = (0.0 * 984 + 1.0 * 164) / (984 + 164)  # math-prm weighs as much as all six code subsets
    assert d["sections"] == pytest.approx({"Chat": chat, "Safety": 0.0, "Reasoning": reasoning})
    assert d["sections_missing"] == ["Chat Hard"]
    assert d["score"] == pytest.approx((chat + 0.0 + reasoning) / 3)
    assert d["subsets"]["mine"] == {"score": 1.0, "rows": 1, "section": None}


def test_hub_ids_pick_the_formats_without_downloading():
    assert dataset_ref_for("hf:allenai/reward-bench-2").model_dump(include={"format", "split"}) == {
        "format": "rewardbench2",
        "split": "test",
    }
    assert (dataset_ref_for("hf:allenai/reward-bench").format, dataset_ref_for("hf:allenai/reward-bench").split) == (
        "rewardbench",
        "filtered",
    )
    assert dataset_ref_for("hf:allenai/reward-bench-2", "prompt_chosen_rejected").format == "prompt_chosen_rejected"
    assert dataset_ref_for("hf:org/other").format == "prompt_chosen_rejected"
    assert dataset_ref("hf:allenai/reward-bench-2").format == "rewardbench2"  # a config entry given as a string


@pytest.fixture(scope="module")
def student(tmp_path_factory, tokenizer):
    folder, _, _ = make_exported_student(tokenizer, tmp_path_factory.mktemp("rb") / "rm")
    return str(folder)


def test_bad_rows_name_file_row_and_field(student, tmp_path, capsys):
    good = _bo4("a", "x", ["y", "z", "w"])
    cases = [
        ({**good, "chosen": []}, "rewardbench2", "row 2, field 'chosen': empty list"),
        ({**good, "num_correct": 2}, "rewardbench2", "row 2, field 'num_correct': is 2, but the row has 1 chosen"),
        ({k: v for k, v in good.items() if k != "subset"}, "rewardbench2", "row 2, field 'subset': missing field"),
        ({**good, "id": "tie:1", "subset": "Ties"}, "rewardbench2", "row 2, field 'id': a Ties row's id is 'ref:<n>'"),
        ({**good, "chosen": ["x", "v"]}, "rewardbench2", "row 2, field 'chosen': subset 'Math' is best-of-N"),
        ({"prompt": "p", "chosen": "a", "rejected": "b"}, "rewardbench", "row 2, field 'subset': missing field"),
    ]
    for k, (bad, fmt, msg) in enumerate(cases):
        ok = {"prompt": "q", "chosen": "a", "rejected": "b", "subset": "chat"} if fmt == "rewardbench" else good
        f = _write(tmp_path / f"bad{k}.jsonl", [ok, bad])
        err = cli_error(capsys, ["score", student, str(f), "--format", fmt, "--out", str(tmp_path / "o.jsonl")])
        assert f"bad{k}.jsonl, {msg}" in err, err


def test_score_prints_and_writes_rewardbench2_scores(student, tmp_path, capsys):
    out = tmp_path / "rb2.jsonl"
    assert main(["score", student, str(SAMPLE), "--format", "rewardbench2", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    rb = s["rewardbench"]
    assert json.loads((tmp_path / "rb2.rewardbench.json").read_text()) == rb
    assert set(rb["subsets"]) == {"Factuality", "Focus", "Math", "Precise IF", "Safety", "Ties"}
    assert rb["score"] == pytest.approx(np.mean([x["score"] for x in rb["subsets"].values()]))
    # one reward per response: the chosen of a row has the same reward in each of its pairs
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == s["pairs"] == 26
    by_chosen = {}
    for r in rows:
        by_chosen.setdefault(r["id"].split("-r")[0], set()).add(r["reward_chosen"])
    assert all(len(v) == 1 for v in by_chosen.values())
    # the rules recomputed from the written rewards
    pairs = load_file(SAMPLE, "rewardbench2").pairs
    again = rewardbench2_scores(
        pairs, np.array([r["reward_chosen"] for r in rows]), [r["reward_rejected"] for r in rows]
    )
    assert again == rb
    # text summary
    assert main(["score", student, str(SAMPLE), "--format", "rewardbench2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "RewardBench 2 score: " in text and "(mean of 6 subset scores)" in text and "official Ties rule" in text
    # RewardBench 1's output layout does not apply
    err = cli_error(
        capsys, ["score", student, str(SAMPLE), "--format", "rewardbench2", "--output-format", "rewardbench"]
    )
    assert "RewardBench 1's layout" in err


def test_score_rewardbench1_adds_sections(student, tmp_path, capsys):
    rows = [
        {"id": 1, "subset": "alpacaeval-easy", "prompt": "Say hi.", "chosen": "Hello there!", "rejected": "No."},
        {"id": 2, "subset": "math-prm", "prompt": "2+2?", "chosen": "4", "rejected": "5"},
    ]
    f = _write(tmp_path / "rb1.jsonl", rows)
    out = tmp_path / "rb1.scores.jsonl"
    assert main(["score", student, str(f), "--format", "rewardbench", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    res = json.loads((tmp_path / "rb1.scores.results.json").read_text())  # RewardBench's own layout, unchanged
    assert set(res["extra_results"]) == {"alpacaeval-easy", "math-prm"}
    extra = res["extra_results"]  # one subset per section: the section's score is that subset's accuracy
    assert s["rewardbench"]["sections"] == {"Chat": extra["alpacaeval-easy"], "Reasoning": extra["math-prm"]}
    assert s["rewardbench"]["sections_missing"] == ["Chat Hard", "Safety"]


def test_evaluate_adds_rewardbench2_scores_per_cell_and_model(evaluated, tmp_path):  # noqa: F811
    """`evaluate RUN rb2.jsonl --format rewardbench2`: the target's entry of evaluated_targets holds the RewardBench 2
    scores of every model of the cell, equal to the rules applied to the rewards files it wrote."""
    from test_evaluate_run import _cli, _no_training

    from w2s_shift.io import read_json, read_jsonl

    run_dir = tmp_path / "run"
    shutil.copytree(evaluated[0], run_dir, ignore=shutil.ignore_patterns(".lock"))
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        code, _, err = _cli(["evaluate", str(run_dir), str(SAMPLE), "--format", "rewardbench2"])
    assert code == 0, err
    entry = read_json(run_dir / "metrics.json")["evaluated_targets"][-1]
    cell = entry["rewardbench"]["ultrafeedback/seed0"]
    assert set(cell) >= {"teacher", "naive"}
    pairs = load_file(SAMPLE, "rewardbench2").pairs
    for label, scores in cell.items():
        rows = read_jsonl(run_dir / "ultrafeedback/seed0/rewards" / f"{label}__rewardbench2_sample.jsonl")
        rc, rr = [r["reward_chosen"] for r in rows], [r["reward_rejected"] for r in rows]
        assert scores == rewardbench2_scores(pairs, rc, rr) and scores["subsets_scored"] == 6
    # the report shows them: one row per model with its score and its subsets' in pp
    report = (run_dir / "report.md").read_text()
    assert "### RewardBench scores" in report
    naive = cell["naive"]
    want = f"| rewardbench2_sample | ultrafeedback/seed0 | naive | {100 * naive['score']:.1f} |"
    assert want in report and f"Ties {100 * naive['subsets']['Ties']['score']:.1f}" in report


def test_a_rewardbench2_file_without_format_names_the_format_to_pass(student, tmp_path, capsys):
    """Read in the default format, a RewardBench 2 row (lists of chosen and rejected texts) names --format
    rewardbench2; exit 2, nothing written."""
    out = tmp_path / "o.jsonl"
    err = cli_error(capsys, ["score", student, str(SAMPLE), "--out", str(out)])
    assert (
        "rewardbench2_sample.jsonl, row 1, field 'chosen': a list of texts, as in a RewardBench 2 row: give --format "
        "rewardbench2" in err
    ), err
    assert not out.exists()
    err = cli_error(capsys, ["data", "inspect", str(SAMPLE)])
    assert "row 1, field 'chosen'" in err and "--format rewardbench2" in err, err

"""Requested split sizes the data cannot meet are warned and recorded; a split left with fewer
than 10 pairs is refused. No model is loaded or trained here."""

import json

import pytest

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.pipeline import prepare_data, split_shortfalls


def _data(tmp_path, n, name="pairs.jsonl"):
    f = tmp_path / name
    f.write_text(
        "".join(
            json.dumps({"prompt": f"{name} question {i}?", "chosen": f"good answer {i}", "rejected": f"bad answer {i}"})
            + "\n"
            for i in range(n)
        )
    )
    return f


def _cfg(tmp_path, f, **data):
    return RunConfig.model_validate(
        {
            "output_dir": str(tmp_path / "out"),
            "data": {
                "source": {"path": str(f)},
                "ood": [{"path": str(_data(tmp_path, 7, "ood.jsonl"))}],
                "n_ood": 5,
                **data,
            },
            "teacher": {"name": "minilm-l6"},
            "student": {"name": "smollm2-135m"},
        }
    )


def test_unmet_sizes_are_listed_with_both_numbers(tmp_path):
    # 60 one-pair prompts, fractions 0.4/0.4/0.2: 27 / 21 / 12 by the hash midpoints (seed 0); teacher capped at 20
    cfg = _cfg(tmp_path, _data(tmp_path, 60), n_teacher_train=20, n_test=1000, n_ood=100)
    splits, ood, summary = prepare_data(cfg)
    assert {k: len(v) for k, v in splits.items()} == {"teacher_train": 20, "student_train": 21, "test": 12}
    assert summary["shortfalls"] == [
        {"split": "test", "requested": 1000, "available": 12},
        {"split": "ood:ood", "requested": 100, "available": 7},
    ]


def test_met_sizes_list_nothing(tmp_path):
    _, _, summary = prepare_data(_cfg(tmp_path, _data(tmp_path, 60), n_test=12))
    assert summary["shortfalls"] == []


def test_a_split_short_of_its_request_under_10_pairs_is_refused(tmp_path):
    # 60 prompts, fractions 0.45/0.45/0.1 -> test 6 pairs, 1000 requested
    cfg = _cfg(tmp_path, _data(tmp_path, 60), n_test=1000, split_fractions=[0.45, 0.45, 0.1])
    with pytest.raises(ValueError) as e:
        prepare_data(cfg)
    msg = str(e.value)
    assert "'test'" in msg and "has 6 pairs" in msg and "requested 1000" in msg and "at least 10" in msg, msg


def test_split_shortfalls_rules():
    caps = {"teacher_train": None, "student_train": 8, "test": 50}
    # an explicit cap below 10 that is met is honoured; a cap above the split's size is listed
    assert split_shortfalls("s", {"teacher_train": 30, "student_train": 8, "test": 12}, caps, 50, (0.4, 0.4, 0.2)) == [
        {"split": "test", "requested": 50, "available": 12}
    ]
    with pytest.raises(ValueError, match=r"'teacher_train' has 9 pairs \(requested all"):
        split_shortfalls("s", {"teacher_train": 9, "student_train": 8, "test": 12}, caps, 50, (0.4, 0.4, 0.2))


def test_cli_refuses_with_exit_2_before_claiming_the_run_dir(tmp_path, capsys):
    f, o = _data(tmp_path, 60), _data(tmp_path, 7, "ood.jsonl")
    c = tmp_path / "c.yaml"
    c.write_text(
        f"output_dir: {tmp_path / 'out'}\ndata:\n  source: {{path: {f}}}\n  ood: [{{path: {o}}}]\n  n_test: 1000\n"
        "  split_fractions: [0.45, 0.45, 0.1]\nteacher: {name: minilm-l6}\nstudent: {name: smollm2-135m}\n"
    )
    assert main(["run", str(c)]) == 2
    err = capsys.readouterr().err
    assert "'test'" in err and "has 6 pairs" in err and "requested 1000" in err
    assert not (tmp_path / "out" / "run.json").exists()

"""Choosing the student's lr and epochs on gold validation pairs carved from the student-train pool."""

import math

import pytest
from conftest import tiny_grid_dict

from w2s_shift.config import RunConfig
from w2s_shift.pipeline import prepare_data
from w2s_shift.pipeline.prepare import gold_validation_pairs
from w2s_shift.pipeline.select import bt_loss, choose, select_student_settings


def _cfg(tiny_model_dirs, out, **over):
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], out, ["pandalm"], ["naive"], **over)
    return RunConfig.model_validate(d)


def test_bt_loss_matches_hand_computed_values():
    # margins 0 and log(3): log(1 + e^0) = log 2; log(1 + 1/3) = log(4/3)
    assert bt_loss([0.0, math.log(3)], [0.0, 0.0]) == pytest.approx((math.log(2) + math.log(4 / 3)) / 2)
    assert bt_loss([800.0], [0.0]) == pytest.approx(0.0, abs=1e-12)  # stable for large margins
    assert bt_loss([0.0], [800.0]) == pytest.approx(800.0)


def test_choose_prefers_accuracy_then_loss_then_the_gentler_setting():
    t = [
        {"learning_rate": 1e-4, "epochs": 1, "val_accuracy": 60.0, "val_bt_loss": 0.60},
        {"learning_rate": 3e-4, "epochs": 2, "val_accuracy": 64.0, "val_bt_loss": 0.70},
        {"learning_rate": 1e-4, "epochs": 2, "val_accuracy": 64.0, "val_bt_loss": 0.65},
        {"learning_rate": 5e-5, "epochs": 2, "val_accuracy": 64.0, "val_bt_loss": 0.65},
    ]
    assert choose(t) == t[3]
    assert choose(t[:3]) == t[2]
    with pytest.raises(ValueError, match="no selection trial to choose from"):
        choose([])


def test_gold_validation_is_disjoint_from_training_and_test(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    val, train = gold_validation_pairs(cfg, 20)
    splits, _, _ = prepare_data(cfg)
    assert [p.id for p in train] == [p.id for p in splits["student_train"]]
    assert len(val) == 20
    keys = lambda ps: {p.prompt_key() for p in ps}  # noqa: E731
    assert not keys(val) & keys(train)
    assert not keys(val) & keys(splits["test"])
    assert not keys(val) & keys(splits["teacher_train"])
    # the same carving every time
    assert [p.id for p in gold_validation_pairs(cfg, 20)[0]] == [p.id for p in val]


def test_gold_validation_refuses_an_exhausted_pool(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    cfg.data.n_student_train = None  # training keeps the whole pool
    with pytest.raises(ValueError, match="left for a gold validation split"):
        gold_validation_pairs(cfg, 20)


def test_select_trains_each_setting_and_resumes(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    out = tmp_path / "sel"
    res = select_student_settings(cfg, [1e-4, 1e-2], [1, 2], n_val=16, out=out)
    assert [(t["learning_rate"], t["epochs"]) for t in res["trials"]] == [(1e-4, 1), (1e-4, 2), (1e-2, 1), (1e-2, 2)]
    for t in res["trials"]:
        assert 0 <= t["val_accuracy"] <= 100 and t["val_accuracy"] * 16 / 100 == pytest.approx(
            round(t["val_accuracy"] * 16 / 100)
        )
        assert t["val_bt_loss"] > 0
    assert res["chosen"] == {k: choose(res["trials"])[k] for k in ("learning_rate", "epochs")}
    assert res["validation"]["pairs"] == 16
    # the settings differ, so do the trained models: the validation losses are not all equal
    assert len({t["val_bt_loss"] for t in res["trials"]}) == 4
    md = (out / "selection.md").read_text()
    assert "**(chosen)**" in md and "--set student.learning_rate=" in md
    # a rerun trains nothing: every trial is read back (its seconds unchanged)
    again = select_student_settings(cfg, [1e-4, 1e-2], [1, 2], n_val=16, out=out)
    assert [t["seconds"] for t in again["trials"]] == [t["seconds"] for t in res["trials"]]


def test_select_refuses_an_empty_or_bad_grid(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    with pytest.raises(ValueError, match="at least one learning rate"):
        select_student_settings(cfg, [], [1])
    with pytest.raises(ValueError, match="must be > 0"):
        select_student_settings(cfg, [0.0], [1])


def test_select_command_prints_the_table_and_refuses_bad_counts(tiny_model_dirs, tmp_path, capsys):
    import yaml

    from w2s_shift.cli import main

    cfg = tmp_path / "c.yaml"
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", ["pandalm"], ["naive"])
    cfg.write_text(yaml.safe_dump(d))
    out = tmp_path / "sel"
    args = ["select", str(cfg), "--learning-rates", "1e-3", "--epochs", "1", "--val-pairs", "8", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "| 0.001 **(chosen)** | 1 |" in text and "--set student.learning_rate=0.001 --set student.epochs=1" in text
    assert (out / "selection.json").is_file() and (out / "trials" / "lr0.001-ep1.json").is_file()
    assert main([*args[:-4], "--val-pairs", "0"]) == 2
    assert "--val-pairs must be >= 1" in capsys.readouterr().err


def test_select_retrains_damaged_or_edited_trials_and_records_divergence(tiny_model_dirs, tmp_path):
    import json

    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    out = tmp_path / "sel"
    first = select_student_settings(cfg, [1e-3], [1], n_val=8, out=out)["trials"][0]
    f = out / "trials" / "lr0.001-ep1.json"
    good = json.loads(f.read_text())
    # not an object, a field missing, a value out of range, a non-finite loss: each trial is trained again
    for bad in ([1, 2], {k: v for k, v in good.items() if k != "val_bt_loss"}, {**good, "val_accuracy": 200.0},
                {**good, "val_interval": None}, {**good, "val_bt_loss": -1.0}):  # fmt: skip
        f.write_text(json.dumps(bad))
        again = select_student_settings(cfg, [1e-3], [1], n_val=8, out=out)["trials"][0]
        assert again["val_accuracy"] == first["val_accuracy"] and again["val_bt_loss"] == first["val_bt_loss"]
    # a learning rate that diverges is a row of the selection, never chosen
    res = select_student_settings(cfg, [1e-3, 1e3], [1], n_val=8, out=out)
    bad = res["trials"][1]
    assert bad["diverged"] and bad["val_accuracy"] is None
    assert res["chosen"]["learning_rate"] == 1e-3
    assert "| 1000.0 | 1 | diverged |" in (out / "selection.md").read_text()
    with pytest.raises(ValueError, match="every setting diverged"):
        select_student_settings(cfg, [1e3], [1], n_val=8, out=out)


def test_select_refuses_duplicates_and_settings_outside_the_config_limits(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    with pytest.raises(ValueError, match="duplicate learning rate 0.001"):
        select_student_settings(cfg, [1e-3, 1e-3], [1])
    with pytest.raises(ValueError, match=r"student.epochs = 5000: Input should be less than or equal to 1000"):
        select_student_settings(cfg, [1e-3], [5000])


def test_select_default_folder_sits_beside_the_run_directory(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, str(tmp_path / "run") + "/")  # a trailing slash
    select_student_settings(cfg, [1e-3], [1], n_val=8)
    assert (tmp_path / "run-select" / "selection.json").is_file()


def test_select_holds_a_lock_and_refuses_links_out_of_its_folder(tiny_model_dirs, tmp_path):
    """`select --out` wrote without a lock (two selections in one folder mixed their trials) and through a symbolic
    link to outside it; it now takes the folder's lock and makes the check every writer makes."""
    from w2s_shift.pipeline import RunDirError
    from w2s_shift.runlock import lock_run_dir

    out = tmp_path / "sel"
    out.mkdir()
    held = lock_run_dir(out)
    try:
        with pytest.raises(RunDirError, match="another w2s-shift run .* is writing to this run directory"):
            select_student_settings(_cfg(tiny_model_dirs, tmp_path / "run"), [1e-3], [1], n_val=10, out=out)
    finally:
        held.release()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "trials").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(RunDirError, match=f"{out / 'trials'}: a symbolic link to {elsewhere}, outside"):
        select_student_settings(_cfg(tiny_model_dirs, tmp_path / "run"), [1e-3], [1], n_val=10, out=out)
    assert list(elsewhere.iterdir()) == []

"""Choosing a W2S method's own setting (L2-SP's lambda, WiSE-FT's a) on gold validation pairs carved from the
student-train pool: ``w2s-shift select-method``."""

import json

import pytest
from conftest import tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.pipeline.select_method import method_candidates, select_method_setting


def _cfg(tiny_model_dirs, out):
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], out, ["pandalm"], ["naive"])
    return RunConfig.model_validate(d)


def test_select_method_trains_each_value_on_teacher_labels_and_resumes(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path / "run")
    out = tmp_path / "sel"
    res = select_method_setting(cfg, "l2sp", "l2sp_lambda", [0.001, 1000.0], n_val=16, out=out)
    assert [t["value"] for t in res["trials"]] == [0.001, 1000.0]
    for t in res["trials"]:
        # a whole number of the 16 validation pairs, a finite Bradley-Terry loss
        assert (
            t["val_accuracy"] * 16 / 100 == pytest.approx(round(t["val_accuracy"] * 16 / 100)) and t["val_bt_loss"] > 0
        )
    best = min(res["trials"], key=lambda t: (-t["val_accuracy"], t["val_bt_loss"], t["value"]))
    assert res["chosen"] == {"value": best["value"]}
    assert len({t["val_bt_loss"] for t in res["trials"]}) == 2  # the lambdas acted
    labels = json.loads((out / "selection.json").read_text())["trials"]
    assert [t["label"] for t in labels] == ["l2sp-l2sp_lambda-0.001", "l2sp-l2sp_lambda-1000.0"]
    # the students trained on the teacher's soft labels (its stage), not gold
    assert (out / "cell" / "teacher_labels.jsonl").is_file()
    md = (out / "selection.md").read_text()
    assert "**(chosen)**" in md and "Declare: `- {name: l2sp, l2sp_lambda:" in md
    # a rerun trains nothing: the trials are read back
    stamp = (out / "trials" / "l2sp-l2sp_lambda-0.001.json").stat().st_mtime_ns
    assert select_method_setting(cfg, "l2sp", "l2sp_lambda", [0.001, 1000.0], n_val=16, out=out) == res
    assert (out / "trials" / "l2sp-l2sp_lambda-0.001.json").stat().st_mtime_ns == stamp


def test_select_method_command_and_bad_candidates(tiny_model_dirs, tmp_path, capsys):
    with pytest.raises(ValueError, match="no setting 'anchor_lambda'.*l2sp_lambda"):
        method_candidates("l2sp", "anchor_lambda", [1.0])
    with pytest.raises(ValueError, match="distinct values"):
        method_candidates("l2sp", "l2sp_lambda", [1.0, 1.0])
    with pytest.raises(ValueError, match="l2sp_lambda = -1"):
        method_candidates("l2sp", "l2sp_lambda", [-1])
    with pytest.raises(ValueError, match="not a W2S student"):
        method_candidates("ceiling", "label", [1])
    cfg = tmp_path / "c.json"
    cfg.write_text(
        json.dumps(
            tiny_grid_dict(
                tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", ["pandalm"], ["naive"]
            )
        )
    )
    args = ["select-method", str(cfg), "--method", "wise_ft", "--field", "wise_alpha", "--values", "0.5", "1"]
    assert main([*args, "--val-pairs", "16", "--out", str(tmp_path / "sel")]) == 0
    out = capsys.readouterr().out
    assert "wise_ft.wise_alpha chosen on gold validation pairs" in out and "| 0.5" in out
    # WiSE-FT's two values share one training: naive's, which the selection's grid trains with the same settings
    models = sorted(p.name for p in (tmp_path / "sel" / "cell" / "models").glob("*.safetensors"))
    assert models == [
        "naive.safetensors",
        "teacher.safetensors",
        "wise_ft-wise_alpha-0.5.safetensors",
        "wise_ft-wise_alpha-1.safetensors",
    ]

"""End to end: the whole protocol with tiny random-init models on bundled real data; config errors; CLI."""

import json

import numpy as np
import pytest

from w2s_shift.cli import main
from w2s_shift.config import ConfigError, RunConfig
from w2s_shift.config_io import load_config
from w2s_shift.io import read_jsonl
from w2s_shift.pipeline import RunDirError, prepare_data, run


def _cfg(tiny_model_dirs, out, **over):
    d = {
        "output_dir": str(out),
        "data": {
            "source": "ultrafeedback",
            "ood": ["hh-helpful-base", "pandalm"],
            "n_teacher_train": 24,
            "n_student_train": 20,
            "n_test": 16,
            "n_ood": 12,
            "skip_invalid": True,
        },
        "teacher": {"name": tiny_model_dirs["teacher"], "max_length": 64, "epochs": 1, "batch_size": 8, "bf16": False},
        "student": {
            "name": tiny_model_dirs["student"],
            "max_length": 64,
            "trainable_layers": 2,
            "epochs": 1,
            "batch_size": 4,
            "bf16": False,
        },
        "methods": ["naive", {"name": "anchor", "anchor_lambda": 1e-2}, "ceiling"],
        "bootstrap": 200,
    }
    d.update(over)
    return RunConfig.model_validate(d)


def _cell(metrics, i=0):
    return metrics["cells"][i]


@pytest.fixture(scope="module")
def finished_run(tiny_model_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = _cfg(tiny_model_dirs, out)
    metrics = run(cfg)
    return cfg, out, metrics


def test_run_writes_every_artifact(finished_run):
    cfg, out, metrics = finished_run
    for f in ("config.yaml", "run.json", "metrics.json", "report.md", "report.html"):
        assert (out / f).is_file(), f
    cell = out / "ultrafeedback" / "seed0"
    for model in ("teacher", "naive", "anchor", "ceiling"):
        for ds in ("ultrafeedback", "hh-helpful-base", "pandalm"):
            rows = read_jsonl(cell / "rewards" / f"{model}__{ds}.jsonl")
            assert len(rows) == _cell(metrics)["n_pairs"][ds]
    labels = read_jsonl(cell / "teacher_labels.jsonl")
    assert len(labels) == 20 and all(0.0 < r["q"] < 1.0 for r in labels)
    report = (out / "report.md").read_text()
    assert "| naive |" in report and "WRG" in report


def test_metrics_match_the_saved_rewards(finished_run):
    cfg, out, metrics = finished_run
    cell = out / "ultrafeedback" / "seed0"
    acc = {}
    for model in ("teacher", "naive", "anchor", "ceiling"):
        for ds in ("ultrafeedback", "hh-helpful-base", "pandalm"):
            rows = read_jsonl(cell / "rewards" / f"{model}__{ds}.jsonl")
            acc[(model, ds)] = 100.0 * np.mean([r["reward_chosen"] > r["reward_rejected"] for r in rows])
            assert _cell(metrics)["accuracy"][model][ds] == pytest.approx(acc[(model, ds)])
    m = _cell(metrics)["metrics"]["naive"]
    assert m["WRG"] == pytest.approx(acc[("naive", "ultrafeedback")] - acc[("teacher", "ultrafeedback")])
    aogs = [acc[("naive", d)] - acc[("teacher", d)] for d in ("hh-helpful-base", "pandalm")]
    assert m["AOG_mean"] == pytest.approx(np.mean(aogs))
    assert m["NTS"] == pytest.approx(np.mean(aogs) - max(0.0, -m["WRG"]))
    assert "ceiling" not in _cell(metrics)["metrics"]
    # teacher labels are sigmoid of the teacher's margins on student-train
    t = read_jsonl(cell / "rewards" / "teacher__student_train.jsonl")
    q = [r["q"] for r in read_jsonl(cell / "teacher_labels.jsonl")]
    want = [1 / (1 + np.exp(-(r["reward_chosen"] - r["reward_rejected"]))) for r in t]
    assert q == pytest.approx(want)


def test_rerun_skips_finished_stages_and_other_config_is_refused(finished_run, tiny_model_dirs):
    cfg, out, metrics = finished_run
    stages = out / "ultrafeedback" / "seed0" / "stages"
    before = {p.name: p.read_text() for p in stages.glob("*.json")}
    again = run(cfg)
    after = {p.name: p.read_text() for p in stages.glob("*.json")}
    assert before == after  # nothing retrained
    assert _cell(again)["accuracy"] == _cell(metrics)["accuracy"]
    other = _cfg(tiny_model_dirs, out, seed=1)
    with pytest.raises(RunDirError, match="different config"):
        run(other)


def test_resume_after_a_lost_student_stage(finished_run, tiny_model_dirs, tmp_path):
    """A killed run leaves no stage marker: the rerun redoes that stage only, with the same result."""
    cfg, out, metrics = finished_run
    import shutil

    copy_dir = tmp_path / "copy"
    shutil.copytree(out, copy_dir)
    c2 = _cfg(tiny_model_dirs, copy_dir)
    cell = copy_dir / "ultrafeedback" / "seed0"
    (cell / "stages" / "student-anchor.json").unlink()
    (cell / "models" / "anchor.json").unlink()  # trained weights lost too: retrain
    (cell / "rewards" / "anchor__pandalm.jsonl").write_text('{"index": 0, "reward_ch')  # half-written
    teacher_marker = (cell / "stages" / "teacher.json").read_text()
    m2 = run(c2)
    assert (cell / "stages" / "teacher.json").read_text() == teacher_marker
    assert _cell(m2)["accuracy"]["anchor"] == _cell(metrics)["accuracy"]["anchor"]  # CPU: bit-identical rerun


def test_splits_share_no_prompt_and_are_deterministic(tiny_model_dirs, tmp_path):
    cfg = _cfg(tiny_model_dirs, tmp_path)
    s1, ood1, _ = prepare_data(cfg)
    s2, _, _ = prepare_data(cfg)
    keys = {k: {p.prompt_key() for p in v} for k, v in s1.items()}
    assert not keys["teacher_train"] & keys["student_train"]
    assert not keys["teacher_train"] & keys["test"]
    assert not keys["student_train"] & keys["test"]
    assert [p.to_json() for p in s1["test"]] == [p.to_json() for p in s2["test"]]


def test_bad_config_lists_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("student:\n  name: x\n  epochs: -1\n  batch_size: 0\nmethods: [naive, magic]\nbogus: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(bad))
    msg = str(e.value)
    for part in ("student.epochs", "student.batch_size", "methods.1.name", "bogus"):
        assert part in msg, msg
    assert "4 problem(s)" in msg or "problem(s)" in msg


def test_quickstart_preset_validates_offline():
    cfg = load_config("quickstart")
    assert cfg.teacher.name == "minilm-l6" and cfg.student.name == "smollm2-135m"
    assert [m.name for m in cfg.methods] == ["naive", "anchor", "ceiling"] and cfg.seeds == [0]
    assert cfg.methods[1].anchor_lambda == 1.0 and cfg.methods[1].anchor_normalize
    # a weak-to-strong setting: the teacher gets fewer gold pairs than the students
    assert cfg.data.n_teacher_train < cfg.data.n_student_train and cfg.data.n_test >= 500
    assert [s.name for s in cfg.data.sources] == ["hh-helpful-base"] and [o.name for o in cfg.data.ood] == [
        "ultrafeedback"
    ]


def test_cli_reports_bad_data_with_file_row_field(tmp_path, tiny_model_dirs, capsys):
    f = tmp_path / "pairs.jsonl"
    f.write_text(
        json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
        + "\n"
        + json.dumps({"prompt": "q", "chosen": "a"})
        + "\n"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"output_dir: {tmp_path / 'out'}\ndata:\n  source: {{path: {f}}}\n  ood: [pandalm]\n"
        f"teacher: {{name: {tiny_model_dirs['teacher']}}}\nstudent: {{name: {tiny_model_dirs['student']}}}\n"
    )
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "row 2" in err and "'rejected'" in err


def test_cli_data_list(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "ultrafeedback" in out and "hh-helpful-base" in out and "Harmless" in out


def test_a_stage_whose_output_is_missing_or_truncated_is_redone(finished_run, tiny_model_dirs, tmp_path):
    cfg, out, metrics = finished_run
    import shutil

    d = tmp_path / "copy2"
    shutil.copytree(out, d)
    cell = d / "ultrafeedback" / "seed0"
    (cell / "rewards" / "teacher__pandalm.jsonl").unlink()  # marker kept, an output lost
    (cell / "rewards" / "naive__hh-helpful-base.jsonl").write_text('{"index": 0, "rew')  # truncated
    m2 = run(_cfg(tiny_model_dirs, d))
    assert _cell(m2)["accuracy"] == _cell(metrics)["accuracy"]


def test_a_full_disk_is_refused_before_any_work(tiny_model_dirs, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    cfg = _cfg(tiny_model_dirs, tmp_path / "out")
    with pytest.raises(RunDirError, match=r"only 1 MiB free .* at least 500 MiB"):
        run(cfg)
    assert not (tmp_path / "out" / "run.json").exists()


def test_export_added_to_a_finished_run_exports_from_the_saved_weights(finished_run, tiny_model_dirs, tmp_path):
    import shutil

    from transformers import AutoModelForSequenceClassification

    cfg, out, metrics = finished_run
    d = tmp_path / "exp"
    shutil.copytree(out, d)
    stages = d / "ultrafeedback" / "seed0" / "stages"
    before = {p.name: p.read_text() for p in stages.glob("*.json")}
    run(_cfg(tiny_model_dirs, d, export=["anchor"]))  # export is not part of the run's digest: no --overwrite
    assert {p.name: p.read_text() for p in stages.glob("*.json")} == before  # nothing retrained
    m = AutoModelForSequenceClassification.from_pretrained(d / "ultrafeedback" / "seed0" / "export" / "anchor")
    assert m.config.num_labels == 1


def test_ood_targets_are_matched_by_identity_not_by_file_stem(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for f in (a / "test.jsonl", b / "test.jsonl"):
        f.write_text('{"prompt": "p", "chosen": "x", "rejected": "y"}\n')
    with pytest.raises(Exception, match="both named 'test'.*set label"):
        RunConfig.model_validate({"data": {"source": str(a / "test.jsonl"), "ood": [str(b / "test.jsonl")]}})
    ok = RunConfig.model_validate(
        {
            "data": {
                "source": str(a / "test.jsonl"),
                "ood": [{"path": str(b / "test.jsonl"), "label": "b"}, str(a / "test.jsonl")],
            }
        }
    )
    assert [o.display for o in ok.data.ood_for(ok.data.sources[0])] == ["b"]


def test_lambda_labels_are_exact():
    c = RunConfig.model_validate({"methods": [{"name": "anchor", "anchor_lambda": [1e-4, 1.5e-4, 2.5e-4, 0]}]})
    assert [m.display for m in c.expanded_methods()] == [
        "anchor-lam1e-4",
        "anchor-lam1.5e-4",
        "anchor-lam2.5e-4",
        "anchor-lam0",
    ]


def test_atomic_writes_get_the_usual_file_mode(tmp_path):
    """Results are readable like files from open(): mode 0666 minus the umask, not mkstemp's 0600."""
    import os

    from w2s_shift.io import write_json_atomic

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "m.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644

"""What a new user meets first: `run --dry-run` opens each source and prints the split sizes a run trains and
scores on, so a column mapping that fails on row 1 fails the dry run (exit 2, file, row and field)."""

import json

import pytest
import yaml
from conftest import cli_error, tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.pipeline.prepare import prepare_data


def _custom(tmp_path, n=80):
    rows = [{"question": f"Question number {i}?", "good": f"A fine answer {i}.", "bad": "No."} for i in range(n)]
    f = tmp_path / "custom.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _config(tmp_path, tiny_model_dirs, source, skip_invalid=False) -> str:
    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"prompt": f"Q{i}?", "chosen": "Yes.", "rejected": "No."}) + "\n" for i in range(30))
    )
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", [str(other)], ["naive"]
    )
    d["data"].update(sources=[source], n_teacher_train=None, n_student_train=20, skip_invalid=skip_invalid)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_dry_run_opens_each_source_and_prints_split_sizes(tmp_path, tiny_model_dirs, capsys):
    f = _custom(tmp_path)
    good = {"path": str(f), "columns": {"prompt": "question", "chosen": "good", "rejected": "bad"}}
    cfg = _config(tmp_path, tiny_model_dirs, good)
    assert main(["run", cfg, "--dry-run"]) == 0
    out = capsys.readouterr().out
    splits, _, summary = prepare_data(RunConfig.model_validate(yaml.safe_load(open(cfg))), seed=0)
    sizes = {k: len(v) for k, v in splits.items()}
    assert (sizes["student_train"], sizes["test"], summary["ood"]["other"]["used"]) == (20, 10, 8)
    assert (
        f"data custom: 80 valid pairs -> teacher-train {sizes['teacher_train']}, student-train 20, test 10 "
        "(split seed 0); OOD other 8 of 30"
    ) in out.splitlines(), out
    assert 10 <= sizes["teacher_train"] <= 80 - 30
    assert not (tmp_path / "run").exists()  # nothing written
    # a mapping that fails on row 1 fails the dry run with the run's message
    bad = {"path": str(f), "columns": {"prompt": "question", "chosen": "answer", "rejected": "bad"}}
    err = cli_error(capsys, ["run", _config(tmp_path, tiny_model_dirs, bad), "--dry-run"])
    assert "custom.jsonl, row 1, field 'answer': missing field" in err, err
    assert "all 80 rows fail, so --skip-invalid would keep none" in err, err
    err = cli_error(capsys, ["run", _config(tmp_path, tiny_model_dirs, bad, skip_invalid=True), "--dry-run"])
    assert (
        "source dataset 'custom' has no valid pairs: all 80 rows invalid, e.g. " in err
        and "custom.jsonl, row 1, field 'answer': missing field" in err
    ), err


def test_times_sum_over_reruns_and_a_resume_is_logged(tmp_path, tiny_model_dirs, capsys):
    """A rerun that reuses every stage adds its own (near-zero) times to the first run's instead of replacing them:
    each stage time and the wall time are the first run's plus the rerun's, and the rerun logs the stages it found
    and reused."""
    from w2s_shift.io import read_json
    from w2s_shift.pipeline import run

    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", ["hh-helpful-base"], ["naive"]
    )
    first = run(RunConfig.model_validate(d))
    capsys.readouterr()
    t1 = first["cells"][0]["timings_seconds"]
    assert first["wall_seconds"] == first["wall_seconds_this_run"] > 0 and t1["student-naive"] > 0
    second = run(RunConfig.model_validate(d))
    log = capsys.readouterr().out
    t2 = second["cells"][0]["timings_seconds"]
    n = len(list((tmp_path / "run" / "ultrafeedback" / "seed0" / "stages").glob("*.json")))
    assert n >= 4
    assert f"resuming: {n} finished stage(s) of 1 earlier run(s) in {tmp_path / 'run'}" in log, log
    assert f"resumed: {n} of {n} stage(s) reused from earlier runs" in log, log
    assert set(t2) == set(t1)
    for k in t1:  # the rerun's own time of a reused stage is small, and added
        assert t1[k] <= t2[k] <= t1[k] + second["wall_seconds_this_run"] + 0.2, (k, t1[k], t2[k])
    assert second["wall_seconds"] == pytest.approx(first["wall_seconds"] + second["wall_seconds_this_run"], abs=0.3)
    saved = read_json(tmp_path / "run" / "timings.json")
    assert saved["runs"] == 2 and saved["wall_seconds"] == pytest.approx(second["wall_seconds"], abs=0.3)
    report = (tmp_path / "run" / "report.md").read_text()
    assert (
        f"wall time: {second['wall_seconds']} s over every run of this directory (the last one "
        f"{second['wall_seconds_this_run']} s)"
    ) in report

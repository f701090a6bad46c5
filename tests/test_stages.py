"""Stages split by what they depend on: a training stage per model keyed on its training
inputs, a scoring stage per (model, evaluation set). Adding an OOD target to a config scores only."""

import json

import numpy as np
import pytest
from conftest import tiny_grid_dict

from w2s_shift.config import RunConfig
from w2s_shift.io import file_sha256, read_json, read_jsonl
from w2s_shift.pipeline import RunDirError, run, training_digest

METHODS = ["naive", {"name": "anchor", "anchor_lambda": 1.0}, "ceiling", "zero_shot"]
TRAINED = ["teacher", "student-naive", "student-anchor", "student-ceiling"]


def _cfg(tiny_model_dirs, student, out, ood, **over):
    over = {"drift_interval": 1, **over}
    return RunConfig.model_validate(tiny_grid_dict(tiny_model_dirs["teacher"], student, out, ood, METHODS, **over))


def _markers(cell):
    return {p.stem: read_json(p) for p in (cell / "stages").glob("*.json")}


@pytest.fixture(scope="module")
def extended(tiny_model_dirs, lm_student_dir, tmp_path_factory):
    """A run with one OOD target, then the same config with one more target, in the same directory."""
    out = tmp_path_factory.mktemp("stages")
    first = run(_cfg(tiny_model_dirs, lm_student_dir, out, ["pandalm"]))
    cell = out / "ultrafeedback" / "seed0"
    before = _markers(cell)
    weights = {p.name: p.stat().st_mtime_ns for p in (cell / "models").glob("*.safetensors")}
    second = run(_cfg(tiny_model_dirs, lm_student_dir, out, ["pandalm", "hh-helpful-base"]))
    return out, cell, first, second, before, weights


def test_one_training_stage_per_model_and_one_scoring_stage_per_model_and_set(extended):
    out, cell, first, second, before, _ = extended
    assert sorted(k for k in before if not k.startswith(("score-", "mechanism-"))) == sorted(TRAINED)
    assert sorted(k for k in before if k.startswith("mechanism-")) == sorted(
        f"mechanism-{m}__{d}" for m in ("naive", "anchor", "ceiling") for d in ("ultrafeedback", "pandalm")
    )
    models = ["teacher", "naive", "anchor", "ceiling", "zero_shot"]
    assert sorted(k for k in before if k.startswith("score-")) == sorted(
        f"score-{m}__{d}" for m in models for d in ("ultrafeedback", "pandalm")
    )
    for m in models:  # each scoring stage wrote exactly its model's rewards on its set
        mk = before[f"score-{m}__pandalm"]
        assert mk["model"] == m and mk["dataset"] == "pandalm" and mk["pairs"] == 8
        assert f"rewards/{m}__pandalm.jsonl" in mk["outputs"]
    # a training stage lists no evaluation-set rewards: those belong to the scoring stages
    assert not any(o.startswith("rewards/naive__") for o in before["student-naive"]["outputs"])


def test_adding_an_ood_target_retrains_nothing_and_scores_only_the_new_set(extended):
    out, cell, first, second, before, weights = extended
    after = _markers(cell)
    for name, mk in before.items():  # every finished stage kept as it was: same digest, not rewritten
        assert after[name] == mk, name
    new = sorted(k for k in after if k not in before)
    assert new == sorted(
        [f"score-{m}__hh-helpful-base" for m in ("teacher", "naive", "anchor", "ceiling", "zero_shot")]
        + [f"mechanism-{m}__hh-helpful-base" for m in ("naive", "anchor", "ceiling")]
    )
    assert {p.name: p.stat().st_mtime_ns for p in (cell / "models").glob("*.safetensors")} == weights
    c = second["cells"][0]
    assert c["ood"] == ["pandalm", "hh-helpful-base"]
    assert set(c["accuracy"]["naive"]) == {"ultrafeedback", "pandalm", "hh-helpful-base"}
    assert np.isfinite(c["accuracy"]["teacher"]["hh-helpful-base"])
    # the old sets' numbers are unchanged; drift on the new set was added to the student's drift file
    assert c["accuracy"]["naive"]["pandalm"] == first["cells"][0]["accuracy"]["naive"]["pandalm"]
    drift = read_json(cell / "drift" / "naive.json")
    assert set(drift["final"]) == {"ultrafeedback", "pandalm", "hh-helpful-base"}
    assert len(read_jsonl(cell / "rewards" / "teacher__hh-helpful-base.jsonl")) == 8


def test_the_stage_log_shows_scoring_only(tiny_model_dirs, lm_student_dir, extended, capsys):
    out, *_ = extended
    capsys.readouterr()
    run(_cfg(tiny_model_dirs, lm_student_dir, out, ["pandalm", "hh-helpful-base", "hh-helpful-online"]))
    log = capsys.readouterr().out
    assert "differs from the run's only in what is evaluated" in log
    assert "trained earlier, reusing its weights" in log and "teacher done earlier" in log
    assert "scoring naive on hh-helpful-online" in log
    assert "scoring naive on pandalm" not in log
    for what in ("teacher ", "student naive:", "student anchor:", "student ceiling:"):  # no training line
        assert f"seed 0: {what}" not in log.replace("teacher done", "").replace("scoring", ""), what


def test_a_change_to_training_inputs_still_needs_overwrite(tiny_model_dirs, lm_student_dir, extended):
    out, *_ = extended
    cfg = _cfg(tiny_model_dirs, lm_student_dir, out, ["pandalm"])
    cfg2 = cfg.model_copy(update={"seeds": [1]})
    assert training_digest(cfg2) != training_digest(cfg)
    with pytest.raises(RunDirError, match="different config"):
        run(cfg2)


def test_the_training_digest_ignores_only_evaluation_settings(tiny_model_dirs, tmp_path):
    """Evaluation-only settings leave it unchanged; with drift logged during training (drift_interval > 0) the first
    OOD target's probe is a training input, so its settings count (the students would retrain)."""
    for interval in (0, 1):
        base = _cfg(tiny_model_dirs, tiny_model_dirs["teacher"], tmp_path, ["pandalm"], drift_interval=interval)
        d = json.loads(base.model_dump_json())
        for path, value, same in [
            (("data", "ood"), ["pandalm", "hh-helpful-base"], True),  # a target appended
            (("data", "ood"), ["hh-helpful-base", "pandalm"], not interval),  # a new first target
            (("data", "n_ood"), 5, not interval),
            (("bootstrap",), 500, True),
            (("drift_pairs",), 16, True),
            (("data", "n_student_train"), 11, False),
            (("student", "learning_rate"), 1e-3, False),
        ]:
            e = json.loads(json.dumps(d))
            tgt = e
            for k in path[:-1]:
                tgt = tgt[k]
            tgt[path[-1]] = value
            other = RunConfig.model_validate(e)
            assert (training_digest(other) == training_digest(base)) is same, (interval, path, value)
            assert other.digest() != base.digest()


def _claimed(tmp_path, cfg):
    """A run directory as claim_run_dir leaves it (config.yaml and run.json), without running anything."""
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    (tmp_path / "run.json").write_text(
        json.dumps({"config_digest": cfg.digest(), "training_digest": training_digest(cfg)})
    )
    return tmp_path


def test_a_refused_config_names_the_fields_that_changed_and_why_an_eval_setting_retrains(tmp_path):
    """The refusal without --overwrite says what differs from the run's config.yaml (it named only two digests),
    and why a change of an evaluation setting still needs --overwrite when drift is logged during training."""
    from w2s_shift.pipeline import prepare_run_dir

    models = {"name": "t", "bf16": False}
    base = {
        "output_dir": str(tmp_path),
        "data": {"sources": ["ultrafeedback"], "ood": ["pandalm"], "n_ood": 8},
        "teacher": models,
        "student": models,
        "methods": ["naive", {"name": "anchor", "anchor_lambda": 1.0}],
        "drift_interval": 1,
        "min_free_disk_mb": 0,
    }
    _claimed(tmp_path, RunConfig.model_validate(base))

    def refusal(**over):
        with pytest.raises(RunDirError) as e:
            prepare_run_dir(RunConfig.model_validate({**base, **over, "threads": 3}), overwrite=False)
        return str(e.value)

    msg = refusal(teacher={**models, "epochs": 3}, methods=["naive", {"name": "anchor", "anchor_lambda": 2.0}])
    assert "; changed: teacher.epochs 1.0 -> 3.0, methods.1.anchor_lambda 1.0 -> 2.0)" in msg
    assert "drift_interval" not in msg and "threads" not in msg
    msg = refusal(methods=["naive"])
    assert '; changed: methods ["naive", "anchor"] -> ["naive"])' in msg
    msg = refusal(data={**base["data"], "n_ood": 4})
    assert "changed: data.n_ood 8 -> 4; these are evaluation settings, but with drift_interval 1 > 0" in msg
    # the same evaluation change without drift logged in training is accepted (training stages kept)
    nodrift = {**base, "drift_interval": 0}
    _claimed(tmp_path, RunConfig.model_validate(nodrift))
    assert prepare_run_dir(RunConfig.model_validate({**nodrift, "data": {**base["data"], "n_ood": 4}}), False)


def test_a_cell_directory_is_refused_as_a_run_directory_even_with_overwrite(tiny_model_dirs, lm_student_dir, extended):
    out, cell, *_ = extended
    before = sorted(p.name for p in cell.iterdir())
    cfg = _cfg(tiny_model_dirs, lm_student_dir, cell, ["pandalm"])
    for overwrite in (False, True):
        with pytest.raises(RunDirError, match=r"is a cell directory .* of the run in"):
            run(cfg, overwrite=overwrite)
    assert sorted(p.name for p in cell.iterdir()) == before  # nothing written into the cell


def test_a_json_lines_output_cut_at_a_line_boundary_redoes_its_stage(tmp_path):
    """A truncated JSON-lines file that still parses (cut right after a newline) is told apart by the row count
    the marker recorded; a marker without counts or hashes (older runs) falls back to the parse check."""
    from w2s_shift.io import write_jsonl_atomic
    from w2s_shift.pipeline.rundir import Stage

    (tmp_path / "rewards").mkdir()
    out = tmp_path / "rewards" / "naive__set.jsonl"
    write_jsonl_atomic(out, [{"id": str(i), "reward_chosen": 1.0, "reward_rejected": 0.0} for i in range(4)])
    stage = Stage(tmp_path, "score-naive__set", "d1")
    stage.finish(["rewards/naive__set.jsonl"])
    assert read_json(stage.marker)["jsonl_rows"] == {"rewards/naive__set.jsonl": 4}
    assert stage.done() and not Stage(tmp_path, "score-naive__set", "d2").done()
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]))
    assert len(read_jsonl(out)) == 2  # still parses
    assert not stage.done()
    info = read_json(stage.marker)
    del info["jsonl_rows"], info["sha256"]  # a marker of an older run: neither counts nor hashes
    stage.marker.write_text(json.dumps(info))
    assert stage.done()
    out.write_text("".join(lines[:2]) + lines[2][:5])  # cut inside a line: never parses
    assert not stage.done()


def test_a_json_lines_output_edited_in_place_redoes_its_stage(tmp_path):
    """An output whose rows and count are kept but whose content changed (two pairs swapped, a reward flipped) no
    longer matches the SHA-256 its marker recorded: the stage is not done, so a rerun scores again instead of
    reusing it; the same bytes again match."""
    from w2s_shift.io import write_jsonl_atomic
    from w2s_shift.pipeline.rundir import Stage

    (tmp_path / "rewards").mkdir()
    out = tmp_path / "rewards" / "naive__set.jsonl"
    rows = [{"id": str(i), "reward_chosen": float(i), "reward_rejected": 0.5} for i in range(4)]
    write_jsonl_atomic(out, rows)
    stage = Stage(tmp_path, "score-naive__set", "d1")
    stage.finish(["rewards/naive__set.jsonl"])
    assert read_json(stage.marker)["sha256"] == {"rewards/naive__set.jsonl": file_sha256(out)} and stage.done()
    for edited in ([rows[1], rows[0], *rows[2:]], [{**rows[0], "reward_chosen": 9.0}, *rows[1:]]):
        write_jsonl_atomic(out, edited)
        assert len(read_jsonl(out)) == 4 and not stage.done()
    write_jsonl_atomic(out, rows)
    assert stage.done()


def _one_naive(tiny_model_dirs, teacher, source, out) -> RunConfig:
    d = tiny_grid_dict(str(teacher), tiny_model_dirs["student"], out, ["pandalm"], ["naive"])
    d["data"]["sources"] = [{"path": str(source), "label": "src"}]
    return RunConfig.model_validate(d)


def _accuracies(metrics) -> dict:
    return metrics["cells"][0]["accuracy"]


def test_a_data_file_or_model_folder_changed_in_place_retrains_what_read_it(tiny_model_dirs, tmp_path, capsys):
    """The same paths with other content: rows swapped in the source file, then other teacher weights. The rerun in
    the same directory says which input changed, trains again, and gives a fresh run's numbers on the new content."""
    import shutil

    from safetensors.torch import load_file, save_file

    src_rows = [json.loads(x) for x in open("tests/malformed/data/good_source.jsonl", encoding="utf-8") if x.strip()]
    source = tmp_path / "src.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in src_rows), encoding="utf-8")
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dirs["teacher"], teacher)
    first = run(_one_naive(tiny_model_dirs, teacher, source, tmp_path / "run"))
    capsys.readouterr()

    flipped = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in src_rows]
    source.write_text("".join(json.dumps(r) + "\n" for r in flipped), encoding="utf-8")
    again = run(_one_naive(tiny_model_dirs, teacher, source, tmp_path / "run"))
    log = capsys.readouterr().out
    assert "data src" in log and "changed since the last run" in log, log
    assert "teacher done earlier" not in log and "trained earlier, reusing" not in log
    fresh = run(_one_naive(tiny_model_dirs, teacher, source, tmp_path / "control"))
    assert _accuracies(again) == _accuracies(fresh) != _accuracies(first)
    # ID accuracies on the swapped pairs mirror the first run's: the teacher learned the same pairs reversed
    assert _accuracies(again)["teacher"]["src"] != _accuracies(first)["teacher"]["src"]

    def teacher_rewards(out):
        return read_jsonl(out / "src" / "seed0" / "rewards" / "teacher__pandalm.jsonl")

    before = teacher_rewards(tmp_path / "run")
    w = teacher / "model.safetensors"
    sd = load_file(str(w))
    save_file({k: v * 1.5 if v.is_floating_point() else v for k, v in sd.items()}, str(w), metadata={"format": "pt"})
    capsys.readouterr()
    third = run(_one_naive(tiny_model_dirs, teacher, source, tmp_path / "run"))
    log = capsys.readouterr().out
    assert "teacher (" in log and "changed since the last run" in log and "teacher done earlier" not in log, log
    control = run(_one_naive(tiny_model_dirs, teacher, source, tmp_path / "control2"))
    assert _accuracies(third) == _accuracies(control)
    assert teacher_rewards(tmp_path / "run") == teacher_rewards(tmp_path / "control2") != before
    inputs = read_json(tmp_path / "run" / "inputs.json")["inputs"]
    assert set(inputs) == {"data src", "data pandalm", "teacher", "student"}


def test_dataset_names_with_the_separator_keep_their_own_rewards(tiny_model_dirs, tmp_path):
    """Targets x__y.jsonl and y.jsonl beside a naive student and a ceiling: every (model, target) has its own rewards
    file, and naive's accuracy on x__y is the one a control run gives the same file under another name (before,
    a ceiling labelled naive__x wrote naive__x__y.jsonl over naive's; such a label is now refused)."""
    import shutil

    from w2s_shift.config import ConfigError
    from w2s_shift.data.adapters import load_named

    rows = [json.dumps(p.to_json()) + "\n" for p in load_named("pandalm", skip_invalid=True).pairs[:15]]
    data = tmp_path / "data"
    data.mkdir()
    (data / "x__y.jsonl").write_text("".join(rows), encoding="utf-8")
    (data / "y.jsonl").write_text("".join(rows[5:]), encoding="utf-8")
    shutil.copy(data / "x__y.jsonl", data / "z.jsonl")

    def grid(out, targets, ceiling_label="ceiling"):
        methods = ["naive", {"name": "ceiling", "label": ceiling_label}]
        d = tiny_grid_dict(
            tiny_model_dirs["teacher"], tiny_model_dirs["student"], out, [str(data / t) for t in targets], methods
        )
        d["data"]["n_ood"] = None
        return RunConfig.model_validate(d)

    got = run(grid(tmp_path / "run", ["x__y.jsonl", "y.jsonl"]))["cells"][0]
    control = run(grid(tmp_path / "control", ["z.jsonl", "y.jsonl"]))["cells"][0]
    assert got["accuracy"]["naive"]["x__y"] == control["accuracy"]["naive"]["z"]
    assert got["accuracy"]["ceiling"]["y"] == control["accuracy"]["ceiling"]["y"]
    assert got["n_pairs"]["x__y"] == 15 and got["n_pairs"]["y"] == 10
    files = {p.name for p in (tmp_path / "run" / "ultrafeedback" / "seed0" / "rewards").glob("*.jsonl")}
    assert {"naive__x__y.jsonl", "naive__y.jsonl", "ceiling__x__y.jsonl", "ceiling__y.jsonl"} <= files
    with pytest.raises((ConfigError, ValueError), match="may not contain '__'"):
        grid(tmp_path / "bad", ["x__y.jsonl", "y.jsonl"], ceiling_label="naive__x")


def test_content_hashes_are_read_back_while_size_and_mtime_are_unchanged(tmp_path, monkeypatch):
    """inputs.json carries each file's sha256 with its size and modification time: a rerun reads a file again only
    when one of them changed (a 500 MB weights file is not hashed on every run)."""
    import hashlib
    import os

    import w2s_shift.io as wio

    f = tmp_path / "weights.bin"
    f.write_bytes(b"abc")
    records = wio.sha256_records([f])
    assert records[str(f.resolve())]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    monkeypatch.setattr(wio, "SHA256_CACHE", {})  # a new process
    wio.remember_sha256(records)
    monkeypatch.setattr(wio, "open", lambda *a, **k: pytest.fail("read again"), raising=False)
    assert wio.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    f.write_bytes(b"abd")  # same size, new mtime
    os.utime(f, ns=(10**18, 10**18))
    monkeypatch.undo()
    assert wio.file_sha256(f) == hashlib.sha256(b"abd").hexdigest()

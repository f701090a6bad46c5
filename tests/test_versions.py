"""Stale stages: stage digests include the package version and per-stage format versions; a run
directory holding stages computed by other code is refused without --overwrite, naming the stages to recompute."""

import json
from types import SimpleNamespace

import pytest

from w2s_shift import versions
from w2s_shift.config import RunConfig
from w2s_shift.pipeline import RunDirError, prepare_run_dir, stale_stages
from w2s_shift.pipeline.stages import teacher_digest
from w2s_shift.versions import STAGE_FORMATS, stage_kind, stage_versions


def _cfg(out):
    return RunConfig.model_validate(
        {"output_dir": str(out), "teacher": {"name": "t", "bf16": False}, "student": {"name": "s", "bf16": False}}
    )


def test_stage_versions_hold_the_package_and_the_formats_a_stage_reads():
    from w2s_shift import __version__

    assert stage_versions("teacher") == {
        "w2s_shift": __version__,
        "render": STAGE_FORMATS["render"],
        "teacher": STAGE_FORMATS["teacher"],
    }
    assert set(stage_versions("student")) == {"w2s_shift", "render", "teacher", "seam", "student"}
    assert [stage_kind(n) for n in ("teacher", "seam-4-0.5", "student-anchor-L3-4-lam1e-4")] == [
        "teacher",
        "seam",
        "student",
    ]
    with pytest.raises(ValueError, match="unknown stage 'labels'"):
        stage_kind("labels")


def test_render_version_comes_from_the_render_module():
    from w2s_shift.data import render

    assert STAGE_FORMATS["render"] == getattr(render, "RENDER_VERSION", 1)


def test_the_teacher_digest_changes_with_the_package_and_the_stage_format(tmp_path, monkeypatch):
    ctx = SimpleNamespace(data_digest="abc", cfg=_cfg(tmp_path))
    base = teacher_digest(ctx, 0)
    monkeypatch.setitem(versions.STAGE_FORMATS, "teacher", STAGE_FORMATS["teacher"] + 1)
    bumped = teacher_digest(ctx, 0)
    monkeypatch.setattr(versions, "__version__", "99.0")
    assert len({base, bumped, teacher_digest(ctx, 0)}) == 3


def _marker(path, versions_=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"digest": "d", "outputs": []}
    if versions_ is not None:
        info["versions"] = versions_
    path.write_text(json.dumps(info))


def test_a_run_dir_written_by_other_code_is_refused_naming_the_stale_stages(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config_digest": cfg.digest(), "w2s_shift_version": "0.0.9"}))
    cell = tmp_path / "ultrafeedback" / "seed0" / "stages"
    _marker(cell / "teacher.json", stage_versions("teacher"))  # current: kept
    _marker(cell / "student-naive.json")  # written before versions were recorded
    old = {**stage_versions("student"), "student": STAGE_FORMATS["student"] - 1}
    _marker(tmp_path / "ultrafeedback" / "seed1" / "stages" / "student-anchor.json", old)
    assert stale_stages(tmp_path) == ["ultrafeedback/seed0/student-naive", "ultrafeedback/seed1/student-anchor"]
    with pytest.raises(RunDirError) as e:
        prepare_run_dir(cfg, overwrite=False)
    msg = str(e.value)
    assert "written by w2s-shift 0.0.9" in msg and "2 finished stage(s)" in msg and "--overwrite" in msg
    assert "ultrafeedback/seed0/student-naive, ultrafeedback/seed1/student-anchor" in msg
    assert "seed0/teacher" not in msg
    assert prepare_run_dir(cfg, overwrite=True) == tmp_path  # --overwrite recomputes them (their digests differ)


def test_a_run_dir_of_this_code_is_accepted(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config_digest": cfg.digest()}))
    _marker(tmp_path / "a" / "seed0" / "stages" / "teacher.json", stage_versions("teacher"))
    _marker(tmp_path / "a" / "seed0" / "stages" / "seam-4-0.5.json", stage_versions("seam"))
    assert stale_stages(tmp_path) == []
    assert prepare_run_dir(cfg, overwrite=False) == tmp_path


def test_a_different_config_written_by_other_code_names_both(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config_digest": "0" * 16, "w2s_shift_version": "0.0.9"}))
    _marker(tmp_path / "a" / "seed0" / "stages" / "teacher.json")
    with pytest.raises(
        RunDirError, match=r"different config .*; it was written by w2s-shift 0\.0\.9 .*a/seed0/teacher"
    ):
        prepare_run_dir(cfg, overwrite=False)

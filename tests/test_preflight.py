"""Every model of the run is load-checked before any training, so a broken student is found
before the teacher trains, no run.json is written, and the fixed config then runs in the same directory
without --overwrite. Tiny random-init models (tests/conftest.py), the tiny run of the malformed corpus."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from test_malformed_corpus import CASE_DIR, TINY_RUN, _fill

from w2s_shift.cli import main
from w2s_shift.models.loading import ModelError
from w2s_shift.pipeline import load_check


def _argv(tiny_model_dirs, tmp_path, *extra) -> list:
    subs = {
        "case_dir": str(CASE_DIR),
        "tmp": str(tmp_path),
        "model_dirs.student": tiny_model_dirs["student"],
        "model_dirs.teacher": tiny_model_dirs["teacher"],
    }
    return ["run"] + [_fill(a, subs) for a in TINY_RUN] + list(extra)


def _student_copy(tiny_model_dirs, tmp_path, name="bad_student") -> Path:
    d = tmp_path / name
    shutil.copytree(tiny_model_dirs["student"], d)
    return d


def _assert_nothing_trained(run_dir: Path, out: str) -> None:
    assert not (run_dir / "run.json").exists() and not (run_dir / "config.yaml").exists()
    made = [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")] if run_dir.exists() else []
    assert not [p for p in made if "stages" in p or "teacher_labels" in p or "checkpoints" in p], made
    assert ": teacher " not in out and "gold pairs" not in out, out  # the teacher stage's line never printed


def test_a_truncated_student_stops_the_run_before_the_teacher_and_the_fix_reruns(
    tiny_model_dirs, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    bad = _student_copy(tiny_model_dirs, tmp_path)
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    run_dir = tmp_path / "run"
    assert main(_argv(tiny_model_dirs, tmp_path, "--set", f"student.name={bad}")) == 2
    out = capsys.readouterr()
    line = [x for x in out.err.splitlines() if x.startswith("w2s-shift: error: ")][0]
    assert line.startswith(
        f"w2s-shift: error: student.name: {bad}: model.safetensors: not a valid safetensors file, truncated or corrupt"
    ), line
    assert "Traceback" not in out.err
    _assert_nothing_trained(run_dir, out.out)
    # the fixed config runs into the same directory without --overwrite (no run.json claimed it)
    assert main(_argv(tiny_model_dirs, tmp_path)) == 0, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    assert "preflight: teacher" in out and (run_dir / "run.json").is_file() and (run_dir / "metrics.json").is_file()


@pytest.mark.parametrize("what", ["not_gguf", "no_weights", "missing_layer", "bigger_config"])
def test_a_broken_student_is_refused_before_any_training(what, tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = _student_copy(tiny_model_dirs, tmp_path)
    if what == "not_gguf":
        bad = tmp_path / "student.gguf"
        bad.write_bytes(b"PK\x03\x04 a zip file, not GGUF" * 4)
        want = [f"student.name: {bad}: not a GGUF file", "b'PK\\x03\\x04'"]
    elif what == "no_weights":
        (bad / "model.safetensors").unlink()
        want = [f"student.name: {bad}: no weights file"]
    elif what == "missing_layer":  # the tiny Llama has 4 layers: drop the last one's weights
        sd = {k: v for k, v in load_file(str(bad / "model.safetensors")).items() if not k.startswith("layers.3.")}
        save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
        want = [f"student.name: {bad}: the checkpoint lacks 9 weight(s)", "layers.3."]
    else:
        import json

        c = json.loads((bad / "config.json").read_text())
        c["intermediate_size"] = 128
        (bad / "config.json").write_text(json.dumps(c))
        want = [f"student.name: {bad}: the weights' shapes do not match config.json", "[64, 32] in the file, [128, 32]"]
    assert main(_argv(tiny_model_dirs, tmp_path, "--set", f"student.name={bad}")) == 2
    out = capsys.readouterr()
    for w in want:
        assert w in out.err, (w, out.err[-2000:])
    _assert_nothing_trained(tmp_path / "run", out.out)


def test_load_check_passes_the_intact_tiny_models(tiny_model_dirs):
    load_check(tiny_model_dirs["student"])
    load_check(tiny_model_dirs["teacher"])


def test_load_check_names_the_teacher_key_too(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad_teacher"
    shutil.copytree(tiny_model_dirs["teacher"], bad)
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")  # a header that claims 8 bytes
    assert main(_argv(tiny_model_dirs, tmp_path, "--set", f"teacher.name={bad}")) == 2
    err = capsys.readouterr().err
    assert f"teacher.name: {bad}: model.safetensors: not a valid safetensors file" in err, err[-2000:]
    with pytest.raises(ModelError, match="truncated or corrupt"):
        load_check(str(bad))


@pytest.mark.parametrize(
    "name, said",
    [
        ("smollm2-135", "nearest preset: smollm2-135m"),
        ("org/model-that-does-not-exist", "presets: smollm2-135m, minilm-l6"),
    ],
)
def test_an_uncached_hub_name_offline_is_refused_before_any_training(
    name, said, tiny_model_dirs, tmp_path, monkeypatch, capsys
):
    """Offline, a student name that is no preset, no folder and not in the hub cache stops the run up front."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tiny_model_dirs, tmp_path, "--set", f"student.name={name}")) == 2
    out = capsys.readouterr()
    line = [x for x in out.err.splitlines() if x.startswith("w2s-shift: error: ")][0]
    assert line == (
        f"w2s-shift: error: student.name: {name}: not a preset, a local folder or a model in the hub cache, and the "
        f"hub cannot be reached (offline); {said}"
    ), line
    _assert_nothing_trained(tmp_path / "run", out.out)


def test_a_hub_name_in_the_hub_cache_passes_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from w2s_shift.pipeline.preflight import check_hub_id

    snap = tmp_path / "hub" / "models--org--cached" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--cached" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    check_hub_id("org/cached")
    with pytest.raises(ModelError, match="org/missing: not a preset"):
        check_hub_id("org/missing")

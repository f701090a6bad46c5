"""One writer per run directory for every command that writes one (report, evaluate, export, bon; `score --out`
refused inside a run), tested with two real processes: one held between reading metrics.json and writing (the
fault points of w2s_shift.pipeline.rundir), the other refused at once, and no update lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_error, tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.data.adapters import load_named
from w2s_shift.io import read_json
from w2s_shift.pipeline import run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def finished(tiny_model_dirs, lm_student_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("onewriter") / "run"
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, out, ["hh-helpful-base"], ["naive"])
    d["drift_interval"] = 0
    run(RunConfig.model_validate(d))
    return out


def _target(folder: Path, name: str) -> str:
    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "id": f"p{i}"}
        for i, p in enumerate(load_named("pandalm", skip_invalid=True).pairs[:6])
    ]
    f = folder / f"{name}.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(f)


def _held(argv: list, point: str, hold_dir: Path) -> subprocess.Popen:
    """``w2s-shift ARGV`` in another process, held at the fault point ``point`` until :func:`_release`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "W2S_SHIFT_HOLD": point, "W2S_SHIFT_HOLD_DIR": str(hold_dir)}
    p = subprocess.Popen(
        [sys.executable, "-m", "w2s_shift", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 240
    while not (hold_dir / f"{point}.held").exists():
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            out, err = p.communicate()
            pytest.fail(f"{argv[0]} never reached {point} (exit {p.returncode}): {err[-2000:]}")
        time.sleep(0.05)
    return p


def _release(p: subprocess.Popen, point: str, hold_dir: Path) -> tuple:
    (hold_dir / f"{point}.go").touch()
    out, err = p.communicate(timeout=300)
    return p.returncode, err


def _report_names(run_dir: Path) -> str:
    return (run_dir / "report.md").read_text(encoding="utf-8")


def test_evaluate_waits_its_turn_while_report_reads(finished, tmp_path, capsys):
    """A report that has read metrics.json holds the run: an evaluate is refused at once (naming the PID), so the
    report cannot write a report without the evaluate's target after the evaluate wrote it (the lost update)."""
    target = _target(tmp_path, "sideone")
    p = _held(["report", str(finished)], "report:read", tmp_path)
    try:
        err = cli_error(capsys, ["evaluate", str(finished), target])
        assert f"another w2s-shift report (PID {p.pid} " in err and "is writing to this run directory" in err
        assert "wait for it to finish (`w2s-shift evaluate ... --wait`) or run `w2s-shift evaluate` again" in err
        assert "output_dir" not in err
    finally:
        code, perr = _release(p, "report:read", tmp_path)
    assert code == 0, perr
    assert main(["evaluate", str(finished), target]) == 0
    names = [e["name"] for e in read_json(finished / "metrics.json")["evaluated_targets"]]
    assert "sideone" in names and "sideone" in _report_names(finished)


def test_report_waits_its_turn_while_evaluate_reads(finished, tmp_path, capsys):
    """An evaluate that has read metrics.json holds the run: a report is refused at once, and with --wait it runs
    after the evaluate and renders its target."""
    target = _target(tmp_path, "sidetwo")
    p = _held(["evaluate", str(finished), target], "evaluate:read", tmp_path)
    try:
        err = cli_error(capsys, ["report", str(finished)])
        assert f"another w2s-shift evaluate (PID {p.pid} " in err and "is writing to this run directory" in err
        assert "(`w2s-shift report ... --wait`) or run `w2s-shift report` again once it has" in err, err
        waiting = subprocess.Popen(
            [sys.executable, "-m", "w2s_shift", "report", str(finished), "--wait"],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 120
        while "waiting for it to finish" not in (waiting.stderr.readline() or "") and time.time() < deadline:
            pass  # the waiting report says whom it waits for, then blocks on the lock
    finally:
        code, perr = _release(p, "evaluate:read", tmp_path)
    assert code == 0, perr
    out, werr = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, werr
    # the waiting report wrote last, after the evaluate's metrics.json, and its report holds the target
    assert (finished / "report.md").stat().st_mtime_ns >= (finished / "metrics.json").stat().st_mtime_ns
    assert "sidetwo" in _report_names(finished) and out
    assert "sidetwo" in [e["name"] for e in read_json(finished / "metrics.json")["evaluated_targets"]]


@pytest.mark.parametrize("where", ["metrics.json", "scores.jsonl", "ultrafeedback/seed0/rewards/x.jsonl"])
def test_score_out_into_a_run_directory_is_refused(finished, tiny_model_dirs, tmp_path, capsys, where):
    before = (finished / "metrics.json").read_bytes()
    data = _target(tmp_path, "pairs")
    err = cli_error(capsys, ["score", tiny_model_dirs["teacher"], data, "--out", str(finished / where)])
    assert f"lies in the run directory {finished}" in err and "give a file outside it" in err
    assert (finished / "metrics.json").read_bytes() == before
    assert not (finished / "scores.jsonl").exists()


def test_export_out_of_space_exits_2_naming_the_file_and_the_limit(finished):
    """An export that runs out of space (here the file size limit, ulimit -f, in a real process: the same EFBIG path
    as a full disk's ENOSPC through safetensors' own writer) exits 2 naming the file and the free space, with no
    folder or temporary folder left behind."""
    import resource

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    p = subprocess.run(
        [sys.executable, "-m", "w2s_shift", "export", str(finished), "naive"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=small_files,
        capture_output=True,
        text=True,
        timeout=300,
    )
    export = finished / "ultrafeedback" / "seed0" / "export"
    assert p.returncode == 2, p.stderr
    assert "w2s-shift: error: cannot write this result file: File too large (" in p.stderr
    assert (
        f"MiB free on its disk; or the file size limit, ulimit -f, was reached): {export}/naive/model.safetensors\n"
        in (p.stderr)
    )
    assert "Traceback" not in p.stderr and "SafetensorError" not in p.stderr
    assert not export.exists() or list(export.iterdir()) == []

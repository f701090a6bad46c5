"""One writer per run directory: an OS lock on RUN_DIR/.lock, tested with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from w2s_shift.cli import main
from w2s_shift.runlock import RunLock, RunLockError

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "malformed" / "data"

HOLD = (
    "import sys, time; from w2s_shift.runlock import RunLock; l = RunLock(sys.argv[1]).acquire(); "
    "print('locked', flush=True); time.sleep(float(sys.argv[2]))"
)


def _holder(run_dir: Path, seconds: float) -> subprocess.Popen:
    """A second process that takes the run directory's lock, says so, and keeps it ``seconds``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), str(seconds)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert p.stdout.readline().strip() == "locked"
    return p


def _run_argv(run_dir: Path, *extra) -> list:
    return [
        "run",
        "--output-dir",
        str(run_dir),
        "--set",
        f"data.source={DATA}/good_source.jsonl",
        "--set",
        f"data.ood=[{DATA}/good_ood.jsonl]",
        "--set",
        "teacher.name=./no/such/teacher",
        "--set",
        "student.name=./no/such/student",
        "--set",
        "methods=[naive]",
        *extra,
    ]


def test_a_second_run_refuses_at_once_naming_the_pid(tmp_path, capsys):
    run_dir = tmp_path / "run"
    p = _holder(run_dir, 60)
    try:
        assert main(_run_argv(run_dir, "--overwrite")) == 2
        out, err = capsys.readouterr()
        assert f"PID {p.pid} " in err and "--wait" in err and str(run_dir) in err, err
        assert "data: source" not in out  # at once, before any data or model is loaded
        assert not (run_dir / "run.json").exists() and not (run_dir / "config.yaml").exists()
    finally:
        p.kill()
        p.wait()
    # the holder was killed (SIGKILL): its lock died with it, the next run is not blocked by the lock
    assert p.returncode == -signal.SIGKILL
    assert main(_run_argv(run_dir)) == 2
    err = capsys.readouterr().err
    assert "no/such/teacher" in err and "PID" not in err, err


def test_wait_blocks_until_the_holder_ends(tmp_path, capsys):
    run_dir = tmp_path / "run"
    p = _holder(run_dir, 1.5)
    t = time.time()
    with pytest.raises(RunLockError, match=f"PID {p.pid} "):
        RunLock(run_dir).acquire()
    with RunLock(run_dir, wait=True) as lock:
        waited = time.time() - t
        assert p.wait(5) == 0
        assert f'"pid": {os.getpid()}' in lock.path.read_text()
    assert 0.5 < waited < 20
    assert f"held by w2s-shift run, PID {p.pid} " in capsys.readouterr().err
    # released: a fresh process takes it at once
    q = _holder(run_dir, 0)
    assert q.wait(10) == 0


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLockError, match=f"PID {os.getpid()} "):
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()


# ---------------------------------------------------------------------------------------------------------
# a directory holding results but no run.json


@pytest.mark.parametrize("what", ["config.yaml", "metrics.json", "src/seed0"])
def test_results_without_run_json_are_not_replaced_without_overwrite(tmp_path, capsys, what):
    from w2s_shift.config_io import load_config
    from w2s_shift.pipeline import RunDirError, prepare_run_dir

    run_dir = tmp_path / "run"
    target = run_dir / what
    if what.endswith("seed0"):
        target.mkdir(parents=True)
    else:
        run_dir.mkdir()
        target.write_text("{}")
    assert main(_run_argv(run_dir)) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} holds results ({what}) but no run.json" in err and "--overwrite" in err, err
    cfg = load_config(None, [f"output_dir={run_dir}"])
    with pytest.raises(RunDirError, match="no run.json"):
        prepare_run_dir(cfg, overwrite=False)
    assert prepare_run_dir(cfg, overwrite=True) == run_dir
    # an empty directory, or one holding only the lock file, is free to use
    empty = tmp_path / "empty"
    RunLock(empty).acquire().release()
    assert prepare_run_dir(load_config(None, [f"output_dir={empty}"]), overwrite=False) == empty


# ---------------------------------------------------------------------------------------------------------
# ANCHOR layers checked offline


def test_anchor_layers_duplicates_and_out_of_range_are_refused_offline(capsys):
    from w2s_shift.config import ConfigError
    from w2s_shift.config_io import check_anchor_layers_offline, load_config

    with pytest.raises(ConfigError, match=r"repeats layer\(s\) \[4\]"):
        load_config(None, ["methods=[{name: anchor, anchor_layers: [4, 4]}]"])
    cfg = load_config(None, ["student.name=smollm2-135m", "methods=[{name: anchor, anchor_layers: [99]}]"])
    with pytest.raises(
        ConfigError, match=r"anchor_layers \[99\] outside 1..30: the student smollm2-135m has 30 layers"
    ):
        check_anchor_layers_offline(cfg)
    check_anchor_layers_offline(
        load_config(None, ["student.name=smollm2-135m", "methods=[{name: anchor, anchor_layers: [30]}]"])
    )

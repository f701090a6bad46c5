"""Faults: a run SIGKILLed inside each stage (teacher training, labelling, student training, evaluation) resumes
on rerun and reaches the same metrics, bit for bit on CPU, as an uninterrupted run with the same seed; the same
seed twice gives identical metrics."""

import os
import signal
import subprocess
import sys

import pytest
import yaml

from w2s_shift.config_io import load_config
from w2s_shift.pipeline import run

KILL_POINTS = [
    "teacher:step3",
    "teacher:labels",
    "student-naive:step2",
    "student-naive:eval",
    "student-anchor:step3",
    "student-anchor-auto:step4",  # the drift budget: the resumed run continues from the checkpoint's lambda
]


def _config(tiny_model_dirs, out) -> dict:
    return {
        "output_dir": str(out),
        "seed": 0,
        "data": {
            "source": "ultrafeedback",
            "ood": ["hh-helpful-base"],
            "n_teacher_train": 24,
            "n_student_train": 20,
            "n_test": 12,
            "n_ood": 10,
            "skip_invalid": True,
        },
        "teacher": {"name": tiny_model_dirs["teacher"], "max_length": 48, "epochs": 1, "batch_size": 4, "bf16": False},
        "student": {
            "name": tiny_model_dirs["student"],
            "max_length": 48,
            "trainable_layers": 2,
            "epochs": 1,
            "batch_size": 4,
            "bf16": False,
            "learning_rate": 1e-3,
        },
        "methods": [
            "naive",
            {"name": "anchor", "anchor_lambda": 1e-2},
            {"name": "anchor", "anchor_lambda": "auto", "anchor_target_drift": 1e-6, "label": "anchor-auto"},
        ],
        "bootstrap": 100,
        "drift_pairs": 8,
        "drift_interval": 2,
        "checkpoint_fraction": 0.2,
    }


TIMING_KEYS = {
    "wall_seconds",
    "wall_seconds_this_run",
    "timings",
    "timings_seconds",
    "seconds",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
}


def _untimed(obj, where=""):
    """``obj`` without timing fields (wall-clock seconds, throughput) and the run directory's own path."""
    if isinstance(obj, dict):
        return {k: _untimed(v, f"{where}.{k}") for k, v in obj.items() if k not in TIMING_KEYS and k != "output_dir"}
    if isinstance(obj, list):
        return [_untimed(v, where) for v in obj]
    return obj


def _diff(a, b, where="metrics"):
    """The paths where two JSON values differ (for a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in set(a) ^ set(b)]
        return out + [d for k in a.keys() & b.keys() for d in _diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {str(a)[:120]} != {str(b)[:120]}"]


def _assert_same_metrics(run_dir, reference):
    """The whole metrics.json of a resumed run equals the uninterrupted run's, timings aside."""
    import json

    got = json.loads((run_dir / "metrics.json").read_text())
    want = json.loads(json.dumps(reference))
    diff = _diff(_untimed(got), _untimed(want))
    assert not diff, "\n".join(diff[:20])


def _accuracies(metrics):
    return [(c["source"], c["seed"], c["accuracy"]) for c in metrics["cells"]]


@pytest.fixture(scope="module")
def reference_metrics(tiny_model_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    return run(load_config(_write(_config(tiny_model_dirs, out), out.parent / "ref.yaml")))


def _write(d: dict, path):
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_same_seed_twice_gives_identical_metrics(tiny_model_dirs, reference_metrics, tmp_path):
    again = run(load_config(_write(_config(tiny_model_dirs, tmp_path / "again"), tmp_path / "c.yaml")))
    assert _accuracies(again) == _accuracies(reference_metrics)
    assert again["cells"][0]["metrics"] == reference_metrics["cells"][0]["metrics"]


def test_kill_in_every_stage_then_resume_reaches_the_same_metrics(tiny_model_dirs, reference_metrics, tmp_path):
    """One run directory, killed at each point in turn (each rerun resumes and is killed at the next point); the
    last rerun finishes. Every kill must really happen (exit by SIGKILL), and leave work to resume."""
    out = tmp_path / "killed"
    cfg = _write(_config(tiny_model_dirs, out), tmp_path / "c.yaml")
    cell = out / "ultrafeedback" / "seed0"
    for point in KILL_POINTS:
        env = {**os.environ, "W2S_SHIFT_FAULT": point}
        p = subprocess.run(
            [sys.executable, "-m", "w2s_shift", "run", cfg], env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == -signal.SIGKILL, (point, p.returncode, p.stderr[-2000:])
        assert not (out / "metrics.json").exists()
        if point == "teacher:step3":  # a finished checkpoint to resume training from
            assert list((cell / "checkpoints").glob("teacher-*/checkpoint-*/trainer_state.json"))
        if point == "teacher:labels":  # trained weights kept; the stage itself is not marked done
            assert (cell / "models" / "teacher.safetensors").is_file() and not (
                cell / "stages" / "teacher.json"
            ).exists()
        if point == "student-naive:eval":  # trained and marked; its first scoring stage not marked done
            assert (cell / "stages" / "student-naive.json").exists()
            assert not (cell / "stages" / "score-naive__ultrafeedback.json").exists()
    final = run(load_config(cfg))
    assert _accuracies(final) == _accuracies(reference_metrics)
    assert final["cells"][0]["metrics"] == reference_metrics["cells"][0]["metrics"]
    _assert_same_metrics(out, reference_metrics)  # training logs, train_loss and drift during training included
    assert not list((cell / "checkpoints").glob("*/checkpoint-*"))  # cleaned up once the weights are saved


def test_a_truncated_result_file_is_never_read_as_complete(tiny_model_dirs, reference_metrics, tmp_path):
    """Truncate every kind of artifact of a finished run; the rerun redoes exactly what depends on it."""
    import shutil

    src = tmp_path / "src"
    cfgd = _config(tiny_model_dirs, src)
    run(load_config(_write(cfgd, tmp_path / "c.yaml")))
    for rel in (
        "teacher_labels.jsonl",
        "rewards/naive__hh-helpful-base.jsonl",
        "drift/anchor.json",
        "logs/naive.jsonl",
    ):
        d = tmp_path / rel.replace("/", "_")
        shutil.copytree(src, d)
        f = d / "ultrafeedback" / "seed0" / rel
        f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 2)])
        m = run(load_config(_write({**cfgd, "output_dir": str(d)}, tmp_path / "d.yaml")))
        assert _accuracies(m) == _accuracies(reference_metrics), rel
        _assert_same_metrics(d, reference_metrics)  # a stage redone from saved weights keeps its drift "during"


def _truncate(f):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


DAMAGES = {
    "model.safetensors": _truncate,
    "trainer_state.json": lambda f: f.write_text("{garbage"),
    "w2s_resume_state.json": lambda f: f.write_text("{garbage"),
    "optimizer.pt": _truncate,
}


def test_a_damaged_checkpoint_is_skipped_and_the_rerun_reaches_the_same_metrics(
    tiny_model_dirs, reference_metrics, tmp_path, capsys
):
    """Killed after a student checkpoint, one file of that checkpoint damaged: the rerun names the checkpoint,
    starts that stage over (the only checkpoint kept) and ends with the uninterrupted run's metrics."""
    import shutil

    killed = tmp_path / "killed"
    cfgd = _config(tiny_model_dirs, killed)
    env = {**os.environ, "W2S_SHIFT_FAULT": "student-naive:step3"}
    p = subprocess.run(
        [sys.executable, "-m", "w2s_shift", "run", _write(cfgd, tmp_path / "k.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    for name, damage in DAMAGES.items():
        d = tmp_path / name
        shutil.copytree(killed, d)
        # the fault fires at the end of step 3, before that step's checkpoint: step 2's is the one kept
        (ckpt,) = (d / "ultrafeedback" / "seed0" / "checkpoints").glob("naive-*/checkpoint-*")
        assert (ckpt / "trainer_state.json").is_file() and ckpt.name == "checkpoint-2"
        damage(ckpt / name)
        capsys.readouterr()
        run(load_config(_write({**cfgd, "output_dir": str(d)}, tmp_path / "d.yaml")))
        said = [ln for ln in capsys.readouterr().out.splitlines() if "damaged checkpoint" in ln]
        assert len(said) == 1 and str(ckpt) in said[0] and name in said[0], (name, said)
        _assert_same_metrics(d, reference_metrics)


def test_the_newest_checkpoint_that_reads_back_is_chosen(tmp_path):
    """An unfinished checkpoint (no trainer_state.json) and a damaged one are passed over for an older good one."""
    import json

    import torch
    from safetensors.torch import save_file

    from w2s_shift.training.loop import last_complete_checkpoint

    for step in (2, 5, 7):
        c = tmp_path / f"checkpoint-{step}"
        c.mkdir()
        save_file({"w": torch.zeros(64)}, str(c / "model.safetensors"))
        torch.save({"s": 1}, c / "optimizer.pt")
        if step != 7:
            (c / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    _truncate(tmp_path / "checkpoint-5" / "optimizer.pt")
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    _truncate(tmp_path / "checkpoint-2" / "model.safetensors")
    assert last_complete_checkpoint(str(tmp_path)) is None

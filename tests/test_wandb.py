"""report_to: wandb through transformers' WandbCallback, offline (WANDB_MODE=offline, no account, no network): one
wandb run per trained model, grouped by grid cell, with the final ID/OOD metrics in its summary."""

import json
import struct
import sys

import pytest
import yaml
from conftest import tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.io import read_json
from w2s_shift.tracking import check_report_to, check_wandb_credentials, finish_wandb, wandb_run_id

wandb = pytest.importorskip("wandb")


def wandb_records(path) -> list:
    """The protobuf records of an offline run's ``run-<id>.wandb`` file (LevelDB log framing: a 7-byte file header,
    32 KiB blocks, 7-byte record headers crc32/length/type, type 1 full, 2-4 first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, out, buf = path.read_bytes(), [], b""
    assert data[:4] == b":W&B"
    pos = 7
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (n == 0 and kind == 0):
            pos += left
            continue
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
            buf = b""
    return out


def offline_run(folder, wait_s: float = 30.0) -> dict:
    """{"id", "group", "name", "summary": {key: value}} of one offline run folder. wandb's service process writes
    the file in the background; on a loaded machine its run record can land after ``wandb.finish`` returns, so the
    file is read again (up to ``wait_s`` seconds) until the record is there."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        (f,) = folder.glob("run-*.wandb")
        info = {"summary": {}}
        try:
            records = wandb_records(f)
        except Exception:  # a record cut mid-write: read again, or fail with the parse error at the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        for r in records:
            kind = r.WhichOneof("record_type")
            if kind == "run":
                info.update(id=r.run.run_id, group=r.run.run_group, name=r.run.display_name)
            elif kind == "summary":
                info["summary"].update(
                    {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.summary.update}
                )
        if "name" in info or time.monotonic() > deadline:
            return info
        time.sleep(0.5)


def test_wandb_offline_one_run_per_model_with_final_metrics(tiny_model_dirs, lm_student_dir, tmp_path, monkeypatch):
    for k in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_GROUP", "WANDB_RUN_ID", "WANDB_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], lm_student_dir, out, ["hh-helpful-base"], ["naive", "ceiling"], drift=False
    )
    d["report_to"] = ["wandb"]
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(d), encoding="utf-8")
    assert main(["run", str(f)]) == 0
    runs = [offline_run(p) for p in sorted((out / "wandb").glob("offline-run-*"))]
    group = "ultrafeedback/seed0"
    models = ("teacher", "naive", "ceiling")
    # each model's training, then its final metrics written into the same run (resumed by id)
    assert sorted((r["name"], r["group"], r["id"]) for r in runs) == sorted(
        (f"{group}/{m}", group, wandb_run_id(out, group, m)) for m in (*models, *models)
    )
    cell = read_json(out / "metrics.json")["cells"][0]
    for r in runs:
        model = r["name"].rsplit("/", 1)[1]
        if "accuracy/ultrafeedback" not in r["summary"]:
            assert r["summary"]["train_loss"] > 0 and "train/loss_w2s" in r["summary"]  # the training run
            continue
        s = r["summary"]
        assert s["accuracy/ultrafeedback"] == pytest.approx(cell["accuracy"][model]["ultrafeedback"])
        assert s["accuracy/hh-helpful-base"] == pytest.approx(cell["accuracy"][model]["hh-helpful-base"])
        assert [s["accuracy_ci95_low/ultrafeedback"], s["accuracy_ci95_high/ultrafeedback"]] == pytest.approx(
            cell["accuracy_ci95"][model]["ultrafeedback"]
        )
        assert s["n_pairs/hh-helpful-base"] == 8
        if model == "naive":
            assert s["NTS"] == pytest.approx(cell["metrics"]["naive"]["NTS"])
            assert s["AOG/hh-helpful-base"] == pytest.approx(cell["metrics"]["naive"]["AOG"]["hh-helpful-base"])
        else:
            assert "NTS" not in s
    assert sum("accuracy/ultrafeedback" in r["summary"] for r in runs) == 3


def test_report_to_is_checked_against_installed_packages(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ValueError, match=r"report_to wandb needs the wandb package: pip install -e '\.\[wandb\]'"):
        check_report_to(["wandb"])
    with pytest.raises(ValueError, match="report_to wandb needs"):
        RunConfig.model_validate({"report_to": ["wandb"]})


def test_wandb_without_credentials_or_offline_mode_is_refused_before_the_data_loads(
    tiny_model_dirs, tmp_path, monkeypatch, capsys
):
    """report_to [wandb] with no key and no WANDB_MODE stopped after data loading with wandb's UsageError
    ("unexpected error"); now the run stops at once, exit 2, saying how to log in or log offline."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "W2S_SHIFT_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", ["pandalm"], ["naive"])
    d["report_to"] = ["wandb"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(d), encoding="utf-8")
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "report_to wandb: no Weights & Biases credentials for api.wandb.ai" in err and "WANDB_MODE=offline" in err
    assert "unexpected error" not in err and not (tmp_path / "run").exists()
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password x\n")
    check_wandb_credentials(["wandb"])  # a `wandb login` entry: accepted
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb_credentials(["wandb"])


def test_finish_wandb_finishes_the_open_run_only(monkeypatch):
    """A launched process ends without exit hooks, so the command line finishes the last run itself."""
    import types

    calls = []
    fake = types.SimpleNamespace(run=object(), finish=lambda: calls.append("finish"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    finish_wandb()
    assert calls == ["finish"]
    fake.run = None
    finish_wandb()
    assert calls == ["finish"]  # no run open: nothing finished
    monkeypatch.delitem(sys.modules, "wandb")
    finish_wandb()  # wandb never imported: not imported now
    assert "wandb" not in sys.modules

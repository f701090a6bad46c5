"""Reuse only when the content is unchanged: a data file or model folder edited in place with its size and
modification time set back (as ``cp -p``, ``rsync -a`` or ``touch -r`` do) is hashed again, and the stages that read
it run again; hashes are still read back while a file is untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from conftest import tiny_grid_dict

import w2s_shift.io as wio
from w2s_shift.config import RunConfig
from w2s_shift.io import read_json
from w2s_shift.pipeline import run


def _same_size_edit(path, new_bytes: bytes) -> None:
    """Write ``new_bytes`` (the file's size) in place, then set the access and modification times back."""
    st = path.stat()
    assert len(new_bytes) == st.st_size
    with open(path, "r+b") as f:
        f.write(new_bytes)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_an_edit_with_size_and_mtime_set_back_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(wio, "SHA256_CACHE", {})
    f = tmp_path / "data.jsonl"
    f.write_bytes(b"abc")
    assert wio.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    records = wio.sha256_records([f])
    _same_size_edit(f, b"abd")
    assert wio.file_sha256(f) == hashlib.sha256(b"abd").hexdigest()
    # in a later process, from inputs.json's records: the edited file is read again
    monkeypatch.setattr(wio, "SHA256_CACHE", {})
    wio.remember_sha256(records)
    assert wio.file_sha256(f) == hashlib.sha256(b"abd").hexdigest()
    # a file replaced by another one (a new inode) with size and times copied over (cp -p, rsync -a)
    g = tmp_path / "new.jsonl"
    g.write_bytes(b"xyz")
    st = f.stat()
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(g, f)
    assert wio.file_sha256(f) == hashlib.sha256(b"xyz").hexdigest()


def test_records_of_an_untouched_file_are_read_back_and_old_records_are_hashed_again(tmp_path, monkeypatch):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"abc")
    records = wio.sha256_records([f])
    rec = records[str(f.resolve())]
    assert set(rec) == {"size", "mtime_ns", "ctime_ns", "ino", "sha256"} and rec["ino"] == f.stat().st_ino
    monkeypatch.setattr(wio, "SHA256_CACHE", {})
    wio.remember_sha256({str(f.resolve()): {**rec, "sha256": "recorded"}})
    assert wio.file_sha256(f) == "recorded"  # untouched: not read again
    monkeypatch.setattr(wio, "SHA256_CACHE", {})
    old = {k: v for k, v in rec.items() if k in ("size", "mtime_ns")}  # an inputs.json of older code
    wio.remember_sha256({str(f.resolve()): {**old, "sha256": "recorded"}})
    assert wio.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()


def _cfg(tiny_model_dirs, teacher, source, out) -> RunConfig:
    d = tiny_grid_dict(str(teacher), tiny_model_dirs["student"], out, ["pandalm"], ["naive"])
    d["data"]["sources"] = [{"path": str(source), "label": "src"}]
    return RunConfig.model_validate(d)


def test_a_rerun_after_edits_with_size_and_mtime_set_back_trains_again(tiny_model_dirs, tmp_path, capsys):
    """The source's pairs reversed and the teacher's weights scaled, each in place with its size and modification
    time set back: the rerun in the same directory names both inputs, trains the teacher again and gives a fresh
    run's numbers."""
    from safetensors.torch import load_file, save

    rows = [json.loads(x) for x in open("tests/malformed/data/good_source.jsonl", encoding="utf-8") if x.strip()]
    source = tmp_path / "src.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dirs["teacher"], teacher)
    first = run(_cfg(tiny_model_dirs, teacher, source, tmp_path / "run"))
    capsys.readouterr()

    flipped = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]
    _same_size_edit(source, "".join(json.dumps(r) + "\n" for r in flipped).encode("utf-8"))
    w = teacher / "model.safetensors"
    sd = load_file(str(w))
    _same_size_edit(w, save({k: v * 1.5 if v.is_floating_point() else v for k, v in sd.items()}, {"format": "pt"}))

    again = run(_cfg(tiny_model_dirs, teacher, source, tmp_path / "run"))
    log = capsys.readouterr().out
    assert "data src (" in log and "teacher (" in log and log.count("changed since the last run") == 2, log
    assert "teacher done earlier" not in log and "trained earlier, reusing" not in log, log
    fresh = run(_cfg(tiny_model_dirs, teacher, source, tmp_path / "control"))
    acc = again["cells"][0]["accuracy"]
    assert acc == fresh["cells"][0]["accuracy"] != first["cells"][0]["accuracy"]
    assert acc["teacher"]["src"] != first["cells"][0]["accuracy"]["teacher"]["src"]
    rec = read_json(tmp_path / "run" / "inputs.json")["files"][str(source.resolve())]
    assert rec["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest() and rec["ino"] == source.stat().st_ino

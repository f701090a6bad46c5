"""Bad input found by trying to break the CLI: each gets a clear message and exit code 2, never a traceback."""

import shutil

import pytest
from conftest import cli_error

from w2s_shift.cli import main
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import DataError
from w2s_shift.models.loading import ModelError, load_backbone


def test_set_with_invalid_yaml(capsys):
    assert "not valid YAML" in cli_error(capsys, ["run", "--set", "methods=[naive"])


def test_set_infinite_epochs_and_empty_lists(capsys):
    err = cli_error(capsys, ["run", "--set", "teacher.epochs=.inf", "--set", "data.ood=[]", "--set", "methods=[]"])
    assert "teacher.epochs" in err and "data.ood" in err and "methods" in err and "3 problem(s)" in err


def test_set_merges_into_a_missing_section(tmp_path):
    from w2s_shift.config_io import load_config

    f = tmp_path / "c.yaml"
    f.write_text("seed: 3\n")
    cfg = load_config(str(f), ["teacher.epochs=1"])
    assert cfg.teacher.name == "minilm-l6" and cfg.teacher.epochs == 1


def test_columns_must_map_known_fields_to_names(capsys, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  source: {path: x.jsonl, columns: {prompt: 5, chosen: [good], extra: y}}\n")
    err = cli_error(capsys, ["run", str(f)])
    assert "columns" in err


def test_report_of_a_missing_or_broken_run_dir(capsys, tmp_path):
    assert "nope: not a directory; give the directory of a finished" in cli_error(
        capsys, ["report", str(tmp_path / "nope")]
    )
    assert "metrics.json: not found; is" in cli_error(capsys, ["report", str(tmp_path)])
    (tmp_path / "metrics.json").write_text("{}")
    assert "metrics.json: no 'cells'" in cli_error(capsys, ["report", str(tmp_path)])


def test_data_without_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["data"])  # argparse prints the usage of `data` and exits


def test_duplicate_csv_columns_and_bom(tmp_path):
    f = tmp_path / "dup.csv"
    f.write_text("prompt,chosen,chosen,rejected\np,a,b,c\n")
    with pytest.raises(DataError, match="duplicate column name"):
        load_file(f)
    g = tmp_path / "bom.csv"
    g.write_bytes("\ufeffprompt,chosen,rejected\np,a,b\n".encode("utf-8"))
    assert [p.prompt for p in load_file(g).pairs] == ["p"]
    h = tmp_path / "bom.jsonl"
    h.write_bytes('\ufeff{"prompt": "p", "chosen": "a", "rejected": "b"}\n'.encode("utf-8"))
    assert len(load_file(h).pairs) == 1


def test_directory_as_data_file(tmp_path):
    d = tmp_path / "x.jsonl"
    d.mkdir()
    with pytest.raises(DataError, match="is a directory"):
        load_file(d)


def test_response_object_without_content(tmp_path):
    f = tmp_path / "o.jsonl"
    f.write_text('{"prompt": "p", "chosen": "a", "rejected": {"text": "b"}}\n')
    with pytest.raises(DataError, match="row 1, field 'rejected': expected a string or a message"):
        load_file(f)


def test_model_folder_without_tokenizer_and_a_plain_file(tiny_model_dirs, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_model_dirs['student']}/{f}", d / f)
    with pytest.raises(ModelError, match="no tokenizer files"):
        load_backbone(str(d))
    with pytest.raises(ModelError, match="is a file"):
        load_backbone(str(d / "model.safetensors"))


def test_labels_cannot_escape_the_run_directory(capsys):
    err = cli_error(capsys, ["run", "--set", "methods=[{name: naive, label: ../../evil}]"])
    assert "methods.0.label" in err
    from w2s_shift.config import DatasetRef

    assert DatasetRef(path="../x/my data.v2.jsonl").display == "my_data"
    assert DatasetRef(hf="org/../..").display == "dataset"


def _tiny_run_argv(tiny_model_dirs, tmp_path, out) -> list:
    """`run` of the malformed corpus's tiny run (tests/test_malformed_corpus.py) into ``out``."""
    from test_malformed_corpus import CASE_DIR, TINY_RUN

    subs = {"{case_dir}": str(CASE_DIR), "{tmp}": str(tmp_path)}
    subs |= {f"{{model_dirs.{k}}}": v for k, v in tiny_model_dirs.items()}
    args = []
    for a in TINY_RUN:
        for k, v in subs.items():
            a = a.replace(k, v)
        args.append(a)
    return ["run", *args, "--output-dir", str(out)]


def test_output_dir_naming_a_file_says_it_is_a_file(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """--output-dir naming a file (or a path under one) says so, not "[Errno 17] File exists"."""
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "results.txt"
    f.write_text("not a folder\n")
    err = cli_error(capsys, _tiny_run_argv(tiny_model_dirs, tmp_path, f))
    assert f"{f}: cannot write to the run directory: {f} is a file, not a directory" in err, err
    assert "Errno" not in err and f.read_text() == "not a folder\n"
    err = cli_error(capsys, _tiny_run_argv(tiny_model_dirs, tmp_path, f / "run"))
    assert f"{f / 'run'}: cannot write to the run directory: {f} is a file, not a directory" in err, err


def test_a_link_out_of_the_run_directory_is_refused(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """A sub-folder of the run directory that is a symbolic link to outside it is refused, naming the link,
    before anything is written through it; a link that stays inside the run directory is accepted."""
    monkeypatch.chdir(tmp_path)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "good_source" / "seed0").mkdir(parents=True)
    elsewhere.mkdir()
    link = run / "good_source" / "seed0" / "logs"
    link.symlink_to(elsewhere, target_is_directory=True)
    err = cli_error(capsys, [*_tiny_run_argv(tiny_model_dirs, tmp_path, run), "--overwrite"])  # refused even so
    assert f"{link}: a symbolic link to {elsewhere}, outside the run directory {run}" in err, err
    assert list(elsewhere.iterdir()) == [] and not (run / "config.yaml").exists()
    link.unlink()
    (run / "good_source" / "seed0" / "stages").mkdir()
    link.symlink_to(run / "good_source" / "seed0" / "stages", target_is_directory=True)
    from w2s_shift.pipeline.rundir import refuse_links_out_of

    refuse_links_out_of(run)  # inside the run directory: kept


def test_max_length_beyond_the_model_warns_and_records_the_length_used(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """student.max_length 100000 on the tiny Llama's 512 positions: a warning, and every stage marker (also in
    metrics.json) records the 512 tokens actually used, next to the config's 100000."""
    import json

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    argv = [*_tiny_run_argv(tiny_model_dirs, tmp_path, run), "--set", "student.max_length=100000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    want = "WARNING: student.max_length 100000 exceeds the 512 positions of"
    assert want in out and "it trains and is scored at 512 tokens" in out, out[-3000:]
    assert "WARNING: teacher.max_length" not in out
    stages = json.loads((run / "metrics.json").read_text())["cells"][0]["stages"]
    assert stages["student-naive"]["max_length"] == 512 and stages["teacher"]["max_length"] == 64
    assert stages["score-naive__good_ood"]["max_length"] == 512
    assert (
        json.loads((run / "good_source" / "seed0" / "stages" / "student-naive.json").read_text())["max_length"] == 512
    )


def test_disk_full_during_a_checkpoint_names_the_file_and_says_space_ran_out(
    tiny_model_dirs, tmp_path, monkeypatch, capsys
):
    """torch.save failing inside a checkpoint as it does on a full disk (a RuntimeError "[enforce fail at
    inline_container.cc:672] ..." after part of the file is written): exit 2 naming the checkpoint's file and that
    space ran out, not "unexpected error (RuntimeError) ... (please report it)"."""
    import torch

    real_save = torch.save

    def full_disk_save(obj, f, *args, **kwargs):
        if "checkpoint-" not in str(f):
            return real_save(obj, f, *args, **kwargs)
        with open(f, "wb") as out:
            out.write(b"PK\x03\x04 part of a zip")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2304 vs 2196")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("W2S_SHIFT_DEBUG", raising=False)
    monkeypatch.setattr(torch, "save", full_disk_save)
    run = tmp_path / "run"
    err = cli_error(capsys, [*_tiny_run_argv(tiny_model_dirs, tmp_path, run), "--set", "checkpoint_fraction=0.5"])
    ckpt = sorted(p for p in run.rglob("checkpoint-*") if p.is_dir())[0]
    written = max((p for p in ckpt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    assert written.read_bytes() == b"PK\x03\x04 part of a zip"
    assert f"could not write the checkpoint {ckpt}: the file {written} could not be written: no space left" in err, err
    assert "MiB free on its disk" in err and "training resumes from the last complete checkpoint" in err
    assert "unexpected error" not in err and "please report" not in err
    import errno

    from w2s_shift.training.trainer import is_write_failure

    assert is_write_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert is_write_failure(OSError(errno.EFBIG, "File too large"))  # ulimit -f
    assert not is_write_failure(OSError(errno.ENOENT, "No such file or directory"))
    assert not is_write_failure(RuntimeError("shape mismatch"))


def test_a_checkpoint_cut_at_the_file_size_limit_is_named_with_the_limit(tmp_path, monkeypatch):
    """Under `ulimit -f` the file that failed is the one cut at the limit; a smaller file written after it was named
    instead, and the message said the disk was full."""
    import os
    import resource

    from w2s_shift.training.trainer import checkpoint_write_error

    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "optimizer.pt").write_bytes(b"x" * 4096)  # cut at the limit
    later = folder / "rng_state.pth"
    later.write_bytes(b"small")
    os.utime(later, ns=(2**62, 2**62))  # newer than the cut file
    monkeypatch.setattr(resource, "getrlimit", lambda what: (4096, resource.RLIM_INFINITY))
    err = str(
        checkpoint_write_error(
            RuntimeError("[enforce fail at inline_container.cc:672] . file write failed"), str(tmp_path), 4
        )
    )
    assert f"the file {folder / 'optimizer.pt'} could not be written" in err, err
    assert "the file size limit (ulimit -f: 4096 bytes) was reached" in err and "raise the limit" in err
    assert "no space left" not in err


@pytest.mark.parametrize("code, what", [(28, "No space left on device"), (27, "File too large")])
def test_a_result_file_that_cannot_be_written_is_named(tmp_path, monkeypatch, capsys, code, what):
    """Disk full (or the file size limit) while metrics.json or report.html is written: the error named no file."""
    import os

    from w2s_shift.io import write_json_atomic

    def fail(fd):
        raise OSError(code, what)

    monkeypatch.setattr(os, "fsync", fail)
    target = tmp_path / "run" / "metrics.json"
    with pytest.raises(OSError) as e:
        write_json_atomic(target, {"cells": []})
    assert e.value.filename == str(target) and e.value.errno == code
    assert f"cannot write this result file: {what} (" in e.value.strerror and "MiB free on its disk" in e.value.strerror
    assert not target.exists() and list((tmp_path / "run").iterdir()) == []  # no temporary file left

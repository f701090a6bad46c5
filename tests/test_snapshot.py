"""`w2s-shift snapshot RUN OUT`: a run still going read through its finished seeds, every stage reused, RUN only
read (w2s_shift/pipeline/snapshot.py)."""

import json
import os
import re

import pytest
import yaml
from conftest import cli_error, tiny_grid_dict

from w2s_shift.config import RunConfig
from w2s_shift.io import read_json
from w2s_shift.pipeline import run


def _files(root):
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_snapshot_reads_the_finished_seeds_of_a_run_still_going(tiny_model_dirs, tmp_path, capsys):
    from w2s_shift.cli import main

    run_dir, out = tmp_path / "r", tmp_path / "snap"
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], run_dir, ["pandalm"], ["naive", "ceiling"], seeds=[0, 1]
    )
    run(RunConfig(**d))
    whole = read_json(run_dir / "metrics.json")["cells"]
    # the run as it is while seed 1 trains: seed 1's cell has not written its metrics; the run's own metrics.json is
    # an earlier run's (a run grown by a seed, or by --until-decided, keeps it until it ends), no sign of the end
    (run_dir / "ultrafeedback" / "seed1" / "metrics.json").unlink()
    # the run's side work (none of it in a stage's digest), which a snapshot must not repeat
    side = {**yaml.safe_load((run_dir / "config.yaml").read_text()), "export": "all", "bon": {"enabled": True}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(side, sort_keys=False))
    before = _files(run_dir)
    capsys.readouterr()
    assert main(["snapshot", str(run_dir), str(out)]) == 0
    said = capsys.readouterr().out
    assert _files(run_dir) == before  # the run directory is only read
    cells = read_json(out / "metrics.json")["cells"]
    assert [c["seed"] for c in cells] == [0]
    assert cells[0]["accuracy"] == whole[0]["accuracy"] and cells[0]["gap_check"] == whole[0]["gap_check"]
    reused, total = map(int, re.search(r"resumed: (\d+) of (\d+) stage", said).groups())
    assert reused == total > 0  # nothing computed again
    assert "snapshot of " in said and "seeds [0] of [0, 1] finished" in said and (out / "report.md").is_file()
    weights = next((out / "ultrafeedback" / "seed0" / "models").iterdir())
    original = run_dir / "ultrafeedback" / "seed0" / "models" / weights.name
    assert os.stat(weights).st_ino == os.stat(original).st_ino  # linked, not copied
    assert main(["plan", "--power", str(out)]) == 0 and "gap check" in capsys.readouterr().out
    # a 1-seed pilot read with no training noise (--seed-sd 0): its pair noise is shared by every seed on the one
    # split, so every seed count needs the same pairs, and the plan says so instead of "more seeds need fewer"
    assert main(["plan", "--power", str(out), "--seed-sd", "0"]) == 0
    text = capsys.readouterr().out
    needs = re.findall(r"    (\d+) seeds: not reachable \(needs ([\d,]+) ID pairs[^;]*(; .*)?\)", text)
    assert needs and len({n for _, n, _ in needs}) == 1, text
    assert [why for k, _, why in needs] == ["; as many at 10 seeds" if k != "10" else "" for k, *_ in needs], text
    assert "more seeds need fewer pairs" not in text
    assert "a larger test set is needed" in text
    # the run's side work is not repeated in OUT: no tracker, no export, no best-of-n
    snap_cfg = RunConfig(**yaml.safe_load((out / "config.yaml").read_text()))
    assert (snap_cfg.report_to, snap_cfg.export, snap_cfg.bon.enabled) == ([], "none", False)
    # bad input: one line, exit 2
    assert "exists and is not an empty folder" in cli_error(capsys, ["snapshot", str(run_dir), str(out)])
    assert "inside the run directory" in cli_error(capsys, ["snapshot", str(run_dir), str(run_dir / "s")])
    (run_dir / "ultrafeedback" / "seed0" / "metrics.json").unlink()
    assert "no seed is finished yet" in cli_error(capsys, ["snapshot", str(run_dir), str(tmp_path / "s2")])
    # every cell done, but the run's metrics.json is an earlier run's with seed 0 only (killed before it wrote its own)
    for s in (0, 1):
        (run_dir / "ultrafeedback" / f"seed{s}" / "metrics.json").write_text("{}")
    older = read_json(run_dir / "metrics.json")
    older["cells"] = [c for c in older["cells"] if c["seed"] == 0]
    (run_dir / "metrics.json").write_text(json.dumps(older))
    msg = cli_error(capsys, ["snapshot", str(run_dir), str(tmp_path / "s3")])
    assert "every seed is finished; resume it (`w2s-shift run`: every stage is reused)" in msg
    run(RunConfig(**d), overwrite=True)  # the run finishes (its config's export and bon back to the defaults)
    msg = cli_error(capsys, ["snapshot", str(run_dir), str(tmp_path / "s3")])
    assert "every seed is finished; read it as it is" in msg
    assert "not a w2s-shift run directory" in cli_error(capsys, ["snapshot", str(tmp_path), str(tmp_path / "s4")])


def test_a_failed_snapshot_leaves_out_as_it_found_it(tiny_model_dirs, tmp_path, monkeypatch):
    """The grid failing in OUT (a model path that resolves elsewhere, a tracker without credentials) after the
    copy: OUT is removed (or emptied, when it was an empty folder), RUN untouched, so the same command can be rerun."""
    from w2s_shift.pipeline import grid, snapshot
    from w2s_shift.pipeline.rundir import RunDirError

    run_dir = tmp_path / "r"
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], run_dir, ["pandalm"], ["naive"], seeds=[0, 1]
    )
    run(RunConfig(**d))
    (run_dir / "ultrafeedback" / "seed1" / "metrics.json").unlink()
    before = _files(run_dir)
    copied = []

    def fail(cfg, **kw):
        copied.append(sorted(p.name for p in (tmp_path / cfg.output_dir).rglob("*.safetensors")))
        raise RunDirError("the grid failed")

    monkeypatch.setattr(grid, "run", fail)
    for out, existed in ((tmp_path / "new" / "snap", False), (tmp_path / "empty", True)):
        if existed:
            out.mkdir()
        with pytest.raises(RunDirError, match="the grid failed"):
            snapshot.snapshot(run_dir, out)
        assert copied[-1], "the failure came after the copy"
        assert (out.is_dir() and not any(out.iterdir())) if existed else not (tmp_path / "new").exists()
    assert _files(run_dir) == before

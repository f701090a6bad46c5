"""`w2s-shift snapshot RUN OUT`: a run still going read through its finished seeds, every stage reused, RUN only
read (w2s_shift/pipeline/snapshot.py)."""

import os
import re

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
    # the run as it is while seed 1 trains: seed 1's cell has not written its metrics, the run none of its own
    for f in (run_dir / "metrics.json", run_dir / "ultrafeedback" / "seed1" / "metrics.json"):
        f.unlink()
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
    # bad input: one line, exit 2
    assert "exists and is not an empty folder" in cli_error(capsys, ["snapshot", str(run_dir), str(out)])
    assert "inside the run directory" in cli_error(capsys, ["snapshot", str(run_dir), str(run_dir / "s")])
    (run_dir / "ultrafeedback" / "seed0" / "metrics.json").unlink()
    assert "no seed is finished yet" in cli_error(capsys, ["snapshot", str(run_dir), str(tmp_path / "s2")])
    run(RunConfig(**d))  # the run finishes
    assert "the run is finished" in cli_error(capsys, ["snapshot", str(run_dir), str(tmp_path / "s3")])
    assert "not a w2s-shift run directory" in cli_error(capsys, ["snapshot", str(tmp_path), str(tmp_path / "s4")])

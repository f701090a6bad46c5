"""The notebook API: `from w2s_shift import run_grid, load_run`, results as DataFrames, the CLI's validation; the
README's example block runs (on tiny models: its preset and output folder are replaced by a tiny config and a
temporary folder, nothing else)."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml
from conftest import tiny_grid_dict

import w2s_shift
from w2s_shift.config import ConfigError
from w2s_shift.io import read_json, read_jsonl
from w2s_shift.pipeline import RunDirError

README = Path(w2s_shift.__file__).parent.parent / "README.md"


def readme_example() -> str:
    text = README.read_text(encoding="utf-8").split("## Notebooks", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.fixture(scope="module")
def example_run(tiny_model_dirs, lm_student_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp / "unused", ["pandalm"], ["naive", "ceiling"])
    cfg = tmp / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(d), encoding="utf-8")
    code = readme_example()
    assert len(code.strip().splitlines()) <= 10 and '"quickstart"' in code and '"runs/nb"' in code
    code = code.replace('"quickstart"', repr(str(cfg))).replace('"runs/nb"', repr(str(tmp / "nb")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    return tmp / "nb", out.getvalue()


def test_the_readme_example_runs_and_prints_the_runs_numbers(example_run):
    run_dir, printed = example_run
    print(printed)  # shown with pytest -s
    cell = read_json(run_dir / "metrics.json")["cells"][0]
    assert cell["ood"] == ["pandalm"]
    # the accuracy pivot: one line per model with its ID and OOD accuracy (%, rounded to 0.1)
    lines = {}
    for ln in printed.splitlines():  # the first line of each model is the pivot's (the groupby's come later)
        if ln.split():
            lines.setdefault(ln.split()[0], ln.split()[1:])
    assert lines["dataset"] == ["pandalm", "ultrafeedback"]
    for model in ("teacher", "naive", "ceiling"):
        assert [float(x) for x in lines[model][:2]] == [
            round(cell["accuracy"][model]["pandalm"], 1),
            round(cell["accuracy"][model]["ultrafeedback"], 1),
        ]
    assert f"{cell['metrics']['naive']['NTS']:.1f}" in printed or str(cell["metrics"]["naive"]["NTS"]) in printed


def test_dataframes_hold_the_runs_values(example_run):
    run_dir, _ = example_run
    run = w2s_shift.load_run(run_dir)
    cell = run.cells[0]
    acc = run.accuracy
    assert len(acc) == 3 * 2 and set(acc.columns) >= {"accuracy", "ci95_low", "ci95_high", "n_pairs", "split"}
    row = acc[(acc.model == "naive") & (acc.dataset == "pandalm")].iloc[0]
    assert (row.accuracy, [row.ci95_low, row.ci95_high], row.n_pairs, row.split) == (
        cell["accuracy"]["naive"]["pandalm"],
        cell["accuracy_ci95"]["naive"]["pandalm"],
        8,
        "OOD",
    )
    w = run.w2s_metrics
    nts = w[(w.model == "naive") & (w.metric == "NTS")].iloc[0]
    assert nts.value == cell["metrics"]["naive"]["NTS"]
    assert [nts.ci95_low, nts.ci95_high] == cell["metrics"]["naive"]["ci95"]["NTS"]
    aog = w[(w.metric == "AOG") & (w.target == "pandalm")].iloc[0]
    assert aog.value == cell["metrics"]["naive"]["AOG"]["pandalm"]
    assert set(w.model) == {"naive"}  # the ceiling is not a W2S student
    r = run.rewards
    assert len(r) == 3 * (10 + 8)
    raw = read_jsonl(run_dir / "ultrafeedback" / "seed0" / "rewards" / "naive__pandalm.jsonl")
    mine = r[(r.model == "naive") & (r.dataset == "pandalm")]
    assert list(mine.reward_chosen) == [x["reward_chosen"] for x in raw]
    assert 100 * mine.correct.mean() == pytest.approx(cell["accuracy"]["naive"]["pandalm"])


def test_run_grid_validates_as_the_cli_does(tmp_path, tiny_model_dirs, lm_student_dir):
    with pytest.raises(ConfigError, match="student.epochs"):
        w2s_shift.run_grid({"student": {"name": "x", "epochs": -1}}, output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="no-such-key"):
        w2s_shift.run_grid("quickstart", overrides=["no-such-key=1"])
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp_path, ["pandalm"], ["naive"])
    d["methods"] = [{"name": "anchor", "anchor_layers": [99]}]
    d["student"]["name"] = "smollm2-135m"  # a preset with a recorded depth (30 layers): refused offline
    with pytest.raises(ConfigError, match=r"anchor_layers \[99\] outside 1..30"):
        w2s_shift.run_grid(d)
    with pytest.raises(RunDirError, match="metrics.json: not found; is .* a finished w2s-shift run directory"):
        w2s_shift.load_run(tmp_path)


def test_run_grid_leaves_the_callers_dict_alone_and_takes_paths(tmp_path, tiny_model_dirs, lm_student_dir):
    """run_grid changed the caller's dict (a nested --set wrote into it) and refused a pathlib.Path output_dir in
    it; an output_dir argument with ': ' or '[' was parsed as YAML."""
    import copy

    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp_path / "run", ["pandalm"], ["naive"])
    d["output_dir"] = tmp_path / "run"  # a Path, as a notebook writes it
    d["data"]["sources"] = [{"path": Path("tests/malformed/data/good_source.jsonl")}]
    before = copy.deepcopy(d)
    with pytest.raises(ConfigError) as e:  # an invalid override: only it is named, nothing about the paths
        w2s_shift.run_grid(d, overrides=["student.epochs=-1", "teacher.epochs=2"], output_dir=tmp_path / "a: [b]")
    assert "student.epochs" in str(e.value) and "output_dir" not in str(e.value) and "path" not in str(e.value)
    assert d == before and d["teacher"]["epochs"] == 1


def test_load_run_names_the_run_directory_to_give(example_run):
    run_dir, _ = example_run
    with pytest.raises(RunDirError, match=f"{run_dir / 'metrics.json'}: is a file; give the run directory"):
        w2s_shift.load_run(run_dir / "metrics.json")
    cell = run_dir / "ultrafeedback" / "seed0"
    with pytest.raises(RunDirError, match=f"{cell}: this is a cell directory .*give the run directory \\({run_dir}\\)"):
        w2s_shift.load_run(cell)
    assert w2s_shift.load_run(run_dir).accuracy.shape[0] > 0

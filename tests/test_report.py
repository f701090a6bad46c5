"""Grid-run metrics and report on a hand-made cell directory with known accuracies."""

import json
import math
import re

import pytest

from w2s_shift.cli import main
from w2s_shift.io import write_json_atomic
from w2s_shift.report import compare, write_report
from w2s_shift.results import aggregate, build_cell_metrics, load_rewards

LN4, LN9 = math.log(4.0), math.log(9.0)  # margins with sigmoid 0.8 and 0.9

# pairs right out of 10 per model and dataset (the first k pairs are right); uf is ID, hh and shp are OOD
RIGHT = {
    "teacher": {"uf": 6, "hh": 5, "shp": 7},
    "naive": {"uf": 8, "hh": 4, "shp": 7},
    "anchor-1e-4": {"uf": 7, "hh": 7, "shp": 8},
    "anchor-1e-2": {"uf": 6, "hh": 6, "shp": 7},
    "anchor-mid": {"uf": 5, "hh": 6, "shp": 8},
    "ceiling": {"uf": 9, "hh": 8, "shp": 9},
    "zero-shot": {"uf": 5, "hh": 5, "shp": 5},
}
METHODS = [
    {
        "label": "naive",
        "name": "naive",
        "anchor_lambda": 0.0,
        "anchor_layers": "last",
        "layer_spec": "last",
        "finetune": "top_layers",
    },
    {
        "label": "anchor-1e-4",
        "name": "anchor",
        "anchor_lambda": 1e-4,
        "anchor_layers": "last",
        "layer_spec": "last",
        "finetune": "top_layers",
    },
    {
        "label": "anchor-1e-2",
        "name": "anchor",
        "anchor_lambda": 1e-2,
        "anchor_layers": "last",
        "layer_spec": "last",
        "finetune": "top_layers",
    },
    {
        "label": "anchor-mid",
        "name": "anchor",
        "anchor_lambda": 1e-4,
        "anchor_layers": [2, 3],
        "layer_spec": "middle",
        "finetune": "top_layers",
    },
    {
        "label": "ceiling",
        "name": "ceiling",
        "anchor_lambda": 0.0,
        "anchor_layers": "last",
        "layer_spec": "last",
        "finetune": "top_layers",
    },
    {
        "label": "zero-shot",
        "name": "zero_shot",
        "anchor_lambda": 0.0,
        "anchor_layers": "last",
        "layer_spec": "last",
        "finetune": "top_layers",
    },
]
DATA = {
    "splits": {"teacher_train": 40, "student_train": 4, "test": 10},
    "source": {"invalid_rows_skipped": {"skipped": 1, "by_reason": {"empty": 1}}, "duplicate_prompts_removed": 2},
    "ood": {
        "hh": {"used": 10, "invalid_rows_skipped": {"skipped": 0}, "prompt_overlap_removed": 3},
        "shp": {"used": 10, "invalid_rows_skipped": {"skipped": 0}, "prompt_overlap_removed": 0},
    },
}


def _rows(k: int, margin: float, n: int = 10):
    return [
        {"index": i, "id": f"p{i}", "reward_chosen": margin if i < k else -margin, "reward_rejected": 0.0}
        for i in range(n)
    ]


def make_cell(root, seed=0, right=None):
    """RUN/uf/seed<k>/ with rewards (teacher |margin| ln 4, students ln 9), labels, logs and drift files."""
    right = right or RIGHT
    d = root / "uf" / f"seed{seed}"
    for mdl, per in right.items():
        for ds, k in per.items():
            f = d / "rewards" / f"{mdl}__{ds}.jsonl"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("".join(json.dumps(r) + "\n" for r in _rows(k, LN4 if mdl == "teacher" else LN9)))
    (d / "teacher_labels.jsonl").write_text(
        "".join(
            json.dumps({"index": i, "id": f"s{i}", "q": q, "gold_agrees": q > 0.5}) + "\n"
            for i, q in enumerate([0.9, 0.7, 0.4, 0.8])
        )
    )
    (d / "logs").mkdir()
    for mdl in ("teacher", "naive", "anchor-1e-4"):
        rows = [
            {"loss": 0.69, "loss_w2s": 0.69, "step": 10, "epoch": 0.5, "learning_rate": 1e-4},
            {
                "loss": 0.55,
                "loss_w2s": 0.54,
                "loss_anchor": 0.02 if mdl.startswith("anchor") else None,
                "step": 20,
                "epoch": 1.0,
                "learning_rate": 5e-5,
            },
            {"train_runtime": 12.5, "train_samples_per_second": 3.2, "step": 20, "epoch": 1.0},
        ]
        (d / "logs" / f"{mdl}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "drift").mkdir()
    for mdl, err in (("naive", 0.30), ("anchor-1e-4", 0.05), ("anchor-1e-2", 0.01)):
        final = {
            ds: {"2": {"rel_sq_err": err / 3, "cka": 0.99}, "4": {"rel_sq_err": err, "cka": 1 - err}}
            for ds in ("uf", "hh", "shp")
        }
        during = [
            {"step": st, "dataset": ds, "4": {"rel_sq_err": err * st / 20, "cka": 1 - err * st / 20}}
            for st in (10, 20)
            for ds in ("uf", "hh")
        ]
        write_json_atomic(d / "drift" / f"{mdl}.json", {"layers": [2, 4], "final": final, "during": during})
    cell = {
        "source": "uf",
        "seed": seed,
        "dir": f"uf/seed{seed}",
        "id": "uf",
        "ood": ["hh", "shp"],
        "models": list(right),
        "methods": METHODS,
        "ceiling": "ceiling",
        "zero_shot": "zero-shot",
        "data": DATA,
        "timings": {"teacher": 3.04, "students": 10.0},
    }
    return d, cell


@pytest.fixture
def cell0(tmp_path):
    d, cell = make_cell(tmp_path / "run")
    return build_cell_metrics(d, cell, bootstrap=300, seed=0)


def test_load_rewards(tmp_path):
    d, _ = make_cell(tmp_path)
    c, r = load_rewards(d, "naive", "uf")
    assert c.shape == (10,) and (c > r).sum() == 8


def test_cell_accuracy_and_shift_metrics(cell0):
    m = cell0
    assert m["accuracy"]["teacher"] == {"uf": 60.0, "hh": 50.0, "shp": 70.0}
    assert m["accuracy"]["naive"]["uf"] == 80.0 and m["n_pairs"] == {"uf": 10, "hh": 10, "shp": 10}
    lo, hi = m["accuracy_ci95"]["naive"]["uf"]
    assert lo < 80.0 < hi
    assert m["accuracy_ood_mean"]["anchor-1e-4"] == pytest.approx(75.0)
    nv, an, mid = m["metrics"]["naive"], m["metrics"]["anchor-1e-4"], m["metrics"]["anchor-mid"]
    assert nv["WRG"] == pytest.approx(20.0) and nv["AOG"] == {"hh": pytest.approx(-10.0), "shp": pytest.approx(0.0)}
    assert nv["AOG_mean"] == pytest.approx(-5.0) and nv["NTS"] == pytest.approx(-5.0)
    assert (
        an["WRG"] == pytest.approx(10.0) and an["AOG_mean"] == pytest.approx(15.0) and an["NTS"] == pytest.approx(15.0)
    )
    assert mid["WRG"] == pytest.approx(-10.0) and mid["NTS"] == pytest.approx(0.0)  # AOG 10 - (60 - 50)
    assert nv["PGR"]["uf"] == pytest.approx(2 / 3) and an["PGR"]["hh"] == pytest.approx(2 / 3)
    assert nv["ci95"]["WRG"][0] >= 0.0  # the teacher's right pairs are a subset of naive's: never below 0
    assert "ceiling" not in m["metrics"] and "zero-shot" not in m["metrics"]
    d = m["differences"]["anchor-1e-4"]
    assert d["vs"] == "naive" and d["accuracy"]["uf"] == pytest.approx(-10.0) and d["NTS"] == pytest.approx(20.0)
    assert "naive" not in m["differences"]
    assert m["teacher_beats_chance_id"] is False  # 60% on 10 pairs: the interval includes 50


def test_cell_calibration_agreement_labels_drift_training(cell0):
    m = cell0
    # teacher: every pair at confidence 0.8, 60% right -> ECE 20 pp; naive: confidence 0.9, 80% right -> 10 pp
    ece, agree = m["model_metrics"]["ece"], m["model_metrics"]["agreement_with_teacher"]
    assert ece["teacher"]["uf"] == pytest.approx(20.0) and ece["naive"]["uf"] == pytest.approx(10.0)
    assert agree["naive"]["uf"] == pytest.approx(80.0)  # differ on pairs 6 and 7
    assert agree["ceiling"]["hh"] == pytest.approx(70.0) and agree["teacher"]["uf"] is None
    assert m["teacher_labels"]["n"] == 4 and m["teacher_labels"]["mean_q"] == pytest.approx(0.7)
    assert m["teacher_labels"]["agree_with_gold"] == pytest.approx(75.0)
    assert m["drift"]["anchor-1e-4"]["final"]["hh"]["4"]["rel_sq_err"] == pytest.approx(0.05)
    assert "anchor-mid" not in m["drift"]
    tr = m["training"]["anchor-1e-4"]
    assert tr["step"] == [10, 20] and tr["loss"] == [0.69, 0.55] and tr["loss_anchor"] == [None, 0.02]
    assert tr["summary"]["train_runtime"] == 12.5
    assert m["timings_seconds"] == {"teacher": 3.0, "students": 10.0}
    json.dumps(m, allow_nan=False)  # metrics.json must be strict JSON


def test_cell_errors_name_the_file(tmp_path):
    d, cell = make_cell(tmp_path)
    (d / "rewards" / "naive__hh.jsonl").unlink()
    with pytest.raises(ValueError, match=r"naive__hh\.jsonl: file not found"):
        build_cell_metrics(d, cell, 50, 0)
    d2, cell2 = make_cell(tmp_path / "b")
    rows = _rows(8, 1.0)
    rows[0]["id"] = "other"
    (d2 / "rewards" / "naive__uf.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="naive__uf.jsonl: its pairs"):
        build_cell_metrics(d2, cell2, 50, 0)
    (d2 / "rewards" / "naive__uf.jsonl").write_text('{"index": 0, "id": "p0", "reward_chosen": 1.0}\n')
    with pytest.raises(ValueError, match="lacks the field 'reward_rejected'"):
        build_cell_metrics(d2, cell2, 50, 0)


def _two_seeds(tmp_path):
    run = tmp_path / "run"
    d0, c0 = make_cell(run, 0)
    right1 = {k: dict(v) for k, v in RIGHT.items()}
    right1["naive"]["uf"] = 9
    d1, c1 = make_cell(run, 1, right1)
    cells = [build_cell_metrics(d0, c0, 200, 0), build_cell_metrics(d1, c1, 200, 1)]
    return run, cells


def test_aggregate_two_seeds(tmp_path):
    _, cells = _two_seeds(tmp_path)
    a = aggregate(cells[::-1])["uf"]  # order of the input does not matter: values follow the seeds
    assert a["seeds"] == [0, 1]
    st = a["accuracy"]["naive"]["uf"]
    assert (
        st["values"] == [80.0, 90.0]
        and st["mean"] == pytest.approx(85.0)
        and st["std"] == pytest.approx(math.sqrt(50.0))
    )
    assert a["metrics"]["naive"]["WRG"]["mean"] == pytest.approx(25.0)
    assert a["metrics"]["anchor-1e-4"]["NTS"]["std"] == pytest.approx(0.0)
    assert a["differences"]["anchor-1e-4"]["NTS"]["values"] == pytest.approx([20.0, 20.0])
    assert a["model_metrics"]["ece"]["teacher"]["uf"]["value"] == pytest.approx(20.0)
    assert a["drift_final"]["naive"]["hh"]["4"]["rel_sq_err"]["mean"] == pytest.approx(0.30)
    assert a["teacher_beats_chance_id"] == [False, False]
    one = aggregate(cells[:1])["uf"]["accuracy"]["naive"]["uf"]
    assert one["std"] is None and one["mean"] == 80.0


def _no_external_refs(page: str):
    assert not re.search(r"<(script|link|iframe)\b", page, re.IGNORECASE)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:|//)", page, re.IGNORECASE)
    srcs = re.findall(r"<img[^>]*\ssrc=\"([^\"]*)\"", page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)


def test_write_report_single_seed(tmp_path, cell0):
    run = tmp_path / "run"
    table = write_report(
        run,
        {
            "cells": [cell0],
            "aggregate": aggregate([cell0]),
            "wall_seconds": 12.0,
            "config": {"teacher": {"name": "tiny-t"}, "student": {"name": "tiny-s"}},
        },
    )
    md, page = (run / "report.md").read_text(), (run / "report.html").read_text()
    assert "| naive |" in table and "WRG" in table and "PGR (ID)" in table
    for text in (md, page):
        assert "80.00" in text and "+20.00" in text and "+15.00" in text and "0.67" in text
        assert "tiny-s" in text and "Calibration" in text and "duplicate prompts removed: 2" in text
    assert "| zero-shot | zero_shot, top_layers | 50.00 [" in md
    assert "**+15.00" in md  # anchor-1e-4 has the best NTS and AOG mean
    assert "| anchor-1e-4 | 4 (final output) | 0.05 / 0.9500 | 0.05 / 0.9500 | 0.05 / 0.9500 |" in md
    pngs = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert pngs == [
        "uf-accuracy.png",
        "uf-drift-aog.png",
        "uf-drift.png",
        "uf-lambda.png",
        "uf-layers.png",
        "uf-training.png",
    ]
    assert all(f"plots/{p}" in md for p in pngs)
    assert len(re.findall(r"<img ", page)) == 6
    assert "Drift vs OOD gain (descriptive)" in md and "Spearman rank correlation" in md
    _no_external_refs(page)
    assert (run / "plots" / "uf-accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_report_skips_plots_without_data_and_removes_stale(tmp_path, cell0):
    run = tmp_path / "run"
    c = json.loads(json.dumps(cell0))
    c["drift"], c["training"] = {}, {}
    c["methods"] = [m for m in c["methods"] if m["label"] in ("naive", "anchor-1e-4", "ceiling", "zero-shot")]
    (run / "plots").mkdir(parents=True)
    (run / "plots" / "uf-lambda.png").write_bytes(b"old")
    write_report(run, {"cells": [c]})
    assert sorted(p.name for p in (run / "plots").glob("*.png")) == ["uf-accuracy.png"]


def test_write_report_several_seeds_mean_std(tmp_path):
    run, cells = _two_seeds(tmp_path)
    table = write_report(run, {"cells": cells, "aggregate": aggregate(cells)})
    assert "85.00 ± 7.07" in table  # naive ID accuracy over seeds 0 and 1
    page = (run / "report.html").read_text()
    assert "85.00 ± 7.07" in page
    _no_external_refs(page)


def test_write_report_refuses_old_metrics(tmp_path):
    with pytest.raises(ValueError, match="no 'cells'"):
        write_report(tmp_path, {"accuracy": {}})


def test_compare_and_cli(tmp_path, capsys):
    run_a, cells = _two_seeds(tmp_path / "a")
    write_json_atomic(run_a / "metrics.json", {"cells": cells, "aggregate": aggregate(cells)})
    run_b = tmp_path / "b" / "other"
    d, c = make_cell(run_b)
    write_json_atomic(run_b / "metrics.json", {"cells": [build_cell_metrics(d, c, 100, 0)]})
    out = compare([run_a, run_b])
    lines = out.splitlines()
    assert lines[0].startswith(
        "| source | model | run ID acc | run OOD acc | run NTS | run ECE ID | run agree w/ teacher ID | other ID acc"
    )
    naive = next(x for x in lines if x.startswith("| uf | naive |"))
    assert "85.00 ± 7.07" in naive and "| 80.00 |" in naive and "-5.00" in naive
    assert "not scored on the same test sets" not in out  # the same sets: nothing to say
    # a run on another split (data.seed 7): its columns differ by the test pairs too, and the comparison says so
    run_c = tmp_path / "c" / "split7"
    d, c = make_cell(run_c)
    write_json_atomic(
        run_c / "metrics.json", {"cells": [build_cell_metrics(d, c, 100, 0)], "config": {"data": {"seed": 7}}}
    )
    said = compare([run_b, run_c]).split("\n\n")[-1]
    assert said.startswith("These runs are not scored on the same test sets (other: uf (uf 10, hh 10")
    assert "split7: uf (data.seed 7; uf 10, hh 10, shp 10))" in said and "mixes the models with the test pairs" in said
    assert main(["compare", str(run_a), str(run_b)]) == 0
    assert "85.00 ± 7.07" in capsys.readouterr().out
    assert main(["compare", str(run_a), str(tmp_path / "missing")]) == 2
    assert "missing: not a directory" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.json").write_text("{not json")
    assert main(["compare", str(tmp_path / "bad")]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_cli_report_rewrites_report(tmp_path, capsys):
    run_a, cells = _two_seeds(tmp_path)
    write_json_atomic(run_a / "metrics.json", {"cells": cells})
    assert main(["report", str(run_a)]) == 0
    assert "85.00 ± 7.07" in capsys.readouterr().out
    assert "seeds 0, 1" in (run_a / "report.md").read_text() and (run_a / "report.html").is_file()


def test_cli_report_refuses_damaged_metrics_naming_the_field(tmp_path, capsys, cell0):
    """NaN, strings where numbers belong, and a cell directory are refused, naming what is wrong;
    the report files are not rewritten."""
    import copy
    import json

    run = tmp_path / "run"
    write_json_atomic(run / "metrics.json", {"cells": [cell0]})
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    good = (run / "report.md").read_text()
    for value, says in (
        (float("nan"), "is nan (not a finite number)"),
        ("80", "is str '80', expected a number"),
        (float("inf"), "is inf"),
    ):
        bad = copy.deepcopy(cell0)
        bad["accuracy"]["naive"][bad["id"]] = value
        (run / "metrics.json").write_text(json.dumps({"cells": [bad]}))  # json.dumps writes NaN/Infinity
        assert main(["report", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"field cells[0].accuracy.naive.{bad['id']} {says}" in err and str(run / "metrics.json") in err, err
        assert (run / "report.md").read_text() == good
    (run / "metrics.json").write_text('{"cells": 5}')  # cells not a list: named, never a TypeError
    assert main(["report", str(run)]) == 2
    assert "field cells is int '5', expected a list of cells" in capsys.readouterr().err
    assert (run / "report.md").read_text() == good
    cell = run / "uf" / "seed0"
    (cell / "stages").mkdir(parents=True)
    write_json_atomic(cell / "metrics.json", cell0)
    assert main(["report", str(cell)]) == 2
    says = f"{cell}: this is a cell directory (<source>/seed<k>); give the run directory ({run})"
    assert says in capsys.readouterr().err


def test_cli_report_refuses_a_truncated_deleted_or_changed_rewards_file(tmp_path, capsys, cell0):
    """report checks the rewards files metrics.json was computed from: a file cut to 7 of its 10 rows, one whose
    rewards no longer give the recorded accuracy, and a deleted one are each named (exit 2, report.md kept); a
    metrics.json without its run's stages (a copy) is rendered as before."""
    run = tmp_path / "run"
    write_json_atomic(run / "metrics.json", {"cells": [cell0]})
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    good = (run / "report.md").read_text()
    cell = run / "uf" / "seed0"
    (cell / "stages").mkdir()  # a run's cell, as the pipeline leaves it
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    f = cell / "rewards" / "naive__hh.jsonl"
    whole = f.read_text()
    f.write_text("".join(whole.splitlines(keepends=True)[:7]))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: 7 rows, but metrics.json was computed from 10 pairs: the file is damaged (truncated?)" in err, err
    assert "delete it and rerun the run" in err and (run / "report.md").read_text() == good
    rows = [json.loads(x) for x in whole.splitlines()]
    rows[0]["reward_chosen"], rows[0]["reward_rejected"] = rows[0]["reward_rejected"], rows[0]["reward_chosen"]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run)]) == 2
    acc = cell0["accuracy"]["naive"]["hh"]
    err = capsys.readouterr().err
    assert f"{f}: its rewards give accuracy {acc - 10:.2f}, but metrics.json records {acc:.2f} for naive on hh" in err
    f.unlink()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: missing, but metrics.json was computed from it (10 pairs of naive on hh)" in err, err
    assert (run / "report.md").read_text() == good
    # the stages' recorded SHA-256: an edit that keeps rows and accuracy (two pairs swapped) is caught, and so is
    # one in a rewards file metrics.json does not count (a target `evaluate` added), never rendered as it is
    from w2s_shift.pipeline.rundir import Stage

    f.write_text(whole)
    side = cell / "rewards" / "naive__side.jsonl"
    side.write_text(whole)
    Stage(cell, "score-naive__hh", "d").finish(["rewards/naive__hh.jsonl"])
    Stage(cell, "score-naive__side", "d").finish(["rewards/naive__side.jsonl"])
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    lines = whole.splitlines(keepends=True)
    for edited in (f, side):
        edited.write_text("".join([lines[1], lines[0], *lines[2:]]))
        assert main(["report", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"{edited}: not the file its stage wrote (its SHA-256 differs" in err, err
        edited.write_text(whole)


def test_pgr_interval_reports_the_undefined_share_and_is_na_above_5_percent(tmp_path, monkeypatch):
    """PGR is undefined on a resample where the ceiling does not beat the teacher. Ceiling 9/10
    vs teacher 6/10 on uf (its right pairs a superset): undefined when none of pairs 6-8 is drawn, 0.7^10 = 2.8% of
    resamples: interval kept, share shown. Ceiling 7/10: 0.9^10 = 35%: interval n/a (the old code kept it)."""
    import w2s_shift.results.cells as report_mod

    real = report_mod.cell_gap_check
    # 10 pairs are too few for the issue-15 gap check (its lower bound is 0 on 2.8% of resamples): this test is
    # about the undefined share of a cell that passes it
    monkeypatch.setattr(report_mod, "cell_gap_check", lambda *a, **k: {**real(*a, **k), "passed": True})
    d, cell = make_cell(tmp_path / "a")
    m = build_cell_metrics(d, cell, bootstrap=2000, seed=0)
    share = m["metrics"]["naive"]["PGR_undefined_share"]["uf"]
    assert share == pytest.approx(0.7**10, abs=0.012) and share > 0
    assert m["metrics"]["naive"]["ci95"]["PGR"]["uf"] is not None
    write_report(tmp_path / "a", {"cells": [m], "aggregate": aggregate([m]), "wall_seconds": 1.0})
    md = (tmp_path / "a" / "report.md").read_text()
    assert f"({100 * share:.1f}% of resamples undefined)" in md

    right = {k: dict(v) for k, v in RIGHT.items()}
    right["ceiling"]["uf"] = 7
    d, cell = make_cell(tmp_path / "b", right=right)
    m = build_cell_metrics(d, cell, bootstrap=2000, seed=0)
    share = m["metrics"]["naive"]["PGR_undefined_share"]["uf"]
    assert share == pytest.approx(0.9**10, abs=0.03)
    assert m["metrics"]["naive"]["PGR"]["uf"] == pytest.approx(2.0)  # (80 - 60) / (70 - 60): the point is defined
    assert m["metrics"]["naive"]["ci95"]["PGR"]["uf"] is None
    write_report(tmp_path / "b", {"cells": [m], "aggregate": aggregate([m]), "wall_seconds": 1.0})
    md = (tmp_path / "b" / "report.md").read_text()
    assert f"2.00 [n/a: undefined in {100 * share:.0f}% of resamples]" in md


def test_drift_per_block_for_students_that_train_more_than_their_top_blocks(tmp_path):
    """Students reporting 3+ blocks get a per-block drift line (ID, and the OOD sets' mean); 2 blocks get none."""
    from w2s_shift.report.plots import _plot_drift_blocks, drift_per_block
    from w2s_shift.report.tables import Source

    d, cell = make_cell(tmp_path / "run")
    per = {"2": 0.001, "3": 0.01, "4": 0.1}
    final = {
        ds: {b: {"rel_sq_err": v * k, "cka": 0.9} for b, v in per.items()}
        for k, ds in ((1, "uf"), (2, "hh"), (4, "shp"))
    }
    write_json_atomic(d / "drift" / "naive.json", {"layers": [2, 3, 4], "final": final, "during": []})
    m = build_cell_metrics(d, cell, bootstrap=50, seed=0)
    s = Source("uf", [m], aggregate([m])["uf"])
    assert drift_per_block(s, ["uf"]) == {"naive": ([2, 3, 4], [0.001, 0.01, 0.1])}
    blocks, ood = drift_per_block(s, ["hh", "shp"])["naive"]
    assert blocks == [2, 3, 4] and ood == pytest.approx([0.003, 0.03, 0.3])  # mean of 2x and 4x
    assert _plot_drift_blocks(s)[:8] == b"\x89PNG\r\n\x1a\n"
    write_json_atomic(d / "drift" / "naive.json", {"layers": [2, 4], "final": final, "during": []})
    m = build_cell_metrics(d, cell, bootstrap=50, seed=0)
    s = Source("uf", [m], aggregate([m])["uf"])
    assert drift_per_block(s, ["uf"]) == {} and _plot_drift_blocks(s) is None


def test_a_metrics_file_of_the_older_layout_renders_the_same_per_model_table(tmp_path, capsys, cell0):
    """metrics.json written before per-model metrics were registered ("calibration" with its ECE and reliability
    bins, "agreement_with_teacher" without the teacher, an aggregate without "model_metrics") is read as the new
    layout by the one reader: the report's table and the API's frame are those of the new file."""
    from w2s_shift import load_run

    run_new, run_old = tmp_path / "new", tmp_path / "old"
    write_json_atomic(run_new / "metrics.json", {"cells": [cell0], "aggregate": aggregate([cell0])})
    mm = cell0["model_metrics"]
    old = {k: v for k, v in cell0.items() if k != "model_metrics"}
    old["calibration"] = {m: {d: {"ece": v, "bins": []} for d, v in per.items()} for m, per in mm["ece"].items()}
    old["agreement_with_teacher"] = {m: per for m, per in mm["agreement_with_teacher"].items() if m != "teacher"}
    agg = aggregate([cell0])
    for a in agg.values():
        del a["model_metrics"]
    write_json_atomic(run_old / "metrics.json", {"cells": [old], "aggregate": agg})
    assert main(["report", str(run_new)]) == 0 and main(["report", str(run_old)]) == 0
    capsys.readouterr()

    def table(run):
        md = (run / "report.md").read_text()
        return md.split("### Calibration, agreement and other per-model metrics", 1)[1].split("###", 1)[0]

    assert "| naive | 10.00" in table(run_new) and table(run_old) == table(run_new)
    assert load_run(run_old).model_metrics.equals(load_run(run_new).model_metrics)


def test_a_metrics_file_of_a_newer_format_is_refused_naming_it(tmp_path, capsys, cell0):
    from w2s_shift.results import METRICS_FORMAT

    run = tmp_path / "run"
    write_json_atomic(run / "metrics.json", {"metrics_format": METRICS_FORMAT + 1, "cells": [cell0]})
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"metrics_format {METRICS_FORMAT + 1} was written by a newer w2s-shift" in err
    assert not (run / "report.md").exists()


def test_a_cell_without_a_field_the_results_need_is_refused_naming_it(tmp_path, capsys, cell0):
    from w2s_shift import load_run

    run = tmp_path / "run"
    write_json_atomic(run / "metrics.json", {"cells": [{k: v for k, v in cell0.items() if k != "n_pairs"}]})
    assert main(["report", str(run)]) == 2
    assert "metrics.json: field cells.0.n_pairs: Field required" in capsys.readouterr().err
    write_json_atomic(run / "metrics.json", {"cells": [cell0]})
    est = load_run(run).result.cells[0].w2s("naive", "AOG", "hh")  # the typed view: value and paired interval
    assert est.value == cell0["metrics"]["naive"]["AOG"]["hh"]
    assert [est.low, est.high] == cell0["metrics"]["naive"]["ci95"]["AOG"]["hh"]


def test_a_sequential_record_of_another_grid_or_a_damaged_one_is_named_not_shown(tmp_path, cell0):
    """sequential.json is shown only when its last look is this report's grid: a later plain run with other seeds
    leaves a record the report must not pass off as this grid's verdicts."""
    run = tmp_path / "run"
    metrics = {"cells": [cell0], "aggregate": aggregate([cell0])}
    look = {"look": 1, "seeds": 2, "seed_list": [0, 1], "alpha": 0.0054, "spent": 0.0054, "claims": {}, "rows": {}}
    plan = {"max_seeds": 2, "alpha": 0.05, "spending": "obrien-fleming", "margin": 3.8, "looks": [look]}
    verdicts = {"uf/a": {"verdict": "reproduced", "seeds": 2, "open": False}}
    rec = {"plan": plan, "looks": [look], "verdicts": verdicts, "stopped": "every claim decided", "seeds_used": 2}
    write_json_atomic(run / "sequential.json", rec)
    write_report(run, metrics)  # cell0 is seed 0 alone
    md = (run / "report.md").read_text()
    assert "is of another grid (its last look had seeds [0, 1], this report's grid has [0])" in md
    assert "| uf/a | reproduced |" not in md
    look["seed_list"] = [cell0["seed"]]
    write_json_atomic(run / "sequential.json", rec)
    write_report(run, metrics)
    md = (run / "report.md").read_text()
    assert "| uf/a | reproduced | 2 | no |" in md and "alpha 0.0054" in md and "stopped: every claim decided" in md
    (run / "sequential.json").write_text('{"plan": {}}')
    write_report(run, metrics)
    assert "sequential.json is not a w2s-shift sequential record: not shown." in (run / "report.md").read_text()

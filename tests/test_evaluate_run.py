"""`w2s-shift evaluate RUN_DIR NAME_OR_FILE...` on tiny random-init models: a finished run scored on
a new OOD target without training; the same rewards as a run configured with that target from the start; a rerun
skips; a killed evaluate resumes; bad input exits 2 and writes nothing."""

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import RunConfig
from w2s_shift.data.adapters import load_named
from w2s_shift.io import read_json, read_jsonl
from w2s_shift.pipeline import run

A = "hh-helpful-base"
NEW = "newpairs"  # the display name of newpairs.jsonl
A_SOURCE = "ultrafeedback"  # the source of tiny_grid_dict


@pytest.fixture(scope="module")
def new_file(tmp_path_factory):
    """newpairs.jsonl: 10 PandaLM pairs plus 2 pairs whose prompt is a prompt of the source (ultrafeedback)."""
    src = load_named("ultrafeedback", skip_invalid=True).pairs[:2]
    other = load_named("pandalm", skip_invalid=True).pairs[:10]
    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "id": f"pl{i}"} for i, p in enumerate(other)
    ]
    rows += [
        {"prompt": p.prompt, "chosen": "A short answer.", "rejected": "No.", "id": f"uf{i}"} for i, p in enumerate(src)
    ]
    f = tmp_path_factory.mktemp("data") / f"{NEW}.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def lm_student(lm_student_dir):
    """The tiny untied-head Llama of conftest: the trained students' backbone, and the zero-shot model."""
    return lm_student_dir


def _cfg(tiny_model_dirs, student, out, ood):
    """data.n_ood 10: newpairs' 10 pairs left after the overlap removal, all of which `evaluate` scores by default."""
    methods = ["naive", "ceiling", "zero_shot"]
    d = tiny_grid_dict(tiny_model_dirs["teacher"], student, out, ood, methods, drift_interval=0)
    d["data"]["n_ood"] = 10
    return RunConfig.model_validate(d)


def _no_training(mp):
    def boom(*a, **k):
        raise AssertionError("evaluate must not train")

    import w2s_shift.pipeline.stages
    import w2s_shift.training.loop

    mp.setattr(w2s_shift.pipeline.stages, "train_pairs", boom)
    mp.setattr(w2s_shift.training.loop, "train_pairs", boom)


def _cli(argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _snapshot(d: Path) -> dict:
    """Every file of a run directory (but its lock) with its bytes' sha256."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def evaluated(tiny_model_dirs, lm_student, new_file, tmp_path_factory):
    """A run with OOD [A], then `w2s-shift evaluate RUN newpairs.jsonl --headline` with training made to fail (a
    headline target: the run's results are then those of a run configured with it)."""
    out = tmp_path_factory.mktemp("run_a")
    run(_cfg(tiny_model_dirs, lm_student, out, [A]))
    before = {n: (out / n).read_bytes() for n in ("config.yaml", "run.json", "metrics.json")}
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        code, stdout, stderr = _cli(["evaluate", str(out), str(new_file), "--headline"])
    assert code == 0, stderr
    return out, before, stdout


@pytest.fixture(scope="module")
def run_ab(tiny_model_dirs, lm_student, new_file, tmp_path_factory):
    """The same run configured with OOD [A, newpairs.jsonl] from the start."""
    out = tmp_path_factory.mktemp("run_ab")
    return out, run(_cfg(tiny_model_dirs, lm_student, out, [A, str(new_file)]))


def test_evaluate_adds_the_target_to_metrics_and_report_without_training(evaluated, new_file):
    out, before, stdout = evaluated
    for model in ("teacher", "naive", "ceiling"):
        assert f"scoring {model} on {NEW} (10 pairs; saved weights, no training)" in stdout
    assert (
        f"scoring zero_shot on {NEW} (10 pairs; pretrained model, mean response log-likelihood, no training)" in stdout
    )
    assert "nothing was trained" in stdout
    # config.yaml and run.json are not changed; metrics.json is
    assert (out / "config.yaml").read_bytes() == before["config.yaml"]
    assert (out / "run.json").read_bytes() == before["run.json"]
    m = read_json(out / "metrics.json")
    c = m["cells"][0]
    assert c["ood"] == [A, NEW] and c["datasets"] == ["ultrafeedback", A, NEW]
    assert c["n_pairs"][NEW] == 10  # 12 rows, 2 share a source prompt, 10 left, all scored
    assert c["data"]["ood"][NEW]["prompt_overlap_removed"] == 2 and c["data"]["ood"][NEW]["used"] == 10
    assert f"{NEW}: 12 valid pairs, 2 removed because their prompt is in the source, 10 scored (all of them)" in stdout
    acc = c["accuracy"]
    for model in ("teacher", "naive", "ceiling", "zero_shot"):
        assert 0.0 <= acc[model][NEW] <= 100.0
    # AOG on the new target = Acc_naive - Acc_teacher there (pp), with its paired interval
    rows = {
        mdl: read_jsonl(out / "ultrafeedback" / "seed0" / "rewards" / f"{mdl}__{NEW}.jsonl")
        for mdl in ("teacher", "naive")
    }
    hand = {mdl: 100.0 * np.mean([r["reward_chosen"] > r["reward_rejected"] for r in rs]) for mdl, rs in rows.items()}
    assert acc["naive"][NEW] == pytest.approx(hand["naive"]) and acc["teacher"][NEW] == pytest.approx(hand["teacher"])
    assert c["metrics"]["naive"]["AOG"][NEW] == pytest.approx(hand["naive"] - hand["teacher"])
    lo, hi = c["metrics"]["naive"]["ci95"]["AOG"][NEW]
    assert lo <= c["metrics"]["naive"]["AOG"][NEW] <= hi
    assert set(c["metrics"]) == {"naive"}  # ceiling and zero-shot: references, not W2S students
    assert NEW in c["length_baseline"]["datasets"]
    assert NEW in c["drift"]["naive"]["final"] and NEW in c["drift"]["ceiling"]["final"]
    assert m["aggregate"]["ultrafeedback"]["ood"] == [A, NEW]
    e = m["evaluated_targets"]
    assert [x["name"] for x in e] == [NEW]
    assert e[0]["sha256"] == hashlib.sha256(new_file.read_bytes()).hexdigest() and e[0]["path"] == str(
        new_file.resolve()
    )
    assert e[0]["per_source"]["ultrafeedback"] == {"pairs": 12, "prompt_overlap_removed": 2, "used": 10}
    # the cell's own metrics.json too, and a scoring-only stage marker
    assert read_json(out / "ultrafeedback" / "seed0" / "metrics.json")["ood"] == [A, NEW]
    stages = out / "ultrafeedback" / "seed0" / "stages"
    for model in ["teacher", "naive", "ceiling", "zero_shot"]:  # the scoring stage `run` uses, per model
        st = read_json(stages / f"score-{model}__{NEW}.json")
        assert st["model"] == model and st["dataset"] == NEW and st["pairs"] == 10
        assert st["outputs"][0] == f"rewards/{model}__{NEW}.jsonl"
    assert {p.stem for p in stages.glob("mechanism-*__" + NEW + ".json")} == {
        f"mechanism-{m}__{NEW}" for m in ("naive", "ceiling")
    }  # the students' mechanism test on the new target
    assert sorted(p.stem for p in stages.glob("*.json") if not p.stem.startswith(("score-", "mechanism-"))) == [
        "student-ceiling",
        "student-naive",
        "teacher",
    ]  # no training stage was added
    md = (out / "report.md").read_text(encoding="utf-8")
    assert f"OOD: {A}, {NEW}" in md and f"OOD target {NEW} added after the run" in md
    assert f"| {NEW} acc, n=10 |" in md and f"| {A} acc, n=10 |" in md and "| ultrafeedback (ID) acc, n=10 |" in md
    assert f"OOD: {A}, {NEW}" in (out / "report.html").read_text(encoding="utf-8")
    # `w2s-shift report` rebuilds the report from metrics.json with the new target
    (out / "report.md").unlink()
    assert _cli(["report", str(out)])[0] == 0
    assert f"OOD: {A}, {NEW}" in (out / "report.md").read_text(encoding="utf-8")


def test_rewards_equal_those_of_a_run_configured_with_the_target(evaluated, run_ab):
    out_a, _, _ = evaluated
    out_ab, metrics_ab = run_ab
    ca, cb = out_a / "ultrafeedback" / "seed0", out_ab / "ultrafeedback" / "seed0"
    for model in ("teacher", "naive", "ceiling", "zero_shot"):
        for ds in (A, NEW):  # A: the same trained models; NEW: the same pairs scored by them
            ra, rb = (
                read_jsonl(ca / "rewards" / f"{model}__{ds}.jsonl"),
                read_jsonl(cb / "rewards" / f"{model}__{ds}.jsonl"),
            )
            assert [r["id"] for r in ra] == [r["id"] for r in rb] and len(ra) == 10
            for k in ("reward_chosen", "reward_rejected"):
                np.testing.assert_allclose([r[k] for r in ra], [r[k] for r in rb], atol=1e-5, rtol=0)
    ma, mb = read_json(out_a / "metrics.json")["cells"][0], metrics_ab["cells"][0]
    assert mb["ood"] == ma["ood"] and mb["data"]["ood"][NEW]["prompt_overlap_removed"] == 2
    assert ma["accuracy"]["naive"][NEW] == mb["accuracy"]["naive"][NEW]
    assert ma["metrics"]["naive"]["AOG"][NEW] == pytest.approx(mb["metrics"]["naive"]["AOG"][NEW])
    fa, fb = ma["drift"]["naive"]["final"][NEW], mb["drift"]["naive"]["final"][NEW]
    assert fa.keys() == fb.keys()
    for layer in fa:
        assert fa[layer]["rel_sq_err"] == pytest.approx(fb[layer]["rel_sq_err"], abs=1e-5)


def test_a_second_evaluate_of_the_same_target_is_skipped_and_rescores_nothing(evaluated, new_file):
    out, _, _ = evaluated
    snap = _snapshot(out)
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        import w2s_shift.pipeline.score_stage

        mp.setattr(w2s_shift.pipeline.score_stage, "save_rewards", lambda *a, **k: pytest.fail("rescored"))
        code, stdout, _ = _cli(["evaluate", str(out), str(new_file), "--headline"])
    assert code == 0
    assert f"{NEW}: already added to this run by an earlier evaluate (same data); skipped, nothing rescored" in stdout
    assert _snapshot(out) == snap


def _without(cells: list, keys: tuple) -> list:
    return [{k: v for k, v in c.items() if k not in keys} for c in cells]


def _headline(m: dict) -> dict:
    """What a side target must not move: every cell's headline metrics and the aggregate of them."""
    keep = ("ood", "datasets", "accuracy", "accuracy_ci95", "accuracy_ood_mean", "accuracy_ood_mean_ci95", "metrics")
    return {
        "cells": [{k: c[k] for k in keep} for c in m["cells"]],
        "aggregate": {s: {k: a[k] for k in ("ood", "accuracy", "metrics")} for s, a in m["aggregate"].items()},
    }


def test_an_added_set_is_a_side_target_unless_headline_and_remove_takes_it_out(evaluated, new_file, tmp_path):
    """By default a set added with evaluate is reported beside the grid: the headline (AOG mean, NTS, every
    declared target's numbers, the claims) is bit-identical to before; the side table holds its accuracies and AOGs
    (AOG = Acc_naive - Acc_teacher there, by hand). `--remove` restores metrics.json's cells exactly; adding it back
    with --headline rescores nothing and moves it into AOG mean."""
    out, _, _ = evaluated
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    side = tmp_path / "sidepairs.jsonl"
    side.write_bytes(new_file.read_bytes())
    before = read_json(copy / "metrics.json")
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        code, stdout, err = _cli(["evaluate", str(copy), str(side)])
    assert code == 0, err and "added side target(s) sidepairs" in stdout
    m = read_json(copy / "metrics.json")
    assert _headline(m) == _headline(before)
    c = m["cells"][0]
    assert c["side"] == ["sidepairs"] and "sidepairs" not in c["ood"]
    rows = {
        mdl: read_jsonl(copy / "ultrafeedback" / "seed0" / "rewards" / f"{mdl}__sidepairs.jsonl")
        for mdl in ("teacher", "naive")
    }
    hand = {mdl: 100.0 * np.mean([r["reward_chosen"] > r["reward_rejected"] for r in rs]) for mdl, rs in rows.items()}
    st = c["side_targets"]
    assert st["accuracy"]["naive"]["sidepairs"] == pytest.approx(hand["naive"])
    assert st["AOG"]["naive"]["sidepairs"] == pytest.approx(hand["naive"] - hand["teacher"])
    lo, hi = st["AOG_ci95"]["naive"]["sidepairs"]
    assert lo <= st["AOG"]["naive"]["sidepairs"] <= hi
    assert m["evaluated_targets"][-1]["role"] == "side"
    md = (copy / "report.md").read_text(encoding="utf-8")
    assert "### Side targets" in md and "| sidepairs acc, n=10 | AOG sidepairs |" in md
    assert "sidepairs" not in md.split("### Side targets")[0]  # not in the headline table or its title
    # the same set again as a headline target: refused, with the way to do it
    code, _, err = _cli(["evaluate", str(copy), str(side), "--headline"])
    assert code == 2 and "added to this run earlier as a side target" in err and "--remove sidepairs" in err
    # --remove: the cells are those of before, bit for bit; rewards files stay
    code, stdout, err = _cli(["evaluate", str(copy), "--remove", "sidepairs", "sidepairs"])  # twice: once
    assert code == 0, err
    assert "removed sidepairs from" in stdout + err
    after = read_json(copy / "metrics.json")
    # the set's files stay: its scoring stages and its drift measured at the end
    kept = ("stages", "drift")
    assert [{**c, "side": [], "side_targets": None} for c in _without(before["cells"], kept)] == _without(
        after["cells"], kept
    )
    assert "sidepairs" not in (copy / "report.md").read_text(encoding="utf-8")
    assert (copy / "ultrafeedback" / "seed0" / "rewards" / "naive__sidepairs.jsonl").is_file()
    code, _, err = _cli(["evaluate", str(copy), "--remove", A])
    assert code == 2 and "is an OOD target of config.yaml" in err
    # back as a headline target: nothing rescored, and the headline's AOG mean now averages it in
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        import w2s_shift.pipeline.score_stage

        mp.setattr(w2s_shift.pipeline.score_stage, "save_rewards", lambda *a, **k: pytest.fail("rescored"))
        code, _, err = _cli(["evaluate", str(copy), str(side), "--headline"])
    assert code == 0, err
    c = read_json(copy / "metrics.json")["cells"][0]
    assert c["ood"][-1] == "sidepairs" and c["side"] == []
    aog = c["metrics"]["naive"]["AOG"]
    assert c["metrics"]["naive"]["AOG_mean"] == pytest.approx(np.mean([aog[t] for t in c["ood"]]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{missing}"], "nope.jsonl: file not found"),
        (["ultrafeedback"], "is the source dataset 'ultrafeedback' of this run"),
        ([A], f"target '{A}' is already an OOD target of this run"),
        (["no-such-dataset"], "no-such-dataset: neither a dataset name"),
        (["pandalm", "--format", "trl"], "--format applies to a file"),
        (["{malformed}", "--no-skip-invalid"], "bad.jsonl, row 2, field 'rejected'"),  # the run skips
        (["{new}", "{new}"], f"target '{NEW}' is given twice"),
        # every row invalid and skipped (the run's skip_invalid): the rows skipped are counted, the first named
        (["{allbad}"], "0 valid pairs (2 invalid row(s) skipped (first: "),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(evaluated, new_file, tmp_path, argv, message):
    out, _, _ = evaluated
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "q", "chosen": "a"}\n', encoding="utf-8"
    )
    (tmp_path / "allbad.jsonl").write_text('{"prompt": "q"}\n{"prompt": "r", "chosen": "a"}\n', encoding="utf-8")
    argv = [
        a.format(missing=tmp_path / "nope.jsonl", malformed=bad, new=new_file, allbad=tmp_path / "allbad.jsonl")
        for a in argv
    ]
    snap = _snapshot(out)
    code, _, err = _cli(["evaluate", str(out), *argv])
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert _snapshot(out) == snap


def test_not_a_run_directory_exits_2(tmp_path, new_file):
    code, _, err = _cli(["evaluate", str(tmp_path), str(new_file)])
    assert code == 2 and "not a finished w2s-shift run directory: run.json (the run marker) is missing" in err
    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "config.yaml").write_text("seeds: [0]\n")
    code, _, err = _cli(["evaluate", str(tmp_path), str(new_file)])
    assert code == 2 and "metrics.json: not found" in err and "finish the run first (`w2s-shift run` resumes it)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "run.json"]  # not even a lock file
    code, _, err = _cli(["evaluate", str(tmp_path / "nope"), str(new_file)])
    assert code == 2 and "not a directory" in err and not (tmp_path / "nope").exists()


def test_a_killed_evaluate_resumes_from_its_last_finished_target(evaluated, capsys):
    """Scoring the second of two targets fails (as a kill would stop it): the first target's stage is kept,
    metrics.json is unchanged; the rerun reuses the first target and scores the second."""
    out, _, _ = evaluated
    import w2s_shift.pipeline.evaluate as ev
    import w2s_shift.pipeline.score_stage as scoring

    metrics_before = (out / "metrics.json").read_bytes()
    real = scoring.save_rewards

    def dies_on_online(cell_dir, model, dataset, pairs, rewards, precision=None):
        if dataset == "hh-helpful-online" and model == "naive":
            raise KeyboardInterrupt
        real(cell_dir, model, dataset, pairs, rewards, precision)

    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        mp.setattr(scoring, "save_rewards", dies_on_online)
        with pytest.raises(KeyboardInterrupt):
            ev.evaluate_run(out, ["pandalm", "hh-helpful-online"], skip_invalid=True, n_pairs=8)
    stages = out / "ultrafeedback" / "seed0" / "stages"
    assert (stages / "score-naive__pandalm.json").is_file()
    assert (stages / "score-teacher__hh-helpful-online.json").is_file()  # the teacher finished it
    assert not (stages / "score-naive__hh-helpful-online.json").exists()
    assert (out / "metrics.json").read_bytes() == metrics_before
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        m = ev.evaluate_run(out, ["pandalm", "hh-helpful-online"], skip_invalid=True, n_pairs=8)
    stdout = capsys.readouterr().out
    assert "ultrafeedback seed 0: pandalm scored earlier, reusing its rewards" in stdout
    assert "scoring naive on pandalm" not in stdout and "scoring naive on hh-helpful-online" in stdout
    assert m["cells"][0]["ood"] == [A, NEW] and m["cells"][0]["side"] == ["pandalm", "hh-helpful-online"]
    assert [e["name"] for e in m["evaluated_targets"]] == [NEW, "pandalm", "hh-helpful-online"]
    assert read_json(out / "metrics.json")["cells"][0]["side"] == m["cells"][0]["side"]


def test_a_later_run_says_how_to_add_back_the_targets_evaluate_added(
    evaluated, tiny_model_dirs, lm_student, new_file, tmp_path, capsys
):
    """A rerun of the run's config (in a copy of the directory) rebuilds metrics.json from the config, names the
    target `evaluate` added and the command that adds it back; that command scores nothing again."""
    out, _, _ = evaluated
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        m = run(_cfg(tiny_model_dirs, lm_student, copy, [A]))
    log = capsys.readouterr().out
    assert m["cells"][0]["ood"] == [A] and "evaluated_targets" not in m
    added = [e["name"] for e in read_json(out / "metrics.json")["evaluated_targets"]]  # NEW (+ earlier tests')
    assert NEW in added
    assert f"target(s) {', '.join(added)} added to this run earlier by `w2s-shift evaluate`" in log
    assert f"`w2s-shift evaluate {copy} {new_file.resolve()} --headline`" in log
    assert "adds them back without scoring again" in log
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        import w2s_shift.pipeline.score_stage

        mp.setattr(w2s_shift.pipeline.score_stage, "save_rewards", lambda *a, **k: pytest.fail("rescored"))
        code, stdout, _ = _cli(["evaluate", str(copy), str(new_file), "--headline"])
    assert code == 0 and f"{NEW} scored earlier, reusing its rewards" in stdout
    assert read_json(copy / "metrics.json")["cells"][0]["ood"] == [A, NEW]


def test_damaged_saved_weights_are_refused_before_any_model_is_scored(evaluated, tmp_path):
    """A truncated models/<label>.safetensors of the last model is found up front (its header), exit 2 naming the
    file, and nothing is written: it was found only when that model was loaded, after the teacher's and the other
    students' rewards, stage markers and drift files had been written for the new target."""
    import shutil

    out, _, _ = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    cell = copy / "ultrafeedback" / "seed0"
    last = [m for m in read_json(cell / "metrics.json")["models"] if (cell / "models" / f"{m}.safetensors").is_file()]
    w = cell / "models" / f"{last[-1]}.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    target = tmp_path / "fresh.jsonl"
    target.write_text(
        "".join(f'{{"prompt": "fresh {i}", "chosen": "yes {i}", "rejected": "no"}}\n' for i in range(6)),
        encoding="utf-8",
    )
    snap = _snapshot(copy)
    code, _, err = _cli(["evaluate", str(copy), str(target)])
    assert code == 2, err
    assert sorted(k for k, v in _snapshot(copy).items() if snap.get(k) != v) == []
    assert f"{w}: not a readable safetensors file" in err and "the saved weights are damaged" in err
    assert "Traceback" not in err


def test_swapped_saved_weights_are_refused_by_evaluate_and_trained_again_by_run(
    evaluated, tiny_model_dirs, lm_student, tmp_path, capsys
):
    """Two students' weight files swapped (same shapes, each .json intact): each file's header carries its training
    digest, so `evaluate` refuses up front, naming the file, and `run` trains those two again instead of scoring the
    other model's weights under their names."""
    import shutil

    from w2s_shift.models.state import saved_weights_problem

    out, _, _ = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    cell = copy / "ultrafeedback" / "seed0"
    w = {m: cell / "models" / f"{m}.safetensors" for m in ("naive", "ceiling")}
    digests = {m: read_json(cell / "models" / f"{m}.json")["digest"] for m in w}
    assert digests["naive"] != digests["ceiling"] and all(saved_weights_problem(w[m], digests[m]) is None for m in w)
    data = {m: w[m].read_bytes() for m in w}
    w["naive"].write_bytes(data["ceiling"])
    w["ceiling"].write_bytes(data["naive"])
    snap = _snapshot(copy)
    code, _, err = _cli(["evaluate", str(copy), str(tmp_path / "unused.jsonl")])
    assert code == 2 and "unused.jsonl" in err  # a missing target is found first
    target = tmp_path / "fresh.jsonl"
    target.write_text('{"prompt": "p", "chosen": "yes", "rejected": "no"}\n', encoding="utf-8")
    code, _, err = _cli(["evaluate", str(copy), str(target)])
    assert code == 2, err
    why = f"these weights were saved by training digest {digests['ceiling']}, not {digests['naive']}"
    assert f"{w['naive']}: {why}" in err
    assert "Traceback" not in err and _snapshot(copy) == snap
    capsys.readouterr()
    run(_cfg(tiny_model_dirs, lm_student, copy, [A]))
    log = capsys.readouterr().out
    for m in w:
        assert f"student {m}: {w[m]}: these weights were saved by training digest" in log and "training it again" in log
        assert saved_weights_problem(w[m], digests[m]) is None  # its own weights again


@pytest.mark.parametrize(
    "name, text, what",
    [
        ("config.yaml", ": : :\n", "ParserError"),
        ("config.yaml", "seeds: [0]\nnot_a_field: 1\n", "ValidationError"),
        ("run.json", "{", "JSONDecodeError"),
        ("metrics.json", "[", None),
    ],
)
def test_an_unreadable_run_file_is_named(tmp_path, new_file, name, text, what):
    """The error named only the run directory ("cannot read the run's files"), not which of its files is damaged."""
    (tmp_path / "config.yaml").write_text("seeds: [0]\n")
    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / name).write_text(text)
    code, _, err = _cli(["evaluate", str(tmp_path), str(new_file)])
    says = f"cannot read this file of the run ({what})" if what else "not JSON (Expecting value, line 1)"
    assert code == 2 and f"{tmp_path / name}: {says}" in err, err


def test_n_pairs_all_scores_every_pair_and_n_subsamples(evaluated, tmp_path):
    """`evaluate` scores every pair of a new set by default (here 30, above the run's data.n_ood of 10) and says
    so; `--n-pairs 5` scores 5; the report's table states n per set; a bad value exits 2."""
    out, _, _ = evaluated
    pairs = load_named("pandalm", skip_invalid=True).pairs[:30]
    f = tmp_path / "bench30.jsonl"
    f.write_text("".join(json.dumps(p.to_json()) + "\n" for p in pairs), encoding="utf-8")
    for n, argv in ((30, []), (5, ["--n-pairs", "5"])):
        copy = tmp_path / f"copy{n}"
        shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
        with pytest.MonkeyPatch.context() as mp:
            _no_training(mp)
            code, stdout, err = _cli(["evaluate", str(copy), str(f), *argv])
        assert code == 0, err
        how = "all of them" if n == 30 else "--n-pairs 5"
        assert (
            f"target bench30: 30 valid pairs, 0 removed because their prompt is in the source, {n} scored ({how})"
            in (stdout)
        )
        c = read_json(copy / "metrics.json")["cells"][0]
        assert (
            c["n_pairs"]["bench30"] == n
            and len(read_jsonl(copy / "ultrafeedback/seed0/rewards/naive__bench30.jsonl")) == n
        )
        assert read_json(copy / "metrics.json")["evaluated_targets"][-1]["n_pairs"] == (n if argv else "all")
        assert f"| bench30 acc, n={n} |" in (copy / "report.md").read_text(encoding="utf-8")
    code, _, err = _cli(["evaluate", str(tmp_path / "copy5"), str(f)])  # added with 5 earlier: not silently reused
    assert code == 2 and "added to this run earlier with --n-pairs 5" in err
    for bad in ("0", "some"):
        code, _, err = _cli(["evaluate", str(out), str(f), "--n-pairs", bad])
        assert code == 2 and "--n-pairs must be a whole number from 1 to 100,000,000 or 'all'" in err


@pytest.mark.parametrize("command, link", [("report", "plots"), ("evaluate", "ultrafeedback/seed0/rewards")])
def test_report_and_evaluate_refuse_a_link_out_of_the_run_directory(evaluated, tmp_path, command, link):
    """A folder of the run replaced by a symbolic link to a folder outside it: `report` and `evaluate` wrote their
    files there (exit 0); now they stop before writing, naming the link, as `run` does (one check for every writer)."""
    out, _, _ = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(copy / link, elsewhere)
    shutil.rmtree(copy / link)
    (copy / link).symlink_to(elsewhere, target_is_directory=True)
    target = tmp_path / "fresh.jsonl"
    target.write_text(
        "".join(f'{{"prompt": "fresh {i}", "chosen": "yes {i}", "rejected": "no"}}\n' for i in range(6)),
        encoding="utf-8",
    )
    outside, inside = _snapshot(elsewhere), _snapshot(copy)
    code, _, err = _cli([command, str(copy)] + ([str(target)] if command == "evaluate" else []))
    assert code == 2, err
    assert f"{copy / link}: a symbolic link to {elsewhere}, outside the run directory" in err, err
    assert _snapshot(elsewhere) == outside and _snapshot(copy) == inside


def test_evaluate_takes_the_runs_skip_invalid_unless_told(evaluated, tmp_path):
    """The run's config has data.skip_invalid: true; `evaluate RUN pandalm` stopped at pandalm's first invalid row
    ("row 19, field 'rejected': empty string") all the same. It now skips and counts invalid rows as the run would;
    --no-skip-invalid stops at the first."""
    out, _, _ = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    f = tmp_path / "skippy.jsonl"
    rows = [{"prompt": f"new prompt {i}", "chosen": f"yes {i}", "rejected": "no"} for i in range(5)]
    rows.insert(2, {"prompt": "broken", "chosen": "yes", "rejected": ""})
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    snap = _snapshot(copy)
    code, _, err = _cli(["evaluate", str(copy), str(f), "--no-skip-invalid"])
    assert code == 2 and "skippy.jsonl, row 3, field 'rejected'" in err and "--skip-invalid" in err, err
    assert _snapshot(copy) == snap
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        code, stdout, err = _cli(["evaluate", str(copy), str(f)])
    assert code == 0, err
    assert "target skippy: 5 valid pairs" in stdout and "1 invalid rows skipped" in stdout, stdout
    entry = read_json(copy / "metrics.json")["evaluated_targets"][-1]
    assert entry["name"] == "skippy" and entry["skip_invalid"] is True
    assert read_json(copy / "metrics.json")["cells"][0]["n_pairs"]["skippy"] == 5


@pytest.mark.parametrize("n", ["\u0663", "\uff13", "100000000000000000000000", "1e23"])
def test_n_pairs_beyond_ascii_digits_or_the_bound_is_refused_clearly(evaluated, new_file, n):
    out, _, _ = evaluated
    snap = _snapshot(out)
    code, _, err = _cli(["evaluate", str(out), str(new_file), "--n-pairs", n])
    assert code == 2 and "--n-pairs must be a whole number from 1 to 100,000,000 or 'all'" in err, err
    assert "Traceback" not in err and "unexpected error" not in err and _snapshot(out) == snap


def test_a_target_named_like_an_internal_split_is_refused(evaluated, new_file, tmp_path):
    out, _, _ = evaluated
    f = tmp_path / "student_train.jsonl"
    shutil.copy(new_file, f)
    snap = _snapshot(out)
    code, _, err = _cli(["evaluate", str(out), str(f)])
    assert code == 2 and "target 'student_train'" in err and "internal split" in err, err
    assert _snapshot(out) == snap


def test_evaluate_refuses_stages_of_other_code_as_run_does(evaluated, new_file, tmp_path):
    """A finished stage whose marker records other stage-format versions: `run` refuses it without --overwrite;
    `evaluate` added this code's rewards beside it."""
    out, _, _ = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    m = copy / "ultrafeedback" / "seed0" / "stages" / "teacher.json"
    info = read_json(m)
    info["versions"] = {k: -1 for k in info["versions"]}
    m.write_text(json.dumps(info))
    snap = _snapshot(copy)
    code, _, err = _cli(["evaluate", str(copy), str(new_file)])
    assert code == 2 and "1 finished stage(s) were computed by other w2s-shift code" in err, err
    assert "ultrafeedback/seed0/teacher" in err and "--overwrite" in err and _snapshot(copy) == snap


def test_every_rewards_file_records_the_precision_it_was_computed_in(evaluated):
    out, _, _ = evaluated
    cell = out / "ultrafeedback" / "seed0"
    files = sorted((cell / "rewards").glob("*.jsonl"))
    assert len(files) >= 7 and "teacher__student_train.jsonl" in [f.name for f in files]
    for f in files:
        assert {r["precision"] for r in read_jsonl(f)} == {"float32"}, f  # bf16: false in this run
    assert read_json(cell / "stages" / f"score-naive__{A}.json")["precision"] == "float32"


def test_export_saves_a_student_of_a_finished_run_and_changes_nothing_else(evaluated, tmp_path):
    """`w2s-shift export RUN LABEL`: from the saved weights, without training, scoring or rebuilding the report (a
    config's `export:` rerun rebuilt the report and dropped the targets `evaluate` added)."""
    out, _, _ = evaluated
    before = _snapshot(out)
    cell = out / A_SOURCE / "seed0"
    code, stdout, err = _cli(["export", str(out), "naive", "--dry-run"])
    assert code == 0 and stdout.strip() == f"would write {cell / 'export' / 'naive'}" and _snapshot(out) == before
    for argv, says in (
        (["zero_shot"], "no trained student 'zero_shot' in this run; it can export naive, ceiling (or all)"),
        (["naive", "--seed", "3"], "--seed 3 is not a seed of this run (0)"),
        (["naive", "--source", "nope"], f"--source 'nope' is not a source of this run ({A_SOURCE})"),
    ):
        code, _, err = _cli(["export", str(out), *argv])
        assert code == 2 and says in err, err
    assert _snapshot(out) == before
    with pytest.MonkeyPatch.context() as mp:
        _no_training(mp)
        import w2s_shift.pipeline.score_stage as scoring

        mp.setattr(scoring, "save_rewards", lambda *a, **k: pytest.fail("export must not score"))
        code, stdout, err = _cli(["export", str(out), "naive"])
    assert code == 0, err
    after = _snapshot(out)
    new = sorted(set(after) - set(before))
    assert new and all(f.startswith(f"{A_SOURCE}/seed0/export/naive/") for f in new)
    assert {k: v for k, v in after.items() if k in before} == before  # metrics.json, the report: unchanged
    assert NEW in read_json(out / "metrics.json")["cells"][0]["ood"]  # the evaluated target stays
    info = read_json(cell / "export" / "naive" / "w2s_shift_export.json")
    assert info["metadata"]["weights_digest"] == read_json(cell / "models" / "naive.json")["digest"]
    assert "`naive`, `ceiling`" in (out / "report.md").read_text()  # the report lists what can be exported
    # the same command again keeps the export (same weights, same files); an export folder whose files were changed
    # (another model's weights copied in, a file removed) is written again, never reported as exported as it is
    exported = _snapshot(cell / "export" / "naive")
    assert set(info["files"]) == set(exported) - {"w2s_shift_export.json"}
    stamp = (cell / "export" / "naive" / "model.safetensors").stat().st_mtime_ns
    assert _cli(["export", str(out), "naive"])[0] == 0
    assert (cell / "export" / "naive" / "model.safetensors").stat().st_mtime_ns == stamp
    (cell / "export" / "naive" / "model.safetensors").write_bytes(b"not the weights")
    (cell / "export" / "naive" / "config.json").unlink()
    assert _cli(["export", str(out), "naive"])[0] == 0
    assert _snapshot(cell / "export" / "naive") == exported

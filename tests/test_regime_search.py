"""The CPU regime search (benchmarks/regime_search.py): its declaration, its rule, and a --smoke run on tiny models.

The smoke run goes through the same code as the real search (validation file, `w2s-shift run` in a child process,
the numbers, the results file); its accuracies are those of tiny random-init models and mean nothing.
"""

import calendar
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SMOKE_ONLY = ["3", "12", "15"]  # three sources, both teacher strengths, three depths


def _load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_regime_search", BENCH / "regime_search.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


R = _load()


def test_the_declared_search_covers_sources_teachers_and_depths_cheapest_first():
    from w2s_shift.data.adapters import DATASETS

    s = R.load_search()
    rows = R.declared(s)
    assert len(rows) >= 12
    assert len({r["source"] for r in rows}) >= 3
    assert len({r["teacher"] for r in rows}) >= 2
    assert len({r["depth"] for r in rows}) >= 2
    assert len({r["id"] for r in rows}) == len(rows)
    costs = [s["depths"][r["depth"]]["cost"] for r in rows]
    assert costs == sorted(costs)  # run order: the cheaper depths first
    for src in {r["source"] for r in rows}:  # offline: bundled or in the shared data folder, never the hub
        spec = DATASETS[src]
        assert spec.bundled or spec.files, src
    pre = s["preconditions"]
    assert (pre["gap_min_pp"], pre["gap_ci_low_above_pp"], pre["naive_wrg_above_pp"], pre["level"]) == (
        5.0,
        0.0,
        0.0,
        0.95,
    )


def test_each_configuration_is_an_ordinary_run_config_scored_on_the_validation_file(tmp_path):
    from w2s_shift.config import RunConfig

    s = R.load_search()
    for c in R.declared(s):
        d = R.run_config(s, c, tmp_path / "val.jsonl", tmp_path / c["id"])
        cfg = RunConfig.model_validate(d)
        assert cfg.seeds == [0]
        assert [r.display for r in cfg.data.sources] == [c["source"]]
        assert [(r.path, r.display) for r in cfg.data.ood] == [(str(tmp_path / "val.jsonl"), "validation")]
        assert cfg.data.remove_ood_overlap is False  # the file's pairs come from the source: keep them
        assert [m.name for m in cfg.methods] == ["naive", "anchor", "ceiling"]
        anchor = cfg.methods[1]
        assert anchor.anchor_lambda == 1.0 and anchor.anchor_layers == "last"
        assert cfg.student.trainable_layers == s["depths"][c["depth"]]["student"]["trainable_layers"]
        assert cfg.teacher.trainable_layers == s["teachers"][c["teacher"]]["teacher"]["trainable_layers"]
        assert cfg.data.n_teacher_train == s["teachers"][c["teacher"]]["data"]["n_teacher_train"]


def _numbers(gap, lo, wrg):
    return {"gap": {"value": gap, "ci": [lo, gap + 5]}, "naive_wrg": {"value": wrg, "ci": [wrg - 5, wrg + 5]}}


def test_the_rule_is_the_declared_preconditions_and_nothing_else():
    pre = R.load_search()["preconditions"]
    assert R.qualifies(_numbers(5.0, 0.1, 0.1), pre)[0] is True
    ok, why = R.qualifies(_numbers(4.99, 0.1, 3.0), pre)
    assert not ok and why == "gap +4.99 < 5 pp"
    ok, why = R.qualifies(_numbers(9.0, 0.0, 3.0), pre)
    assert not ok and why == "gap interval low +0.00 <= 0"
    ok, why = R.qualifies(_numbers(9.0, 1.0, 0.0), pre)
    assert not ok and why == "naive WRG +0.00 <= 0"
    ok, why = R.qualifies(_numbers(-2.0, -6.0, -1.0), pre)
    assert why.count(";") == 2


def test_the_committed_choice_is_the_rule_applied_and_its_inputs_are_shown():
    """The committed results file: `chosen` is the qualifying row with the fewest wall minutes, and the table says
    what each qualifying row's minutes were measured under (wall minutes carry the machine's load)."""
    res = json.loads((BENCH / "results" / "regime_search-2026-12-07.json").read_text())
    done = [r for r in res["configurations"] if r["status"] == "done"]
    q = [r for r in done if R.qualifies(r["validation"], res["preconditions"])[0]]
    assert [r["id"] for r in q] == res["qualifying"] and res["chosen"] == min(q, key=lambda r: r["minutes"])["id"]
    md = R.markdown(res)
    if len(q) > 1:
        line = next(x for x in md.splitlines() if x.startswith("Tie-break inputs: "))
        assert all(f"{r['id'][:2]} {r['minutes']:.1f} wall" in line for r in q)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tokenizer):
    tok = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(tok)
    out = tmp_path_factory.mktemp("regime")
    res = out / "results.json"
    argv = ["--smoke", "--out", str(out), "--results", str(res), "--tokenizer", str(tok), "--only", *SMOKE_ONLY]
    rc = R.main(argv)
    return {"rc": rc, "out": out, "res": res, "argv": argv, "results": json.loads(res.read_text())}


def test_smoke_writes_every_row_and_the_preconditions_block(smoke):
    assert smoke["rc"] == 0
    r = smoke["results"]
    s = R.load_search()
    assert r["smoke"] is True
    assert [c["id"] for c in r["configurations"]] == [c["id"] for c in R.declared(s)]
    done = [c for c in r["configurations"] if c["status"] == "done"]
    assert [c["id"][:2] for c in done] == [f"{int(k):02d}" for k in SMOKE_ONLY]
    assert all(c["status"] == "pending" for c in r["configurations"] if c not in done)
    pre = r["preconditions"]
    for k in ("gap_min_pp", "gap_ci_low_above_pp", "naive_wrg_above_pp", "level", "tie_break"):
        assert pre[k] == s["preconditions"][k]
    assert "no OOD number, no test-split number" in pre["rule"]
    # declared before the first configuration ran: earlier than every finished stage of every run
    declared = calendar.timegm(time.strptime(pre["declared_utc"], "%Y-%m-%d %H:%M:%S"))
    stages = [p for c in done for p in Path(c["run_dir"]).glob("*/seed*/stages/*.json")]
    assert len(stages) >= 4 * len(done)
    assert declared <= min(p.stat().st_mtime for p in stages)
    assert r["cpu"]["class"] and r["search_sha256"]
    for c in done:
        v = c["validation"]
        assert v["pairs"] == s["smoke"]["validation_pairs"]
        assert c["qualifies"] is R.qualifies(v, s["preconditions"])[0]
        assert c["minutes"] > 0
        assert {t["model"] for t in c["costs"]["trainings"]} == {"teacher", "naive", "anchor", "ceiling"}
        assert all(t["steps"] > 0 and t["seconds"] >= 0 for t in c["costs"]["trainings"])
    md = smoke["res"].with_suffix(".md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2:4].isdigit()]
    assert len(table) == len(r["configurations"])
    assert "**Preconditions**" in md and r["cpu"]["class"] in md
    assert sum(ln.endswith("| pending |") for ln in table) == len(r["configurations"]) - len(SMOKE_ONLY)


def _correct(cell: Path, model: str) -> np.ndarray:
    rows = [json.loads(x) for x in (cell / "rewards" / f"{model}__validation.jsonl").read_text().splitlines()]
    return np.array([r["reward_chosen"] > r["reward_rejected"] for r in rows], dtype=float)


def test_smoke_numbers_recomputed_from_the_validation_rewards(smoke):
    for c in [c for c in smoke["results"]["configurations"] if c["status"] == "done"]:
        run = Path(c["run_dir"])
        m = json.loads((run / "metrics.json").read_text())["cells"][0]
        cell = run / m["dir"]
        lab = {x["name"]: x["label"] for x in m["methods"]}
        t, n, ce = (_correct(cell, k) for k in ("teacher", lab["naive"], lab["ceiling"]))
        v = c["validation"]
        assert v["gap"]["value"] == pytest.approx(100 * (ce.mean() - t.mean()), abs=0.01)
        assert v["naive_wrg"]["value"] == pytest.approx(100 * (n.mean() - t.mean()), abs=0.01)
        assert v["gap"]["ci"][0] <= v["gap"]["value"] <= v["gap"]["ci"][1]
        if ce.mean() > t.mean():
            assert v["naive_pgr"]["value"] == pytest.approx((n.mean() - t.mean()) / (ce.mean() - t.mean()), abs=1e-3)
        else:
            assert v["naive_pgr"]["value"] is None
        drift = m["drift"]
        last = {k: drift[lab[k]]["final"]["validation"] for k in ("naive", "anchor")}
        ratio = (
            last["anchor"][max(last["anchor"], key=int)]["rel_sq_err"]
            / (last["naive"][max(last["naive"], key=int)]["rel_sq_err"])
        )
        assert v["drift_ratio"] == pytest.approx(ratio, abs=1e-3)


def test_smoke_validation_pairs_share_no_prompt_with_the_runs_splits(smoke):
    from w2s_shift.config_io import load_config
    from w2s_shift.data.resolve import resolve_dataset
    from w2s_shift.data.splits import prompt_keys
    from w2s_shift.pipeline.prepare import prepare_data

    for c in [c for c in smoke["results"]["configurations"] if c["status"] == "done"]:
        cfg = load_config(c["config"], [])
        val_file = smoke["out"] / "validation" / f"{c['source']}.jsonl"
        val = resolve_dataset(str(val_file)).pairs
        assert len(val) == R.load_search()["smoke"]["validation_pairs"]
        splits, _, _ = prepare_data(cfg, cfg.data.sources[0], 0)
        keys = set(prompt_keys(val))
        for name in ("teacher_train", "student_train", "test"):
            assert not keys & set(prompt_keys(splits[name])), name
        info = smoke["results"]["validation"]["files"][c["source"]]
        assert info["prompts_shared_with"] == {"teacher_train": 0, "student_train": 0, "test": 0}


def test_a_rerun_keeps_finished_configurations_and_other_preconditions_are_refused(smoke, tmp_path, capsys):
    logs = {
        c["id"]: (smoke["out"] / "logs" / f"{c['id']}.log").read_text()
        for c in smoke["results"]["configurations"]
        if c["status"] == "done"
    }
    assert R.main(smoke["argv"]) == 0
    for k, text in logs.items():  # nothing ran again
        assert (smoke["out"] / "logs" / f"{k}.log").read_text() == text
    again = json.loads(smoke["res"].read_text())
    assert again["preconditions"] == smoke["results"]["preconditions"]
    assert [c["status"] for c in again["configurations"]] == [c["status"] for c in smoke["results"]["configurations"]]
    other = tmp_path / "results.json"
    r = json.loads(smoke["res"].read_text())
    r["preconditions"]["gap_min_pp"] = 3.0
    other.write_text(json.dumps(r))
    argv = [*smoke["argv"]]
    argv[argv.index("--results") + 1] = str(other)
    capsys.readouterr()
    assert R.main(argv) == 2
    assert "another declaration of the search" in capsys.readouterr().err


def test_the_evidence_w2s_preset_is_the_chosen_configuration_on_its_test_split(tmp_path):
    """evidence-w2s trains exactly what the search chose (the committed results file's `chosen`), on the same split
    (data.seed, split_fractions), so its test split holds prompts the search never selected on."""
    from w2s_shift.config import RunConfig
    from w2s_shift.config_io import load_config
    from w2s_shift.data.adapters import DATASETS

    s = R.load_search()
    res = json.loads((BENCH / "results" / "regime_search-2026-12-07.json").read_text())
    row = next(c for c in R.declared(s) if c["id"] == res["chosen"])
    chosen = RunConfig.model_validate(R.run_config(s, row, tmp_path / "val.jsonl", tmp_path / "run"))
    preset = load_config("evidence-w2s")
    assert [r.display for r in preset.data.sources] == [row["source"]]
    for field in ("seed", "split_fractions", "n_teacher_train", "n_student_train", "skip_invalid"):
        assert getattr(preset.data, field) == getattr(chosen.data, field), field
    assert preset.teacher == chosen.teacher and preset.student == chosen.student
    category = DATASETS[row["source"]].category
    offline = {k for k, v in DATASETS.items() if v.category == category and v.files and k != row["source"]}
    assert {r.display for r in preset.data.ood} == offline  # every other source of the category read offline
    assert len(preset.seeds) >= 5 and preset.data.remove_ood_overlap
    anchors = [m for m in preset.expanded_methods() if m.name == "anchor"]
    last = sorted(m.anchor_lambda for m in anchors if m.anchor_layers == "last")
    assert last == [0.1, 1.0, 10.0]  # claim (c)'s sweep, declared before any result
    assert [m.anchor_layers for m in anchors if m.anchor_layers != "last"] == ["middle"]  # blocks 15 + 23 train
    assert {m.name for m in preset.expanded_methods()} >= {"naive", "confidence", "seam", "l2sp", "wise_ft", "grm"}


def test_the_read_after_the_choice_gives_each_finished_configurations_chance_at_five_seeds():
    # one validation seed: the pair SE from the interval's width, all of it shared by the seeds of one split, 2 pp
    # training SD assumed. A gap of +20 [+14, +26] passes in every seed; +6 [+1, +10.8] mostly does not (by hand:
    # need = max(5, 1.96 x 2.5) = 5, each seed N(6 + w, 2^2), w ~ N(0, 2.5^2) shared)
    from scipy import integrate
    from scipy import stats as st

    def row(i, gap, gap_ci, acc, acc_ci, status="done"):
        v = {"gap": {"value": gap, "ci": gap_ci}, "accuracy": {"teacher": {"value": acc, "ci": acc_ci}}}
        return {"id": f"{i:02d}-x", "status": status, "validation": v}

    res = {
        "configurations": [
            row(1, 20.0, [14.0, 26.0], 55.4, [51.0, 59.8]),
            row(2, 6.0, [1.0, 10.8], 61.4, [57.2, 65.6]),
            {"id": "03-x", "status": "pending"},
        ]
    }
    text = " ".join(R.read_after_choice(res))
    se = 9.8 / (2 * 1.959964)
    five = integrate.quad(lambda w: st.norm.pdf(w, scale=se) * st.norm.sf(5 - 6 - w, scale=2.0) ** 5, -40, 40)[0]
    assert f"02 gap {100 * five:.0f}%" in text and "01 gap 100%" in text and "03" not in text.split("): ")[1]
    assert "never used to choose" in text
    assert R.read_after_choice({"configurations": [{"id": "01-x", "status": "pending"}]}) == []

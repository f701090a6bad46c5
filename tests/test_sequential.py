"""Adding seeds until the claims are decided: the spending functions and boundaries by hand, the error rate over the
looks on simulated nulls as hard as real data, decisions frozen at the look that makes them, and
``w2s-shift run --until-decided --max-seeds N`` on a tiny grid (seeds added, resumed from its stages, bad input)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import cli_error, tiny_grid_dict

from w2s_shift.metrics.claims import INCONCLUSIVE, NO_INFORMATION, NOT_REPRODUCED, REPRODUCED, RULED_OUT
from w2s_shift.metrics.sequential import (
    ABOVE,
    BELOW,
    CONTINUE,
    OPEN,
    RULED,
    at_level,
    decide_at,
    frozen_verdicts,
    group_sequential_bounds,
    look_plan,
    obrien_fleming_spending,
    pocock_spending,
    sequential_decisions,
    stop_reason,
)
from w2s_shift.metrics.significance import seed_pair_interval


def test_spending_functions_by_hand():
    # Lan & DeMets (1983): O'Brien-Fleming type 2 - 2 Phi(z_0.975 / sqrt(t)); z_0.975 = 1.959964.
    # t = 0.5: z = 1.959964 sqrt(2) = 2.771808, 2 P(Z > 2.771808) = 2 x 0.0027873 = 0.0055746;
    # t = 0.4: z = 3.098975, 2 x 0.00097097 = 0.0019419; t = 1: all of alpha; t = 0: nothing
    got = obrien_fleming_spending([0.0, 0.4, 0.5, 1.0])
    assert got == pytest.approx([0.0, 0.0019419, 0.0055746, 0.05], abs=2e-7)
    # Pocock type alpha ln(1 + (e - 1) t): t = 0.5 -> 0.05 ln(1.8591409) = 0.05 x 0.6201145 = 0.0310057
    assert pocock_spending([0.0, 0.5, 1.0]) == pytest.approx([0.0, 0.0310057, 0.05], abs=2e-7)
    with pytest.raises(ValueError, match="information fractions"):
        obrien_fleming_spending([1.5])
    with pytest.raises(ValueError, match="alpha must be in"):
        pocock_spending([0.5], alpha=0)


def test_look_plan_spends_alpha_over_seeds_2_to_n():
    # looks at k = 2, 3, 4, 5 of N = 5: t = 0.4, 0.6, 0.8, 1; O'Brien-Fleming-type cumulative 0.0019419, 0.0113964
    # (z = 1.959964 / sqrt(0.6) = 2.530301), 0.0284296 (z = 2.191306), 0.05; each look's level its increment
    plan = look_plan(2, 5)
    assert [p["seeds"] for p in plan] == [2, 3, 4, 5] and [p["t"] for p in plan] == [0.4, 0.6, 0.8, 1.0]
    assert [p["spent"] for p in plan] == pytest.approx([0.0019419, 0.0113964, 0.0284296, 0.05], abs=2e-7)
    assert [p["alpha"] for p in plan] == pytest.approx([0.0019419, 0.0094545, 0.0170332, 0.0215704], abs=3e-7)
    assert sum(p["alpha"] for p in plan) == pytest.approx(0.05)
    assert [p["alpha"] for p in look_plan(2, 5, spending="bonferroni")] == pytest.approx([0.0125] * 4)
    # the group-sequential reading: the last look's nominal level is larger than the increment, the first the same
    gs = look_plan(2, 5, boundary="group-sequential")
    assert gs[0]["alpha"] == pytest.approx(plan[0]["alpha"], rel=1e-6)
    assert gs[-1]["alpha"] == pytest.approx(0.03907, abs=1e-4) and gs[-1]["alpha"] > plan[-1]["alpha"]
    for bad, match in (((1, 5), "2 <= first"), ((4, 3), "2 <= first")):
        with pytest.raises(ValueError, match=match):
            look_plan(*bad)
    with pytest.raises(ValueError, match="spending must be one of"):
        look_plan(2, 5, spending="haybittle")


def test_group_sequential_bounds_match_the_published_tables():
    # five equally spaced looks, alpha 0.025 on each side: Lan-DeMets O'Brien-Fleming type 4.877, 3.357, 2.680, 2.290,
    # 2.031; Pocock type 2.438, 2.427, 2.410, 2.397, 2.386 (Jennison & Turnbull 2000, Ch. 7; R's gsDesign / ldbounds)
    from scipy import stats as st

    t = np.arange(1, 6) / 5
    obf = 2 * (2 - 2 * st.norm.cdf(st.norm.isf(0.0125) / np.sqrt(t)))
    assert group_sequential_bounds(t, obf) == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=1e-3)
    assert group_sequential_bounds(t, pocock_spending(t)) == pytest.approx(
        [2.438, 2.427, 2.410, 2.397, 2.386], abs=1e-3
    )


def test_sequential_decisions_stop_at_the_first_decision():
    # m = 3.8; looks (mean, half-width): ruled out needs the interval inside (-3.8, 3.8)
    means = np.array([[1.0, 1.0, 1.0], [5.0, 9.0, 9.0], [-9.0, -9.0, -9.0], [5.0, 0.0, 9.0], [0.0, 0.0, 0.0]])
    half = np.array([[9.0, 2.0, 0.5], [6.0, 8.0, 1.0], [8.0, 1.0, 1.0], [6.0, 1.0, 1.0], [9.0, 9.0, 9.0]])
    decision, look = sequential_decisions(means, half, 3.8)
    assert decision.tolist() == [RULED, ABOVE, BELOW, RULED, CONTINUE]
    assert look.tolist() == [1, 1, 0, 1, 2]


def _bench(name: str):
    """A benchmark script as a module (benchmarks/sequential_design.py reuses interval_coverage.py's simulator)."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(f"bench_{name}_seq", bench / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_false_decision_rate_over_the_looks_stays_within_5_percent_on_simulated_nulls():
    # interval_coverage.py's correlated world (one shared split of 2,000 pairs, pair effects shared by the seeds,
    # contested pairs, seed SD 4 pp), looks at 2, 3, 4, 5 seeds, 1,500 nulls: Monte Carlo SE of a 5% share 0.56
    # points, limit 6.1%. benchmarks/results/sequential_design-2026-12-07.json (4,000 a row): uncorrected looks 10.8%,
    # O'Brien-Fleming union 3.2%, group-sequential 4.5%; this band can fail: looking again at 0.05 leaves it
    bench = _bench("sequential_design")
    row = bench.run_row(np.random.default_rng(11), 5, 2000, 4.0, 1500)
    limit = 0.05 + 2 * (0.05 * 0.95 / 1500) ** 0.5
    rates = {r: row["rules"][r]["false_decision"] for r in bench.RULES}
    assert rates["obf-union"] <= limit and rates["obf-group-sequential"] <= limit, rates
    assert rates["bonferroni"] <= limit and rates["uncorrected"] > limit, rates
    assert rates["obf-union"] <= rates["obf-group-sequential"] <= rates["uncorrected"], rates
    # a true effect of 10 pp: decided above 0 by 5 seeds most of the time, with fewer seeds on average than 5
    ten = row["rules"]["obf-group-sequential"]["by_effect"]["10"]
    assert ten["right"] > 0.8 and ten["expected_seeds"] < 4.5, ten
    assert row["rules"]["obf-group-sequential"]["false_ruled_out_at_m"] <= 0.025 + 2 * (0.025 / 1500) ** 0.5


def _claim(points: list, noise: float = 1.0) -> dict:
    """A one-row superiority claim on a seeds x pairs comparison (3 seeds, bootstrap SD ``noise`` pp per seed)."""
    rng = np.random.default_rng(0)
    reps = np.asarray(points) + noise * rng.standard_normal((400, len(points)))
    stat = seed_pair_interval(points, reps, groups=list(range(len(points))))
    return {"claim": "b", "rows": [{"what": "NTS x - y", "stat": stat, "want": 1, "primary": True}], "why": None}


def test_a_look_decides_at_its_own_level():
    # seeds 5.5, 6, 6.5 pp: p from the generalized interval ~0.003, so reproduced at 0.05 and not at the first look's
    # 0.0019; at_level widens the interval and leaves p alone; the input claim is untouched
    c = _claim([5.5, 6.0, 6.5])
    stat = c["rows"][0]["stat"]
    wide = at_level(stat, 0.0019)
    assert wide["p"] == stat["p"] and wide["level"] == pytest.approx(1 - 0.0019)
    assert at_level(stat, 0.05)["ci"] == pytest.approx(stat["ci"])
    assert wide["ci"][0] < stat["ci"][0] and wide["ci"][1] > stat["ci"][1] and wide["mde"] > stat["mde"]
    assert 0.0019 < stat["p"] < 0.05, stat["p"]
    at05, at_first = decide_at([c], 0.05)[0], decide_at([c], 0.0019)[0]
    assert at05["verdict"] == REPRODUCED and at05["alpha"] == 0.05
    assert at_first["verdict"] in (INCONCLUSIVE, NO_INFORMATION) and at_first["rows"][0]["status"] != "for"
    assert "verdict" not in c and c["rows"][0]["stat"] is stat
    # the first look of a 40-seed plan, alpha 1.9e-18: its level rounds to 1.0, yet the MDE Holm's step reads is at
    # 1.9e-18 / m (finite, larger than at 0.0019), never at alpha 0 (infinite, read as "nothing varies")
    from w2s_shift.metrics.significance import mde_of

    tiny = at_level(stat, 1.9e-18)
    assert tiny["level"] == 1.0 and tiny["alpha"] == 1.9e-18
    assert wide["mde"] < mde_of(tiny) < mde_of(tiny, family=3) < np.inf
    row = decide_at([c], 1.9e-18)[0]["rows"][0]
    assert row["status"] == NO_INFORMATION and np.isfinite(row["stat"]["mde"])


def test_frozen_verdicts_keep_the_first_decision():
    looks = [
        {"seeds": 2, "claims": {"s/a": NO_INFORMATION, "s/b": NO_INFORMATION, "s/c": "not tested"}},
        {"seeds": 3, "claims": {"s/a": REPRODUCED, "s/b": INCONCLUSIVE, "s/c": "not tested"}},
        {"seeds": 4, "claims": {"s/a": INCONCLUSIVE, "s/b": RULED_OUT, "s/c": "not tested"}},
        {"seeds": 5, "claims": {"s/a": NOT_REPRODUCED, "s/b": INCONCLUSIVE, "s/c": "not tested"}},
    ]
    got = frozen_verdicts(looks)
    assert got["s/a"] == {"verdict": REPRODUCED, "seeds": 3, "open": False}
    assert got["s/b"] == {"verdict": RULED_OUT, "seeds": 4, "open": False}
    assert got["s/c"] == {"verdict": "not tested", "seeds": 5, "open": False}
    assert frozen_verdicts(looks[:1])["s/a"]["open"] and NO_INFORMATION in OPEN


def test_the_loop_stops_when_nothing_is_open_and_says_which_claims_are_withheld():
    open_ = {"s/a": {"verdict": NO_INFORMATION, "seeds": 3, "open": True}}
    assert stop_reason(open_, 3, 5) is None  # a claim open, seeds left: add one
    assert stop_reason(open_, 5, 5) == "--max-seeds 5 reached with 1 claim(s) open: s/a"
    assert stop_reason({}, 2, 5) == "no claim of the paper to decide: the grid has none of its W2S methods"
    closed = {
        "s/a": {"verdict": "withheld", "seeds": 2, "open": False},
        "s/b": {"verdict": RULED_OUT, "seeds": 2, "open": False},
    }
    assert stop_reason(closed, 2, 5) == (
        "every claim decided or closed at 2 seeds; withheld: s/a (a seed without the weak-to-strong gap stays in the "
        "run, so more seeds cannot decide them)"
    )
    assert stop_reason({"s/b": closed["s/b"]}, 2, 5) == "every claim decided or closed at 2 seeds"


def _stage_times(run: Path) -> dict:
    return {str(p.relative_to(run)): p.stat().st_mtime_ns for p in sorted(run.glob("*/seed*/stages/*.json"))}


def test_run_until_decided_adds_seeds_up_to_n_and_resumes_from_its_stages(
    tmp_path, tiny_model_dirs, lm_student_dir, capsys
):
    from w2s_shift.cli import main

    run = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, run, ["pandalm"], ["naive"], seeds=[0, 1])
    cfg.write_text(yaml.safe_dump(d))
    assert main(["run", str(cfg), "--until-decided", "--max-seeds", "3"]) == 0
    out = capsys.readouterr().out
    rec = json.loads((run / "sequential.json").read_text())
    # 10 ID and 8 OOD test pairs say nothing about claim (a) at any look: the loop adds seed 2 and stops at N = 3
    assert [look["seed_list"] for look in rec["looks"]] == [[0, 1], [0, 1, 2]]
    assert [look["alpha"] for look in rec["looks"]] == pytest.approx([p["alpha"] for p in look_plan(2, 3)])
    assert rec["plan"]["max_seeds"] == 3 and rec["seeds_used"] == 3
    assert all(v in OPEN for look in rec["looks"] for k, v in look["claims"].items() if k.endswith("/a"))
    assert rec["stopped"].startswith("--max-seeds 3 reached") and "ultrafeedback/a" in rec["stopped"]
    assert rec["verdicts"]["ultrafeedback/b"] == {"verdict": "not tested", "seeds": 3, "open": False}
    metrics = json.loads((run / "metrics.json").read_text())
    assert sorted(c["seed"] for c in metrics["cells"]) == [0, 1, 2]
    assert "until-decided: look 2 of 2: seeds [0, 1, 2], alpha 0.0" in out and "until-decided: stopped: " in out
    # the report, redrawn after the last look, leads with the frozen verdicts and the look each came from
    report = (run / "report.md").read_text()
    seq = report.split("## Seeds added until decided", 1)[1].split("\n## ", 1)[0]
    assert report.index("## Seeds added until decided") < report.index("## Source ultrafeedback")
    assert "| ultrafeedback/b | not tested | 3 | no |" in seq and "--max-seeds 3 reached" in seq
    assert f"2 seeds at alpha {rec['looks'][0]['alpha']:.4g}" in seq and "Seeds used: 3" in seq
    # the second look trained seed 2 only: seeds 0 and 1's stages (2 of every 3) were reused
    reused, total = map(int, re.search(r"resumed: (\d+) of (\d+) stage", out).groups())
    assert 3 * reused == 2 * total and total >= 9, out
    # the same command again: every stage reused (no marker rewritten), the same record
    before = _stage_times(run)
    assert len(before) >= 9
    assert main(["run", str(cfg), "--until-decided", "--max-seeds", "3"]) == 0
    out = capsys.readouterr().out
    assert _stage_times(run) == before
    assert "resumed: " in out and json.loads((run / "sequential.json").read_text())["looks"] == rec["looks"]
    # another plan on the same directory is refused: it would change the error rate after looking
    msg = cli_error(capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "4"])
    assert "another plan (max_seeds 3 -> 4)" in msg and "--output-dir" in msg
    # a damaged record (its plan not a mapping) is named, never an AttributeError
    (run / "sequential.json").write_text('{"plan": 5}')
    msg = cli_error(capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "3"])
    assert "sequential.json: not a w2s-shift sequential record" in msg
    assert main(["run", str(cfg), "--until-decided", "--max-seeds", "3", "--overwrite"]) == 0  # --overwrite: a new one
    assert "is not a w2s-shift sequential record; a new plan replaces it" in capsys.readouterr().out
    assert json.loads((run / "sequential.json").read_text())["looks"] == rec["looks"]


def test_a_look_row_writes_what_is_not_finite_as_null():
    from w2s_shift.pipeline.until_decided import _row

    # an MDE where nothing varies (NaN), and the infinite interval and MDE of a look whose alpha rounds to 0
    row = {"what": "x", "primary": True, "p_holm": 1.0, "status": "no information"}
    stat = {"value": 1.5, "ci": (-np.inf, np.inf), "mde": np.inf}
    assert _row({**row, "stat": stat}) == {**row, "value": 1.5, "ci": [None, None], "mde": None}
    assert _row({**row, "stat": {**stat, "ci": (0.5, 2.5), "mde": np.nan}})["mde"] is None
    assert json.dumps(_row({**row, "stat": stat}), allow_nan=False)


def test_until_decided_bad_input_exits_2_with_a_clear_message(tmp_path, tiny_model_dirs, lm_student_dir, capsys):
    cfg = tmp_path / "c.yaml"
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp_path / "r", ["pandalm"], ["naive"])
    cfg.write_text(yaml.safe_dump({**d, "seeds": [0, 1, 2]}))
    msg = cli_error(capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "2"])
    assert "--max-seeds 2 is below the config's 3 seeds [0, 1, 2]" in msg and "--max-seeds 3 or more" in msg
    msg = cli_error(capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "4", "--dry-run"])
    assert "cannot be a --dry-run" in msg
    assert "needs --max-seeds N" in cli_error(capsys, ["run", str(cfg), "--until-decided"])
    assert "give both, or neither" in cli_error(capsys, ["run", str(cfg), "--max-seeds", "4"])
    assert "must be 2 or more" in cli_error(capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "1"])
    assert "at most 100, got 10000000000" in cli_error(
        capsys, ["run", str(cfg), "--until-decided", "--max-seeds", "10000000000"]
    )
    assert not (tmp_path / "r").exists()  # refused before the run directory is made

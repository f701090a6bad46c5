"""The weak-to-strong gap check and the "longer response wins" length baseline, on hand-made inputs."""

import json

import numpy as np
import pytest

from w2s_shift.metrics.length import (
    length_agreement,
    length_explained_difference,
    longer_wins_accuracy,
    margin_length_correlation,
)
from w2s_shift.metrics.stats import gap_check
from w2s_shift.report import write_report
from w2s_shift.results import NO_GAP, build_cell_metrics

# ---- gap check and length baseline ---------------------------------------------------------------------------------


def test_gap_check_passes_with_a_clear_gap():
    teacher = np.r_[np.ones(60), np.zeros(40)]  # 60% right
    ceiling = np.r_[np.ones(80), np.zeros(20)]  # 80% right, a superset of the teacher's right pairs
    g = gap_check(ceiling, teacher, n_boot=500, seed=0)
    assert g["gap_pp"] == pytest.approx(20.0) and g["n"] == 100 and g["min_gap_pp"] == 5.0
    lo, hi = g["ci"]
    assert 0.0 < lo < 20.0 < hi and g["passed"] is True


def test_gap_check_fails_below_5pp_or_with_the_interval_touching_0():
    t = np.r_[np.ones(60), np.zeros(40)]
    small = gap_check(np.r_[np.ones(64), np.zeros(36)], t, n_boot=500)  # +4 pp, interval above 0
    assert small["gap_pp"] == pytest.approx(4.0) and small["ci"][0] > 0 and small["passed"] is False
    # one pair of 10 differs: +10 pp, but 0.9^10 = 35% of resamples miss that pair, so the lower end is 0
    wide = gap_check(np.r_[np.ones(7), np.zeros(3)], np.r_[np.ones(6), np.zeros(4)], n_boot=500)
    assert wide["gap_pp"] == pytest.approx(10.0) and wide["ci"][0] == 0.0 and wide["passed"] is False
    neg = gap_check(t[::-1], np.ones(100), n_boot=200)
    assert neg["gap_pp"] == pytest.approx(-40.0) and neg["passed"] is False


def test_longer_wins_accuracy_and_agreement_ties_count_half():
    lc, lr = [10, 5, 7, 3], [5, 10, 7, 1]  # longer: chosen, rejected, equal, chosen
    assert longer_wins_accuracy(lc, lr) == pytest.approx(100 * (1 + 0 + 0.5 + 1) / 4)
    # the model prefers chosen, rejected, chosen, rejected: agrees, agrees, half, disagrees
    assert length_agreement([1.0, -1.0, 2.0, -3.0], lc, lr) == pytest.approx(62.5)
    with pytest.raises(ValueError, match="same pairs"):
        length_agreement([1.0, 2.0], lc, lr)


def test_margin_length_correlation_hand_value():
    # length differences 1, 2, 3; margins 1, 3, 2: deviations (-1, 0, 1) and (-1, 1, 0): r = 1 / sqrt(2 * 2)
    assert margin_length_correlation([1.0, 3.0, 2.0], [2, 4, 6], [1, 2, 3]) == pytest.approx(0.5)
    assert margin_length_correlation([1.0, 2.0, 3.0], [5, 5, 5], [1, 1, 1]) is None  # constant length difference


LC8, LR8 = [200] * 4 + [100] * 4, [100] * 4 + [200] * 4  # chosen longer on pairs 0-3, rejected longer on 4-7


def test_length_explained_difference():
    follower, teacher = [1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 1, 0, 0, 0]
    r = length_explained_difference(follower, teacher, LC8, LR8)
    assert r["delta"] == pytest.approx(12.5) and r["delta_longer_right"] == pytest.approx(50.0)
    assert r["delta_longer_wrong"] == pytest.approx(-25.0) and r["explained_by_length"] is True
    assert (r["n_longer_right"], r["n_longer_wrong"], r["n_equal"]) == (4, 4, 0)
    skilled = [1, 1, 1, 0, 1, 1, 0, 0]  # gains on both strata: +25 and +25
    r = length_explained_difference(skilled, teacher, LC8, LR8)
    assert r["delta"] == pytest.approx(25.0) and r["delta_longer_wrong"] == pytest.approx(25.0)
    assert r["explained_by_length"] is False
    # a loss only on the pairs where the longer response is the rejected one: explained by length
    r = length_explained_difference(follower, [1, 1, 1, 1, 1, 1, 0, 0], LC8, LR8)
    assert r["delta"] == pytest.approx(-25.0) and r["delta_longer_right"] == 0.0 and r["explained_by_length"] is True


# ---- the cell metrics and the report ---------------------------------------------------------------------------

METHODS = [
    {"label": "naive", "name": "naive", "anchor_lambda": 0.0, "anchor_layers": "last", "layer_spec": "last"},
    {"label": "ceiling", "name": "ceiling", "anchor_lambda": 0.0, "anchor_layers": "last", "layer_spec": "last"},
]
# ID uf: longer-wins 50%; OOD hh: chosen longer on 0-5, equal on 6, rejected longer on 7 -> (6 + 0.5) / 8
LENGTHS = {"uf": (LC8, LR8), "hh": ([300] * 6 + [100, 100], [100] * 7 + [300])}
# reward margins (chosen - rejected); sign = the model's preference
MARGINS = {
    "teacher": {"uf": [1, 1, -1, -1, 1, 1, -1, -1], "hh": [1, -1, 1, -1, 1, -1, 1, -1]},
    "naive": {"uf": [1, 1, 1, 1, -1, -1, -1, -1], "hh": [1, 1, 1, 1, 1, 1, -1, -1]},
    "ceiling": {"uf": [1] * 8, "hh": [1] * 8},
}


def _cell(root, margins, lengths=True):
    d = root / "src" / "seed0"
    (d / "rewards").mkdir(parents=True)
    for m, per in margins.items():
        for ds, mg in per.items():
            rows = [
                {"index": i, "id": f"p{i}", "reward_chosen": float(x), "reward_rejected": 0.0}
                | ({"len_chosen": LENGTHS[ds][0][i], "len_rejected": LENGTHS[ds][1][i]} if lengths else {})
                for i, x in enumerate(mg)
            ]
            (d / "rewards" / f"{m}__{ds}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell = {
        "source": "uf",
        "seed": 0,
        "dir": "src/seed0",
        "id": "uf",
        "ood": ["hh"],
        "models": list(margins),
        "methods": METHODS,
        "ceiling": "ceiling",
        "zero_shot": None,
    }
    return d, cell


def test_cell_gap_check_passes_and_length_baseline(tmp_path):
    d, cell = _cell(tmp_path, MARGINS)
    m = build_cell_metrics(d, cell, bootstrap=500, seed=0)
    g = m["gap_check"]
    # ceiling 100% vs teacher 50% on uf: 4 of 8 pairs differ; 0.5^8 < 2.5% of resamples miss them all
    assert g["ceiling"] == "ceiling" and g["gap_pp"] == pytest.approx(50.0) and g["n"] == 8
    assert g["ci"][0] > 0 and g["passed"] is True
    assert m["metrics"]["naive"]["PGR"]["uf"] == pytest.approx(0.0)  # naive 50% = teacher: PGR 0, defined
    json.dumps(m, allow_nan=False)  # the cell goes to metrics.json as is
    lb = m["length_baseline"]
    assert lb["unit"] == "characters"
    uf, hh = lb["datasets"]["uf"], lb["datasets"]["hh"]
    assert uf["longer_wins_accuracy"] == pytest.approx(50.0) and hh["longer_wins_accuracy"] == pytest.approx(81.25)
    assert hh["n_equal"] == 1 and hh["n"] == 8
    assert uf["agreement"]["naive"] == pytest.approx(100.0) and uf["agreement"]["teacher"] == pytest.approx(50.0)
    assert hh["agreement"]["naive"] == pytest.approx(100 * 7.5 / 8)  # 6 agree, the tie counts 1/2, pair 7 agrees
    assert uf["margin_length_corr"]["naive"] == pytest.approx(1.0)
    assert uf["margin_length_corr"]["teacher"] == pytest.approx(0.0, abs=1e-12)
    assert uf["margin_length_corr"]["ceiling"] is None  # constant margin
    assert uf["length_driven"] == ["naive"] and hh["length_driven"] == ["naive"]
    assert hh["agreement"]["ceiling"] == pytest.approx(81.25)  # 6 agree, the tie 1/2, pair 7 (chosen shorter) not
    # naive's AOG on hh: +25 pp, all on pairs 0-5 (chosen longer), nothing on pair 7 (rejected longer)
    a = lb["AOG"]["naive"]["hh"]
    assert a["delta"] == pytest.approx(25.0) and a["delta_longer_right"] == pytest.approx(50.0)
    assert a["delta_longer_wrong"] == 0.0 and a["explained_by_length"] is True
    assert lb["gap"]["explained_by_length"] is False  # the ceiling gains on both strata (+50, +50)
    assert lb["WRG"]["naive"]["delta"] == 0.0 and lb["WRG"]["naive"]["explained_by_length"] is False
    # ... but 2 pairs of 8 do not clear test-pair noise (the paired interval holds 0): not flagged
    assert a["ci"][0] <= 0 < a["ci"][1] and a["clears_noise"] is False
    assert not any("explained by length" in f for f in lb["flags"])
    assert "naive is length-driven on uf: it agrees with longer-wins on 100.0% of pairs" in lb["flags"]

    write_report(tmp_path, {"cells": [m]})
    md = (tmp_path / "report.md").read_text()
    assert "Weak-to-strong gap check" in md and "+50.00 pp" in md and "passes" in md and NO_GAP not in md
    assert "longer wins (accuracy) | 50.0 | 81.2 |" in md
    assert "(+25.0 pp" not in md and "only where its paired 95% bootstrap interval over test pairs excludes 0" in md
    assert "100.0 / r +1.00 **length-driven**" in md


def test_cell_without_gap_undefines_pgr_and_says_so(tmp_path):
    margins = {**MARGINS, "ceiling": {"uf": [1, 1, -1, -1, 1, 1, -1, 1], "hh": [1] * 8}}  # +12.5 pp, 1 pair of 8
    d, cell = _cell(tmp_path, margins)
    m = build_cell_metrics(d, cell, bootstrap=500, seed=0)
    g = m["gap_check"]
    assert g["gap_pp"] == pytest.approx(12.5) and g["ci"][0] == 0.0 and g["passed"] is False
    assert m["metrics"]["naive"]["PGR"] == {"uf": None, "hh": None}
    assert m["metrics"]["naive"]["ci95"]["PGR"] == {"uf": None, "hh": None}
    write_report(tmp_path, {"cells": [m]})
    md = (tmp_path / "report.md").read_text()
    assert f"**Warning: {NO_GAP}**" in md and "+12.50 pp" in md
    row = next(line for line in md.splitlines() if line.startswith("| naive |"))
    assert row.rstrip().endswith("| undefined (no W2S gap) |")


def test_cell_without_lengths_or_ceiling(tmp_path):
    d, cell = _cell(tmp_path, MARGINS, lengths=False)
    m = build_cell_metrics(d, {**cell, "ceiling": None, "models": ["teacher", "naive"]}, bootstrap=100, seed=0)
    assert m["gap_check"] is None and m["length_baseline"] is None
    write_report(tmp_path, {"cells": [m]})
    assert "no ceiling in this cell" in (tmp_path / "report.md").read_text()
    old = {k: v for k, v in m.items() if k not in ("gap_check", "length_baseline")}  # an older metrics.json
    write_report(tmp_path / "old", {"cells": [old]})
    md = (tmp_path / "old" / "report.md").read_text()
    assert "The paper's claims\n\nNot computed: " in md and "teacher__uf.jsonl: file not found" in md
    assert "seed 0: not computed (a metrics.json of an older w2s-shift version)" in md and "Length baseline" not in md


def test_bad_length_names_file_and_row(tmp_path):
    d, cell = _cell(tmp_path, MARGINS)
    f = d / "rewards" / "teacher__hh.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    rows[2]["len_rejected"] = "long"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"teacher__hh\.jsonl: row 3: field 'len_rejected'"):
        build_cell_metrics(d, cell, bootstrap=100, seed=0)


def test_pipeline_saves_response_lengths(tmp_path):
    from w2s_shift.data.schema import make_pair
    from w2s_shift.pipeline import save_rewards

    pairs = [
        make_pair("q?", "a longer answer", "no", "x", path="t", row=1, id="a"),
        make_pair("q2?", "ok", "four", "x", path="t", row=2, id="b"),
    ]
    save_rewards(tmp_path, "m", "x", pairs, np.array([1.0, 2.0, 0.5, 0.25]))
    rows = [json.loads(x) for x in (tmp_path / "rewards" / "m__x.jsonl").read_text().splitlines()]
    assert [(r["len_chosen"], r["len_rejected"]) for r in rows] == [(15, 2), (2, 4)]
    assert [(r["reward_chosen"], r["reward_rejected"]) for r in rows] == [(1.0, 0.5), (2.0, 0.25)]


def test_length_flag_only_where_the_effect_clears_noise(tmp_path):
    from w2s_shift.results.cuts import cell_length_baseline

    # 40 pairs, chosen longer on the first 20: naive follows length (right on those 20, wrong on the rest), the
    # teacher is right on every 4th pair of each half: naive +25 pp on hh, all of it on the chosen-longer pairs
    n = 40
    lc, lr = [300] * 20 + [100] * 20, [100] * 20 + [300] * 20
    teacher = np.array([1 if i % 4 == 0 else -1 for i in range(n)], dtype=float)
    naive = np.array([1] * 20 + [-1] * 20, dtype=float)
    margins = {"teacher": {"uf": teacher, "hh": teacher}, "naive": {"uf": teacher, "hh": naive}}
    d = tmp_path / "c"
    (d / "rewards").mkdir(parents=True)
    for m, per in margins.items():
        for ds, mg in per.items():
            rows = [
                {
                    "id": f"p{i}",
                    "reward_chosen": float(x),
                    "reward_rejected": 0.0,
                    "len_chosen": lc[i],
                    "len_rejected": lr[i],
                }
                for i, x in enumerate(mg)
            ]
            (d / "rewards" / f"{m}__{ds}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lb = cell_length_baseline(d, ["teacher", "naive"], ["uf", "hh"], margins, "uf", ["hh"], ["naive"], None)
    a = lb["AOG"]["naive"]["hh"]
    # naive right on 20 pairs, teacher on 10: +25 pp; +75 on chosen-longer (100 - 25), -25 on rejected-longer
    assert a["delta"] == pytest.approx(25.0) and a["explained_by_length"] is True
    assert a["delta_longer_right"] == pytest.approx(75.0) and a["delta_longer_wrong"] == pytest.approx(-25.0)
    assert a["clears_noise"] is True and a["ci"][0] > 0
    assert any(f.startswith("AOG of naive on hh (+25.0 pp [+") and "is explained by length" in f for f in lb["flags"])

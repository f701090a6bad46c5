"""The interventional mechanism test (w2s_shift.metrics.intervention) on synthetic features put through the functions
the pipeline calls (tests/mechanism_worlds.py): a student whose features lost information is found (positive
control); features only rotated, a head-only failure and a drift the ceiling shares give no support (negative
controls); the estimators' formulas on hand-made inputs, the claims' interval and its null rejection; and the
pipeline's stage and report section on a tiny grid."""

import re

import numpy as np
import pytest
from scipy.stats import binomtest, special_ortho_group

from tests import mechanism_worlds as W
from w2s_shift.metrics import intervention as I
from w2s_shift.metrics.significance import seed_pair_interval


@pytest.fixture(scope="module")
def worlds():
    return {w: W.rows(w) for w in ("representation", "rotated", "head", "shared")}


def test_positive_control_features_that_lost_information_are_found(worlds):
    r = worlds["representation"][("w2s", "ood")]
    assert r["refit"] == 0 and r["check_accuracy"] > 85  # its head reads the pretrained source features well
    ip, pr = r["did"]["interpolation"], r["did"]["probe"]
    assert ip["value"] == pytest.approx(32.25, abs=0.01) and ip["ci"][0] > 20  # moving back recovers OOD accuracy
    assert pr["value"] == pytest.approx(-9.67, abs=0.01) and pr["ci"][1] < -4  # its features transfer worse
    assert ip["n_seeds"] == 3 and ip["seed_noise"] and ip["test"] == "seeds x pairs"
    assert r["reading"] == {"interpolation": "supports", "probe": "supports", "overall": "supports"}
    ceiling = worlds["representation"][("ceiling", "ood")]
    assert ceiling["gain"]["interpolation"]["value"] == ceiling["gain"]["probe"]["value"] == 0.0
    assert ceiling["reading"] is None and worlds["representation"][("w2s", "src")]["reading"] is None  # ID: none


def test_negative_control_rotated_features_lose_nothing_and_give_no_support(worlds):
    """A rotation of the features loses no information: the probes give the same pair margins, so the probe gain is
    exactly 0; the student's head on the unrotated features is below chance in distribution, so it is refit, and
    the interpolation compares features alone. The head left as it was would read a +74.7 pp 'gain'."""
    r = worlds["rotated"][("w2s", "ood")]
    assert r["refit"] == 3 and r["check_accuracy"] < 1  # the half turn mirrors its head: below chance
    assert r["gain"]["probe"]["nonzero"] == 0 and r["gain"]["interpolation"]["nonzero"] == 0
    assert r["acc_a0"] - r["acc_student"] == pytest.approx(74.67, abs=0.01)  # the own head at a = 0 (not used)
    assert r["reading"] == {"interpolation": "no information", "probe": "no information", "overall": "no support"}
    files = W.mechanism_files("rotated", seeds=(0,))[0]["w2s"]["sets"]["ood"]
    own = I.gains(files, "own")["interpolation"]
    assert own.mean() > 60 and I.seeds_pairs_effect([own])["ci"][0] > 60  # what the head left as it was reads


def test_negative_control_a_head_only_failure_is_not_blamed_on_the_representation(worlds):
    r, c = worlds["head"][("w2s", "ood")], worlds["head"][("ceiling", "ood")]
    assert c["acc_student"] - r["acc_student"] > 70  # the W2S student fails OOD: its head reads the spurious cue
    assert r["refit"] == 0 and r["acc_a0"] == r["acc_student"]  # the features are the pretrained ones
    assert r["did"]["interpolation"]["nonzero"] == r["did"]["probe"]["nonzero"] == 0
    assert r["reading"]["overall"] == "no support"


def test_a_drift_the_ceiling_shares_supports_nothing_once_the_ceiling_is_subtracted(worlds):
    """Fine-tuning distorts both models' OOD features alike: each shows the signature alone, the difference not."""
    r = worlds["shared"][("w2s", "ood")]
    assert r["gain"]["interpolation"]["ci"][0] > 5 and r["gain"]["probe"]["ci"][1] < -5  # alone: the signature
    assert r["did"]["probe"]["nonzero"] == 0  # same features, same probes
    assert r["did"]["interpolation"]["value"] == pytest.approx(-20.17, abs=0.01)  # the heads differ, not features
    assert r["reading"] == {"interpolation": "against", "probe": "no information", "overall": "no support"}


def test_a_tie_counts_as_wrong():
    m = np.array([1.0, 0.0, -2.0, 3.0])
    assert I.correct(m).tolist() == [1, 0, 0, 1] and I.pairwise_accuracy(m) == 50.0
    assert I.head_check(np.array([1.0, 0.0, 0.0, 0.0]))["accuracy"] == 25.0


def test_interpolation_margins_by_hand_and_errors():
    ref_diff = np.array([[1.0, 0.0], [0.0, 2.0]])
    w = np.array([2.0, -1.0])
    m = np.array([-1.0, 3.0])
    assert I.interpolation_margins(ref_diff, w, m, 0.0).tolist() == [2.0, -2.0]  # the head on pretrained features
    assert I.interpolation_margins(ref_diff, w, m, 1.0).tolist() == [-1.0, 3.0]  # the student
    assert I.interpolation_margins(ref_diff, w, m, 0.5).tolist() == [0.5, 0.5]
    assert I.interpolation_curve(ref_diff, w, m, alphas=(0.0, 0.5, 0.75, 1.0)) == [50.0, 100.0, 50.0, 50.0]
    with pytest.raises(ValueError, match="outside"):
        I.interpolation_margins(ref_diff, w, m, 1.5)
    with pytest.raises(ValueError, match="does not fit"):
        I.interpolation_margins(ref_diff[:1], w, m, 0.5)


def test_the_head_check_is_scipy_s_one_sided_binomial_test():
    c = I.head_check(np.r_[np.ones(60), -np.ones(40)])
    assert (
        c["p"] == pytest.approx(binomtest(60, 100, 0.5, alternative="greater").pvalue) == pytest.approx(0.02844, 1e-3)
    )
    assert c["passed"] and c["accuracy"] == 60.0 and c["pairs"] == 100
    assert not I.head_check(np.r_[np.ones(55), -np.ones(45)])["passed"]  # p = 0.18
    assert I.fit_heads(np.eye(3)[[0, 0, 0]], np.eye(3)[[0, 0, 0]], -np.ones(3))["head"] == "refit"
    with pytest.raises(ValueError, match="no pairs"):
        I.head_check(np.array([]))


def test_probe_fits_a_separable_direction_is_rotation_equivariant_and_refuses_bad_input():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 1, (200, 5))
    d[:, 2] = np.abs(d[:, 2]) + 0.1  # the preference lives in unit 2
    w = I.fit_probe(d)
    assert int(np.argmax(np.abs(w))) == 2 and w[2] > 0 and I.pairwise_accuracy(d @ w) == 100.0
    assert I.fit_probe(100.0 * d) == pytest.approx(I.fit_probe(d) / 100.0, rel=1e-4)  # feature scale does not matter
    r = special_ortho_group.rvs(5, random_state=1)
    assert (d @ r.T) @ I.fit_probe(d @ r.T) == pytest.approx(d @ w, rel=1e-6, abs=1e-9)  # the same pair margins
    with pytest.raises(ValueError, match="finite"):
        I.fit_probe(np.full((3, 2), np.nan))


def test_the_effect_is_the_claims_interval_with_the_exact_test_where_few_pairs_differ():
    rng = np.random.default_rng(3)
    seeds = [rng.normal(mu, 30.0, 500) for mu in (-6.0, 0.0, 6.0)]
    e = I.seeds_pairs_effect(seeds, n_boot=500)
    w = I._weights(500, 500, 0)  # one group: every seed resampled alike
    ref = seed_pair_interval([s.mean() for s in seeds], np.stack([w @ s / 500 for s in seeds], axis=1), [0, 0, 0])
    assert e["ci"] == pytest.approx(ref["ci"]) and e["value"] == pytest.approx(np.mean([s.mean() for s in seeds]))
    assert e["ci"][0] < -5 and e["ci"][1] > 5 and e["test"] == "seeds x pairs"  # the seed spread is in it
    few = [np.r_[np.full(3, 100.0), np.zeros(97)], np.r_[np.full(3, 100.0), np.zeros(97)]]
    f = I.seeds_pairs_effect(few, n_boot=200)
    assert f["test"] == "exact" and f["p"] == pytest.approx(2 / 2**6) and f["nonzero"] == 6
    assert I.reading(f, +1) == "supports" and I.reading(f, -1) == "against"
    assert I.reading({**f, "nonzero": 5}, +1) == "no information"  # 2 / 2^5 = 0.0625: no exact result can pass
    one = I.seeds_pairs_effect([seeds[0]], n_boot=500)
    assert not one["seed_noise"] and I.reading(one, +1) == "not decided (1 seed)"
    assert I.reading(None, +1) == "no ceiling"


def _null_gains(rng, k: int, n: int, seed_sd: float) -> list:
    """k seeds' per-pair gains (pp) with no true effect, on one shared test split: each pair's difficulty (60% easy,
    25% hard, 15% contested) and its own effect (SD 0.15) shared by every seed, and a training effect per seed (SD
    ``seed_sd`` pp), symmetric about 0."""
    q = rng.choice([0.9, 0.7, 0.5], size=n, p=[0.6, 0.25, 0.15])
    e = rng.normal(0.0, 0.15, n)
    out = []
    for _ in range(k):
        room = 2 * np.minimum(q, 1 - q)
        x = np.clip(e + rng.normal(0.0, seed_sd / 100), -room, room)
        out.append(100.0 * ((rng.random(n) < q + x / 2).astype(float) - (rng.random(n) < q - x / 2)))
    return out


@pytest.mark.parametrize("k", [2, 3])
def test_the_interval_keeps_its_level_on_true_nulls(k):
    """300 true nulls at 250 pairs and seed SD 4 pp: at most 5% + 2 Monte Carlo SE (7.5%) excluding 0 (the two-stage
    percentile bootstrap it replaces rejected 11-16% of such nulls)."""
    rng = np.random.default_rng(10 + k)
    hits = [I.reading(I.seeds_pairs_effect(_null_gains(rng, k, 250, 4.0), n_boot=200), +1) for _ in range(300)]
    rate = np.mean([h in ("supports", "against") for h in hits])
    assert rate <= 0.05 + 2 * (0.05 * 0.95 / 300) ** 0.5


def test_a_grid_writes_the_mechanism_stage_and_the_report_section(tiny_model_dirs, tmp_path, monkeypatch):
    """Each trained student gets mechanism/<label>.json (the head check on teacher-train pairs, interpolation curve
    from a = 0 to 1 ending at the student's own accuracy, probe accuracies, per-pair 0/1 outcomes and pair ids) and a
    report row per set, the W2S student minus the ceiling too; each set's stage records its own seconds (what `plan
    --power` sums into a run's cost), not the time since the student's first set began; a rerun reuses the stage;
    ``mechanism: false`` writes none."""
    import time

    from tests.conftest import tiny_grid_dict
    from w2s_shift.config import RunConfig
    from w2s_shift.io import read_json, read_jsonl
    from w2s_shift.pipeline import run
    from w2s_shift.results.verdicts import intervention_effects

    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], ["naive", "ceiling"]
    )
    d["student"].update(learning_rate=3e-3)
    real_outcomes = I.set_outcomes

    def slow_outcomes(*a, **k):  # each set's own work takes at least 0.4 s
        time.sleep(0.4)
        return real_outcomes(*a, **k)

    monkeypatch.setattr(I, "set_outcomes", slow_outcomes)
    run(RunConfig(**d))
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    for label in ("naive", "ceiling"):  # the ID set first, then pandalm: the second stage's clock is its own
        first, second = (
            read_json(cell / "stages" / f"mechanism-{label}__{s}.json")["seconds"] for s in ("ultrafeedback", "pandalm")
        )
        assert first >= 0.4 and 0.4 <= second < 0.75
    m = read_json(cell / "mechanism" / "naive.json")
    assert set(m["sets"]) == {"ultrafeedback", "pandalm"} and m["alphas"][0] == 0.0 and m["alphas"][-1] == 1.0
    assert m["fit_set"] == "teacher_train" and m["format"] == I.FILE_FORMAT
    cells = read_json(tmp_path / "r" / "metrics.json")["cells"]
    assert m["fit_pairs"] == m["check"]["pairs"] == cells[0]["data"]["splits"]["teacher_train"]
    assert m["head"] == ("own" if m["check"]["p"] < 0.05 else "refit")
    rows = read_jsonl(cell / "rewards" / "naive__pandalm.jsonl")
    own = I.pairwise_accuracy(np.array([r["reward_chosen"] - r["reward_rejected"] for r in rows]))
    v = m["sets"]["pandalm"]
    assert v["interpolation"][-1] == pytest.approx(own) == pytest.approx(100 * np.mean(v["student"]))
    assert len(v["ids"]) == len(set(v["ids"])) == len(rows) == 8  # one id per pair, none repeated
    assert 100 * np.mean(v["probe_student"]) == pytest.approx(v["probe"]["student"])
    section = (tmp_path / "r" / "report.md").read_text().split("### The mechanism by intervention")[1]
    section = section.split("\n### ")[0]
    assert "teacher-train pairs (16, gold orientation)" in section
    row = next(
        line for line in section.splitlines() if line.startswith("| naive | pandalm (OOD) | ") and "check" in line
    )
    assert len(re.findall(r"[+-]\d+\.\d\d \[[+-]\d+\.\d, [+-]\d+\.\d\], MDE (\d+\.\d|–), pairs only", row)) == 2
    got = {(r["model"], r["set"]): r for r in intervention_effects(tmp_path / "r", cells)["rows"]}
    rd = got[("naive", "pandalm")]["reading"]
    assert got[("ceiling", "pandalm")]["did"] is None and rd["overall"] == "no support"
    assert {rd["interpolation"], rd["probe"]} <= {"no information", "not decided (1 seed)"}  # one seed decides nothing
    did = next(
        line
        for line in section.splitlines()
        if line.startswith("| naive | pandalm (OOD) | ") and "W2S" not in line and "check" not in line
    )
    assert f"| {rd['interpolation']} / {rd['probe']} | no support |" in did
    marker = (cell / "stages" / "mechanism-naive__pandalm.json").stat().st_mtime_ns
    run(RunConfig(**d))
    assert (cell / "stages" / "mechanism-naive__pandalm.json").stat().st_mtime_ns == marker  # reused
    run(RunConfig(**{**d, "output_dir": str(tmp_path / "off"), "mechanism": False}))
    assert not (tmp_path / "off" / "ultrafeedback" / "seed0" / "mechanism").exists()


def test_the_mechanism_takes_a_scored_students_features_from_its_scoring_pass(tiny_model_dirs, tmp_path, monkeypatch):
    """A trained student's features on an evaluation set come from its scoring forwards, not a second pass, and the
    mechanism file is what a second pass gives: rerun with the scoring stages reused (so nothing is kept and the
    stage runs its own pass), the file is the same. bf16 on (`bf16: auto` on a native-bf16 CPU or GPU); the ID
    test set (10 pairs) is scored by scoring's pass, the OOD set (8 pairs = drift_pairs) by the drift probe's, which
    keeps no features, so the stage makes that pass itself."""
    from tests.conftest import tiny_grid_dict
    from w2s_shift.config import RunConfig
    from w2s_shift.io import read_json
    from w2s_shift.pipeline import intervene, run

    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], ["naive"], drift_pairs=8
    )
    d["student"].update(learning_rate=3e-3, bf16=True)
    passes, real = [], intervene.pair_diffs

    def counted(f, backbone, name, pairs):
        passes.append(name)
        return real(f, backbone, name, pairs)

    monkeypatch.setattr(intervene, "pair_diffs", counted)
    run(RunConfig(**d))
    # the pretrained model's passes (fit set, both evaluation sets) and the student's on the fit set and pandalm
    assert sorted(passes) == ["pandalm", "pandalm", "teacher_train", "teacher_train", "ultrafeedback"]
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    first = read_json(cell / "mechanism" / "naive.json")
    for p in [cell / "mechanism" / "naive.json", *(cell / "stages").glob("mechanism-*.json")]:
        p.unlink()
    passes.clear()
    run(RunConfig(**d))
    assert sorted(passes) == ["pandalm", "pandalm", "teacher_train", "teacher_train", "ultrafeedback", "ultrafeedback"]
    assert read_json(cell / "mechanism" / "naive.json") == first

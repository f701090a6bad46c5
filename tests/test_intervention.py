"""The interventional mechanism test on synthetic features (w2s_shift.metrics.intervention): a planted
representational failure (positive control) is found by both interpolation and probe transfer; a head-only failure
(negative control) by neither; and the estimators' formulas on hand-made inputs."""

import re

import numpy as np
import pytest

from w2s_shift.metrics import intervention as I

H, U, V = 8, 0, 1  # hidden size; the preference direction u and a spurious direction v (e.g. length)


def _pairs(n: int, spurious: bool, rng) -> tuple:
    """Pretrained features (B, H) of chosen and rejected sequences: u carries the preference in every domain; v
    tracks it in the source domain only (``spurious``), and is noise out of it."""
    c, r = rng.normal(0, 1, (n, H)), rng.normal(0, 1, (n, H))
    c[:, U] += 1.0
    r[:, U] -= 1.0
    if spurious:
        c[:, V] += 1.5
        r[:, V] -= 1.5
    return c, r


def _drifted(f: np.ndarray, rng) -> np.ndarray:
    """A representational failure out of distribution (the feature distortion of Kumar et al. 2022): the student's
    features of OOD inputs keep a fifth of their preference direction u, the rest replaced by noise."""
    g = f.copy()
    g[:, U] = 0.2 * f[:, U] + rng.normal(0, 1, len(f))
    return g


def _world(seed: int, failure: str) -> dict:
    """Source pairs (v spurious there) and OOD pairs; the student's features and head for one kind of failure."""
    rng = np.random.default_rng(seed)
    (sc, sr), (oc, orr) = _pairs(400, True, rng), _pairs(400, False, rng)
    w = np.zeros(H)
    w[U] = 1.0
    if failure == "representation":  # source features as pretrained, OOD ones distorted; the head reads u
        stu = {"sc": sc, "sr": sr, "oc": _drifted(oc, rng), "orr": _drifted(orr, rng)}
    else:  # head-only: the features stay pretrained, the head also reads the spurious v
        stu = {"sc": sc, "sr": sr, "oc": oc, "orr": orr}
        w[V] = 1.5
    return {"ref": (sc - sr, oc - orr), "stu": (stu["sc"] - stu["sr"], stu["oc"] - stu["orr"]), "w": w}


def _effects(failure: str, seeds=(0, 1, 2)) -> tuple:
    """Per seed, per OOD pair: the interpolation effect (correct at a = 0 minus at a = 1) and the probe-transfer
    effect (student-feature probe minus pretrained-feature probe)."""
    interp, probe = [], []
    for s in seeds:
        x = _world(s, failure)
        m_stu = x["stu"][1] @ x["w"]
        interp.append(I.correct(I.interpolation_margins(x["ref"][1], x["w"], m_stu, 0.0)) - I.correct(m_stu))
        p_ref, p_stu = I.fit_probe(x["ref"][0]), I.fit_probe(x["stu"][0])
        probe.append(I.correct(x["stu"][1] @ p_stu) - I.correct(x["ref"][1] @ p_ref))
    return I.bootstrap_seeds_pairs(interp, n=500), I.bootstrap_seeds_pairs(probe, n=500)


def test_positive_control_a_planted_representational_failure_is_found():
    (di, lo_i, hi_i), (dp, lo_p, hi_p) = _effects("representation")
    assert di > 5 and lo_i > 0  # moving the features back to the pretrained ones recovers OOD accuracy
    assert dp < -5 and hi_p < 0  # the drifted features themselves transfer worse
    x = _world(0, "representation")
    curve = I.interpolation_curve(x["ref"][1], x["w"], x["stu"][1] @ x["w"])
    assert len(curve) == 11 and curve[0] > curve[-1] + 5  # from a = 0 (pretrained features) to a = 1 (the student)


def test_negative_control_a_head_only_failure_is_not_blamed_on_the_representation():
    (di, lo_i, hi_i), (dp, lo_p, hi_p) = _effects("head")
    assert di == lo_i == hi_i == 0.0  # identical features: the interpolation does not move a single pair
    assert dp == lo_p == hi_p == 0.0  # identical features: identical probes
    x = _world(0, "head")
    assert I.pairwise_accuracy(x["stu"][1] @ x["w"]) < I.pairwise_accuracy(x["ref"][1] @ I.fit_probe(x["ref"][0]))


def test_interpolation_margins_by_hand_and_errors():
    ref_diff = np.array([[1.0, 0.0], [0.0, 2.0]])
    w = np.array([2.0, -1.0])
    m = np.array([-1.0, 3.0])
    assert I.interpolation_margins(ref_diff, w, m, 0.0).tolist() == [2.0, -2.0]  # the head on pretrained features
    assert I.interpolation_margins(ref_diff, w, m, 1.0).tolist() == [-1.0, 3.0]  # the student
    assert I.interpolation_margins(ref_diff, w, m, 0.5).tolist() == [0.5, 0.5]
    assert I.interpolation_curve(ref_diff, w, m, alphas=(0.0, 0.4, 1.0)) == [50.0, 100.0, 50.0]
    assert I.pairwise_accuracy(np.array([1.0, 0.0, -2.0, 3.0])) == 62.5  # a tie counts half
    with pytest.raises(ValueError, match="outside"):
        I.interpolation_margins(ref_diff, w, m, 1.5)
    with pytest.raises(ValueError, match="does not fit"):
        I.interpolation_margins(ref_diff[:1], w, m, 0.5)


def test_probe_fits_a_separable_direction_and_refuses_bad_input():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 1, (200, 5))
    d[:, 2] = np.abs(d[:, 2]) + 0.1  # the preference lives in unit 2
    w = I.fit_probe(d)
    assert int(np.argmax(np.abs(w))) == 2 and w[2] > 0 and I.pairwise_accuracy(d @ w) == 100.0
    assert I.fit_probe(100.0 * d) == pytest.approx(I.fit_probe(d) / 100.0, rel=1e-4)  # feature scale does not matter
    with pytest.raises(ValueError, match="finite"):
        I.fit_probe(np.full((3, 2), np.nan))
    got = I.probe_transfer({"a": d}, {"a": -d})
    assert got == {"a": 0.0}


def test_two_stage_bootstrap_holds_seed_noise():
    """Seeds whose effects differ by far more than the pairs' noise: the two-stage interval is wide, the pairs-only
    interval of the pooled pairs is narrow (and would call a seed-level null significant)."""
    rng = np.random.default_rng(0)
    seeds = [rng.normal(mu, 1.0, 500) for mu in (-6.0, 0.0, 6.0)]
    m, lo, hi = I.bootstrap_seeds_pairs(seeds, n=1000)
    assert m == pytest.approx(np.mean([s.mean() for s in seeds]))
    assert lo < -2 and hi > 2
    _, plo, phi = I.bootstrap_pairs(np.concatenate(seeds), n=1000)
    assert phi - plo < (hi - lo) / 5
    assert I.bootstrap_seeds_pairs([seeds[0]], n=200) == I.bootstrap_pairs(seeds[0], n=200)


def test_the_minimum_detectable_effect_is_bloom_s_multiple_of_the_bootstrap_se():
    """400 pairs of unit SD in one seed: se = SD / 20 (about 0.05), MDE at 80% power = (1.960 + 0.842) x 0.05 = 0.140;
    seed noise of SD 6 over three seeds widens it to about 2.8 x 6 / sqrt(3) (~ 9.7; the bootstrap over 3 seeds
    is a little narrower, by sqrt((S - 1) / S))."""
    rng = np.random.default_rng(1)
    v = rng.normal(0.0, 1.0, 400)
    one = I.seeds_pairs_effect([v], n=4000)
    assert one["se"] == pytest.approx(v.std() / 20, rel=0.05)  # the bootstrap SE of a mean: SD / sqrt(n)
    assert one["mde"] == pytest.approx(2.8016 * one["se"], rel=1e-3)
    lo, hi = one["ci"]
    assert lo < one["value"] < hi
    three = I.seeds_pairs_effect([rng.normal(mu, 1.0, 400) for mu in (-6.0, 0.0, 6.0)], n=2000)
    assert 2.8016 * 6 / 3**0.5 * (2 / 3) ** 0.5 * 0.8 < three["mde"] < 2.8016 * 6 / 3**0.5 * 1.1


def test_a_grid_writes_the_mechanism_stage_and_the_report_section(tiny_model_dirs, tmp_path):
    """Each trained student gets mechanism/<label>.json (interpolation curve from a = 0 to 1 ending at the student's
    own accuracy, probe accuracies, per-pair gains) and a report row per set; a rerun reuses the stage;
    ``mechanism: false`` writes none."""
    from tests.conftest import tiny_grid_dict
    from w2s_shift.config import RunConfig
    from w2s_shift.io import read_json, read_jsonl
    from w2s_shift.pipeline import run

    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], ["naive"])
    d["student"].update(learning_rate=3e-3)
    run(RunConfig(**d))
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    m = read_json(cell / "mechanism" / "naive.json")
    assert set(m["sets"]) == {"ultrafeedback", "pandalm"} and m["alphas"][0] == 0.0 and m["alphas"][-1] == 1.0
    rows = read_jsonl(cell / "rewards" / "naive__pandalm.jsonl")
    own = I.pairwise_accuracy(np.array([r["reward_chosen"] - r["reward_rejected"] for r in rows]))
    v = m["sets"]["pandalm"]
    assert v["interpolation"][-1] == pytest.approx(own) and len(v["interpolation_gain"]) == len(rows) == 8
    assert np.mean(v["probe_gain"]) == pytest.approx(v["probe"]["student"] - v["probe"]["pretrained"])
    section = (tmp_path / "r" / "report.md").read_text().split("### The mechanism by intervention")[1]
    row = next(line for line in section.splitlines() if line.startswith("| naive | pandalm (OOD)"))
    assert len(re.findall(r"[+-]\d+\.\d\d \[[+-]\d+\.\d, [+-]\d+\.\d\], MDE \d+\.\d", row)) == 2
    marker = (cell / "stages" / "mechanism-naive__pandalm.json").stat().st_mtime_ns
    run(RunConfig(**d))
    assert (cell / "stages" / "mechanism-naive__pandalm.json").stat().st_mtime_ns == marker  # reused
    run(RunConfig(**{**d, "output_dir": str(tmp_path / "off"), "mechanism": False}))
    assert not (tmp_path / "off" / "ultrafeedback" / "seed0" / "mechanism").exists()

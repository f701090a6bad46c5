"""The grid end to end on tiny random-init models and bundled real data: sources x seeds x methods, SEAM,
zero-shot, lambda/layer grids, stage cache hits and misses, LoRA students, seed aggregation."""

import numpy as np
import pytest
import torch

from w2s_shift.config import RunConfig
from w2s_shift.io import read_json, read_jsonl
from w2s_shift.pipeline import run

# one source and one OOD target at the grid's tiny sizes (the single-cell tests below)
ONE_SOURCE = {
    "sources": ["ultrafeedback"],
    "ood": ["pandalm"],
    "n_teacher_train": 16,
    "n_student_train": 12,
    "n_test": 10,
    "n_ood": 8,
    "skip_invalid": True,
}


def _grid(tiny_model_dirs, student_name, out, **over):
    d = {
        "output_dir": str(out),
        "seeds": [0, 1],
        "data": {
            "sources": ["ultrafeedback", "pandalm"],
            "ood": ["ultrafeedback", "pandalm", "hh-helpful-base"],
            "n_teacher_train": 16,
            "n_student_train": 12,
            "n_test": 10,
            "n_ood": 8,
            "skip_invalid": True,
        },
        "teacher": {"name": tiny_model_dirs["teacher"], "max_length": 48, "epochs": 1, "batch_size": 8, "bf16": False},
        "student": {
            "name": student_name,
            "max_length": 48,
            "trainable_layers": 2,
            "epochs": 1,
            "batch_size": 4,
            "bf16": False,
        },
        "methods": [
            "naive",
            {"name": "seam", "seam_nodes": 2},
            {"name": "anchor", "anchor_lambda": [0, 1e-2], "anchor_layers": ["last", [3, 4]]},
            "ceiling",
            "zero_shot",
        ],
        "bootstrap": 100,
        "drift_pairs": 8,
        "drift_interval": 1,
    }
    d.update(over)
    return RunConfig.model_validate(d)


@pytest.fixture(scope="module")
def grid_run(tiny_model_dirs, lm_student_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    cfg = _grid(tiny_model_dirs, lm_student_dir, out)
    return cfg, out, run(cfg)


def _rewards(cell, model, ds):
    rows = read_jsonl(cell / "rewards" / f"{model}__{ds}.jsonl")
    return np.array([r["reward_chosen"] for r in rows]), np.array([r["reward_rejected"] for r in rows])


def test_every_cell_has_every_model_on_its_own_targets(grid_run):
    cfg, out, metrics = grid_run
    cells = {(c["source"], c["seed"]): c for c in metrics["cells"]}
    assert set(cells) == {("ultrafeedback", 0), ("ultrafeedback", 1), ("pandalm", 0), ("pandalm", 1)}
    assert cells[("pandalm", 0)]["ood"] == ["ultrafeedback", "hh-helpful-base"]  # the source itself is left out
    labels = [
        "naive",
        "seam",
        "anchor-last-lam0",
        "anchor-last-lam1e-2",
        "anchor-L3-4-lam0",
        "anchor-L3-4-lam1e-2",
        "ceiling",
        "zero_shot",
    ]
    for (src, seed), c in cells.items():
        cell = out / src / f"seed{seed}"
        for model in ["teacher", *labels]:
            for ds in [src, *c["ood"]]:
                rc, rr = _rewards(cell, model, ds)
                assert rc.size == c["n_pairs"][ds] and np.isfinite(rc).all()
        assert read_json(cell / "stages" / "teacher.json")["outputs"]


def test_lambda_zero_is_naive_and_zero_shot_does_not_depend_on_the_seed(grid_run):
    cfg, out, _ = grid_run
    for src in ("ultrafeedback", "pandalm"):
        for seed in (0, 1):
            cell = out / src / f"seed{seed}"
            for ds in ("hh-helpful-base",):
                np.testing.assert_array_equal(_rewards(cell, "anchor-last-lam0", ds)[0], _rewards(cell, "naive", ds)[0])
                np.testing.assert_array_equal(_rewards(cell, "anchor-L3-4-lam0", ds)[0], _rewards(cell, "naive", ds)[0])
                assert not np.array_equal(_rewards(cell, "anchor-last-lam1e-2", ds)[0], _rewards(cell, "naive", ds)[0])
        z0 = _rewards(out / src / "seed0", "zero_shot", "hh-helpful-base")
        z1 = _rewards(out / src / "seed1", "zero_shot", "hh-helpful-base")
        np.testing.assert_array_equal(z0[0], z1[0])
        # seeds change the teacher
        t0 = _rewards(out / src / "seed0", "teacher", "hh-helpful-base")[0]
        t1 = _rewards(out / src / "seed1", "teacher", "hh-helpful-base")[0]
        assert not np.array_equal(t0, t1)


def test_seam_labels_differ_from_the_teacher_and_are_probabilities(grid_run):
    cfg, out, _ = grid_run
    cell = out / "ultrafeedback" / "seed0"
    seam = [r["q"] for r in read_jsonl(next(cell.glob("seam_labels__*.jsonl")))]
    teacher = [r["q"] for r in read_jsonl(cell / "teacher_labels.jsonl")]
    assert len(seam) == len(teacher) == 12 and all(0 < q < 1 for q in seam)
    assert seam != teacher


def test_drift_is_measured_per_trainable_layer_and_during_training(grid_run):
    cfg, out, _ = grid_run
    cell = out / "ultrafeedback" / "seed0"
    d = read_json(cell / "drift" / "anchor-L3-4-lam1e-2.json")
    assert d["layers"] == [3, 4]
    assert set(d["final"]) == {"ultrafeedback", "pandalm", "hh-helpful-base"}
    for v in d["final"]["ultrafeedback"].values():
        assert v["rel_sq_err"] > 0 and 0 < v["cka"] <= 1 + 1e-9
    assert d["during"] and d["during"][0]["step"] == 1
    # lambda 0 drifts exactly as naive does
    a = read_json(cell / "drift" / "anchor-last-lam0.json")["final"]
    n = read_json(cell / "drift" / "naive.json")["final"]
    assert a == n


def test_seed_aggregation_mean_and_std(grid_run):
    cfg, out, metrics = grid_run
    cells = [c for c in metrics["cells"] if c["source"] == "ultrafeedback"]
    accs = [c["accuracy"]["naive"]["hh-helpful-base"] for c in cells]
    agg = metrics["aggregate"]["ultrafeedback"]["accuracy"]["naive"]["hh-helpful-base"]
    assert agg["mean"] == pytest.approx(np.mean(accs))
    assert agg["std"] == pytest.approx(np.std(accs, ddof=1))
    assert sorted(agg["values"]) == sorted(accs)


def test_stage_cache_hits_and_misses(grid_run, tiny_model_dirs, lm_student_dir):
    """A rerun with one lambda changed trains only the students that depend on it; the teacher, its labels and the
    other students are cache hits."""
    cfg, out, metrics = grid_run
    stages = out / "ultrafeedback" / "seed0" / "stages"
    before = {p.name: p.read_text() for p in stages.glob("*.json")}
    methods = [
        "naive",
        {"name": "seam", "seam_nodes": 2},
        {"name": "anchor", "anchor_lambda": [0, 2e-2], "anchor_layers": ["last", [3, 4]]},
        "ceiling",
        "zero_shot",
    ]
    cfg2 = _grid(
        tiny_model_dirs,
        lm_student_dir,
        out,
        methods=methods,
        seeds=[0],
        data={**cfg.data.model_dump(mode="json"), "sources": ["ultrafeedback"]},
    )
    run(cfg2, overwrite=True)
    after = {p.name: p.read_text() for p in stages.glob("*.json")}
    for name in (
        "teacher.json",
        "student-naive.json",
        "student-seam.json",
        "student-anchor-last-lam0.json",
        "student-ceiling.json",
    ):
        assert after[name] == before[name], name  # hits
    assert "student-anchor-last-lam2e-2.json" in after and "student-anchor-last-lam2e-2.json" not in before  # miss


def test_frozen_anchor_layers_are_refused(tiny_model_dirs, lm_student_dir, tmp_path):
    cfg = _grid(
        tiny_model_dirs,
        lm_student_dir,
        tmp_path / "x",
        seeds=[0],
        data=ONE_SOURCE,
        methods=[{"name": "anchor", "anchor_layers": "middle"}],
    )
    with pytest.raises(ValueError, match=r"anchor layers \[2\] .* are frozen"):
        run(cfg)


def test_lora_student_with_adapter_disabled_reference_and_confidence(tiny_model_dirs, tmp_path):
    """LoRA students: the head trains and is saved with the adapters; reloading the saved state reproduces the
    rewards; ANCHOR's reference is the same model with adapters off."""
    from w2s_shift.models.state import load_trained_state
    from w2s_shift.pipeline import Featurizer

    cfg = _grid(
        tiny_model_dirs,
        tiny_model_dirs["student"],
        tmp_path / "lora",
        seeds=[0],
        data=ONE_SOURCE,
        student={
            "name": tiny_model_dirs["student"],
            "max_length": 48,
            "trainable_layers": 2,
            "epochs": 2,
            "batch_size": 4,
            "bf16": False,
            "learning_rate": 1e-2,
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        },
        methods=["confidence", {"name": "anchor", "anchor_lambda": 1e-2, "reference": "adapter_disabled"}],
    )
    run(cfg)
    cell = tmp_path / "lora" / "ultrafeedback" / "seed0"
    sf = Featurizer(cfg.student, "student")
    fresh = sf.new_model(0)
    head0 = fresh.score.weight.detach().clone()
    load_trained_state(fresh, cell / "models" / "anchor.safetensors")
    assert not torch.equal(fresh.score.weight, head0)  # the head was trained and saved
    from w2s_shift.pipeline import prepare_data
    from w2s_shift.pipeline.score_stage import score_set

    splits, ood, _ = prepare_data(cfg)
    r = score_set(sf, fresh, "pandalm", ood["pandalm"], "reloaded")
    rc, rr = _rewards(cell, "anchor", "pandalm")
    np.testing.assert_allclose(r, np.concatenate([rc, rr]), rtol=1e-6, atol=1e-6)


def test_seam_asks_the_strong_model_each_question_once_per_source(
    tiny_model_dirs, lm_student_dir, tmp_path, monkeypatch
):
    """The strong LM's relevance answers depend on the question only: a second seed reuses them (same labels as
    asking again), so SEAM's strong-model cost does not grow with the number of seeds."""
    import w2s_shift.models.lm as lm

    asked = []
    real = lm.next_token_logprob_diff

    def counting(backbone, head_w, tokenizer, prompts, **kw):
        out = real(backbone, head_w, tokenizer, prompts, **kw)  # raises (not counted) for answers of one token
        asked.extend(prompts)
        return out

    monkeypatch.setattr(lm, "next_token_logprob_diff", counting)
    cfg = _grid(
        tiny_model_dirs,
        lm_student_dir,
        tmp_path / "seam",
        methods=[{"name": "seam", "seam_nodes": 2}],
        data=ONE_SOURCE,
    )
    run(cfg)
    assert asked and len(asked) == len(set(asked))  # every question once, though two seeds label the same pairs
    from w2s_shift.methods.seam import DEFAULT_PRINCIPLES

    assert len(asked) <= 12 * len(DEFAULT_PRINCIPLES)  # at most one question per (pair, principle)
    q0 = [
        r["q"] for r in read_jsonl(next((tmp_path / "seam" / "ultrafeedback" / "seed0").glob("seam_labels__*.jsonl")))
    ]
    q1 = [
        r["q"] for r in read_jsonl(next((tmp_path / "seam" / "ultrafeedback" / "seed1").glob("seam_labels__*.jsonl")))
    ]
    assert len(q0) == len(q1) == 12 and q0 != q1  # the seeds' teachers differ, so their SEAM labels do


def test_plan_power_on_a_finished_run(grid_run, capsys):
    """`w2s-shift plan --power RUN_DIR` reads the pilot's claims and prints, per source, each claim's MDE now and
    the seeds and test pairs that would decide it at the margin (or why none within the limits)."""
    from w2s_shift.cli import main

    _, out, _ = grid_run
    cells = read_json(out / "metrics.json")["cells"]  # as the run directory holds it now (tests above rerun it)
    assert main(["plan", "--power", str(out), "--margin", "5"]) == 0
    text = capsys.readouterr().out
    seeds = len({c["seed"] for c in cells})
    assert f"Pilot {out}: {len(cells)} cells, {seeds} seed(s); margin m = 5 pp" in text
    for src in {c["source"] for c in cells}:
        assert f"\n{src}: " in text
    assert "MDE now" in text and ("seeds:" in text or "not reachable" in text)
    # each pilot seed's gap check as the run recorded it, what a failed one means, and the chance for a new run
    for c in cells:
        g = c["gap_check"]
        state = "passed" if g["passed"] else "failed"
        assert f"seed {c['seed']} {g['gap_pp']:+.1f} [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}] {state}" in text
    assert ("withheld whatever seeds are added" in text) == any(not c["gap_check"]["passed"] for c in cells)
    for c in cells:  # the other precondition, the teacher above chance, as the run recorded it
        state = "passed" if c["teacher_beats_chance_id"] else "failed"
        assert f"seed {c['seed']} {c['accuracy']['teacher'][c['id']]:.1f}% {state}" in text
    assert text.count("chance that every seed of a new run passes") == 2 * len({c["source"] for c in cells})


def test_the_ceiling_trains_first_and_its_gap_check_is_said_before_the_other_students(
    tiny_model_dirs, tmp_path, capsys
):
    """A cell trains the ceiling before the W2S students and logs the weak-to-strong gap check (the numbers its
    metrics hold) as soon as the ceiling is scored; the report keeps the config's order; a student's rewards do not
    depend on what trained before it (each seeds its own head and batches)."""
    from tests.conftest import tiny_grid_dict

    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], ["naive", "ceiling"]
    )
    run(RunConfig(**d))
    out = capsys.readouterr().out
    cell = read_json(tmp_path / "r" / "metrics.json")["cells"][0]
    g = cell["gap_check"]
    said = f"ceiling - teacher {g['gap_pp']:+.2f} pp [{g['ci'][0]:+.2f}, {g['ci'][1]:+.2f}] on 10 ID test pairs"
    line = (
        f"weak-to-strong gap check passed: {said}"
        if g["passed"]
        else f"WARNING: ultrafeedback seed 0: no weak-to-strong gap: {said}"
    )
    assert line in out
    assert out.index("seed 0: student ceiling:") < out.index(line) < out.index("seed 0: student naive:")
    assert [m["label"] for m in cell["methods"]] == ["naive", "ceiling"]
    alone = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "n", ["pandalm"], ["naive"]
    )
    run(RunConfig(**alone))
    for ds in ("ultrafeedback", "pandalm"):
        rel = f"ultrafeedback/seed0/rewards/naive__{ds}.jsonl"
        assert read_jsonl(tmp_path / "r" / rel) == read_jsonl(tmp_path / "n" / rel)

"""data.resplit_per_seed: each training seed may get its own split of the source; the report says
which was used."""

from test_report import make_cell

from w2s_shift.config import RunConfig
from w2s_shift.pipeline import SourceContext, prepare_data, run, split_seed
from w2s_shift.report import write_report
from w2s_shift.results import aggregate, build_cell_metrics


def _cfg(out, resplit, models=("t", "s"), **over):
    d = {
        "output_dir": str(out),
        "seeds": [0, 1],
        "data": {
            "source": "ultrafeedback",
            "ood": ["hh-helpful-base"],
            "n_teacher_train": 24,
            "n_student_train": 20,
            "n_test": 16,
            "n_ood": 12,
            "skip_invalid": True,
            "seed": 3,
            "resplit_per_seed": resplit,
        },
        "teacher": {"name": models[0], "max_length": 64, "epochs": 1, "batch_size": 8, "bf16": False},
        "student": {
            "name": models[1],
            "max_length": 64,
            "trainable_layers": 2,
            "epochs": 1,
            "batch_size": 4,
            "bf16": False,
        },
        "methods": ["naive"],
        "bootstrap": 100,
    }
    d.update(over)
    return RunConfig.model_validate(d)


def _ids(splits):
    return {k: [p.to_json() for p in v] for k, v in splits.items()}


def test_split_seed():
    assert [split_seed(_cfg("o", False), k) for k in (0, 1)] == [3, 3]
    assert [split_seed(_cfg("o", True), k) for k in (0, 1)] == [3 * 1_000_003, 3 * 1_000_003 + 1]


def test_resplit_per_seed_gives_each_seed_its_own_split(tmp_path):
    fixed = _cfg(tmp_path, False)
    a, ood_a, sa = prepare_data(fixed, seed=0)
    b, ood_b, _ = prepare_data(fixed, seed=1)
    assert _ids(a) == _ids(b)  # default: one split for every seed (the old behaviour)
    assert sa["split_seed"] == 3 and sa["resplit_per_seed"] is False

    re = _cfg(tmp_path, True)
    c, ood_c, sc = prepare_data(re, seed=0)
    d, ood_d, sd = prepare_data(re, seed=1)
    assert _ids(c) != _ids(d) and _ids(c) == _ids(prepare_data(re, seed=0)[0])
    for k in ("teacher_train", "student_train", "test"):
        assert _ids(c)[k] != _ids(d)[k]
    assert (sc["split_seed"], sd["split_seed"], sd["resplit_per_seed"]) == (3_000_009, 3_000_010, True)
    # the OOD targets are evaluation sets, not a split: the same pairs for every seed
    assert [p.to_json() for p in ood_c["hh-helpful-base"]] == [p.to_json() for p in ood_a["hh-helpful-base"]]
    assert [p.to_json() for p in ood_d["hh-helpful-base"]] == [p.to_json() for p in ood_b["hh-helpful-base"]]
    # no prompt in two splits, whatever the seed
    keys = {k: {p.prompt_key() for p in v} for k, v in d.items()}
    assert not keys["teacher_train"] & keys["student_train"] and not keys["student_train"] & keys["test"]


def test_use_seed_resplits_and_drops_cached_split_features(tmp_path):
    cfg = _cfg(tmp_path, True)
    ctx = SourceContext(cfg, cfg.data.sources[0], tmp_path)
    first = _ids(ctx.splits)

    from w2s_shift.pipeline import Featurizer

    class F:  # the caches of a Featurizer, and its own way of dropping them
        forget = Featurizer.forget

        def __init__(self):
            self.feats = {"teacher_train": 1, "student_train": 1, "ultrafeedback": 1, "hh-helpful-base": 1}
            self.truncated = dict(self.feats)
            self._ref = {("student_train", None): 1, ("hh-helpful-base", None): 1}
            self._probes = {("ultrafeedback", 32, (4,)): 1, ("hh-helpful-base", 32, (4,)): 1}

    ctx._sf = F()
    ctx.zero_shot_rewards = {"ultrafeedback": 1}
    ctx.use_seed(1)
    assert _ids(ctx.splits) != first and ctx.summary["split_seed"] == 3_000_010
    assert ctx.eval_sets["ultrafeedback"] is ctx.splits["test"]
    assert list(ctx._sf.feats) == ["hh-helpful-base"] and list(ctx._sf.truncated) == ["hh-helpful-base"]
    assert list(ctx._sf._ref) == [("hh-helpful-base", None)] and list(ctx._sf._probes) == [
        ("hh-helpful-base", 32, (4,))
    ]
    assert ctx.zero_shot_rewards == {}
    fixed = SourceContext(_cfg(tmp_path, False), cfg.data.sources[0], tmp_path)
    before = _ids(fixed.splits)
    fixed.use_seed(1)
    assert _ids(fixed.splits) == before


def test_report_says_which_split_was_used(tmp_path):
    for resplit, want in (
        (False, "one split for every seed (data.seed 3)"),
        (True, "resplit for this seed (split seed 3000010)"),
    ):
        d, cell = make_cell(tmp_path / str(resplit))
        cell["data"] = {**cell["data"], "split_seed": 3_000_010 if resplit else 3, "resplit_per_seed": resplit}
        m = build_cell_metrics(d, cell, bootstrap=50, seed=0)
        write_report(tmp_path / str(resplit), {"cells": [m], "aggregate": aggregate([m]), "wall_seconds": 1.0})
        assert want in (tmp_path / str(resplit) / "report.md").read_text()


def test_a_run_with_resplit_trains_each_seed_on_its_own_split(tiny_model_dirs, tmp_path):
    cfg = _cfg(tmp_path / "run", True, models=(tiny_model_dirs["teacher"], tiny_model_dirs["student"]))
    metrics = run(cfg)
    cells = {c["seed"]: c for c in metrics["cells"]}
    assert cells[0]["data"]["split_seed"] == 3_000_009 and cells[1]["data"]["split_seed"] == 3_000_010
    from w2s_shift.io import read_jsonl

    # each cell's summary comes from the split its stages trained on (SourceContext.use_seed); the splits differ
    ctx = {k: prepare_data(cfg, seed=k)[0]["test"] for k in (0, 1)}
    assert [p.to_json() for p in ctx[0]] != [p.to_json() for p in ctx[1]]
    assert all(
        len(read_jsonl(tmp_path / "run" / "ultrafeedback" / f"seed{k}" / "teacher_labels.jsonl")) == 20 for k in (0, 1)
    )
    assert "resplit for this seed" in (tmp_path / "run" / "report.md").read_text()

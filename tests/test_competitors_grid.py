"""ANCHOR beside its competitors (L2-SP, WiSE-FT, GRM's SFT regularizer) in one tiny grid, end to end: each trains
(WiSE-FT once for its a values, naive's training when naive is in the grid), is scored and reported with its
settings; WiSE-FT's models are evaluation-only transforms of one trained student."""

import json
import re

from conftest import tiny_grid_dict
from safetensors.torch import load_file

from w2s_shift.config import RunConfig
from w2s_shift.pipeline import run


def test_anchor_and_its_competitors_run_in_one_grid(tiny_model_dirs, lm_student_dir, tmp_path):
    methods = [
        "naive",
        "anchor",
        {"name": "l2sp", "l2sp_lambda": 0.1},
        {"name": "wise_ft", "wise_alpha": [0.0, 0.5, 1.0]},
        {"name": "grm", "grm_lambda": 0.5},
        "ceiling",
    ]
    cfg = RunConfig.model_validate(
        tiny_grid_dict(
            tiny_model_dirs["teacher"],
            lm_student_dir,
            tmp_path / "r",
            ["pandalm"],
            methods,
            export=["wise_ft-a0.5", "grm"],
        )
    )
    labels = [m.display for m in cfg.expanded_methods()]
    assert labels == ["naive", "anchor", "l2sp", "wise_ft-a0", "wise_ft-a0.5", "wise_ft-a1", "grm", "ceiling"]
    run(cfg)
    root = tmp_path / "r"
    cell = root / "ultrafeedback" / "seed0"
    m = json.loads((root / "metrics.json").read_text())
    entries = {x["label"]: x for x in m["cells"][0]["methods"]}
    assert entries["l2sp"]["l2sp_lambda"] == 0.1
    assert entries["wise_ft-a0.5"]["wise_alpha"] == 0.5
    assert entries["grm"] == {
        "label": "grm",
        "name": "grm",
        "finetune": "top_layers",
        "grm_lambda": 0.5,
        "grm_beta": 0.1,
        "grm_form": "logsigmoid",
    }
    for lab in ("l2sp", "wise_ft-a0", "wise_ft-a0.5", "grm"):
        assert lab in m["cells"][0]["metrics"]  # W2S students: WRG/AOG/NTS computed
    report = (root / "report.md").read_text()
    assert "l2sp, λ=0.1 (L2-SP), top_layers" in report
    assert "wise_ft, a=0.5 (WiSE-FT, student's head), top_layers" in report
    assert "grm, λ=0.5 (GRM SFT, β=0.1), top_layers" in report
    # the table "ANCHOR vs its competitors": one row per competitor, paired intervals; the claims keep their rivals
    table = report.split("### ANCHOR vs its competitors")[1].split("###")[0]
    assert "ANCHOR (anchor, the entry claims (b)-(d) use)" in table
    for lab in ("l2sp", "wise_ft-a0", "wise_ft-a0.5", "wise_ft-a1", "grm"):
        cell_re = r"[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\], MDE (\d+\.\d|–)"  # –: nothing varies
        assert re.search(rf"\n\| {re.escape(lab)} \| [^|]+ \| {cell_re} \| {cell_re} \| {cell_re} \|", table)
    assert "naive" not in table.split("|---")[1] and "ceiling" not in table
    claims = report.split("### The paper's claims")[1].split("###")[0]
    assert "l2sp" not in claims and "grm" not in claims and "wise_ft" not in claims

    def rewards(lab):
        rows = (cell / "rewards" / f"{lab}__ultrafeedback.jsonl").read_text().splitlines()
        return [json.loads(r)["reward_chosen"] for r in rows]

    # WiSE-FT: one training for every a, naive's (the same settings: no training of its own); a = 0.5 lies between;
    # every regularizer acted
    assert not (cell / "models" / "wise_ft-finetuned.safetensors").exists()
    assert not (cell / "stages" / "student-wise_ft-finetuned.json").exists()
    assert json.loads((cell / "models" / "wise_ft-a0.5.json").read_text())["trained_as"] == "naive"
    tuned = load_file(str(cell / "models" / "naive.safetensors"))
    half = load_file(str(cell / "models" / "wise_ft-a0.5.safetensors"))
    assert (half["score.weight"] == tuned["score.weight"]).all()  # the head is the student's
    drift = json.loads((cell / "drift" / "wise_ft-a0.5.json").read_text())
    assert drift["during"] == [] and drift["final"]  # not trained itself; its own final drift
    logs = [json.loads(r) for r in (cell / "logs" / "grm.jsonl").read_text().splitlines()]
    assert any("loss_sft" in r for r in logs)
    logs = [json.loads(r) for r in (cell / "logs" / "l2sp.jsonl").read_text().splitlines()]
    assert any("l2sp_sq" in r for r in logs)
    r = {lab: rewards(lab) for lab in ("naive", "l2sp", "grm", "wise_ft-a0", "wise_ft-a0.5")}
    assert len({tuple(v) for v in r.values()}) == 5
    # a = 1 is the fine-tuned student: trained as naive is, the same rewards as naive's
    assert rewards("wise_ft-a1") == r["naive"]
    # a rerun reuses every stage; a scoring stage redone reads the saved interpolated weights
    before = (cell / "rewards" / "wise_ft-a0.5__pandalm.jsonl").read_text()
    (cell / "stages" / "score-wise_ft-a0.5__pandalm.json").unlink()
    run(cfg)
    assert rewards("wise_ft-a0.5") == r["wise_ft-a0.5"]
    assert (cell / "rewards" / "wise_ft-a0.5__pandalm.jsonl").read_text() == before
    exported = sorted(p.name for p in root.rglob("w2s_shift_export.json"))
    assert len(exported) == 2, exported
    grm_export = load_file(str(cell / "export" / "grm" / "model.safetensors"))
    assert "score.weight" in grm_export and not any("lm_head" in k for k in grm_export)  # GRM's LM head stays out


def test_wise_ft_reuses_naives_training_bit_for_bit(tiny_model_dirs, tmp_path, monkeypatch):
    """WiSE-FT with naive of the same settings in the grid trains once, whichever comes first, under naive's label:
    the weights and rewards are bit-identical to WiSE-FT training its own copy (alone in a grid)."""
    import w2s_shift.pipeline.stages as stages

    trained = []
    real = stages.train_pairs

    def counting(model, ds, pad_id, args, output_dir, **kw):
        trained.append(output_dir.rsplit("/", 1)[-1].rsplit("-", 1)[0])
        return real(model, ds, pad_id, args, output_dir, **kw)

    monkeypatch.setattr(stages, "train_pairs", counting)
    wise = {"name": "wise_ft", "wise_alpha": [0.5, 1.0]}

    def grid(name, methods):
        d = tiny_grid_dict(
            tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / name, ["pandalm"], methods
        )
        run(RunConfig.model_validate(d))
        return tmp_path / name / "ultrafeedback" / "seed0"

    def rewards(cell, lab):
        return (cell / "rewards" / f"{lab}__pandalm.jsonl").read_text()

    alone = grid("alone", [wise])
    assert trained == ["teacher", "wise_ft-finetuned"]
    for order, name in (([wise, "naive"], "wise_first"), (["naive", wise], "naive_first")):
        trained.clear()
        cell = grid(name, order)
        assert trained == ["teacher", "naive"], (name, trained)  # one student training, under naive's label
        assert not (cell / "models" / "wise_ft-finetuned.safetensors").exists()
        a = load_file(str(alone / "models" / "wise_ft-finetuned.safetensors"))
        b = load_file(str(cell / "models" / "naive.safetensors"))
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
        for lab in ("wise_ft-a0.5", "wise_ft-a1"):
            assert rewards(cell, lab) == rewards(alone, lab), (name, lab)
        assert rewards(cell, "naive") == rewards(cell, "wise_ft-a1")
        m = json.loads((cell.parent.parent / "metrics.json").read_text())
        logs = {x["label"] for x in m["cells"][0]["methods"]}
        assert logs == {"naive", "wise_ft-a0.5", "wise_ft-a1"}

"""Whole-network students (every block trains: full fine-tuning, or LoRA on every block): middle-layer ANCHOR acts
on trainable layers. On a tiny 4-block Llama, "middle" is blocks 2 and 3 (50% and 75% depth); a naive student
moves their states, and ANCHOR at those blocks holds them nearer the pretrained reference. With those blocks
frozen (a top-2 student) the config is refused instead (tests/test_grid_run.py), so this check fails if the
middle blocks stop training."""

import json

import pytest
from conftest import tiny_grid_dict

from w2s_shift.config import RunConfig
from w2s_shift.pipeline import run

LORA_ALL = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}


@pytest.mark.parametrize(
    "student,lr,ref",
    [
        ({"trainable_layers": None}, 3e-3, "cached"),  # full fine-tuning, frozen reference states cached once
        ({"trainable_layers": None, "lora": LORA_ALL}, 3e-2, "adapter_disabled"),  # LoRA on every block
    ],
    ids=["full", "lora-all"],
)
def test_middle_layer_anchor_cuts_middle_layer_drift_of_a_whole_network_student(
    tiny_model_dirs, tmp_path, student, lr, ref
):
    methods = ["naive", {"name": "anchor", "anchor_lambda": 10.0, "anchor_layers": "middle", "reference": ref}]
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], methods)
    d["student"].update(student, learning_rate=lr, epochs=3)
    run(RunConfig.model_validate(d))
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    drift = {lab: json.loads((cell / "drift" / f"{lab}.json").read_text()) for lab in ("naive", "anchor")}
    assert drift["anchor"]["layers"] == [1, 2, 3, 4]  # drift reported from the first trainable block up
    for target in ("ultrafeedback", "pandalm"):
        per_block = {lab: drift[lab]["final"][target] for lab in drift}
        assert {"2", "3"} <= set(per_block["naive"]) and {"2", "3"} <= set(per_block["anchor"])
        for block in ("2", "3"):
            naive, anchor = (per_block[lab][block]["rel_sq_err"] for lab in ("naive", "anchor"))
            assert naive > 0, (target, block)  # the naive student moved the middle blocks: they train
            assert anchor < 0.75 * naive, (target, block, anchor, naive)

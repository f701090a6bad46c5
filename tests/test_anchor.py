"""ANCHOR beyond the paper: the normalized anchor term, the drift-budget lambda
(``anchor_lambda: auto``), their config fields, and the lambda x L_anchor / L_w2s logging."""

import copy
import json

import pytest
import torch
from conftest import pair_objective
from test_models import _dataset as toy_pairs
from test_models import tiny_llama

from w2s_shift.config import ConfigError, RunConfig
from w2s_shift.config_io import load_config
from w2s_shift.losses import adaptive_anchor_lambda, anchor_mse, anchor_mse_layers, anchor_relative
from w2s_shift.methods import method_entry
from w2s_shift.models.reward_model import RewardModel
from w2s_shift.training import PairCollator, PairDataset, PairTrainingArguments, make_reference, train_pairs

# ---- the normalized term on known tensors -------------------------------------------------------------------


def _known():
    # N=1 sequence, T=3 tokens, H=2 units; token 0 is prompt (masked out), tokens 1-2 are response
    ref = torch.tensor([[[9.0, 9.0], [1.0, 2.0], [2.0, 0.0]]])
    hid = torch.tensor([[[0.0, 0.0], [2.0, 2.0], [2.0, 3.0]]])
    mask = torch.tensor([[0, 1, 1]])
    return hid, ref, mask


def test_anchor_relative_hand_computed():
    hid, ref, mask = _known()
    # response tokens: squared errors (1 + 0) + (0 + 9) = 10; reference squared norms (1 + 4) + (4 + 0) = 9
    assert anchor_relative(hid, ref, mask).item() == pytest.approx(10 / 9)
    # the paper's raw term: mean over 2 tokens x 2 units = 10 / 4
    assert anchor_mse(hid, ref, mask).item() == pytest.approx(2.5)
    # relative = raw MSE / the reference's mean square over the same tokens and units (9 / 4)
    assert anchor_relative(hid, ref, mask).item() == pytest.approx(2.5 / (9 / 4))


def test_anchor_relative_is_scale_free_and_the_layer_mean():
    hid, ref, mask = _known()
    # a layer 100x larger (a raw middle residual stream) gives 10^4 x the raw MSE but the same relative error
    assert anchor_mse(100 * hid, 100 * ref, mask).item() == pytest.approx(25000.0)
    assert anchor_relative(100 * hid, 100 * ref, mask).item() == pytest.approx(10 / 9)
    # two layers: the mean of the per-layer relative errors; layer 2 = student equal to the reference -> 0
    two = anchor_mse_layers([hid, 100 * ref], [ref, 100 * ref], mask, normalize=True)
    assert two.item() == pytest.approx((10 / 9 + 0.0) / 2)
    assert anchor_mse_layers([hid], [ref], mask).item() == pytest.approx(2.5)  # default: the paper's raw MSE


def test_anchor_relative_gradient_and_empty_mask():
    hid, ref, mask = _known()
    h = hid.clone().requires_grad_(True)
    anchor_relative(h, ref, mask).backward()
    # d/dh of sum m ||h - r||^2 / 9 = 2 m (h - r) / 9; nothing flows to masked tokens
    want = 2 * (hid - ref) * mask[..., None] / 9
    assert torch.allclose(h.grad, want)
    assert anchor_relative(hid, ref, torch.zeros_like(mask)).item() == 0.0


# ---- the drift-budget update rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "drift,want",
    [
        (0.03, 1.0 * (1 + 0.1 * 0.2)),  # e = +0.5, clipped to +0.2: +2%
        (0.021, 1.0 * (1 + 0.1 * 0.05)),  # e = +0.05: +0.5%
        (0.02, 1.0),  # on target: unchanged
        (0.019, 1.0 * (1 - 0.1 * 0.05)),  # e = -0.05
        (0.0, 1.0 * (1 - 0.1 * 0.2)),  # e = -1, clipped to -0.2: -2%
    ],
)
def test_adaptive_lambda_update_rule(drift, want):
    assert adaptive_anchor_lambda(1.0, drift, 0.02) == pytest.approx(want)
    t = adaptive_anchor_lambda(torch.tensor(1.0), torch.tensor(drift), 0.02)
    assert torch.is_tensor(t) and t.item() == pytest.approx(want)


def test_adaptive_lambda_gain_and_errors():
    assert adaptive_anchor_lambda(2.0, 0.04, 0.02, k=1.0) == pytest.approx(2.0 * 1.2)
    lam = 1.0
    for _ in range(10):  # persistent overshoot: a factor 1.02 a step
        lam = adaptive_anchor_lambda(lam, 1.0, 0.02)
    assert lam == pytest.approx(1.02**10)
    for bad in (dict(target=0.0), dict(target=0.02, k=0.0), dict(target=0.02, clip=-1.0)):
        with pytest.raises(ValueError, match="must be > 0"):
            adaptive_anchor_lambda(1.0, 0.1, **bad)


# ---- config -------------------------------------------------------------------------------------------------


def test_config_accepts_float_list_auto_and_labels_auto():
    m = method_entry(dict(name="anchor"))
    assert m.anchor_normalize is True and m.anchor_lambda == 1.0 and m.display == "anchor"
    assert (m.anchor_target_drift, m.anchor_lambda_init, m.anchor_k) == (0.02, 1.0, 0.1)
    a = method_entry(dict(name="anchor", anchor_lambda="auto"))
    assert a.anchor_lambda == "auto" and a.display == "anchor-auto" and a.anchor_active
    assert "auto (target drift 0.02" in a.lambda_text
    assert not method_entry(dict(name="anchor", anchor_lambda=0)).anchor_active
    c = RunConfig.model_validate(
        {
            "methods": [
                "naive",
                {"name": "anchor", "anchor_lambda": [0, 1e-4, "auto"]},
                {"name": "anchor", "anchor_lambda": "auto", "anchor_layers": ["last", "middle"]},
                {"name": "anchor", "anchor_lambda": ["auto"], "anchor_layers": [1, 2], "label": "anchor-auto-L12"},
            ]
        }
    )
    ms = c.expanded_methods()
    assert [m.display for m in ms] == [
        "naive",
        "anchor-lam0",
        "anchor-lam1e-4",
        "anchor-auto",
        "anchor-auto-last",
        "anchor-auto-middle",
        "anchor-auto-L12",
    ]
    assert [m.anchor_lambda for m in ms[1:]] == [0.0, 1e-4, "auto", "auto", "auto", "auto"]  # ["auto"] is "auto"
    assert all(m.anchor_active for m in ms[2:])


def test_config_auto_label_collision_and_unknown_word(tmp_path):
    with pytest.raises(Exception, match="unique"):
        RunConfig.model_validate(
            {
                "methods": [
                    {"name": "anchor", "anchor_lambda": "auto"},
                    {"name": "anchor", "anchor_lambda": [1e-4, "auto"]},
                ]
            }
        )
    f = tmp_path / "c.yaml"
    f.write_text("methods:\n  - {name: anchor, anchor_lambda: adaptive}\n")
    with pytest.raises(ConfigError, match=r"methods\.0\.anchor_lambda.*'adaptive': give a number >= 0, 'auto'"):
        load_config(str(f))
    f.write_text("methods:\n  - {name: anchor, anchor_lambda: [1.0e-4, autoo]}\n")
    with pytest.raises(ConfigError, match="'autoo'"):
        load_config(str(f))
    for field, v in (("anchor_target_drift", 0), ("anchor_lambda_init", -1), ("anchor_k", 0)):
        f.write_text(f"methods:\n  - {{name: anchor, anchor_lambda: auto, {field}: {v}}}\n")
        with pytest.raises(ConfigError, match=f"methods.0.{field}"):
            load_config(str(f))
    # YAML reads 1e-4 (no dot) as a string: still a number
    f.write_text("methods:\n  - {name: anchor, anchor_lambda: 1e-4}\n")
    assert load_config(str(f)).methods[0].anchor_lambda == 1e-4


@pytest.mark.parametrize(
    "entry, message",
    [
        ("anchor_lambda: true", r"methods\.0\.anchor_lambda.*anchor_lambda True: a boolean is not a weight"),
        ("anchor_lambda: [1.0, false]", r"methods\.0\.anchor_lambda.*anchor_lambda False: a boolean"),
        ("anchor_layers: [true]", r"methods\.0\.anchor_layers.*True is not a block index"),
        ("anchor_layers: [last, [2, yes]]", r"methods\.0\.anchor_layers.*True is not a block index"),
    ],
)
def test_config_refuses_a_yaml_boolean_as_lambda_or_layer(tmp_path, entry, message):
    """YAML true/false were taken as lambda 1.0/0.0 and layer 1 without a word."""
    f = tmp_path / "c.yaml"
    f.write_text(f"methods:\n  - {{name: anchor, {entry}}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(str(f))


@pytest.mark.parametrize(
    "value, message",
    [
        ("[4, x]", "anchor_layers [4, 'x']: 'x' is not a block index; give 'last', 'middle', a list of 1-based"),
        ("top", "anchor_layers 'top' is not a layer spec; give 'last', 'middle'"),
        ("4", "anchor_layers 4 is not a layer spec; give 'last', 'middle', a list of 1-based block indices such as"),
        ("[[4, 8], [1, x]]", "anchor_layers [[4, 8], [1, 'x']]: [1, 'x'] is not a layer spec"),
        ("{a: 1}", "anchor_layers {'a': 1} is not a layer spec"),
    ],
)
def test_a_wrong_anchor_layers_value_is_one_clear_line(tmp_path, value, message):
    """One problem line naming the value, not one line per member of pydantic's union of layer shapes."""
    f = tmp_path / "c.yaml"
    f.write_text(f"methods:\n  - {{name: anchor, anchor_layers: {value}}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    text = str(e.value)
    assert "1 problem(s)" in text and text.count("\n  - ") == 1, text
    assert "methods.0.anchor_layers: " in text and message in text, text
    assert "literal[" not in text and "list[int]" not in text


# ---- training: the drift budget on a tiny model ---------------------------------------------------------------


def _dataset(tokenizer, n=16):
    """test_models' toy pairs with soft labels (0.8, or 0.3 on every third pair)."""
    return PairDataset(toy_pairs(tokenizer, n), [0.8 if i % 3 else 0.3 for i in range(n)])


@torch.no_grad()
def _final_drift(model, ref, ds, pad_id) -> float:
    b = PairCollator(pad_id)(list(ds))
    h = model.backbone(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    r = ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    return float(anchor_relative(h, r, b["response_mask"] * b["attention_mask"]))


def test_auto_lambda_holds_drift_near_target_where_lambda_0_overshoots(tokenizer, tmp_path):
    bb = tiny_llama(len(tokenizer))
    base, ds, target = RewardModel(bb, 32), _dataset(tokenizer), 0.02
    common = dict(
        num_train_epochs=10,
        batch_size=4,
        learning_rate=1e-2,
        warmup_ratio=0.0,
        lr_scheduler_type="constant",
        logging_steps=5,
    )
    free = copy.deepcopy(base)
    ref = make_reference(free.backbone)
    train_pairs(free, ds, tokenizer.pad_token_id, PairTrainingArguments(**common), str(tmp_path / "free"))
    auto = copy.deepcopy(base)
    hist = train_pairs(
        auto,
        ds,
        tokenizer.pad_token_id,
        PairTrainingArguments(**common),
        str(tmp_path / "auto"),
        objective=pair_objective(
            anchor_lambda=1.0,
            anchor_lambda_auto=True,
            anchor_normalize=True,
            anchor_target_drift=target,
            anchor_k=0.1,
            reference=make_reference(base.backbone),
        ),
    )
    d_free, d_auto = (
        _final_drift(free, ref, ds, tokenizer.pad_token_id),
        _final_drift(auto, ref, ds, tokenizer.pad_token_id),
    )
    assert d_free > 20 * target, d_free  # unanchored, the last layer drifts far past the budget (1.85 measured)
    assert 0.3 * target < d_auto < 2 * target, d_auto  # held near it (0.013 measured)
    rows = [r for r in hist if "anchor_lambda" in r]
    assert len(rows) == 8
    lams = [r["anchor_lambda"] for r in rows]
    # drift above the target at first: lambda rises, at most 2% a step (40 steps: <= 1.02^40)
    assert lams[0] < lams[4] and max(lams) <= 1.02**40
    assert rows[0]["anchor_drift"] > target and abs(rows[-1]["anchor_drift"] - target) < target
    for r in rows:  # the logged ratio is lambda x L_anchor / L_w2s (means over the interval: approximately)
        assert r["anchor_ratio"] == pytest.approx(r["anchor_lambda"] * r["loss_anchor"] / r["loss_w2s"], rel=0.1)


def test_auto_lambda_updates_once_per_optimizer_step_and_is_checkpointed(tokenizer, tmp_path):
    """The rule applies the step's mean drift once at the next step; a checkpoint holds the current lambda."""
    bb = tiny_llama(len(tokenizer))
    model, ds = RewardModel(bb, 32), _dataset(tokenizer, 8)
    cfg = PairTrainingArguments(
        num_train_epochs=1,
        batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        checkpoint_fraction=0.5,
    )
    obj = pair_objective(
        anchor_lambda=0.5,
        anchor_lambda_auto=True,
        anchor_normalize=False,
        anchor_target_drift=1e-9,
        anchor_k=1.0,
        reference=make_reference(bb),
    )
    hist = train_pairs(model, ds, tokenizer.pad_token_id, cfg, str(tmp_path / "o"), objective=obj)
    lams = [r["anchor_lambda"] for r in hist if "anchor_lambda" in r]
    # step 1: the student is the reference, drift 0 < target, e clipped to -0.2: step 2 uses 0.5 x (1 - 0.2);
    # step 2 drifts (0.82 >> 1e-9): the checkpoint after it holds 0.4 x 1.2
    assert lams == pytest.approx([0.5, 0.4])
    state = json.loads((tmp_path / "o" / "checkpoint-2" / "w2s_resume_state.json").read_text())
    assert state["regularizer"]["lambda"] == {"lambda": pytest.approx(0.48), "auto": True}
    # raw MSE as L_anchor, but the logged drift is still the relative squared error
    r = [r for r in hist if "anchor_drift" in r][-1]
    assert r["anchor_drift"] > 0 and r["anchor_drift"] != pytest.approx(r["loss_anchor"], rel=1e-3)


def test_auto_needs_a_positive_start(tokenizer, tmp_path):
    bb = tiny_llama(len(tokenizer), layers=1)
    with pytest.raises(ValueError, match="anchor_lambda auto needs a starting lambda > 0"):
        pair_objective(anchor_lambda=0.0, anchor_lambda_auto=True, reference=make_reference(bb))


# ---- the report's ratio ---------------------------------------------------------------------------------------


def test_training_curves_carry_the_anchor_ratio(tmp_path):
    from w2s_shift.results.files import training_curves

    f = tmp_path / "anchor-auto.jsonl"
    rows = [
        {
            "step": 5,
            "loss": 0.7,
            "loss_w2s": 0.6,
            "loss_anchor": 0.1,
            "anchor_lambda": 1.0,
            "anchor_drift": 0.1,
            "anchor_ratio": 0.1 / 0.6,
        },
        {
            "step": 10,
            "loss": 0.5,
            "loss_w2s": 0.4,
            "loss_anchor": 0.02,
            "anchor_lambda": 1.1,
            "anchor_drift": 0.02,
            "anchor_ratio": 1.1 * 0.02 / 0.4,
        },
        {"train_runtime": 1.5, "train_loss": 0.6, "step": 10},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = training_curves(f)
    assert c["anchor_ratio"] == pytest.approx([1 / 6, 0.055])
    assert c["anchor_ratio_mean"] == pytest.approx((1 / 6 + 0.055) / 2) and c["anchor_ratio_last"] == pytest.approx(
        0.055
    )
    assert c["anchor_lambda_last"] == pytest.approx(1.1) and c["anchor_drift_last"] == pytest.approx(0.02)
    naive = tmp_path / "naive.jsonl"
    naive.write_text(json.dumps({"step": 5, "loss": 0.7, "loss_w2s": 0.7}) + "\n")
    assert "anchor_ratio_mean" not in training_curves(naive)


# ---- end to end: both reference modes, the label, metrics.json and the report line ---------------------------


def test_pipeline_auto_and_fixed_anchor_log_the_ratio(tiny_model_dirs, tmp_path):
    from w2s_shift.io import read_jsonl
    from w2s_shift.pipeline import run

    cfg = RunConfig.model_validate(
        {
            "output_dir": str(tmp_path / "run"),
            "data": {
                "source": "ultrafeedback",
                "ood": ["hh-helpful-base"],
                "n_teacher_train": 16,
                "n_student_train": 20,
                "n_test": 8,
                "n_ood": 8,
                "skip_invalid": True,
            },
            "teacher": {
                "name": tiny_model_dirs["teacher"],
                "max_length": 64,
                "epochs": 1,
                "batch_size": 8,
                "bf16": False,
            },
            # 10 steps of 2 pairs: one logged row (the pipeline logs every 10 steps)
            "student": {
                "name": tiny_model_dirs["student"],
                "max_length": 64,
                "trainable_layers": 2,
                "epochs": 1,
                "batch_size": 2,
                "bf16": False,
            },
            "methods": [
                "naive",
                {"name": "anchor", "anchor_lambda": "auto", "reference": "cached"},
                {"name": "anchor", "anchor_lambda": 1.0, "reference": "frozen_copy", "label": "anchor-fixed"},
            ],
            "bootstrap": 100,
            "drift": False,
        }
    )
    metrics = run(cfg)
    cell = metrics["cells"][0]
    assert [m["label"] for m in cell["methods"]] == ["naive", "anchor-auto", "anchor-fixed"]
    modes = {m["label"]: m.get("anchor_lambda_mode") for m in cell["methods"]}
    assert modes == {"naive": None, "anchor-auto": "auto", "anchor-fixed": "fixed"}
    tr = cell["training"]
    assert "anchor_ratio_mean" not in tr["naive"]
    for lab in ("anchor-auto", "anchor-fixed"):
        hist = [
            r
            for r in read_jsonl(tmp_path / "run" / "ultrafeedback" / "seed0" / "logs" / f"{lab}.jsonl")
            if "anchor_ratio" in r
        ]
        assert hist and tr[lab]["anchor_ratio_last"] == pytest.approx(hist[-1]["anchor_ratio"])
        assert tr[lab]["anchor_ratio_mean"] == pytest.approx(sum(r["anchor_ratio"] for r in hist) / len(hist))
    assert tr["anchor-fixed"]["anchor_lambda_last"] == 1.0
    # tiny drift below the budget: lambda falls from its init 1.0 by at most 2% a step (mean over 10 steps)
    assert 0.98**10 < tr["anchor-auto"]["anchor_lambda"][0] < 1.0
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.count("λ × L_anchor / L_w2s over training") == 2 and "λ=auto (target drift 0.02)" in report


def test_the_three_lambda_scales_give_the_same_term_and_gradients():
    """lambda_rel x relative error == lambda_unit x per-unit MSE == lambda_tok x per-token MSE on one batch, once the
    lambdas are converted with the batch's reference norm (anchor_lambda_units): the same value and gradients."""
    from w2s_shift.losses import anchor_lambda_units

    g = torch.Generator().manual_seed(3)
    ref = 3.0 * torch.randn(4, 7, 16, generator=g)
    h0 = ref + 0.5 * torch.randn(4, 7, 16, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    r = float((ref.pow(2).sum(-1) * mask).sum() / mask.sum())  # mean per-token squared norm of the reference
    lam = anchor_lambda_units(0.7, "relative", r, 16)
    assert lam["per_unit"] == pytest.approx(16 * lam["per_token"]) and lam["relative"] == pytest.approx(0.7)
    terms, grads = [], []
    for weight, kw in (
        (lam["relative"], {"normalize": True}),
        (lam["per_unit"], {"units": "mean"}),
        (lam["per_token"], {"units": "sum"}),
    ):
        h = h0.clone().requires_grad_(True)
        t = weight * anchor_mse_layers([h], [ref], mask, **kw)
        t.backward()
        terms.append(float(t.detach()))
        grads.append(h.grad)
    assert terms[0] == pytest.approx(terms[1], rel=1e-5) == pytest.approx(terms[2], rel=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[2], grads[0], rtol=1e-5, atol=1e-7)
    # and back: each scale's lambda converts to the same three
    for scale in ("per_unit", "per_token"):
        again = anchor_lambda_units(lam[scale], scale, r, 16)
        assert all(again[k] == pytest.approx(lam[k]) for k in lam)
    with pytest.raises(ValueError, match="scale must be"):
        anchor_lambda_units(1.0, "per_layer", r, 16)
    with pytest.raises(ValueError, match="units must be"):
        anchor_mse(h0, ref, mask, units="max")


def test_anchor_reduction_is_for_the_raw_mse(tmp_path):
    assert method_entry({"name": "anchor"}).anchor_reduction == "mean"
    raw = method_entry({"name": "anchor", "anchor_lambda": 1e-4, "anchor_normalize": False, "anchor_reduction": "sum"})
    assert raw.method.objective(raw, reference=torch.nn.Identity()).regularizer.units == "sum"
    with pytest.raises(ValueError, match="applies to the raw MSE"):
        method_entry({"name": "anchor", "anchor_reduction": "sum"})


def test_training_logs_lambda_on_three_scales_and_the_gradient_ratio(tokenizer, tmp_path):
    """Every logged row: lambda on the three scales, consistent with each other (per unit = H x per token) and with
    the configured one; the regularizer's gradient over the pairwise loss's at the anchored states, 10x larger at
    10x the lambda (same data, same states at the first logged step after training started moving)."""
    bb = tiny_llama(len(tokenizer))
    base, ds = RewardModel(bb, 32), _dataset(tokenizer, 8)
    ratios = {}
    for lam in (0.1, 1.0):
        model = copy.deepcopy(base)
        hist = train_pairs(
            model,
            ds,
            tokenizer.pad_token_id,
            PairTrainingArguments(
                num_train_epochs=2, batch_size=4, learning_rate=1e-2, warmup_ratio=0.0, logging_steps=1, seed=0
            ),
            str(tmp_path / f"l{lam}"),
            objective=pair_objective(
                anchor_lambda=lam, anchor_normalize=False, reference=make_reference(base.backbone)
            ),
        )
        rows = [r for r in hist if "anchor_lambda_per_unit" in r]
        assert len(rows) == 4
        for r in rows:
            assert r["anchor_lambda_per_unit"] == pytest.approx(lam, rel=1e-5)
            assert r["anchor_lambda_per_token"] == pytest.approx(lam / 32, rel=1e-5)
            assert r["anchor_lambda_relative"] > 0
        assert rows[0]["reg_grad_ratio"] == 0.0  # the student starts at the reference: nothing to pull back yet
        ratios[lam] = [r["reg_grad_ratio"] for r in rows[1:]]
        assert all(x > 0 for x in ratios[lam])
    assert ratios[1.0][0] == pytest.approx(10 * ratios[0.1][0], rel=0.05)  # step 1 states differ only by step 0


def test_an_anchor_layer_grid_of_one_spec_is_checked_spec_by_spec(capsys):
    """anchor_layers: [last] (a grid of one spec) crashed the depth check before a model loaded (TypeError comparing
    'last' with a block index), in run --dry-run and plan; each spec of a grid is now checked on its own."""
    from tests.conftest import cli_error
    from w2s_shift.cli import main

    assert main(["run", "--dry-run", "--set", "methods=[naive, {name: anchor, anchor_layers: [last]}]"]) == 0
    assert main(["plan", "quickstart", "--set", "methods=[naive, {name: anchor, anchor_layers: [last, middle]}]"]) == 0
    capsys.readouterr()
    err = cli_error(
        capsys, ["run", "--dry-run", "--set", "methods=[naive, {name: anchor, anchor_layers: [last, [40]]}]"]
    )
    assert "anchor_layers [40] outside 1..30: the student smollm2-135m has 30 layers" in err

"""ANCHOR's competitors as method plug-ins: L2-SP (weight-space anchoring), WiSE-FT (weight interpolation after
training) and GRM's SFT regularizer (language-model loss on the chosen response): each term by hand on a tiny model,
each cutting last-layer drift against naive at a large setting."""

import copy

import pytest
import torch
from pydantic import ValidationError
from test_anchor import _dataset, _final_drift
from test_models import tiny_llama

from w2s_shift.losses import LOSSES
from w2s_shift.methods import Objective, StepContext, method_entry
from w2s_shift.methods.l2sp import L2SPTerm
from w2s_shift.models.reward_model import RewardModel
from w2s_shift.training import PairTrainingArguments, make_reference, train_pairs


def _ctx(model) -> StepContext:
    return StepContext(
        model=model,
        step=0,
        world_size=1,
        device=torch.device("cpu"),
        bf16=False,
        has_cached_reference=False,
        prepare=lambda b: b,
        unwrap=lambda m: m,
        gather_sum=lambda t: t,
    )


COMMON = dict(num_train_epochs=10, batch_size=4, learning_rate=1e-2, warmup_ratio=0.0, lr_scheduler_type="constant")


def _trained_drift(tokenizer, tmp_path, name, objective=None) -> float:
    """Last-layer relative drift of a tiny student trained 10 epochs at lr 1e-2 (test_anchor's setting)."""
    base = RewardModel(tiny_llama(len(tokenizer)), 32)
    ref, ds = make_reference(base.backbone), _dataset(tokenizer)
    model = copy.deepcopy(base)
    train_pairs(
        model, ds, tokenizer.pad_token_id, PairTrainingArguments(**COMMON), str(tmp_path / name), objective=objective
    )
    return _final_drift(model, ref, ds, tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def naive_drift(tokenizer, tmp_path_factory):
    return _trained_drift(tokenizer, tmp_path_factory.mktemp("naive"), "naive")


# ---- L2-SP ----------------------------------------------------------------------------------------------------


def test_l2sp_value_and_gradient_by_hand(tokenizer):
    """lambda sum ||theta - theta_0||^2 over the trainable weights but the head; gradient 2 lambda (theta - theta_0)."""
    model = RewardModel(tiny_llama(len(tokenizer)), 32)
    for p in model.backbone.layers[0].parameters():
        p.requires_grad_(False)  # frozen weights are not penalized
    term = L2SPTerm(0.5)
    term.bind(_ctx(model))
    assert not any(k.startswith("score.") or k.startswith("layers.0.") for k in term.theta0)
    w = model.backbone.norm.weight
    q = model.backbone.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        w[:3] += torch.tensor([1.0, -2.0, 0.5])  # ||.||^2 = 5.25
        q[0, 0] += 3.0  # 9
        model.score.weight += 10.0  # the head: not penalized
        model.backbone.layers[0].mlp.up_proj.weight += 7.0  # frozen: not penalized
    labels = torch.zeros(4)
    value, parts = term.loss(_ctx(model), {"labels": labels}, {}, [], None, 1.0, torch.tensor(1.0))
    assert float(value.detach()) == pytest.approx(0.5 * 14.25, rel=1e-6)
    assert float(parts["l2sp_sq"]) == pytest.approx(14.25, rel=1e-6)
    value.backward()
    assert w.grad[:4].tolist() == pytest.approx([1.0, -2.0, 0.5, 0.0])  # 2 * 0.5 * (theta - theta_0)
    assert float(q.grad[0, 0]) == pytest.approx(3.0) and float(q.grad.abs().sum()) == pytest.approx(3.0)
    assert model.score.weight.grad is None
    # one micro-batch of 4 pairs out of a step of 8 pairs on 2 processes: 4 / 8 * 2 = its share 1
    half, _ = term.loss(_ctx(model), {"labels": labels}, {}, [], torch.tensor(16.0), 2.0, torch.tensor(1.0))
    assert float(half) == pytest.approx(0.5 * 14.25 * 0.5, rel=1e-6)


def test_l2sp_settings_typed_and_validated():
    m = method_entry({"name": "l2sp", "l2sp_lambda": 0.5})
    assert m.l2sp_lambda == 0.5 and m.display == "l2sp"
    assert m.method.describe(m) == {"l2sp_lambda": 0.5}
    for bad in (0, -1, "x", True, float("inf")):
        with pytest.raises(ValidationError, match="l2sp_lambda"):
            method_entry({"name": "l2sp", "l2sp_lambda": bad})
    with pytest.raises(ValidationError):
        method_entry({"name": "l2sp", "anchor_lambda": 1.0})


def test_l2sp_cuts_last_layer_drift(tokenizer, tmp_path, naive_drift):
    obj = Objective(LOSSES["soft_bt"], regularizer=L2SPTerm(10.0))
    d = _trained_drift(tokenizer, tmp_path, "l2sp", obj)
    assert d < 0.5 * naive_drift, (d, naive_drift)  # 0.008 vs 1.85 measured at lambda 10

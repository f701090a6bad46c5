"""PairTrainingArguments: a TrainingArguments subclass whose defaults are the run config's; a method's objective
(its loss and its own settings) reaches the trainer as the method built it."""

import math

import pytest
import torch
from transformers import TrainingArguments

from w2s_shift.config import ModelConfig, RunConfig
from w2s_shift.losses import LOSSES
from w2s_shift.methods import method_entry
from w2s_shift.training import PairTrainer, PairTrainingArguments


def _default(model, name):
    return model.model_fields[name].get_default(call_default_factory=True)


def test_is_a_training_arguments_subclass_with_help_on_every_own_field():
    import dataclasses

    assert issubclass(PairTrainingArguments, TrainingArguments)
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = [f for f in dataclasses.fields(PairTrainingArguments) if f.name not in base]
    assert {f.name for f in own} == {
        "batch_size",
        "warmup_ratio",
        "length_group_size",
        "finite_check_every_step",
        "packing",
        "head_lr_multiplier",
        "checkpoint_fraction",
        "label",
        "logging_dir",
    }  # no method settings: those live in the method's config model and reach the trainer in its objective
    assert all(f.metadata.get("help") for f in own)


def test_defaults_equal_the_run_config():
    """Every own field with a counterpart in the config defaults to the config's value (the pipeline passes them
    all). The fields without one: bf16 (the config's 'auto' is resolved per machine at the run's start and the
    pipeline passes the resolved bool), checkpoint_fraction (0 here: train_pairs alone saves nothing; the run
    config's 0.25 is passed), length_group_size, finite_check_every_step, label and logging_dir (set by the
    pipeline, not configurable)."""
    a = PairTrainingArguments(output_dir="unused")
    pairs = {
        (ModelConfig, "epochs"): a.num_train_epochs,
        (ModelConfig, "batch_size"): a.batch_size,
        (ModelConfig, "gradient_accumulation_steps"): a.gradient_accumulation_steps,
        (ModelConfig, "learning_rate"): a.learning_rate,
        (ModelConfig, "weight_decay"): a.weight_decay,
        (ModelConfig, "warmup_ratio"): a.warmup_ratio,
        (ModelConfig, "head_lr_multiplier"): a.head_lr_multiplier,
        (ModelConfig, "packing"): a.packing,
        (RunConfig, "report_to"): a.report_to,
    }
    wrong = {f"{cls.__name__}.{name}": (_default(cls, name), ours) for (cls, name), ours in pairs.items()}
    wrong = {k: v for k, v in wrong.items() if v[0] != v[1]}
    assert wrong == {}
    # the concrete values, so that a change on both sides is seen too
    assert (a.packing, a.seed, a.data_seed, a.checkpoint_fraction) == (True, 0, 0, 0.0)
    assert a.per_device_train_batch_size == 8 and a.logging_steps == 10 and a.save_total_limit == 1


def test_every_method_setting_reaches_the_objective_unchanged():
    """One settings layer: the values of a method's config entry are what its objective uses."""
    anc = method_entry(
        {"name": "anchor", "anchor_lambda": "auto", "anchor_lambda_init": 0.7, "anchor_target_drift": 0.003,
         "anchor_k": 0.2, "anchor_normalize": False, "reference": "frozen_copy", "anchor_layers": [2]}
    )  # fmt: skip
    reg = anc.method.objective(anc, layers=[2], reference=torch.nn.Identity()).regularizer
    assert (reg.lam.init, reg.lam.auto, reg.lam.target, reg.lam.k) == (0.7, True, 0.003, 0.2)
    assert (reg.normalize, reg.output_layers, reg.adapter_disabled) == (False, [2], False)
    fixed = method_entry({"name": "anchor", "anchor_lambda": 0.25})
    assert fixed.method.objective(fixed).regularizer.lam.init == 0.25 and not fixed.method.objective(fixed).alpha
    assert (
        method_entry({"name": "anchor", "anchor_lambda": 0})
        .method.objective(method_entry({"name": "anchor", "anchor_lambda": 0}))
        .regularizer
        is None
    )  # lambda 0: no term at all
    conf = method_entry({"name": "confidence", "confidence_alpha_max": 0.75, "confidence_warmup": 0.5})
    obj = conf.method.objective(conf)
    assert obj.loss is LOSSES["confidence"] and obj.alpha(0.25) == pytest.approx(0.375) and obj.alpha(0.9) == 0.75
    naive = method_entry("naive")
    assert naive.method.objective(naive).loss is LOSSES["soft_bt"] and naive.method.objective(naive).alpha is None


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"batch_size": 6, "gradient_accumulation_steps": 4}, "batch_size 6 is not divisible by"),
    ],
)
def test_bad_combinations_raise_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        PairTrainingArguments(output_dir="unused", **kw)


class _FixedRewards(torch.nn.Module):
    """Rewards (2B,) = [chosen_1..chosen_B, rejected_1..rejected_B] fixed by hand, whatever the input."""

    def __init__(self, rewards):
        super().__init__()
        self.r = torch.nn.Parameter(torch.tensor(rewards))

    def forward(self, input_ids=None, attention_mask=None, **kw):
        return self.r, torch.zeros(self.r.shape[0], input_ids.shape[1], 2)


def _softplus(x):
    return math.log1p(math.exp(x))


# margins d = (1, -2) (rewards (1, 0) - (0, 2)), soft labels q = (0.8, 0.3).
# soft_bt: mean_i softplus(d_i) - q_i d_i.
# confidence (alpha = 0.5, warm-up 0): the median-threshold hardening of a 2-pair batch flips exactly one pair,
# and either way gives h = (0, 0) here (oriented margins (1, 2) -> h' = (0, 1) -> h = (0, 1 - 1); or (-1, -2) ->
# h' = (1, 0) -> h = (1 - 1, 0)); targets t = 0.5 q + 0.5 h = (0.4, 0.15); loss mean_i softplus(d_i) - t_i d_i.
EXPECTED = {
    "soft_bt": ((_softplus(1.0) - 0.8) + (_softplus(-2.0) + 0.6)) / 2,
    "confidence": ((_softplus(1.0) - 0.4) + (_softplus(-2.0) + 0.3)) / 2,
}


def test_expected_values_by_hand():
    assert EXPECTED["soft_bt"] == pytest.approx(0.620095, abs=1e-6)
    assert EXPECTED["confidence"] == pytest.approx(0.670095, abs=1e-6)


@pytest.mark.parametrize(
    "name, entry", [("soft_bt", {"name": "naive"}), ("confidence", {"name": "confidence", "confidence_warmup": 0.0})]
)
def test_the_trainer_calls_the_methods_registered_loss(tmp_path, name, entry):
    assert {"soft_bt", "confidence"} <= set(LOSSES)
    args = PairTrainingArguments(output_dir=str(tmp_path), packing=False)
    model = _FixedRewards([1.0, 0.0, 0.0, 2.0])
    m = method_entry(entry)
    trainer = PairTrainer(model=model, args=args, objective=m.method.objective(m))
    assert trainer.objective.loss is LOSSES[name]
    batch = {
        "input_ids": torch.zeros(4, 3, dtype=torch.long),
        "attention_mask": torch.ones(4, 3, dtype=torch.long),
        "response_mask": torch.ones(4, 3, dtype=torch.long),
        "labels": torch.tensor([0.8, 0.3]),
    }
    loss = trainer.compute_loss(trainer.model, batch)
    assert float(loss.detach()) == pytest.approx(EXPECTED[name], rel=1e-5)


def test_the_frozen_reference_runs_once_per_anchored_batch(tokenizer, tmp_path):
    """ANCHOR with a frozen copy: one reference forward per compute_loss (the old code ran it twice, discarding the
    first result)."""
    from test_models import _dataset, tiny_llama

    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import PairCollator, PairDataset, make_reference

    bb = tiny_llama(len(tokenizer))
    model = RewardModel(bb, 32)
    ref = make_reference(bb)
    calls = []
    ref.register_forward_hook(lambda *a: calls.append(1))
    ds = PairDataset(_dataset(tokenizer, 4), [0.9, 0.2, 0.7, 0.4])
    args = PairTrainingArguments(output_dir=str(tmp_path), packing=False, batch_size=4)
    m = method_entry({"name": "anchor", "anchor_lambda": 0.5, "reference": "frozen_copy"})
    trainer = PairTrainer(model=model, args=args, train_dataset=ds, objective=m.method.objective(m, reference=ref))
    batch = PairCollator(tokenizer.pad_token_id)([ds[i] for i in range(4)])
    loss = trainer.compute_loss(model, batch)
    assert torch.isfinite(loss) and len(calls) == 1

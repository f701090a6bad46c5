"""Gradient accumulation: 2 micro-batches of 4 pairs give the gradients of one batch of 8 (soft labels + ANCHOR).

The loss of an optimizer step is mean_i l_i + lambda * L_anchor with L_anchor the mean over the response tokens of
the whole step; under accumulation each micro-batch's loss is divided by the pairs and tokens of the whole step
(counted in PairTrainer.get_batch_samples). A per-micro-batch mean (the old compute_loss) weights the tokens of the
micro-batch with fewer response tokens more and does not match.
"""

import copy

import pytest
import torch
from conftest import pair_objective
from test_models import tiny_llama
from transformers import TrainerCallback

from w2s_shift.data.render import encode
from w2s_shift.data.schema import make_pair
from w2s_shift.models.reward_model import RewardModel
from w2s_shift.training import PairDataset, PairTrainingArguments, make_reference, train_pairs


class _Grads(TrainerCallback):
    """The gradients right before the (first) optimizer step (after accumulation; clipping is off)."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _pairs(tokenizer, n=8):
    out = []
    for i in range(n):
        # response lengths differ a lot between pairs, so the two micro-batches hold different token counts
        long = " ".join(["and then it goes on"] * (1 + 3 * (i % 4)))
        p = make_pair(
            f"Question {i}: what is {i} plus {i}?", f"It is {2 * i}, {long}.", "No idea.", "toy", path="t", row=i + 1
        )
        out.append(
            type(
                "E",
                (),
                {
                    "chosen": encode(p.prompt, p.chosen, tokenizer, 96),
                    "rejected": encode(p.prompt, p.rejected, tokenizer, 96),
                },
            )()
        )
    return out


def _grads(tokenizer, tmp_path, accum: int, anchor_lambda: float, history: bool = False, n: int = 8, **anchor) -> dict:
    bb = tiny_llama(len(tokenizer))
    model = RewardModel(copy.deepcopy(bb), 32)
    with torch.no_grad():  # the student starts away from the reference, so ANCHOR has a gradient
        for p in model.backbone.layers[1].parameters():
            p.add_(0.05 * torch.randn_like(p))
    enc = _pairs(tokenizer, n)
    ds = PairDataset(enc, [0.9, 0.2, 0.6, 0.55, 0.7, 0.35, 0.8, 0.5][:n] * (n // 8))
    cfg = PairTrainingArguments(
        num_train_epochs=1,
        batch_size=8,
        gradient_accumulation_steps=accum,
        learning_rate=1e-3,
        warmup_ratio=0.0,
        max_grad_norm=0.0,
        seed=0,
        length_group_size=0,
        logging_steps=1,
    )
    cb = _Grads()
    hist = train_pairs(
        model,
        ds,
        tokenizer.pad_token_id,
        cfg,
        str(tmp_path / f"a{accum}-{anchor_lambda}-{len(anchor)}"),
        callbacks=[cb],
        objective=pair_objective(
            anchor_lambda=anchor_lambda, reference=make_reference(bb) if anchor_lambda else None, **anchor
        ),
    )
    return (cb.grads, hist) if history else cb.grads


@pytest.mark.parametrize("anchor_lambda", [0.0, 5.0])
def test_two_micro_batches_of_four_give_the_gradients_of_one_batch_of_eight(tokenizer, tmp_path, anchor_lambda):
    one = _grads(tokenizer, tmp_path, 1, anchor_lambda)
    two = _grads(tokenizer, tmp_path, 2, anchor_lambda)
    assert one.keys() == two.keys() and len(one) > 4
    for n in one:
        assert torch.allclose(one[n], two[n], rtol=1e-4, atol=1e-7), (n, (one[n] - two[n]).abs().max().item())
    # the check is not vacuous: the backbone's gradients are non-zero
    assert max(g.abs().max().item() for n, g in one.items() if n.startswith("backbone")) > 1e-6


def test_the_micro_batches_differ_in_response_tokens(tokenizer):
    """The setting where a per-micro-batch ANCHOR mean goes wrong: unequal token counts in the two halves
    (the sampler order with length_group_size 0 is a seeded shuffle; any split of these pairs is unequal)."""
    enc = _pairs(tokenizer)
    toks = [sum(e.chosen.response_mask) + sum(e.rejected.response_mask) for e in enc]
    assert len(set(toks)) >= 4


def test_accumulation_must_divide_the_batch():
    from w2s_shift.config import RunConfig

    with pytest.raises(Exception, match="not divisible by gradient_accumulation_steps 3"):
        RunConfig.model_validate({"student": {"name": "x", "batch_size": 8, "gradient_accumulation_steps": 3}})


def test_normalized_anchor_under_accumulation_is_the_relative_error_of_the_whole_step(tokenizer, tmp_path):
    """anchor_normalize: sum over the step's response tokens of the squared error / the same sum of the reference's
    squared norm, per layer. Each micro-batch's error is divided by the reference sums of the whole step
    (PairTrainer._step_reference_sums), so 2 x 4 pairs give the gradients of one batch of 8; a mean of the two
    micro-batches' own ratios does not (its gradient weights each half by 1 / its own reference sum)."""
    one = _grads(tokenizer, tmp_path, 1, 5.0, anchor_normalize=True)
    two = _grads(tokenizer, tmp_path, 2, 5.0, anchor_normalize=True)
    assert one.keys() == two.keys()
    for n in one:
        assert torch.allclose(one[n], two[n], rtol=1e-4, atol=1e-7), (n, (one[n] - two[n]).abs().max().item())
    # not vacuous: the anchor term moves the backbone's gradient (lambda 0 gives other gradients)
    free = _grads(tokenizer, tmp_path, 1, 0.0)
    assert max((one[n] - free[n]).abs().max().item() for n in one if n.startswith("backbone")) > 1e-5


def test_normalized_anchor_step_share_sums_to_the_pooled_ratio():
    """losses.anchor_mse_layers with ref_sq_norm: the micro-batch shares add up to the one-batch relative error,
    which differs from the mean of the per-micro-batch ratios (hand-computed)."""
    from w2s_shift.losses import anchor_mse_layers

    ref = torch.tensor([[[1.0, 0.0]], [[0.0, 3.0]]])  # two sequences of one token, ||ref||^2 = 1 and 9
    hid = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])  # squared errors 1 and 1
    mask = torch.ones(2, 1)
    whole = anchor_mse_layers([hid], [ref], mask, normalize=True)
    assert whole.item() == pytest.approx(2 / 10)
    den = torch.tensor([10.0])
    parts = [
        anchor_mse_layers([hid[i : i + 1]], [ref[i : i + 1]], mask[i : i + 1], normalize=True, ref_sq_norm=den)
        for i in range(2)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(2 / 10)
    ratios = [
        anchor_mse_layers([hid[i : i + 1]], [ref[i : i + 1]], mask[i : i + 1], normalize=True).item() for i in range(2)
    ]
    assert sum(ratios) / 2 == pytest.approx((1 + 1 / 9) / 2)  # 0.556, not 0.2
    with pytest.raises(ValueError, match="normalize"):
        anchor_mse_layers([hid], [ref], mask, ref_sq_norm=den)


def test_auto_lambda_under_accumulation_updates_once_per_optimizer_step_on_the_step_drift(tokenizer, tmp_path):
    """anchor_lambda auto with 2 micro-batches a step: lambda changes once per optimizer step (both micro-batches of a
    step use the same lambda) and from the drift of the whole step, so the lambdas equal those of one batch."""
    kw = dict(anchor_lambda_auto=True, anchor_normalize=True, anchor_k=1.0)
    _, probe = _grads(tokenizer, tmp_path / "p", 1, 0.5, history=True, n=16, anchor_target_drift=1.0, **kw)
    d1 = [r["anchor_drift"] for r in probe if "anchor_drift" in r][0]
    target = 1.1 * d1  # e = (d1 - target) / target = -0.091: inside the clip, so the drift's value matters
    _, h1 = _grads(tokenizer, tmp_path / "one", 1, 0.5, history=True, n=16, anchor_target_drift=target, **kw)
    _, h2 = _grads(tokenizer, tmp_path / "two", 2, 0.5, history=True, n=16, anchor_target_drift=target, **kw)
    l1 = [r["anchor_lambda"] for r in h1 if "anchor_lambda" in r]
    l2 = [r["anchor_lambda"] for r in h2 if "anchor_lambda" in r]
    assert len(l1) == len(l2) == 2
    assert l1[0] == l2[0] == pytest.approx(0.5)
    assert l1[1] == pytest.approx(0.5 * (1 - 1.0 * 0.1 / 1.1), rel=1e-4)
    assert l2 == pytest.approx(l1, rel=1e-5)

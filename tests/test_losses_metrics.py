"""Losses and metrics against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from w2s_shift.losses import (
    LOSSES,
    anchor_mse,
    confidence_alpha,
    confidence_loss,
    confidence_targets,
    orientation,
    pairwise_margin,
    soft_bradley_terry,
)
from w2s_shift.metrics.stats import accuracy_interval, pairwise_accuracy, pgr, shift_metrics


def _sig(x):
    return 1 / (1 + math.exp(-x))


def test_soft_bt_hand_computed():
    d = torch.tensor([2.0, -1.0, 0.0])
    q = torch.tensor([0.9, 0.3, 0.5])
    want = np.mean(
        [
            -(qi * math.log(_sig(di)) + (1 - qi) * math.log(_sig(-di)))
            for di, qi in zip([2.0, -1.0, 0.0], [0.9, 0.3, 0.5])
        ]
    )
    assert soft_bradley_terry(d, q).item() == pytest.approx(want, rel=1e-6)
    # third pair alone: q = 0.5, d = 0 -> log 2
    assert soft_bradley_terry(torch.tensor([0.0]), torch.tensor([0.5])).item() == pytest.approx(math.log(2), rel=1e-6)


def test_soft_bt_with_gold_labels_is_hard_bt():
    d = torch.tensor([1.5, -0.5, 3.0])
    hard = np.mean([-math.log(_sig(x)) for x in [1.5, -0.5, 3.0]])
    assert soft_bradley_terry(d, torch.ones(3)).item() == pytest.approx(hard, rel=1e-6)


def test_pairwise_margin_layout():
    r = torch.tensor([3.0, 1.0, 0.5, 2.0])  # chosen_1, chosen_2, rejected_1, rejected_2
    assert pairwise_margin(r).tolist() == [2.5, -1.0]


def test_anchor_mse_masks_prompt_and_padding():
    h = torch.zeros(2, 3, 2)
    ref = torch.zeros(2, 3, 2)
    h[0, 0] = torch.tensor([100.0, 100.0])  # prompt token: masked out
    h[0, 1] = torch.tensor([1.0, 3.0])  # response: squared errors 1, 9 -> mean 5
    h[1, 2] = torch.tensor([50.0, 50.0])  # padding: masked out
    h[1, 1] = torch.tensor([2.0, 0.0])  # response: 4, 0 -> mean 2
    mask = torch.tensor([[0, 1, 0], [0, 1, 0]])
    assert anchor_mse(h, ref, mask).item() == pytest.approx((5 + 2) / 2)
    assert anchor_mse(h, ref, torch.zeros(2, 3)).item() == 0.0


def test_anchor_mse_gradient_does_not_reach_reference():
    h = torch.randn(1, 2, 3, requires_grad=True)
    ref = torch.randn(1, 2, 3, requires_grad=True)
    anchor_mse(h, ref, torch.ones(1, 2)).backward()
    assert h.grad is not None and ref.grad is None


def test_confidence_loss_threshold_and_targets():
    d = torch.tensor([2.0, -1.0, 0.5, -3.0])
    q = torch.tensor([0.8, 0.4, 0.6, 0.2])
    alpha = 0.5
    # seed 0 orients the batch as s = [-1, -1, 1, 1]: d' = [-2, 1, 0.5, -3]; the top B - B//2 = 2 oriented margins
    # (pairs 1, 2) get h' = 1, so h' = [0, 1, 1, 0] and back in the original orientation h = [1, 0, 1, 0]
    # seed 1: s = [1, -1, 1, -1], d' = [2, 1, 0.5, 3], top 2 = pairs 3, 0: h' = [1, 0, 0, 1], h = [1, 1, 0, 0]
    assert orientation(4, 0).tolist() == [-1.0, -1.0, 1.0, 1.0] and orientation(4, 1).tolist() == [1.0, -1.0, 1.0, -1.0]
    for seed, h in ((0, [1, 0, 1, 0]), (1, [1, 1, 0, 0])):
        target = [(1 - alpha) * qi + alpha * hi for qi, hi in zip(q.tolist(), h)]
        want = np.mean([-(t * math.log(_sig(x)) + (1 - t) * math.log(_sig(-x))) for x, t in zip(d.tolist(), target)])
        assert confidence_loss(d, q, alpha, seed=seed).item() == pytest.approx(want, rel=1e-6)
        assert confidence_targets(d, q, alpha, seed=seed).tolist() == pytest.approx(target)
    assert confidence_loss(d, q, 0.0).item() == pytest.approx(soft_bradley_terry(d, q).item(), rel=1e-6)
    assert confidence_loss(d, q, alpha, reduction="sum").item() == pytest.approx(
        4 * confidence_loss(d, q, alpha).item()
    )


def test_orientation_flips_exactly_half_and_is_seeded():
    for n in (1, 2, 5, 8, 33):
        for seed in range(5):
            s = orientation(n, seed)
            assert int((s < 0).sum()) == n // 2 and int((s > 0).sum()) == n - n // 2
            assert torch.equal(s, orientation(n, seed))
    assert not torch.equal(orientation(32, 0), orientation(32, 1))


def test_confidence_hardens_toward_chosen_when_the_student_prefers_chosen_everywhere():
    """With mean q = 0.55 the old top-round(B mean q) rule hardened the 45% smallest margins
    toward "rejected is better" although the student prefers chosen on every pair."""
    for d, q in (
        (torch.tensor([3.0, 2.0, 1.5, 1.0, 0.8, 0.5, 0.3, 0.1]), torch.full((8,), 0.55)),
        (
            torch.tensor([3.0, 2.0, 1.5, 1.0, 0.8, 0.5, 0.3, 0.1]),
            torch.tensor([0.9, 0.2, 0.6, 0.55, 0.7, 0.35, 0.8, 0.3]),
        ),  # mean 0.55
        (torch.tensor([0.4, 0.2, 1.0, 0.05, 2.0]), torch.full((5,), 0.55)),
    ):
        assert q.mean().item() == pytest.approx(0.55)
        for seed in range(20):
            assert confidence_targets(d, q, 1.0, seed=seed).tolist() == [1.0] * len(d)
            # alpha = 1: the loss is the gold Bradley-Terry loss -log sigmoid(d)
            assert confidence_loss(d, q, 1.0, seed=seed).item() == pytest.approx(
                soft_bradley_terry(d, torch.ones_like(d)).item(), rel=1e-6
            )


def test_confidence_alpha_rises_linearly_without_a_jump():
    assert confidence_alpha(0.0, 0.5, 0.2) == 0.0
    assert confidence_alpha(0.1, 0.5, 0.2) == pytest.approx(0.25)
    assert confidence_alpha(0.199, 0.5, 0.2) == pytest.approx(0.4975)
    assert confidence_alpha(0.2, 0.5, 0.2) == pytest.approx(0.5)
    assert confidence_alpha(0.9, 0.5, 0.2) == pytest.approx(0.5)


def test_losses_are_registered():
    # the pairwise W2S losses selectable by name; the ANCHOR term is added on top, not selected
    assert {"soft_bt", "confidence"} <= set(LOSSES) and "bt" not in LOSSES  # plus any a test registers


def test_pairwise_accuracy_ties_are_wrong():
    assert pairwise_accuracy(np.array([1.0, 2.0, 3.0, 0.0]), np.array([0.0, 2.0, 1.0, 1.0])) == 50.0


def test_shift_metrics_and_pgr_known_numbers():
    """The numbers the removed evaluate.w2s_metrics was tested on, through the live shift_metrics and pgr."""
    acc = {
        "teacher": {"id": 60.0, "a": 55.0, "b": 70.0},
        "naive": {"id": 66.0, "a": 50.0, "b": 72.0},
        "anchor": {"id": 58.0, "a": 59.0, "b": 75.0},
        "ceiling": {"id": 70.0, "a": 65.0, "b": 70.0},
    }
    m = shift_metrics(acc["naive"], acc["teacher"], "id", ["a", "b"])
    assert m["WRG"] == pytest.approx(6.0)
    assert m["AOG"] == {"a": pytest.approx(-5.0), "b": pytest.approx(2.0)}
    assert m["AOG_mean"] == pytest.approx(-1.5)
    assert m["NTS"] == pytest.approx(-1.5)  # no ID loss
    assert pgr(acc["naive"]["id"], acc["teacher"]["id"], acc["ceiling"]["id"]) == pytest.approx(0.6)
    assert pgr(acc["naive"]["b"], acc["teacher"]["b"], acc["ceiling"]["b"]) is None  # ceiling does not beat teacher
    a = shift_metrics(acc["anchor"], acc["teacher"], "id", ["a", "b"])
    assert a["WRG"] == pytest.approx(-2.0)
    assert a["AOG_mean"] == pytest.approx(4.5)
    assert a["NTS"] == pytest.approx(4.5 - 2.0)


def test_accuracy_interval_brackets_the_mean_and_narrows_with_n():
    rng = np.random.default_rng(1)
    small = rng.random(100) < 0.6
    big = rng.random(10000) < 0.6
    lo, hi = accuracy_interval(small, n_boot=1000, seed=0)
    assert lo < 100 * small.mean() < hi
    blo, bhi = accuracy_interval(big, n_boot=1000, seed=0)
    assert (bhi - blo) < (hi - lo) / 5
    # binomial standard error: width about 2 * 1.96 * sqrt(p(1-p)/n)
    assert (bhi - blo) == pytest.approx(2 * 1.96 * 100 * math.sqrt(0.24 / 10000), rel=0.15)


def test_score_and_report_share_one_bootstrap():
    """`score` (accuracy_interval) and the report (joint_bootstrap) give the same interval for the
    same pairs and seed; evaluate.bootstrap_ci, a second resampling scheme, is gone."""
    import w2s_shift.inference as inf
    import w2s_shift.metrics.stats as st
    from w2s_shift.metrics.stats import joint_bootstrap

    assert not hasattr(inf, "bootstrap_ci") and not hasattr(st, "bootstrap_ci")
    rng = np.random.default_rng(2)
    c = {m: {"id": rng.random(150) < p, "ood": rng.random(80) < p} for m, p in (("teacher", 0.6), ("s", 0.7))}
    rep = joint_bootstrap(c, "id", ["ood"], ["s"], n_boot=400, seed=5)["accuracy"]["s"]["id"]["ci"]
    assert accuracy_interval(c["s"]["id"], n_boot=400, seed=5) == pytest.approx(rep, abs=1e-12)

"""The public inference helpers (padding, token-budget batching, model inputs) and the drift probe built on them,
against hand-computed values and against unpadded one-sequence forwards."""

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from w2s_shift.batching import batch_inputs, batches_by_tokens, module_device, pad_sequences
from w2s_shift.inference import score_sequences
from w2s_shift.metrics.drift import DriftProbe, linear_cka, relative_squared_error
from w2s_shift.models.reward_model import RewardModel


def _llama(vocab: int = 50, layers: int = 3, seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaModel(cfg).eval()


def _one(s: list) -> dict:
    """One unpadded sequence as model inputs."""
    return {"input_ids": torch.tensor([s]), "attention_mask": torch.ones(1, len(s), dtype=torch.long)}


SEQS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20, 21]]
MASKS = [[0, 0, 1, 1, 1], [0, 1], [0, 1, 1], [0, 0, 0, 1, 1, 1, 1]]


def test_pad_sequences_right_pads_with_a_mask():
    ids, am = pad_sequences([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.dtype == am.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert am.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    with pytest.raises(ValueError, match="no sequences"):
        pad_sequences([], 0)


def test_batches_by_tokens_by_hand():
    # descending length: 1 (5), 3 (5), 0 (3), 2 (2); [1, 3] pads to 2 x 5 = 10 tokens, adding 0 would make 15
    assert batches_by_tokens([3, 5, 2, 5], max_tokens=10) == [[1, 3], [0, 2]]
    assert batches_by_tokens([3, 5, 2, 5], max_tokens=100, max_rows=3) == [[1, 3, 0], [2]]
    assert batches_by_tokens([20, 1], max_tokens=10) == [[0], [1]]  # a sequence over the budget runs alone
    assert batches_by_tokens([], max_tokens=10) == []


def test_batch_inputs_ids_or_embeddings_with_zero_padding():
    ids = batch_inputs(SEQS, None, [1, 2], pad_id=3, dev="cpu")
    assert ids["input_ids"].tolist() == [[10, 11, 3], [12, 13, 14]]
    assert ids["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    states = [torch.full((len(s), 4), float(k + 1), dtype=torch.bfloat16) for k, s in enumerate(SEQS)]
    emb = batch_inputs(SEQS, states, [1, 2], pad_id=3, dev="cpu")
    assert set(emb) == {"inputs_embeds", "attention_mask"} and emb["inputs_embeds"].dtype == torch.float32
    assert emb["inputs_embeds"][:, :, 0].tolist() == [[2.0, 2.0, 0.0], [3.0, 3.0, 3.0]]
    assert module_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(torch.nn.Identity()) == torch.device("cpu")


def test_score_sequences_equals_unpadded_forwards_in_input_order():
    model = RewardModel(_llama(), 32)
    got = score_sequences(model, SEQS, pad_id=0, max_tokens=8)  # several batches, reordered by length
    with torch.no_grad():
        want = [model(**_one(s))[0] for s in SEQS]
    np.testing.assert_allclose(got, torch.cat(want).double().numpy(), rtol=1e-5, atol=1e-6)


def _response_states(model: RewardModel, layer: int) -> np.ndarray:
    """Block ``layer``'s outputs on the response tokens, one unpadded forward per sequence, concatenated."""
    rows = []
    with torch.no_grad():
        for s, m in zip(SEQS, MASKS):
            _, hs = model(**_one(s), output_layers=[layer])
            rows.append(hs[0][0][torch.tensor(m, dtype=torch.bool)])
    return torch.cat(rows).double().numpy()


def test_drift_probe_zero_for_the_reference_and_equal_to_unpadded_forwards():
    base = _llama()
    probe = DriftProbe(base, SEQS, MASKS, None, pad_id=0, layers=[1, 3], layer_offset=0, max_tokens=8, bf16=False)
    assert probe.ref.shape == (sum(map(sum, MASKS)), 2, 32)  # (response tokens, layers, H)
    same = probe.measure(RewardModel(copy.deepcopy(base), 32))
    assert set(same) == {"1", "3"}
    for v in same.values():
        assert v["rel_sq_err"] == pytest.approx(0.0, abs=1e-10)
        assert v["cka"] == pytest.approx(1.0, abs=1e-6)

    student = RewardModel(copy.deepcopy(base), 32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in student.backbone.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    student.train()
    got = probe.measure(student)
    assert student.training  # measure restores the mode it found
    ref_model = RewardModel(base, 32)
    for layer in (1, 3):
        h, r = _response_states(student, layer), _response_states(ref_model, layer)
        want = float(((h - r) ** 2).sum() / (r**2).sum())
        assert want > 1e-4
        assert got[str(layer)]["rel_sq_err"] == pytest.approx(want, rel=1e-4)
        assert got[str(layer)]["rel_sq_err"] == pytest.approx(relative_squared_error(h, r), rel=1e-4)
        assert got[str(layer)]["cka"] == pytest.approx(linear_cka(h, r), rel=1e-4)
    # during training: the relative error only, from per-layer sums kept on the device (several batches here)
    during = probe.measure_during(student)
    assert student.training and set(during) == {"1", "3"}
    for layer in (1, 3):
        assert during[str(layer)] == {"rel_sq_err": pytest.approx(got[str(layer)]["rel_sq_err"], rel=1e-12)}
    # the probe's rewards come from the same forwards as score_sequences' and equal them to the bit (so scoring
    # a set the probe holds whole can use them); and the drift is the same with or without them
    d2, rewards = probe.measure(student, with_rewards=True)
    assert d2 == got
    want_r = score_sequences(student, SEQS, 0, max_tokens=8)
    assert rewards.dtype == np.float64 and np.array_equal(rewards, want_r)
    assert not np.array_equal(rewards, score_sequences(ref_model, SEQS, 0, max_tokens=8))


@pytest.mark.parametrize("bf16", [True, False])
def test_scoring_returns_the_pooled_states_a_separate_pass_gives_to_the_bit(bf16):
    """score_sequences(with_pooled=True) hands the mechanism stage each sequence's last-token state from its own
    forwards: the same rewards as without it, and states equal to the bit to pooled_states' separate pass over the
    head's backbone. On cached trunk states of a top-2 split (a `trainable_layers` student, as the presets ship)
    under bfloat16 autocast (`bf16: auto` on a native-bf16 CPU or GPU) and in float32; several batches (the
    token budget splits the 4 sequences); also through score_sequences_sharded in one process."""
    from w2s_shift.distributed import score_sequences_sharded
    from w2s_shift.inference import compute_trunk_states, pooled_states
    from w2s_shift.models.reward_model import split_decoder

    trunk, top = split_decoder(_llama(layers=4), 2)
    model = RewardModel(top, 32, layer_offset=2).eval()
    torch.nn.init.normal_(model.score.weight, std=0.5)
    states = compute_trunk_states(trunk, SEQS, 0, dtype=torch.bfloat16 if bf16 else torch.float32)
    kw = dict(states=states, max_tokens=12, bf16=bf16)
    rewards, pooled = score_sequences(model, SEQS, 0, with_pooled=True, **kw)
    assert np.array_equal(rewards, score_sequences(model, SEQS, 0, **kw))
    want = pooled_states(model.backbone, SEQS, 0, **kw)
    assert pooled.dtype == np.float32 and pooled.shape == (4, 32) and np.array_equal(pooled, want.numpy())
    # the head reads these states: w . h is each reward (the head runs in float32)
    w = model.score.weight.detach().double().numpy()[0]
    np.testing.assert_allclose(pooled.astype(np.float64) @ w, rewards, rtol=1e-5, atol=1e-6)
    r2, p2 = score_sequences_sharded(model, SEQS, 0, with_pooled=True, **kw)
    assert np.array_equal(r2, rewards) and np.array_equal(p2, pooled)

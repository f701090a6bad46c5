"""Shared-prefix trunk states: a pair's common start runs once through the frozen layers (the pair packed in one
row, its two responses kept apart by the attention mask), and every state equals the plain pass's
(:func:`w2s_shift.inference.compute_trunk_states`)."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaModel,
    MistralConfig,
    MistralModel,
    Qwen2Config,
    Qwen2Model,
)

import w2s_shift.inference as inf
from w2s_shift.inference import can_share_prefixes, compute_trunk_states
from w2s_shift.models.reward_model import split_decoder

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4)


def _trunk(cls, cfg_cls, **extra):
    torch.manual_seed(0)
    trunk, _ = split_decoder(cls(cfg_cls(**SMALL, **extra)).eval(), 2)
    return trunk.eval()


def _pairs(n: int) -> list:
    """[chosen_1..chosen_n, rejected_1..rejected_n]: a 6-token system turn in every sequence, a prompt of 3 + i
    tokens whose first token differs from pair to pair, then a 2-token chosen and a 4-token rejected response."""
    system = [1, 2, 3, 4, 5, 6]
    prompts = [[30 + i] + [40 + (i + k) % 20 for k in range(2 + i)] for i in range(n)]
    return [system + p + [10, 11] for p in prompts] + [system + p + [20, 21, 22, 23] for p in prompts]


@pytest.mark.parametrize("max_tokens", [8192, 24])
@pytest.mark.parametrize("cls,cfg_cls", [(LlamaModel, LlamaConfig), (Qwen2Model, Qwen2Config)])
def test_shared_prefix_states_equal_the_plain_pass(cls, cfg_cls, max_tokens):
    """Also with a token budget that splits the pairs into several groups and batches (24 tokens)."""
    trunk = _trunk(cls, cfg_cls, num_key_value_heads=2)
    seqs = _pairs(5)
    seqs[2] = seqs[2][:7]  # a chosen sequence that is a prefix of its rejected one: it keeps its last token
    plain = compute_trunk_states(trunk, seqs, 0, max_tokens=max_tokens, dtype=torch.float32)
    shared = compute_trunk_states(trunk, seqs, 0, max_tokens=max_tokens, dtype=torch.float32, share_prefixes=True)
    assert [s.shape for s in shared] == [s.shape for s in plain] == [(len(s), 32) for s in seqs]
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())


def test_each_shared_token_runs_once(monkeypatch):
    """3 pairs packed one a row: the 6 system tokens and the prompt (3, 4, 5 tokens) once per pair, then the 2
    chosen and the 4 rejected response tokens: 9 + 10 + 11 + 3 x 6 = 48 tokens through the trunk instead of
    2 x 27 + 18 = 78, in one forward of 3 rows as wide as the longest (11 + 6 = 17)."""
    trunk = _trunk(LlamaModel, LlamaConfig, num_key_value_heads=2)
    shapes, real = [], trunk.forward

    def counting(*a, **k):
        shapes.append((tuple(k["input_ids"].shape), int((k["attention_mask"] == 0).sum())))
        return real(*a, **k)

    monkeypatch.setattr(trunk, "forward", counting)
    seqs = _pairs(3)
    assert sum(len(s) for s in seqs) == 78
    assert [p for p, _, _ in inf._pair_rows(seqs)] == [9, 10, 11]
    compute_trunk_states(trunk, seqs, 0, dtype=torch.float32, share_prefixes=True)
    # allowed (query, key) entries: causal over each row's prefix + chosen tail, the rejected tail over the prefix
    # and itself, each padding position over itself
    rows = [(9, 2, 4), (10, 2, 4), (11, 2, 4)]
    allowed = sum((p + c) * (p + c + 1) // 2 + r * p + r * (r + 1) // 2 + (17 - p - c - r) for p, c, r in rows)
    assert shapes == [((3, 17), allowed)]
    assert sum(p + c + r for p, c, r in rows) == 48


def test_eager_attention_takes_the_same_packed_mask():
    """The packed mask is additive (0 / most negative value), the form both eager and SDPA attention read."""
    torch.manual_seed(0)
    cfg = LlamaConfig(**SMALL, num_key_value_heads=2, attn_implementation="eager")
    trunk, _ = split_decoder(LlamaModel(cfg).eval(), 2)
    assert trunk.config._attn_implementation == "eager" and can_share_prefixes(trunk)
    seqs = _pairs(4)
    plain = compute_trunk_states(trunk, seqs, 0, dtype=torch.float32)
    shared = compute_trunk_states(trunk, seqs, 0, dtype=torch.float32, share_prefixes=True)
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())


def test_shared_prefix_states_in_bfloat16_agree_within_its_rounding():
    trunk = _trunk(LlamaModel, LlamaConfig, num_key_value_heads=2).to(torch.bfloat16)
    seqs = _pairs(4)
    plain = compute_trunk_states(trunk, seqs, 0)
    shared = compute_trunk_states(trunk, seqs, 0, share_prefixes=True)
    assert all(s.dtype == torch.bfloat16 for s in shared)
    scale = max(float(s.float().abs().max()) for s in plain)
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(plain, shared))
    assert diff <= 0.02 * scale, (diff, scale)


def test_only_causal_full_attention_trunks_share_prefixes():
    assert can_share_prefixes(_trunk(LlamaModel, LlamaConfig, num_key_value_heads=2))
    assert can_share_prefixes(_trunk(Qwen2Model, Qwen2Config, num_key_value_heads=2))
    assert not can_share_prefixes(_trunk(MistralModel, MistralConfig, num_key_value_heads=2, sliding_window=4))
    bert = _trunk(BertModel, BertConfig)
    assert not can_share_prefixes(bert)
    with pytest.raises(ValueError, match="causal full-attention decoder"):
        compute_trunk_states(bert, _pairs(2), 0, share_prefixes=True)
    with pytest.raises(ValueError, match="got 3 sequences"):
        compute_trunk_states(_trunk(LlamaModel, LlamaConfig), _pairs(2)[:3], 0, share_prefixes=True)


def test_the_featurizer_shares_prefixes_when_asked_and_states_match(tiny_model_dirs, monkeypatch):
    from w2s_shift.config import ModelConfig
    from w2s_shift.data.schema import make_pair
    from w2s_shift.pipeline.featurizer import Featurizer

    pairs = [
        make_pair(f"What is {i} plus {i}?", f"It is {2 * i}.", f"No idea {i}.", "toy", path="t", row=i + 1)
        for i in range(6)
    ]
    calls = []
    real = inf.compute_trunk_states

    def spy(*a, **k):
        calls.append(k.get("share_prefixes"))
        return real(*a, **k)

    monkeypatch.setattr("w2s_shift.pipeline.featurizer.compute_trunk_states", spy)
    got = {}
    assert ModelConfig(name="x").trunk_share_prefixes is True  # on by default: fewer tokens, same states
    for share in (True, False):
        mcfg = ModelConfig(name=tiny_model_dirs["student"], trainable_layers=2, bf16=False, trunk_share_prefixes=share)
        got[share] = Featurizer(mcfg, "student").features("test", pairs)["states"]
    assert calls == [True, False]
    assert len(got[True]) == 12
    for a, b in zip(got[True], got[False]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)

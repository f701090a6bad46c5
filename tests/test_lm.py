"""LM log-probabilities from an AutoModel backbone against a LlamaForCausalLM holding the same weights."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

from w2s_shift.models.lm import (
    lm_head_weight,
    next_token_logprob_diff,
    sequence_logprobs,
)

V = 97
PAD = 0


def _config(tie: bool = True, vocab: int = V) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        pad_token_id=PAD,
    )


def _pair(vocab: int = V):
    """A random-init backbone and a causal LM with the same (tied) weights."""
    torch.manual_seed(0)
    base = LlamaModel(_config(vocab=vocab)).eval()
    with torch.no_grad():  # a larger embedding makes the next-token distribution far from uniform
        base.embed_tokens.weight.mul_(20.0)
    lm = LlamaForCausalLM(_config(vocab=vocab)).eval()
    lm.model.load_state_dict(base.state_dict())
    lm.tie_weights()
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
    return base, lm


def _brute(lm, seq) -> np.ndarray:
    """log p(seq[t] | seq[<t]) for t = 1..T-1 (index t), one unpadded sequence at a time; entry 0 is nan."""
    with torch.no_grad():
        logp = torch.log_softmax(lm(torch.tensor([seq])).logits[0].double(), -1)
    out = np.full(len(seq), np.nan)
    for t in range(1, len(seq)):
        out[t] = logp[t - 1, seq[t]].item()
    return out


SEQS = [[5, 17, 33, 2, 9, 41, 60, 7], [11, 12], [3, 80, 4, 4, 19], [96, 1, 50, 23, 8, 30, 70, 2, 6, 44, 13]]
MASKS = [[0, 0, 0, 1, 1, 1, 1, 1], [0, 1], [0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]


def test_sum_and_mean_match_brute_force_in_one_padded_batch():
    base, lm = _pair()
    w = lm_head_weight(base)
    assert w.data_ptr() == base.embed_tokens.weight.data_ptr()
    got_sum = sequence_logprobs(base, w, SEQS, MASKS, PAD, reduce="sum")
    got_mean = sequence_logprobs(base, w, SEQS, MASKS, PAD)
    exp_sum, exp_mean = [], []
    for s, m in zip(SEQS, MASKS):
        b = _brute(lm, s)
        sel = [t for t in range(1, len(s)) if m[t]]  # position 0 of the last mask is ignored
        exp_sum.append(sum(b[t] for t in sel))
        exp_mean.append(exp_sum[-1] / len(sel))
    np.testing.assert_allclose(got_sum, exp_sum, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_mean, exp_mean, rtol=1e-5, atol=1e-5)
    assert got_sum[3] < -50  # 10 tokens of a peaked random LM: far from 0, so the comparison is not vacuous
    # one batch per sequence, and a different pad id, give the same numbers
    np.testing.assert_allclose(
        sequence_logprobs(base, w, SEQS, MASKS, 7, max_tokens=11, reduce="sum"), got_sum, rtol=1e-5, atol=1e-5
    )


def test_single_target_masks_pick_exactly_that_position():
    base, lm = _pair()
    w = lm_head_weight(base)
    s = SEQS[3]
    b = _brute(lm, s)
    masks = [[int(k == t) for k in range(len(s))] for t in range(1, len(s))]
    got = sequence_logprobs(base, w, [s] * len(masks), masks, PAD, reduce="sum")
    np.testing.assert_allclose(got, b[1:], rtol=1e-5, atol=1e-5)
    assert np.ptp(got) > 1.0  # the positions really differ


def test_future_and_target_tokens():
    """A token after the last target changes nothing; a non-target token before a target (its context)
    changes the score; a mask of 1 at position 0 is ignored."""
    base, _ = _pair()
    w = lm_head_weight(base)
    s = [5, 17, 33, 2, 9, 41, 60, 7]
    m = [0, 0, 1, 1, 0, 0, 0, 0]
    future = s[:5] + [88, 88, 88]
    context = [5, 70] + s[2:]
    m0 = [1] + m[1:]
    got = sequence_logprobs(base, w, [s, future, context, s], [m, m, m, m0], PAD, reduce="sum")
    assert got[1] == pytest.approx(got[0], abs=1e-5)
    assert abs(got[2] - got[0]) > 1e-2
    assert got[3] == pytest.approx(got[0], abs=1e-5)


def test_bad_inputs():
    base, _ = _pair()
    w = lm_head_weight(base)
    with pytest.raises(ValueError, match="sequence 1: no target"):
        sequence_logprobs(base, w, [[1, 2], [3, 4]], [[0, 1], [1, 0]], PAD)
    with pytest.raises(ValueError, match="sequence 0: 2 tokens but a target mask of length 3"):
        sequence_logprobs(base, w, [[1, 2]], [[0, 1, 1]], PAD)
    with pytest.raises(ValueError, match="reduce"):
        sequence_logprobs(base, w, [[1, 2]], [[0, 1]], PAD, reduce="max")


def test_untied_head_is_refused_and_explicit_weight_checked():
    base = LlamaModel(_config(tie=False))
    with pytest.raises(ValueError, match=r"'llama' has an untied LM head"):
        lm_head_weight(base)
    w = torch.randn(V, 32)
    assert lm_head_weight(base, w) is w
    with pytest.raises(ValueError, match=r"shape \(96, 32\)"):
        lm_head_weight(base, torch.randn(96, 32))


def test_encoder_is_refused():
    from transformers import BertConfig, BertModel

    bert = BertModel(
        BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    )
    with pytest.raises(ValueError, match="'bert' is not a decoder-only causal language model"):
        lm_head_weight(bert)


def test_next_token_logprob_diff_matches_brute_force(tokenizer):
    base, lm = _pair(vocab=len(tokenizer))
    w = lm_head_weight(base)
    prompts = ["Is the sky blue? Answer Yes or No:", "Question: is water wet?\nAnswer Yes or No:", "Hi"]
    # this tiny tokenizer splits " Yes" and " No" as " " + ...: the default answers are refused
    with pytest.raises(ValueError, match="start with the same token"):
        next_token_logprob_diff(base, w, tokenizer, prompts)
    yes = tokenizer(" yes", add_special_tokens=False)["input_ids"][0]
    no = tokenizer(" no", add_special_tokens=False)["input_ids"][0]
    assert yes != no
    exp = []
    for p in prompts:
        ids = tokenizer(p)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(lm(torch.tensor([ids])).logits[0, -1].double(), -1)
        exp.append((lp[yes] - lp[no]).item())
    got = next_token_logprob_diff(base, w, tokenizer, prompts, yes=" yes", no=" no")
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)
    assert np.ptp(got) > 1e-2
    # swapping the answers flips the sign
    np.testing.assert_allclose(
        next_token_logprob_diff(base, w, tokenizer, prompts, yes=" no", no=" yes"), -got, rtol=1e-6, atol=1e-6
    )
    # left truncation keeps the end of the prompt
    ids = tokenizer(prompts[1])["input_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(lm(torch.tensor([ids[-4:]])).logits[0, -1].double(), -1)
    assert next_token_logprob_diff(base, w, tokenizer, prompts[1:2], yes=" yes", no=" no", max_length=4)[
        0
    ] == pytest.approx((lp[yes] - lp[no]).item(), abs=1e-5)


def test_top_layers_on_cached_trunk_states_equal_the_whole_backbone():
    """Zero-shot from cached trunk states: the top slice of a split_decoder split on the trunk's states gives the
    log-likelihoods of the whole backbone (padded batches, several batch sizes)."""
    from w2s_shift.inference import compute_trunk_states
    from w2s_shift.models.reward_model import split_decoder

    base, lm = _pair()
    w = lm_head_weight(base)
    trunk, top = split_decoder(base, 1)
    states = compute_trunk_states(trunk, SEQS, PAD, dtype=torch.float32)
    assert [s.shape[0] for s in states] == [len(s) for s in SEQS]
    whole = sequence_logprobs(base, w, SEQS, MASKS, PAD, reduce="sum")
    for max_tokens in (8192, 11):
        got = sequence_logprobs(top, w, SEQS, MASKS, PAD, reduce="sum", states=states, max_tokens=max_tokens)
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)
    exp = sum(_brute(lm, SEQS[3])[1:])  # every position after 0 of the last sequence is a target
    assert abs(whole[3] - exp) < 1e-4 and whole[3] < -50


def test_a_bf16_saved_untied_head_is_read_in_float32(tokenizer, tmp_path):
    """Hub checkpoints store bfloat16: the untied lm_head.weight read from one is float32, like the float32 backbone,
    so zero-shot and SEAM logits are float32 matmuls (they were bfloat16 matmuls, rounded in every logit)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from w2s_shift.models.loading import load_backbone, untied_lm_head

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    lm = LlamaForCausalLM(cfg).to(torch.bfloat16)
    lm.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    backbone = load_backbone(str(tmp_path)).backbone
    head = untied_lm_head(backbone)
    assert head.dtype == torch.float32
    torch.testing.assert_close(head, lm.lm_head.weight.detach().float(), rtol=0, atol=0)
    seq = list(range(3, 40))
    mask = [0] * 10 + [1] * 27
    with torch.no_grad():
        hid = backbone(input_ids=torch.tensor([seq])).last_hidden_state[0].double()
    lp = torch.log_softmax(hid @ head.double().T, -1)
    want = float(torch.stack([lp[t - 1, seq[t]] for t in range(10, 37)]).mean())
    got = sequence_logprobs(backbone, lm_head_weight(backbone, head), [seq], [mask], 0)[0]
    rounded = sequence_logprobs(backbone, head.bfloat16(), [seq], [mask], 0)[0]  # what a bf16 head gave
    assert abs(got - want) < 1e-6 < abs(rounded - want) / 5, (got - want, rounded - want)

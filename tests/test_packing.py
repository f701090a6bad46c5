"""Padding-free packing: layout by hand, and packed batches give the padded batches' rewards, losses and gradients."""

import copy
import dataclasses

import pytest
import torch
from conftest import pair_objective
from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model

from w2s_shift.data.render import encode
from w2s_shift.data.schema import make_pair
from w2s_shift.models.reward_model import RewardModel, can_pack, pack_sequences, packed_positions, split_decoder
from w2s_shift.training import (
    PackingMismatchError,
    PairCollator,
    PairDataset,
    PairTrainer,
    PairTrainingArguments,
    check_packing,
    make_reference,
    train_pairs,
)


def test_first_fit_decreasing_rows_by_hand():
    # longest first: 7 -> row 0 (room 1); 5 -> row 1 (room 3); 3 -> row 1 (room 0); 2 -> row 2; 1 -> row 0
    assert pack_sequences([3, 7, 2, 5, 1], 8) == [[1, 4], [3, 0], [2]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_sequences([9], 8)


def test_packed_positions_by_hand():
    rows = [[1, 4], [3, 0], [2]]
    pos, starts, last = packed_positions(rows, [3, 7, 2, 5, 1])
    assert pos.tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 0],
        [0, 1, 2, 3, 4, 0, 1, 2],
        [0, 1, 0, 1, 2, 3, 4, 5],
    ]  # row 2: a 2-token sequence, then its dummy tail
    assert starts.tolist() == [[1, 5], [0, 0], [2, 0], [1, 0], [0, 7]]
    assert last.tolist() == [1 * 8 + 7, 6, 2 * 8 + 1, 1 * 8 + 4, 7]


def _pairs(tokenizer, n=8):
    out = []
    for i in range(n):  # lengths vary a lot: packing has something to do
        p = make_pair(
            f"Question {i}: " + "tell me more " * (i % 4),
            f"Answer {i} " + "yes " * (3 * i % 7),
            "No." + " maybe" * (i % 3),
            "toy",
            path="t",
            row=i + 1,
        )
        out.append(
            type(
                "E",
                (),
                {
                    "chosen": encode(p.prompt, p.chosen, tokenizer, 64),
                    "rejected": encode(p.prompt, p.rejected, tokenizer, 64),
                },
            )()
        )
    return out


def test_collator_places_the_same_tokens(tokenizer):
    enc = _pairs(tokenizer)
    ref_states = [
        (torch.randn(sum(e.chosen.response_mask), 2, 4), torch.randn(sum(e.rejected.response_mask), 2, 4)) for e in enc
    ]
    items = list(PairDataset(enc, [0.7] * len(enc), None, ref_states))
    pad, pk = PairCollator(tokenizer.pad_token_id)(items), PairCollator(tokenizer.pad_token_id, packing=True)(items)
    seqs = [e.chosen for e in enc] + [e.rejected for e in enc]
    total = sum(len(s.input_ids) for s in seqs)
    assert pk["input_ids"].numel() < pad["input_ids"].numel()
    assert pk["input_ids"].shape[1] <= pad["input_ids"].shape[1]  # no row wider than the padded batch
    assert "attention_mask" not in pk and pk["last_index"].shape == (2 * len(enc),)
    assert int(pk["response_mask"].sum()) == int((pad["response_mask"] * pad["attention_mask"]).sum())
    # walk back from each sequence's last token: its ids, response mask and reference states are in place
    flat_ids, flat_rm = pk["input_ids"].reshape(-1), pk["response_mask"].reshape(-1)
    flat_pos = pk["position_ids"].reshape(-1)
    flat_ref = pk["ref_hidden"].reshape(-1, 2, 4)
    for k, s in enumerate(seqs):
        end = int(pk["last_index"][k])
        n = len(s.input_ids)
        assert flat_ids[end - n + 1 : end + 1].tolist() == s.input_ids
        assert flat_rm[end - n + 1 : end + 1].tolist() == s.response_mask
        assert flat_pos[end - n + 1 : end + 1].tolist() == list(range(n))
        sel = flat_rm[end - n + 1 : end + 1] > 0
        assert torch.equal(flat_ref[end - n + 1 : end + 1][sel], pad["ref_hidden"][k, :n][sel])
    assert int((pk["input_ids"] != tokenizer.pad_token_id).sum()) <= total


def _backbone(kind, vocab):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaModel(LlamaConfig(**kw)) if kind == "llama" else Qwen2Model(Qwen2Config(**kw))


def _trainer(model, tmp_path, cfg, objective=None, dataset=None):
    args = dataclasses.replace(cfg, output_dir=str(tmp_path))
    return PairTrainer(model=model, args=args, train_dataset=dataset, objective=objective)


def _loss_and_grads(trainer, model, batch):
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("anchor", [None, "last", "layers"])
def test_packed_batch_gives_the_padded_loss_and_gradients(tokenizer, tmp_path, kind, anchor):
    """Soft BT (+ ANCHOR with a frozen copy, last layer or blocks 1 and 3): loss and every gradient match."""
    model = RewardModel(_backbone(kind, len(tokenizer)), 32)
    model.train()
    enc = _pairs(tokenizer)
    items = list(PairDataset(enc, [0.9, 0.6, 0.2, 0.75, 0.5, 1.0, 0.3, 0.8]))
    kw = {} if anchor is None else dict(anchor_lambda=0.5, anchor_layers=[1, 3] if anchor == "layers" else None)
    ref = None if anchor is None else make_reference(model.backbone)
    if ref is not None:  # a reference that differs from the student, so the anchor term and its gradient are not 0
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
    trainer = _trainer(model, tmp_path, PairTrainingArguments(), pair_objective(**kw, reference=ref))
    pad = PairCollator(tokenizer.pad_token_id)(items)
    pk = PairCollator(tokenizer.pad_token_id, packing=True)(items)
    l_pad, g_pad = _loss_and_grads(trainer, model, pad)
    l_pk, g_pk = _loss_and_grads(trainer, model, pk)
    assert l_pk == pytest.approx(l_pad, rel=1e-5, abs=1e-7)
    if anchor:
        assert trainer._parts["loss_anchor"][0].item() == pytest.approx(
            trainer._parts["loss_anchor"][1].item(), rel=1e-5
        )
        assert trainer._parts["loss_anchor"][0].item() > 1e-4
    assert g_pad.keys() == g_pk.keys() and len(g_pad) > 10
    for n in g_pad:
        assert torch.allclose(g_pk[n], g_pad[n], rtol=1e-4, atol=1e-6), n


def test_packed_split_head_with_cached_reference(tokenizer, tmp_path):
    """Trunk-cached head (inputs_embeds) with cached ANCHOR reference states: packed == padded."""
    from w2s_shift.inference import compute_reference_states, compute_trunk_states
    from w2s_shift.pipeline.featurizer import pairs_of, seqs_of

    trunk, head = split_decoder(_backbone("qwen2", len(tokenizer)), 2)
    enc = _pairs(tokenizer)
    seqs, masks = seqs_of(enc)
    flat = compute_trunk_states(trunk, seqs, tokenizer.pad_token_id, dtype=torch.float32)
    ref = pairs_of(
        compute_reference_states(
            copy.deepcopy(head), seqs, masks, tokenizer.pad_token_id, states=flat, dtype=torch.float32
        )
    )
    states = pairs_of(flat)
    model = RewardModel(head, 32, layer_offset=1)
    with torch.no_grad():
        model.backbone.layers[-1].mlp.down_proj.weight.add_(0.05)  # the student has moved away from its reference
    items = list(PairDataset(enc, [0.8] * len(enc), states, ref))
    trainer = _trainer(
        model,
        tmp_path,
        PairTrainingArguments(),
        pair_objective(anchor_lambda=1.0, reference_mode="cached"),
        dataset=PairDataset(enc, [0.8] * len(enc), states, ref),
    )
    l_pad, g_pad = _loss_and_grads(trainer, model, PairCollator(tokenizer.pad_token_id)(items))
    l_pk, g_pk = _loss_and_grads(trainer, model, PairCollator(tokenizer.pad_token_id, packing=True)(items))
    assert trainer._parts["loss_anchor"][0].item() > 1e-5
    assert l_pk == pytest.approx(l_pad, rel=1e-5)
    for n in g_pad:
        assert torch.allclose(g_pk[n], g_pad[n], rtol=1e-4, atol=1e-6), n


def test_packed_training_follows_padded_training(tokenizer, tmp_path):
    """Four optimizer steps packed vs padded: the final rewards agree to float rounding, while training moved them."""
    enc = _pairs(tokenizer)
    base = RewardModel(_backbone("llama", len(tokenizer)), 32)
    before = None
    final = {}
    for packing in (False, True):
        m = copy.deepcopy(base)
        cfg = PairTrainingArguments(
            num_train_epochs=2, batch_size=4, learning_rate=1e-2, packing=packing, logging_steps=1
        )
        train_pairs(m, PairDataset(enc, [1.0] * len(enc)), tokenizer.pad_token_id, cfg, str(tmp_path / str(packing)))
        batch = PairCollator(tokenizer.pad_token_id)(list(PairDataset(enc, [1.0] * len(enc))))
        m.eval()
        with torch.no_grad():
            final[packing] = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
            if before is None:
                before = base.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    assert float((final[False] - before).abs().max()) > 0.05
    assert torch.allclose(final[True], final[False], atol=1e-4)


class _RowMixer(torch.nn.Module):
    """A backbone whose "attention" mixes every token of a row: h_t = e_t + mean of the row's (unmasked) e.
    It ignores position_ids, as an attention that does not separate packed sequences would; padded and packed
    rows then give different final states whatever the transformers version."""

    def __init__(self, vocab: int, hidden: int = 32):
        super().__init__()
        self.config = BertConfig(vocab_size=vocab, hidden_size=hidden)
        self.embed = torch.nn.Embedding(vocab, hidden)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **_):
        from transformers.modeling_outputs import BaseModelOutput

        e = self.embed(input_ids)
        m = torch.ones(input_ids.shape, dtype=e.dtype) if attention_mask is None else attention_mask.to(e.dtype)
        ctx = (e * m.unsqueeze(-1)).sum(1, keepdim=True) / m.sum(1).clamp_min(1).view(-1, 1, 1)
        return BaseModelOutput(last_hidden_state=e + ctx)


def test_can_pack_and_check_packing_refuses_a_bidirectional_encoder(tokenizer):
    bert = BertModel(
        BertConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
        ),
        add_pooling_layer=False,
    )
    # encoders are always padded: whether their bidirectional mask follows restarting positions is up to the
    # transformers version, so packing is only offered for the causal decoders whose mask does
    assert not can_pack(bert, "last") and not can_pack(_backbone("llama", 64), "mean")
    assert can_pack(_backbone("llama", 64), "last") and can_pack(_backbone("qwen2", 64), "last")
    enc = _pairs(tokenizer, 2)
    ds = PairDataset(enc, [1.0, 1.0])
    # an attention that lets packed sequences see each other: the check must catch it and say what to do
    with pytest.raises(PackingMismatchError, match="teacher: packed rows give final states .* set packing: false"):
        check_packing(RewardModel(_RowMixer(len(tokenizer)), 32), ds, tokenizer.pad_token_id, "teacher")
    assert check_packing(RewardModel(_backbone("qwen2", len(tokenizer)), 32), ds, tokenizer.pad_token_id) < 1e-5


def test_disable_dropout_makes_training_mode_deterministic():
    from w2s_shift.models.reward_model import disable_dropout

    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        add_pooling_layer=False,
    )
    ids = torch.randint(0, 50, (3, 12))
    bert.train()
    assert not torch.equal(bert(input_ids=ids).last_hidden_state, bert(input_ids=ids).last_hidden_state)
    # modules: embeddings 1 + per layer attention probs, attention output, FFN output (1 + 2 x 3); config fields:
    # hidden_dropout_prob, attention_probs_dropout_prob
    assert disable_dropout(bert) == 9
    assert bert.config.hidden_dropout_prob == 0.0 and bert.config.attention_probs_dropout_prob == 0.0
    out = bert(input_ids=ids).last_hidden_state
    assert torch.allclose(out, bert.eval()(input_ids=ids).last_hidden_state, atol=1e-6)
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_dropout=0.2,
        )
    )
    assert disable_dropout(llama) == 3 and all(layer.self_attn.attention_dropout == 0.0 for layer in llama.layers)
    assert llama.config.attention_dropout == 0.0
    # dropout held as plain floats (BART: dropout, activation_dropout, attention_dropout) is found too
    from transformers import BartConfig, BartModel

    bart = BartModel(
        BartConfig(
            vocab_size=50,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            dropout=0.1,
            activation_dropout=0.1,
            attention_dropout=0.1,
        )
    ).train()
    disable_dropout(bart)
    one, two = (bart(input_ids=ids, decoder_input_ids=ids).last_hidden_state for _ in range(2))
    assert torch.equal(one, two)


def test_check_packing_is_not_vacuous_on_short_pairs(tokenizer):
    """Pairs of a few tokens each would sit alone in their rows; the probe sequences are built to share a row."""
    from types import SimpleNamespace

    short = [
        SimpleNamespace(
            chosen=SimpleNamespace(input_ids=[5, 6, 7], response_mask=[0, 1, 1]),
            rejected=SimpleNamespace(input_ids=[5, 6, 8], response_mask=[0, 1, 1]),
        )
    ] * 2
    with pytest.raises(PackingMismatchError):
        check_packing(
            RewardModel(_RowMixer(len(tokenizer)), 32), PairDataset(short, [1.0, 1.0]), tokenizer.pad_token_id
        )
    assert check_packing(RewardModel(_backbone("llama", len(tokenizer)), 32), PairDataset(short, [1.0, 1.0]), 0) < 1e-5


def test_bf16_reference_without_bf16_training_is_refused(tokenizer, tmp_path):
    model = RewardModel(_backbone("llama", len(tokenizer)), 32)
    with pytest.raises(ValueError, match="bfloat16 linear weights .* train with bf16"):
        _trainer(
            model,
            tmp_path,
            PairTrainingArguments(bf16=False),
            pair_objective(anchor_lambda=0.1, reference=make_reference(model.backbone, autocast_bf16=True)),
        )

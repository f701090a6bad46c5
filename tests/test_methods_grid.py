"""The experiment grid's configuration, anchored layers, and the LoRA reference (adapters disabled)."""

import copy
import dataclasses

import pytest
import torch
from conftest import pair_objective
from test_models import _dataset, tiny_llama

from w2s_shift.config import ConfigError, RunConfig
from w2s_shift.config_io import load_config, preset_names
from w2s_shift.losses import anchor_mse, anchor_mse_layers
from w2s_shift.models.reward_model import RewardModel, resolve_layer_spec, split_decoder
from w2s_shift.training import PairCollator, PairDataset, PairTrainer, PairTrainingArguments, make_reference


def test_grid_expands_lambdas_and_layer_specs_with_labels():
    c = RunConfig.model_validate(
        {
            "methods": [
                "naive",
                {"name": "anchor", "anchor_lambda": [0, 1e-4], "anchor_layers": ["last", "middle", [3, 4]]},
                "ceiling",
            ]
        }
    )
    ms = c.expanded_methods()
    assert [m.display for m in ms] == [
        "naive",
        "anchor-last-lam0",
        "anchor-last-lam1e-4",
        "anchor-middle-lam0",
        "anchor-middle-lam1e-4",
        "anchor-L3-4-lam0",
        "anchor-L3-4-lam1e-4",
        "ceiling",
    ]
    assert ms[4].anchor_layers == "middle" and ms[4].anchor_lambda == 1e-4
    assert ms[5].anchor_layers == [3, 4]
    # a plain list of ints is ONE explicit layer set, not a grid
    one = RunConfig.model_validate({"methods": [{"name": "anchor", "anchor_layers": [3, 4]}]}).expanded_methods()
    assert [m.display for m in one] == ["anchor"] and one[0].anchor_layers == [3, 4]


def test_seed_and_source_aliases_and_ood_per_source():
    c = RunConfig.model_validate({"seed": 3, "data": {"source": "ultrafeedback", "ood": ["ultrafeedback", "pandalm"]}})
    assert c.seeds == [3] and [s.display for s in c.data.sources] == ["ultrafeedback"]
    assert [o.display for o in c.data.ood_for(c.data.sources[0])] == ["pandalm"]
    g = RunConfig.model_validate(
        {
            "seeds": [0, 1],
            "data": {"sources": ["ultrafeedback", "pandalm"], "ood": ["ultrafeedback", "pandalm", "hh-helpful-base"]},
        }
    )
    assert [o.display for o in g.data.ood_for(g.data.sources[1])] == ["ultrafeedback", "hh-helpful-base"]


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"seeds": [1, 1]}, "distinct"),
        ({"seed": 1, "seeds": [2]}, "not both"),
        ({"data": {"source": "pandalm", "ood": ["pandalm"]}}, "no OOD target other than itself"),
        ({"methods": [{"name": "anchor", "reference": "adapter_disabled"}]}, "needs a LoRA student"),
        ({"methods": [{"name": "anchor", "anchor_lambda": [1e-4, -1]}]}, "finite and >= 0"),
        ({"methods": [{"name": "anchor", "anchor_layers": [0, 2]}]}, "1-based"),
        ({"methods": ["ceiling", {"name": "ceiling", "label": "c2"}]}, "at most one ceiling"),
        ({"export": ["nope"]}, "unknown students"),
    ],
)
def test_grid_config_errors(bad, msg, tmp_path):
    import yaml

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=msg):
        load_config(str(f))


def test_every_preset_validates_offline():
    names = preset_names()
    assert {
        "quickstart",
        "ablation-lambda",
        "ablation-layers",
        "paper-helpful-llama",
        "paper-helpful-qwen",
        "paper-harmless-llama",
        "paper-harmless-qwen",
        "evidence-helpful",
        "evidence-w2s",
    } <= set(names)
    lam = load_config("ablation-lambda")
    anchors = [m for m in lam.expanded_methods() if m.name == "anchor"]
    assert [m.anchor_lambda for m in anchors] == [0, 0.01, 0.1, 1.0, 10.0, 100.0]
    assert all(m.anchor_normalize for m in anchors)  # the relative error: lambda spans inert to over-constrained
    lay = load_config("ablation-layers")
    assert [m.anchor_layers for m in lay.expanded_methods() if m.name == "anchor"] == ["last", "middle"]
    paper = load_config("paper-helpful-llama")
    assert len(paper.data.sources) == 3 and paper.seeds == [0, 1, 2]
    assert {m.name for m in paper.expanded_methods()} == {
        "naive",
        "confidence",
        "seam",
        "anchor",
        "ceiling",
        "zero_shot",
    }
    assert all(not m.anchor_normalize for m in paper.expanded_methods() if m.name == "anchor")  # the paper's raw MSE
    # downstream: the quickstart's grid to the field, best-of-n on
    down, quick = load_config("downstream"), load_config("quickstart")
    assert down.bon.enabled and (down.bon.n_prompts, down.bon.n_samples, down.bon.max_new_tokens) == (12, 16, 128)
    assert down.digest() == quick.digest() and down.output_dir != quick.output_dir
    ev = load_config("evidence-helpful")
    assert len(ev.seeds) >= 3 and len(ev.data.ood) >= 2
    competitors = {"l2sp", "wise_ft", "grm"}  # ANCHOR's, one declared setting each
    assert {m.name for m in ev.expanded_methods()} == {
        "naive",
        "confidence",
        "seam",
        "anchor",
        "ceiling",
        "zero_shot",
    } | competitors
    for preset in ("evidence-helpful", "evidence-full", "evidence-deep", "ablation-lambda", "ablation-layers"):
        got = [m for m in load_config(preset).expanded_methods() if m.name in competitors]
        assert sorted(m.display for m in got) == ["grm", "l2sp", "wise_ft-a0.5"], preset
    assert sorted(
        (str(m.anchor_lambda), str(m.anchor_layers)) for m in ev.expanded_methods() if m.name == "anchor"
    ) == [("1.0", "[29]"), ("1.0", "last"), ("auto", "[29]"), ("auto", "last")]


def test_layer_specs():
    assert resolve_layer_spec("last", 30) == [30]
    assert resolve_layer_spec("middle", 30) == [15, 23]  # 50% and 75% of depth, rounded half up
    assert resolve_layer_spec("middle", 4) == [2, 3]
    assert resolve_layer_spec([5, 2, 5], 8) == [2, 5]
    with pytest.raises(ValueError, match="outside 1..8"):
        resolve_layer_spec([9], 8)


def _llama(layers=4, seed=0):
    return tiny_llama(64, seed, layers).eval()


def test_split_head_returns_global_blocks_and_refuses_frozen_ones():
    bb = _llama(4)
    ids = torch.randint(0, 64, (3, 7))
    am = torch.ones_like(ids)
    am[1, 5:] = 0
    full = bb(input_ids=ids, attention_mask=am, output_hidden_states=True).hidden_states
    trunk, head = split_decoder(bb, 2)
    states = trunk(input_ids=ids, attention_mask=am).last_hidden_state
    rm = RewardModel(head, 32, layer_offset=2)
    _, hs = rm(attention_mask=am, inputs_embeds=states, output_layers=[3, 4])
    torch.testing.assert_close(hs[0], full[3], atol=1e-5, rtol=1e-5)  # block 3's output (pre-norm)
    torch.testing.assert_close(hs[1], full[4], atol=1e-5, rtol=1e-5)  # the last: normalized, what the head reads
    with pytest.raises(ValueError, match="layer 2 is not a trainable block"):
        rm(attention_mask=am, inputs_embeds=states, output_layers=[2])


def test_anchor_over_layers_is_the_mean_of_per_layer_errors():
    torch.manual_seed(0)
    h = [torch.randn(2, 3, 4) for _ in range(2)]
    r = [torch.randn(2, 3, 4) for _ in range(2)]
    m = torch.tensor([[0, 1, 1], [1, 0, 0]])
    want = 0.5 * (anchor_mse(h[0], r[0], m) + anchor_mse(h[1], r[1], m))
    assert anchor_mse_layers(h, r, m).item() == pytest.approx(want.item())
    # hand check of one layer: mean over hidden units of the 3 masked tokens
    hand = sum(((h[0][n, t] - r[0][n, t]) ** 2).mean() for n, t in [(0, 1), (0, 2), (1, 0)]) / 3
    assert anchor_mse(h[0], r[0], m).item() == pytest.approx(hand.item(), rel=1e-6)


def _trainer(model, ds, pad_id, cfg, tmp_path, objective):
    return PairTrainer(
        model=model,
        args=dataclasses.replace(cfg, output_dir=str(tmp_path)),
        train_dataset=ds,
        data_collator=PairCollator(pad_id),
        objective=objective,
    )


def test_cached_multi_layer_reference_equals_a_frozen_copy(tokenizer, tmp_path):
    """Middle-layer ANCHOR: reference states cached once (response tokens only) give the loss of a frozen copy."""
    from w2s_shift.inference import compute_reference_states
    from w2s_shift.pipeline.featurizer import pairs_of, seqs_of

    bb = tiny_llama(len(tokenizer), layers=4)
    enc = _dataset(tokenizer, 4)
    model = RewardModel(copy.deepcopy(bb), 32)
    with torch.no_grad():  # the student has moved away from the reference
        for p in model.backbone.layers[2].parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = PairTrainingArguments(batch_size=4)
    anchor = dict(anchor_lambda=0.5, anchor_layers=[2, 4])
    seqs, masks = seqs_of(enc)
    ref_states = pairs_of(
        compute_reference_states(bb, seqs, masks, tokenizer.pad_token_id, dtype=torch.float32, layers=[2, 4])
    )
    cached = PairDataset(enc, [0.7] * 4, None, ref_states)
    live = PairDataset(enc, [0.7] * 4)
    coll = PairCollator(tokenizer.pad_token_id)
    t_cached = _trainer(model, cached, tokenizer.pad_token_id, cfg, tmp_path / "a", pair_objective(**anchor))
    t_live = _trainer(
        model, live, tokenizer.pad_token_id, cfg, tmp_path / "b", pair_objective(**anchor, reference=make_reference(bb))
    )
    l_cached = t_cached.compute_loss(model, coll(list(cached)))
    l_live = t_live.compute_loss(model, coll(list(live)))
    assert l_cached.item() == pytest.approx(l_live.item(), rel=1e-5)
    assert t_live._parts["loss_anchor"][0].item() > 0


def test_adapter_disabled_reference_equals_a_frozen_copy(tokenizer, tmp_path):
    """Under LoRA, the same model with its adapters disabled is the pretrained reference: same loss, no copy."""
    from peft import LoraConfig, get_peft_model

    bb = tiny_llama(len(tokenizer))
    frozen = make_reference(bb)
    model = RewardModel(copy.deepcopy(bb), 32)
    model.backbone = get_peft_model(model.backbone, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # trained adapters: lora_B is no longer zero
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn_like(p))
    enc = _dataset(tokenizer, 4)
    ds = PairDataset(enc, [0.9, 0.2, 0.6, 0.5])
    batch = PairCollator(tokenizer.pad_token_id)(list(ds))
    for layers in (None, [1, 2]):
        cfg = PairTrainingArguments(batch_size=4)
        anchor = dict(anchor_lambda=1.0, anchor_layers=layers)
        a = _trainer(
            model,
            ds,
            tokenizer.pad_token_id,
            cfg,
            tmp_path / "a",
            pair_objective(**anchor, reference_mode="adapter_disabled"),
        )
        b = _trainer(model, ds, tokenizer.pad_token_id, cfg, tmp_path / "b", pair_objective(**anchor, reference=frozen))
        la, lb = a.compute_loss(model, batch), b.compute_loss(model, batch)
        assert la.item() == pytest.approx(lb.item(), rel=1e-6)
        assert a._parts["loss_anchor"][0].item() == pytest.approx(b._parts["loss_anchor"][0].item(), rel=1e-6)
        assert a._parts["loss_anchor"][0].item() > 1e-6  # the adapters do move the states
    # the adapters are back on after the reference pass
    with torch.no_grad():
        on = model.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        off = frozen(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    assert not torch.allclose(on, off)


def test_evidence_deep_trains_half_the_blocks_and_anchors_where_they_train():
    cfg = load_config("evidence-deep")
    assert cfg.student.trainable_layers == 16 and len(cfg.seeds) >= 2 and cfg.data.n_student_train >= 250
    ms = cfg.expanded_methods()
    core = {m.display: m for m in ms if m.seeds is None}
    assert set(core) == {"naive", "seam", "anchor-last", "anchor-middle", "ceiling", "zero_shot"} | {
        "l2sp",
        "wise_ft-a0.5",
        "grm",
    }
    # the paper's middle (50% and 75% of 30 blocks: 15 and 23) lies inside the trained blocks 15..30
    assert [core[k].anchor_layers for k in ("anchor-last", "anchor-middle")] == ["last", "middle"]
    assert resolve_layer_spec("middle", 30) == [15, 23]
    sweep = [m for m in ms if m.seeds == [0]]
    # claim (c)'s family is declared up front: lambda 0.1, 1 and 10 at the last layer
    assert sorted(str(m.anchor_lambda) for m in sweep) == ["0.1", "10.0", "auto"]
    assert {m.anchor_layers for m in sweep} == {"last"}
    assert {d.display for d in cfg.data.ood} == {"hh-helpful-online", "pandalm", "ultrafeedback", "hh-harmless-base"}

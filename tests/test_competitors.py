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
from w2s_shift.methods.grm import GRMTerm, chosen_logprob_sums
from w2s_shift.methods.l2sp import L2SPTerm
from w2s_shift.methods.wise_ft import interpolate
from w2s_shift.models.reward_model import RewardModel
from w2s_shift.training import PairCollator, PairTrainingArguments, make_reference, train_pairs


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


def _trained(tokenizer, tmp_path, name, objective=None) -> tuple:
    """(trained model, pretrained model, last-layer relative drift) of a tiny student trained 10 epochs at lr 1e-2
    (test_anchor's setting)."""
    base = RewardModel(tiny_llama(len(tokenizer)), 32)
    ds = _dataset(tokenizer)
    model = copy.deepcopy(base)
    train_pairs(
        model, ds, tokenizer.pad_token_id, PairTrainingArguments(**COMMON), str(tmp_path / name), objective=objective
    )
    return model, base, _drift(model, base, tokenizer)


def _drift(model, base, tokenizer) -> float:
    return _final_drift(model, make_reference(base.backbone), _dataset(tokenizer), tokenizer.pad_token_id)


def _trained_drift(tokenizer, tmp_path, name, objective=None) -> float:
    return _trained(tokenizer, tmp_path, name, objective)[2]


@pytest.fixture(scope="module")
def naive_run(tokenizer, tmp_path_factory):
    return _trained(tokenizer, tmp_path_factory.mktemp("naive"), "naive")


@pytest.fixture(scope="module")
def naive_drift(naive_run):
    return naive_run[2]


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
    assert float(half.detach()) == pytest.approx(0.5 * 14.25 * 0.5, rel=1e-6)


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


# ---- WiSE-FT ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def _rewards(model, tokenizer):
    b = PairCollator(tokenizer.pad_token_id)(list(_dataset(tokenizer)))
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])[0]


def test_wise_ft_ends_are_the_pretrained_and_the_student(tokenizer, naive_run):
    """a = 0: the pretrained backbone read by the student's head; a = 1: the student; between: the weights'
    interpolation (the head always the student's)."""
    student, base, _ = naive_run
    for a in (0.0, 1.0, 0.25):
        m = copy.deepcopy(student)
        interpolate(m, base, a)
        pretrained_with_head = copy.deepcopy(base)
        pretrained_with_head.score.load_state_dict(student.score.state_dict())
        if a == 0.0:
            assert torch.allclose(_rewards(m, tokenizer), _rewards(pretrained_with_head, tokenizer), atol=1e-6)
            assert not torch.allclose(_rewards(m, tokenizer), _rewards(student, tokenizer), atol=1e-3)
        elif a == 1.0:
            assert torch.equal(_rewards(m, tokenizer), _rewards(student, tokenizer))
        else:
            w, w0, w1 = (x.backbone.layers[1].mlp.down_proj.weight for x in (m, base, student))
            assert torch.allclose(w, 0.75 * w0 + 0.25 * w1, atol=1e-7)
        assert torch.equal(m.score.weight, student.score.weight)


def test_wise_ft_scales_lora_adapters(tokenizer):
    """Under LoRA, W_0 + B A becomes W_0 + a B A: the merged weights interpolate between the pretrained and the
    student's."""
    from peft import LoraConfig, get_peft_model

    def lora_model():
        torch.manual_seed(3)
        bb = get_peft_model(tiny_llama(len(tokenizer)), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
        return RewardModel(bb, 32)

    pre, student = lora_model(), lora_model()
    with torch.no_grad():
        for n, p in student.named_parameters():
            if "lora_B" in n:
                p.normal_()  # a trained adapter (B starts at 0)
    merged = {}
    for name, m in (("pre", pre), ("student", student)):
        merged[name] = copy.deepcopy(m.backbone).merge_and_unload().layers[0].self_attn.q_proj.weight
    interpolate(student, pre, 0.5)
    got = copy.deepcopy(student.backbone).merge_and_unload().layers[0].self_attn.q_proj.weight
    assert torch.allclose(got, 0.5 * merged["pre"] + 0.5 * merged["student"], atol=1e-6)


def test_wise_ft_settings_expand_to_one_model_per_alpha():
    m = method_entry({"name": "wise_ft"})
    runs = m.method.expand(m)
    assert [r.display for r in runs] == ["wise_ft-a0.25", "wise_ft-a0.5", "wise_ft-a0.75"]
    assert [r.wise_alpha for r in runs] == [0.25, 0.5, 0.75]
    trained = {r.method.trained_as(r).model_dump_json() for r in runs}
    assert len(trained) == 1  # one training for every a
    assert runs[0].method.trained_as(runs[0]).display == "wise_ft-finetuned"
    one = method_entry({"name": "wise_ft", "wise_alpha": 0.5, "label": "w"})
    assert one.method.expand(one) == [one] and one.display == "w"
    for bad in (-0.1, 1.5, "x", True, [0.5, 0.5], []):
        with pytest.raises(ValidationError, match="wise_alpha"):
            method_entry({"name": "wise_ft", "wise_alpha": bad})


def test_wise_ft_cuts_last_layer_drift(tokenizer, naive_run):
    """Drift falls as a does (measured: 0.16 at a = 0.1, 1.01 at a = 0.25, 1.85 for the student)."""
    student, base, naive = naive_run
    drifts = []
    for a in (0.1, 0.25):
        m = copy.deepcopy(student)
        interpolate(m, base, a)
        drifts.append(_drift(m, base, tokenizer))
    assert drifts[0] < drifts[1] < naive and drifts[0] < 0.5 * naive, (drifts, naive)


# ---- GRM's SFT regularizer -------------------------------------------------------------------------------------


def _tiny_lm(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def _chosen_token_logprobs(lm, batch, n_pairs) -> torch.Tensor:
    """s_i by the causal LM itself: sum of log p(y_t) over chosen sequence i's response tokens."""
    logp = torch.log_softmax(lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, -1)
    s = torch.zeros(n_pairs)
    for i in range(n_pairs):
        for t in range(1, batch["input_ids"].shape[1]):
            if batch["response_mask"][i, t] and batch["attention_mask"][i, t]:
                s[i] += logp[i, t - 1, batch["input_ids"][i, t]]
    return s


def test_grm_sft_term_is_the_lm_token_loss_on_the_chosen_response(tokenizer):
    lm = _tiny_lm(tokenizer)
    model = RewardModel(lm.model, 32)
    ds = _dataset(tokenizer, 6)
    b = PairCollator(tokenizer.pad_token_id)(list(ds))
    want = _chosen_token_logprobs(lm, b, 6)
    assert float(want.max()) < -10  # a real sum over several tokens
    fwd = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    _, hidden = model(**fwd)
    for form, per_pair in (("nll", -want), ("logsigmoid", -torch.nn.functional.logsigmoid(0.1 * want))):
        term = GRMTerm(0.5, lm.lm_head.weight, beta=0.1, form=form)
        term.bind(_ctx(model))
        value, parts = term.loss(_ctx(model), b, fwd, [hidden], None, 1.0, torch.tensor(1.0))
        assert float(value.detach()) == pytest.approx(0.5 * float(per_pair.mean()), rel=1e-5)
        assert float(parts["loss_sft"]) == pytest.approx(float(per_pair.mean()), rel=1e-5)
    # packed rows (padding-free) and cached trunk states (token_ids) give the same sums
    p = PairCollator(tokenizer.pad_token_id, packing=True)(list(ds))
    _, hp = model(input_ids=p["input_ids"], position_ids=p["position_ids"], last_index=p["last_index"])
    s, _ = chosen_logprob_sums(hp, p, lm.lm_head.weight, 6)
    assert torch.allclose(s, want, atol=1e-4)
    cached = {**{k: v for k, v in b.items() if k != "input_ids"}, "token_ids": b["input_ids"]}
    s, _ = chosen_logprob_sums(hidden, cached, lm.lm_head.weight, 6)
    assert torch.allclose(s, want, atol=1e-4)


def test_grm_settings_typed_and_validated():
    m = method_entry({"name": "grm"})
    assert (m.grm_lambda, m.grm_beta, m.grm_form) == (0.01, 0.1, "logsigmoid")
    assert m.method.needs_lm_head and m.method.objective_lm_head
    with pytest.raises(ValueError, match="lm_head"):
        m.method.objective(m)
    for field, bad in (("grm_lambda", 0), ("grm_lambda", True), ("grm_beta", -1), ("grm_form", "dpo")):
        with pytest.raises(ValidationError, match=field):
            method_entry({"name": "grm", field: bad})


def _pretrained_lm(tokenizer):
    """A tiny causal LM that has learned the toy pairs' text (200 Adam steps on every sequence): its head predicts
    the responses, as a real pretrained model's does (a random head would make the SFT term a new task)."""
    lm = _tiny_lm(tokenizer)
    b = PairCollator(tokenizer.pad_token_id)(list(_dataset(tokenizer)))
    labels = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        lm(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss.backward()
        opt.step()
    return lm


def test_grm_cuts_last_layer_drift(tokenizer, tmp_path):
    """From a model that has learned the text, lambda 5 on the chosen responses' token loss keeps the last layer near
    the pretrained one."""
    lm = _pretrained_lm(tokenizer)
    drifts = []
    for name, reg in (("naive", None), ("grm", GRMTerm(5.0, lm.lm_head.weight, form="nll"))):
        base = RewardModel(copy.deepcopy(lm.model), 32)
        model, ds = copy.deepcopy(base), _dataset(tokenizer)
        args = PairTrainingArguments(**COMMON)
        obj = Objective(LOSSES["soft_bt"], regularizer=reg)
        train_pairs(model, ds, tokenizer.pad_token_id, args, str(tmp_path / name), objective=obj)
        drifts.append(_drift(model, base, tokenizer))
    assert drifts[1] < 0.5 * drifts[0], drifts  # measured: 0.60 vs 1.64


# ---- the report's comparison ------------------------------------------------------------------------------------


def test_anchor_vs_competitors_by_hand():
    """ANCHOR minus a competitor on 4 ID and 4 OOD pairs, one seed: teacher 50 / 50, ANCHOR 75 / 75, competitor
    100 / 25 (pp). NTS = AOG mean - max(0, teacher ID - student ID): ANCHOR 25, competitor -25, difference 50; AOG mean
    difference 50; WRG difference -25. A competitor identical to ANCHOR differs by exactly 0 in every replicate."""
    import numpy as np

    from w2s_shift.metrics.claims import anchor_vs

    c = {
        "teacher": {"id": [1, 1, 0, 0], "o": [1, 0, 1, 0]},
        "anchor": {"id": [1, 1, 1, 0], "o": [1, 1, 1, 0]},
        "l2sp": {"id": [1, 1, 1, 1], "o": [1, 0, 0, 0]},
        "grm": {"id": [1, 1, 1, 0], "o": [1, 1, 1, 0]},
    }
    cells = [
        {
            "id": "id",
            "ood": ["o"],
            "ids": {"id": list("abcd"), "o": list("efgh")},
            "correct": {m: {d: np.array(v, dtype=bool) for d, v in x.items()} for m, x in c.items()},
        }
    ]
    methods = [
        {"name": "anchor", "label": "anchor", "anchor_lambda": 1.0, "layer_spec": "last"},
        {"name": "l2sp", "label": "l2sp"},
        {"name": "grm", "label": "grm"},
    ]
    res = anchor_vs(cells, methods, methods[1:], n_boot=200)
    assert res["anchor"]["label"] == "anchor"
    l2sp, grm = (r["stats"] for r in res["rows"])
    assert (l2sp["NTS"]["value"], l2sp["AOG_mean"]["value"], l2sp["WRG"]["value"]) == (50.0, 50.0, -25.0)
    lo, hi = l2sp["NTS"]["ci"]
    assert lo <= 50.0 <= hi and l2sp["NTS"]["n_seeds"] == 1
    for k in ("NTS", "AOG_mean", "WRG"):
        assert grm[k]["value"] == 0.0 and tuple(grm[k]["ci"]) == (0.0, 0.0)  # paired: the same resampled pairs
    assert anchor_vs(cells, methods[1:], methods[1:]) is None  # no ANCHOR entry


def test_l2sp_refuses_sharded_parameters(tokenizer, monkeypatch):
    import w2s_shift.distributed as dist

    model = RewardModel(tiny_llama(len(tokenizer)), 32)
    term = L2SPTerm(1.0)
    term.bind(_ctx(model))
    monkeypatch.setattr(dist, "is_sharded_model", lambda m: True)
    with pytest.raises(ValueError, match="FSDP2 / ZeRO-3"):
        term.loss(_ctx(model), {"labels": torch.zeros(2)}, {}, [], None, 1.0, torch.tensor(1.0))


def test_a_label_may_not_take_wise_ft_trainings_name(tiny_model_dirs, tmp_path):
    from conftest import tiny_grid_dict

    from w2s_shift.config import RunConfig

    methods = ["wise_ft", {"name": "naive", "label": "wise_ft-finetuned"}]
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path, ["pandalm"], methods)
    with pytest.raises(ValueError, match="shared training"):
        RunConfig.model_validate(d)

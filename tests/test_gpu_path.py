"""The GPU path, proven on the CPU: every pretrained pass and scoring on the run's device (the ``meta`` device stands
in for a GPU: a forward there computes shapes only, and any copy to the host fails), a training step with no host
synchronisation, checkpoints stored in bfloat16, float32 master weights, and ZeRO-3 state gathering."""

import sys
import types

import numpy as np
import pytest
import torch

from tests.conftest import tiny_grid_dict
from w2s_shift.config import RunConfig


class Reached(Exception):
    """Raised by the recording hook at the first forward: what ran where is recorded, nothing is computed."""


@pytest.fixture
def on_meta(monkeypatch):
    """Make the run's device ``meta`` and record the first module forward: (module class, devices of its
    parameters and of its tensor inputs); that forward raises :class:`Reached`."""
    import w2s_shift.device as device

    seen: list = []

    def hook(module, args, kwargs):
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        seen.append(
            (
                type(module).__name__,
                {p.device.type for p in module.parameters()},
                {t.device.type for t in tensors},
            )
        )
        raise Reached

    monkeypatch.setattr(device, "select_device", lambda setting="auto": "meta")

    class Recorder:  # patches nn.Module.__call__ (every forward, positional or keyword inputs) while entered
        def __enter__(self):
            seen.clear()
            self.call = torch.nn.Module.__call__
            torch.nn.Module.__call__ = lambda m, *a, **k: hook(m, a, k)
            return seen

        def __exit__(self, *exc):
            torch.nn.Module.__call__ = self.call
            return exc[0] is Reached

    return Recorder


def _only_meta(seen: list, what: str) -> None:
    assert seen, f"{what}: no forward ran"
    name, params, inputs = seen[0]
    assert params == {"meta"}, f"{what}: {name} has parameters on {params}"
    assert inputs <= {"meta"}, f"{what}: {name} got inputs on {inputs}"


def _ctx(tiny_model_dirs, lm_student_dir, tmp_path, **student):
    from w2s_shift.pipeline import SourceContext

    d = tiny_grid_dict(
        tiny_model_dirs["teacher"],
        lm_student_dir,
        tmp_path / "run",
        ["pandalm"],
        ["naive", {"name": "anchor", "anchor_lambda": 1.0}, "seam", "zero_shot"],
    )
    d["student"].update(student)
    cfg = RunConfig(**d)
    return SourceContext(cfg, cfg.data.sources[0], tmp_path / "run")


@pytest.mark.parametrize("split", [True, False])
def test_every_pretrained_pass_and_scoring_runs_on_the_run_device(
    tiny_model_dirs, lm_student_dir, tmp_path, on_meta, split
):
    """Reference states, drift references, zero-shot rewards, SEAM's questions and scoring of a model loaded on the
    host all receive modules and inputs on the run's device (before: the pretrained base stayed on the host)."""
    import w2s_shift.device as device
    from w2s_shift.pipeline.score_stage import score_set, zero_shot_rewards
    from w2s_shift.pipeline.stages import cell_labels

    ctx = _ctx(tiny_model_dirs, lm_student_dir, tmp_path, **({} if split else {"trainable_layers": None}))
    real = device.select_device
    device.select_device = lambda setting="auto": "cpu"  # features (host-side trunk states) first, on the CPU
    try:
        sf, tf = ctx.student(), ctx.teacher()
        pairs, test = ctx.splits["student_train"], ctx.eval_sets["pandalm"]
        sf.features("student_train", pairs), sf.features("pandalm", test)
        model, teacher = sf.new_model(0), tf.new_model(0)
    finally:
        device.select_device = real
    assert sf.split_mode is split
    calls = {
        "reference states": lambda: sf.dataset("student_train", pairs, [0.5] * len(pairs), with_reference=True),
        "drift reference": lambda: sf.drift_probe("pandalm", test, 4, [sf.n_layers]),
        "zero-shot": lambda: zero_shot_rewards(sf, "pandalm", test),
        "scoring": lambda: score_set(sf, model, "pandalm", test, "naive"),
        "SEAM": lambda: cell_labels(ctx, tmp_path, 0, ctx.cfg.methods[2], teacher),
    }
    for what, call in calls.items():
        with on_meta() as seen:
            call()
        _only_meta(seen, what)
    assert all(p.device.type == "cpu" for p in sf.base.parameters())  # the float32 source of students stays


class ToyBackbone(torch.nn.Module):
    """A decoder-shaped backbone with no attention mask to build: embeddings, then ``n`` tanh(linear) blocks;
    returns ``last_hidden_state`` and, when asked, ``hidden_states`` (the embeddings, then each block), as
    transformers does. transformers' own mask construction inspects the mask on the host (a sync inside the
    library, outside this project's per-step code), so the step test runs on this stand-in."""

    def __init__(self, vocab: int = 32, hidden: int = 8, n: int = 3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(n))

    def forward(self, input_ids=None, inputs_embeds=None, output_hidden_states=False, **kwargs):
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        hs = [h]
        for layer in self.layers:
            h = torch.tanh(layer(h))
            hs.append(h)
        return types.SimpleNamespace(last_hidden_state=h, hidden_states=tuple(hs) if output_hidden_states else None)


@pytest.mark.parametrize("packing", [True, False])
def test_a_training_step_stays_on_the_device_with_no_host_sync(tmp_path, packing):
    """PairTrainer.compute_loss (soft Bradley-Terry + ANCHOR on a frozen copy, fixed lambda and the drift budget,
    the last layer and a middle block) on a ``meta`` model and batch: any ``.item()``, ``float(tensor)`` or copy
    to the host in the step would raise on meta tensors."""
    from tests.conftest import pair_objective
    from w2s_shift.data.render import Encoded, EncodedPair
    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import PairCollator, PairDataset, PairTrainer, PairTrainingArguments, make_reference

    torch.manual_seed(0)
    model = RewardModel(ToyBackbone(), 8)
    enc = [
        EncodedPair(
            Encoded(list(range(3, 13 + i)), [0] * 4 + [1] * (6 + i), False),
            Encoded(list(range(5, 12 + i)), [0] * 4 + [1] * (3 + i), False),
        )
        for i in range(4)
    ]
    ds = PairDataset(enc, [0.2, 0.7, 0.9, 0.4])
    args = PairTrainingArguments(output_dir=str(tmp_path), batch_size=4, packing=packing, report_to=[])
    batch = PairCollator(0, packing=packing)([ds[i] for i in range(4)])
    inputs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    for auto, layers in ((False, None), (True, [2])):
        obj = pair_objective(
            anchor_lambda=1.0, anchor_lambda_auto=auto, anchor_layers=layers, reference=make_reference(model.backbone)
        )
        trainer = PairTrainer(model=model, args=args, train_dataset=ds, data_collator=PairCollator(0), objective=obj)
        obj.regularizer.reference = obj.regularizer.reference.to("meta")
        meta = RewardModel(ToyBackbone(), 8).to("meta")
        loss = trainer.compute_loss(meta, inputs, num_items_in_batch=torch.tensor(4.0, device="meta"))
        assert loss.device.type == "meta" and loss.shape == ()
        assert {"loss_w2s", "loss_anchor", "anchor_drift", "anchor_lambda"} <= set(trainer._parts)
        assert all(v.device.type == "meta" for vs in trainer._parts.values() for v in vs)
        assert trainer._pending  # the finiteness check waits for the next log or checkpoint (on the host: every step)


def _bf16_student(tmp_path, tokenizer) -> str:
    """A tiny Llama saved in bfloat16, as hub checkpoints are."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    m = LlamaModel(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).to(torch.bfloat16)
    d = tmp_path / "bf16-student"
    m.save_pretrained(d)
    tokenizer.save_pretrained(d)
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    return str(d)


@pytest.mark.parametrize("split,bf16", [(True, False), (True, True), (False, False), (False, True)])
def test_a_bf16_checkpoint_trains_and_scores(tiny_model_dirs, tokenizer, tmp_path, split, bf16):
    """Before: split mode fed float32 trunk states into bfloat16 blocks ("expected m1 and m2 to have the same
    dtype")."""
    from w2s_shift.pipeline import run

    student = _bf16_student(tmp_path, tokenizer)
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], student, tmp_path / "run", ["pandalm"], ["naive", {"name": "anchor"}]
    )
    d["student"].update(bf16=bf16, learning_rate=1e-3)
    if not split:
        del d["student"]["trainable_layers"]
    metrics = run(RunConfig(**d))
    assert metrics["cells"][0]["models"] == ["teacher", "naive", "anchor"]
    from w2s_shift.io import read_jsonl

    rows = read_jsonl(tmp_path / "run" / "ultrafeedback" / "seed0" / "rewards" / "anchor__pandalm.jsonl")
    assert len(rows) == 8 and all(np.isfinite(r["reward_chosen"]) for r in rows)


@pytest.mark.parametrize("pure_bf16", [False, True])
def test_float32_master_weights_move_at_a_small_learning_rate(tokenizer, tmp_path, pure_bf16):
    """One AdamW step at lr 1e-5 moves every weight by about 1e-5: float32 master weights (the default, whatever the
    checkpoint's dtype) take it; bfloat16 weights of |w| ~ 0.02 (resolution ~1e-4) round most of it away."""
    from w2s_shift.config import ModelConfig
    from w2s_shift.pipeline import Featurizer
    from w2s_shift.training import PairDataset, PairTrainingArguments, train_pairs

    mcfg = ModelConfig(name=_bf16_student(tmp_path, tokenizer), max_length=48, bf16=True, pure_bf16=pure_bf16)
    f = Featurizer(mcfg, "student")
    model = f.new_model(0)
    w = model.backbone.layers[1].mlp.up_proj.weight
    assert w.dtype == (torch.bfloat16 if pure_bf16 else torch.float32)
    before = w.detach().clone()
    pairs = [(list(range(3, 20)), list(range(3, 15)))] * 4
    from w2s_shift.data.render import Encoded, EncodedPair

    enc = [
        EncodedPair(Encoded(c, [0] * 3 + [1] * (len(c) - 3), False), Encoded(r, [0] * 3 + [1] * 9, False))
        for c, r in pairs
    ]
    args = PairTrainingArguments(
        output_dir=str(tmp_path / "t"), batch_size=4, learning_rate=1e-5, warmup_ratio=0.0, bf16=True, report_to=[]
    )
    train_pairs(model, PairDataset(enc, [0.9] * 4), f.pad_id, args)
    moved = float((w.detach() != before).float().mean())
    if pure_bf16:
        assert moved < 0.5  # the documented cost of pure bf16
    else:
        assert moved > 0.99


def test_zero3_partitions_are_gathered_before_saving(monkeypatch):
    """ZeRO-3 parameters (``ds_id``) are read inside ``deepspeed.zero.GatheredParameters`` (DeepSpeed is not
    installed here and its CPU path needs oneCCL: a stand-in module records the gathering)."""
    from w2s_shift.models.state import trainable_state

    gathered = []

    class Gathered:
        def __init__(self, params):
            self.params = list(params)

        def __enter__(self):
            gathered.append(len(self.params))
            for p in self.params:
                p.data = p.full.clone()

        def __exit__(self, *exc):
            for p in self.params:
                p.data = torch.empty(0)

    zero = types.SimpleNamespace(GatheredParameters=Gathered)
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(zero=zero))
    m = torch.nn.Module()
    m.score = torch.nn.Linear(3, 1, bias=False)
    m.block = torch.nn.Linear(3, 3)
    for p in m.parameters():
        p.full, p.ds_id = p.detach().clone(), 1
        p.data = torch.empty(0)  # a partition: this process holds nothing of it
    state = trainable_state(m)
    assert gathered == [3] and state["score.weight"].shape == (1, 3) and state["block.weight"].shape == (3, 3)
    assert torch.equal(state["block.bias"], m.block.bias.full)


def _step(model, ids):
    """One forward (rewards and blocks 4 and 8, as ANCHOR reads them) and backward; returns (loss, gradients,
    bytes of the tensors autograd saved for the backward pass)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        r, hs = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_layers=[4, 8])
        loss = r.sum() + sum(h.pow(2).mean() for h in hs)
    loss.backward()
    return (
        float(loss.detach()),
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        saved[0],
    )


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients_with_less_saved(lora):
    """A deep tiny Llama (8 blocks): gradient checkpointing gives the same loss and gradients (ANCHOR's hidden
    states included) and keeps under a fifth of the activations for the backward pass (the CPU's measure of the
    activation peak: bytes autograd saved; a GPU's allocator peak follows them)."""
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaModel

    from w2s_shift.models.reward_model import RewardModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    bb, ids = LlamaModel(cfg), torch.randint(0, 64, (4, 64))
    runs = []
    for ckpt in (False, True):
        torch.manual_seed(1)
        m = RewardModel(copy.deepcopy(bb), 64)
        if ckpt:
            m.activation_checkpointing_enable()
        if lora:
            m.backbone = get_peft_model(m.backbone, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
            torch.nn.init.normal_(m.backbone.base_model.model.layers[3].self_attn.q_proj.lora_B.default.weight)
        runs.append(_step(m, ids))
    (l0, g0, s0), (l1, g1, s1) = runs
    assert l0 == pytest.approx(l1, abs=1e-6) and sorted(g0) == sorted(g1) and len(g0) > 4
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6)
    assert s1 < s0 / 5


def test_gradient_checkpointing_in_a_grid_changes_no_result(tiny_model_dirs, tmp_path):
    """``gradient_checkpointing: true`` on teacher and student (middle-layer ANCHOR, whole network): the rewards of
    every model equal the run without it (recomputation repeats the same float32 operations)."""
    from w2s_shift.io import read_jsonl
    from w2s_shift.pipeline import run

    out = {}
    for ckpt in (False, True):
        d = tiny_grid_dict(
            tiny_model_dirs["teacher"],
            tiny_model_dirs["student"],
            tmp_path / f"run{ckpt}",
            ["pandalm"],
            ["naive", {"name": "anchor", "anchor_lambda": 1.0, "anchor_layers": [2, 3], "reference": "frozen_copy"}],
        )
        del d["student"]["trainable_layers"]
        d["student"].update(gradient_checkpointing=ckpt, learning_rate=3e-3)
        d["teacher"].update(gradient_checkpointing=ckpt)
        run(RunConfig(**d))
        cell = tmp_path / f"run{ckpt}" / "ultrafeedback" / "seed0" / "rewards"
        out[ckpt] = {f.name: [r["reward_chosen"] for r in read_jsonl(f)] for f in sorted(cell.glob("*.jsonl"))}
    assert sorted(out[True]) == sorted(out[False]) and len(out[True]) == 7
    for k in out[False]:
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("trainable_layers", [None, 2])
def test_the_config_turns_gradient_checkpointing_on_for_each_new_model(tiny_model_dirs, trainable_layers):
    from w2s_shift.config import ModelConfig
    from w2s_shift.pipeline import Featurizer

    for on in (False, True):
        mcfg = ModelConfig(
            name=tiny_model_dirs["student"], trainable_layers=trainable_layers, gradient_checkpointing=on, bf16=False
        )
        model = Featurizer(mcfg, "student").new_model(0)
        flags = [getattr(b, "gradient_checkpointing", None) for b in model.backbone.layers]
        assert flags == [on] * (trainable_layers or 4)


def test_caches_that_do_not_fit_the_host_stop_the_run_before_computing(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """Exit 2 with the numbers and the alternatives, before any state is computed (a 1 KiB host here)."""
    import yaml

    import w2s_shift.pipeline.featurizer as fz
    from w2s_shift.cli import main

    monkeypatch.setattr(fz, "available_host_bytes", lambda: 1024)
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "run", ["pandalm"], ["naive", "anchor"]
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    assert main(["run", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "student" in err and "trunk" in err and "GiB of host memory, but this process can take 0.0 GiB" in err
    assert "reference: frozen_copy" in err and "adapter_disabled" in err and "w2s-shift plan" in err


def test_reference_caches_of_earlier_students_are_freed_when_the_next_would_not_fit(
    tiny_model_dirs, tmp_path, monkeypatch
):
    """A host with room for the trunk states and one reference cache: the second anchored layer set evicts the first
    (whose states were cached for the earlier student) instead of stopping; with room for both, both stay."""
    import w2s_shift.pipeline.featurizer as fz
    from w2s_shift.config import ModelConfig

    f = fz.Featurizer(ModelConfig(name=tiny_model_dirs["student"], trainable_layers=2, bf16=False), "student")
    from w2s_shift.data.schema import PreferencePair

    pairs = [PreferencePair(f"question {i}?", f"yes {i} " * 5, f"no {i}", "t", str(i)) for i in range(12)]
    f.features("student_train", pairs)
    trunk = f.cached_bytes()

    def two_layer_sets() -> list:
        f._ref.clear()
        for layer in (4, 3):
            f.dataset("student_train", pairs, [0.5] * 12, reference_layers=[layer], with_reference=True)
        return list(f._ref)

    assert len(two_layer_sets()) == 2  # room for both
    one = (f.cached_bytes() - trunk) / 2
    room = int(trunk + 1.5 * one / fz.HOST_SHARE)  # beside the trunk states, room for 1.5 reference caches
    monkeypatch.setattr(fz, "available_host_bytes", lambda: room - f.cached_bytes())
    assert two_layer_sets() == [("student_train", (3,))]


# every function a training step runs (the trainer, the losses, the regularizers' hooks) and what may not appear in
# them: each reads a device value on the host, or copies host data to the device and waits for the device's queue
STEP_CODE = {
    "w2s_shift/training/trainer.py": ["PairTrainer.compute_loss", "PairTrainer.get_batch_samples"],
    "w2s_shift/methods/anchor_term.py": [
        "AnchorLambda.value",
        "AnchorTerm.prepare_step",
        "AnchorTerm._step_reference_sums",
        "AnchorTerm._cached_reference",
        "AnchorTerm.reference_hidden",
        "AnchorTerm.loss",
        "response_mask",
    ],
    "w2s_shift/methods/l2sp.py": ["L2SPTerm.loss", "L2SPTerm.squared_distance"],
    "w2s_shift/methods/grm.py": ["GRMTerm.loss", "chosen_logprob_sums", "chosen_sequence_index"],
    "w2s_shift/losses.py": [
        "soft_bradley_terry",
        "anchor_mse",
        "anchor_relative",
        "anchor_sq_sums",
        "anchor_mse_layers",
        "anchor_lambda_units",
        "adaptive_anchor_lambda",
        "confidence_targets",
        "confidence_loss",
        "pairwise_margin",
    ],
}
HOST_READS = {"item", "tolist", "cpu", "numpy", "new_tensor"}


def _step_functions():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for file, names in STEP_CODE.items():
        tree = ast.parse((root / file).read_text())
        found = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found[node.name] = node
            elif isinstance(node, ast.ClassDef):
                found.update({f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
        for name in names:
            assert name in found, f"{file}: {name} not found (renamed? update STEP_CODE)"
            yield file, name, found[name]


def test_the_training_step_reads_nothing_back_from_the_device():
    """A static guard over the step's code: no .item(), .tolist(), .cpu(), .numpy(), torch.equal or new_tensor (each
    waits for the device), and torch.tensor only without a device (built on the host; copied with non_blocking). The
    meta-device test above catches float(tensor) and bool(tensor) on the paths it runs; this one covers every
    method's hooks, the accumulation path included. Before: torch.equal on pair indices per micro-batch,
    float(num_items_in_batch) in L2-SP and GRM, .tolist() and int() of indices in GRM's packed path, the pair count
    and the anchor lambda built with torch.tensor(..., device=...)."""
    import ast

    bad = []
    for file, name, fn in _step_functions():
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            attr = f.attr if isinstance(f, ast.Attribute) else None
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            if attr in HOST_READS or (owner == "torch" and attr == "equal"):
                bad.append(f"{file}:{node.lineno} {name}: .{attr}()")
            if owner == "torch" and attr == "tensor" and any(k.arg == "device" for k in node.keywords):
                bad.append(f"{file}:{node.lineno} {name}: torch.tensor(..., device=...)")
            if attr == "to" and not any(k.arg == "non_blocking" for k in node.keywords):
                src = ast.unparse(node.func.value)
                if src.startswith(("torch.tensor(", "orientation(")) or "batch_samples" in src:
                    bad.append(f"{file}:{node.lineno} {name}: a host tensor copied to the device without non_blocking")
    assert not bad, "\n".join(bad)

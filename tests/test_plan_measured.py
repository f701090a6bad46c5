"""``w2s-shift plan``'s formulas against what tiny runs spend, each by the formula the planner uses on the tiny model's
own shape (plan.shape_from_config_json): the bytes of a Trainer checkpoint on disk (only what trains: the top blocks
or the LoRA adapters, and the head) and how many are written, the activations a training forward saves for backward
(saved-tensor hooks), the reference states a frozen copy keeps for ANCHOR at the paper's middle layers, and the host
memory a student and its frozen copy take while they are built. Each within 25% (the criterion the planner is held to).
"""

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaModel, TrainerCallback

from w2s_shift.data.render import Encoded, EncodedPair
from w2s_shift.models.reward_model import RewardModel
from w2s_shift.plan import Plan, disk_bytes, estimate, host_bytes, shape_from_config_json
from w2s_shift.plan.costs import GIB
from w2s_shift.training import PairDataset, PairTrainingArguments, train_pairs
from w2s_shift.training.loop import make_reference

H, INTER, L = 128, 256, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=400,
        hidden_size=H,
        intermediate_size=INTER,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    d = tmp_path_factory.mktemp("plan-model")
    LlamaModel(cfg).save_pretrained(d)
    return d


def _pairs(n: int, seed: int = 0) -> PairDataset:
    g = torch.Generator().manual_seed(seed)
    enc = []
    for _ in range(n):
        a, b = (torch.randint(3, 400, (12,), generator=g).tolist() for _ in range(2))
        enc.append(EncodedPair(Encoded(a, [0] * 4 + [1] * 8, False), Encoded(b, [0] * 4 + [1] * 8, False)))
    return PairDataset(enc, [0.7] * n)


class _Saves(TrainerCallback):
    def __init__(self):
        self.n = 0

    def on_save(self, args, state, control, **kwargs):
        self.n += 1


def _folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _student(model_dir, lora: bool) -> RewardModel:
    from w2s_shift.models.students import freeze_backbone

    torch.manual_seed(0)
    model = RewardModel(LlamaModel.from_pretrained(model_dir), H)
    if lora:
        from peft import LoraConfig, get_peft_model

        model.backbone = get_peft_model(model.backbone, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj"]))
    else:
        freeze_backbone(model, 2, freeze_embeddings=True)
    return model


@pytest.mark.parametrize("lora", [False, True], ids=["top-2-blocks", "lora"])
def test_checkpoint_bytes_and_count_are_the_plans(model_dir, tmp_path, lora):
    """A checkpoint holds the trainable weights and their AdamW moments, 12 B per trainable parameter (mixed
    precision); the whole model was saved before (the plan said 0.08 GiB for an 8B LoRA checkpoint that took ~30 GB).
    16 pairs, batch 4: 4 steps, a checkpoint every 0.25 of them: 4 written."""
    model = _student(model_dir, lora)
    args = PairTrainingArguments(
        output_dir=str(tmp_path),
        batch_size=4,
        checkpoint_fraction=0.25,
        report_to=[],
        save_total_limit=1,
        learning_rate=1e-3,
    )
    saves = _Saves()
    train_pairs(model, _pairs(16), 0, args, callbacks=[saves])
    folders = [f for f in os.listdir(tmp_path) if f.startswith("checkpoint-")]
    assert len(folders) == 1
    measured = _folder_bytes(tmp_path / folders[0])
    shape = shape_from_config_json(model_dir)
    kw = (
        {"finetune": "lora", "lora_rank": 16, "lora_targets": ["q_proj"]}
        if lora
        else {"trainable_layers": 2, "trunk_cache": False}
    )
    plan = Plan(shape, method="naive", backend="ddp", **kw)
    planned = disk_bytes(plan)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert estimate(plan, 1)["trainable_params"] == n_train  # the same count, so the bytes test the formula
    assert 0.75 <= measured / planned["checkpoint"] <= 1.25, (measured, planned["checkpoint"])
    assert saves.n == 4 and planned["checkpoints_written"] == 4 * planned["checkpoint"]


def test_saved_activations_are_the_plans(model_dir):
    """Bytes a training forward of the whole network saves for backward under bf16 autocast (saved-tensor hooks;
    parameters and their bfloat16 casts excluded, which the plan counts as weights) against the plan's activations
    term (every block plus one for the embedding, final norm and head): 8 sequences of 64 tokens."""
    model = RewardModel(LlamaModel.from_pretrained(model_dir), H)
    ids = torch.randint(3, 400, (8, 64))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        weight_cast = t.dtype == torch.bfloat16 and tuple(t.shape) in shapes
        if ptr not in params and not weight_cast:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(attention_mask=torch.ones_like(ids), input_ids=ids)
    measured = sum(seen.values())
    plan = Plan(shape_from_config_json(model_dir), method="naive", backend="ddp", seq_len=64, batch=4)
    planned = estimate(plan, 1)["activations"] * GIB
    assert 0.75 <= measured / planned <= 1.25, (measured, planned)


def test_a_frozen_copy_keeps_only_the_anchored_states(model_dir):
    """The reference forward of ANCHOR at the middle layers (blocks 2 and 3 of 4) holds two float32 states, as the
    plan counts; through output_hidden_states it held all five (the 8B case: 33 states, ~16 GiB)."""
    from w2s_shift.models.reward_model import layer_states

    ref = make_reference(LlamaModel.from_pretrained(model_dir), autocast_bf16=True)
    ids = torch.randint(3, 400, (8, 64))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, kept = layer_states(lambda hs: ref(input_ids=ids, output_hidden_states=hs), ref, [2, 3])
    measured = sum(t.numel() * t.element_size() for t in kept) + (0 if out.hidden_states is None else 1e12)
    plan = Plan(
        shape_from_config_json(model_dir), reference="frozen_copy", backend="ddp", seq_len=64, batch=4, anchor_layers=2
    )
    planned = 2 * 8 * 64 * H * 4  # the plan's reference-states term: anchor_layers x tokens x hidden x 4 B
    assert measured == planned
    base = Plan(shape_from_config_json(model_dir), reference="frozen_copy", backend="ddp", seq_len=64, batch=4)
    assert (estimate(plan, 1)["other"] - estimate(base, 1)["other"]) * GIB == 8 * 64 * H * (8 + 4)  # one more layer


def test_host_memory_of_a_student_and_its_frozen_copy_is_the_plans(tmp_path):
    """Host memory (resident bytes, /proc/self/statm) a process adds when it builds, from the loaded base, a student (a
    float32 copy under its new head) and ANCHOR's frozen copy (its linears copied straight to bfloat16), for a model of
    ~25 M parameters so that the bytes stand out of the allocator's noise (measured 135.8 MB against the plan's
    134.6); against plan.host_bytes. (The peak, ru_maxrss, is no measure here: the process may have peaked higher
    while it built the base.)"""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import torch, json
        from transformers import LlamaConfig, LlamaModel
        from w2s_shift.models.reward_model import RewardModel
        from w2s_shift.training.loop import make_reference
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=400, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=2)
        base = LlamaModel(cfg)
        cfg.save_pretrained({str(tmp_path)!r})
        import copy, gc, os
        def rss():  # resident bytes now (/proc/self/statm), not the peak: earlier set-up may have peaked higher
            gc.collect()
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        before = rss()
        student = RewardModel(copy.deepcopy(base), 512)
        ref = make_reference(base, autocast_bf16=True)
        after = rss()
        n = sum(p.numel() for p in base.parameters())
        print(json.dumps({{"added": after - before, "base": n * 4}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    got = json.loads(p.stdout.strip().splitlines()[-1])
    plan = Plan(shape_from_config_json(tmp_path), method="anchor", reference="frozen_copy", backend="ddp")
    h = host_bytes(plan)
    assert h["base"] == pytest.approx(got["base"], rel=0.01)
    planned = h["total"] - h["base"]  # what the run adds to the loaded base
    assert 0.75 <= got["added"] / planned <= 1.25, (got, h)

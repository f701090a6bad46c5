"""One gloo process that shards a tiny Llama reward model as accelerate's FSDP2 does under the shipped ``fsdp.yaml``
(``mixed_precision: bf16``: ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16)`` on every block and
the root), for tests/test_fsdp_bf16.py. Prints one JSON line of what it measured:

* ``rewards_dtype``, ``grad_finite``: the student's forward and backward with ``output_layers`` under that policy;
* ``ref_layers``: how many hidden states the frozen copy returns once :func:`w2s_shift.distributed.shard_like` has
  sharded it (the paper's middle layers, blocks 2 and 3 of 4);
* ``anchor_gap``: max |student - frozen copy| over those layers before any update (0 when both compute alike);
* ``deepspeed_bf16``: rewards of a model cast whole to bfloat16 (DeepSpeed's bf16 engine: ``module.bfloat16()``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    port = sys.argv[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaModel

    from w2s_shift.distributed import end_process, shard_like
    from w2s_shift.models.reward_model import RewardModel, resolve_layer_spec
    from w2s_shift.training.loop import make_reference

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    backbone = LlamaModel(cfg)
    layers = resolve_layer_spec("middle", 4)
    ref = make_reference(backbone, autocast_bf16=True)  # as the pipeline makes it for a bf16 run
    ds_model = RewardModel(make_reference(backbone), 32).bfloat16()
    model = RewardModel(backbone, 32)
    model._no_split_modules = ["LlamaDecoderLayer"]
    mesh = init_device_mesh("cpu", (1,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for block in model.backbone.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    ids = torch.randint(0, 100, (4, 9))
    mask = torch.ones_like(ids)
    out = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):  # accelerate autocasts the prepared model's forward too
        rewards, hidden = model(attention_mask=mask, input_ids=ids, output_layers=layers)
    rewards.sum().backward()
    out["rewards_dtype"] = str(rewards.dtype)
    out["grad_finite"] = all(bool(torch.isfinite(p.grad.full_tensor()).all()) for p in model.parameters())
    holder = shard_like(ref, model, policy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref_out = holder(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True)
    hs = ref_out.hidden_states
    out["ref_layers"] = 0 if hs is None else len(hs)
    if hs is not None:
        from w2s_shift.models.reward_model import select_layers

        refs = select_layers(ref_out, layers, holder.layer_offset)
        out["anchor_gap"] = max(float((h.detach().float() - r.float()).abs().max()) for h, r in zip(hidden, refs))
    r_ds, _ = ds_model(attention_mask=mask, input_ids=ids)
    out["deepspeed_bf16"] = [str(r_ds.dtype), bool(torch.isfinite(r_ds).all())]
    print("RESULT " + json.dumps(out), flush=True)
    raise SystemExit(end_process(0))

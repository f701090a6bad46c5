"""``w2s-shift`` under FSDP2 on CPU processes (gloo), for tests: ``accelerate launch --config_file
w2s_shift/configs/accelerate/fsdp.yaml --num_processes 2 tests/fsdp_gloo.py run CONFIG``.

accelerate enables FSDP only for accelerator process groups (its ``AcceleratorState`` takes the FSDP branch for
MULTI_GPU and its kin, never for MULTI_CPU), so on a machine without a GPU the launcher's FSDP settings would be
ignored and each process would train alone. Here the process state, once set up as a gloo CPU rank on the CPU
device, is relabelled MULTI_GPU when the launcher asked for FSDP: accelerate then builds its FSDP2 plugin and the
Trainer shards the model with ``fully_shard`` exactly as on GPUs (torch's FSDP2 runs on gloo CPU meshes). Nothing
else changes: the device stays the CPU and the backend gloo. Test-only; not a supported way to train.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def fsdp_on_gloo() -> None:
    """Patch accelerate's ``PartialState`` as described above (a no-op without ``ACCELERATE_USE_FSDP=true``)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    init = PartialState.__init__

    def patched(self, cpu: bool = False, **kwargs):
        init(self, cpu=cpu, **kwargs)
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if fsdp and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.MULTI_GPU  # the device stays the CPU set up above

    PartialState.__init__ = patched


def record_first_load(folder: str) -> None:
    """Write ``first_load.rank<R>.json`` into ``folder`` at this process's first model load: whether the process group
    existed then (each process must own its device before any model is built or moved)."""
    import json

    import torch.distributed as dist

    from w2s_shift.models import loading

    real, seen = loading.load_backbone, []

    def load_backbone(*args, **kwargs):
        if not seen:
            seen.append(1)
            rank = os.environ.get("RANK", "0")
            with open(os.path.join(folder, f"first_load.rank{rank}.json"), "w", encoding="utf-8") as f:
                json.dump({"process_group": dist.is_available() and dist.is_initialized()}, f)
        return real(*args, **kwargs)

    loading.load_backbone = load_backbone


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fsdp_on_gloo()
    if os.environ.get("W2S_TEST_FIRST_LOAD"):
        record_first_load(os.environ["W2S_TEST_FIRST_LOAD"])
    from w2s_shift.cli import main

    raise SystemExit(main())

"""Two gloo processes that end as the 2-process FSDP2 runs sometimes aborted, for tests/test_distributed.py and
benchmarks/exit_race.py: ``python -m torch.distributed.run --nproc_per_node 2 tests/exit_race_worker.py MODE``.

Each process keeps the process group past ``destroy_process_group`` (as DTensor's caches keep FSDP2's device mesh)
and ends while gloo's worker thread still has to release its last collective, whose tensors Python has let go of:
rank 1 joins late, so its all-gather completes at once and its worker asks for the GIL as the process ends. An
object released during the interpreter's teardown sleeps, so that the worker gets the GIL while the interpreter is
finalizing. ``MODE`` ``plain``: ``destroy_process_group`` and the interpreter's normal exit (SIGABRT, "terminate
called without an active exception", in about half the launches on a 2-core CPU); ``end_process``:
:func:`w2s_shift.distributed.end_process`.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


class SleepsAtTeardown:
    def __del__(self):
        time.sleep(1.0)  # releases the GIL while the interpreter finalizes


if __name__ == "__main__":
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    guard = SleepsAtTeardown()
    keep = dist.distributed_c10d._get_default_group()  # outlives destroy_process_group
    if dist.get_rank() == 1:
        time.sleep(0.3)
    dist.all_gather([torch.zeros(1000) for _ in range(2)], torch.ones(1000), async_op=True)  # only gloo holds these
    if mode == "end_process":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from w2s_shift.distributed import end_process

        end_process(0)
    dist.destroy_process_group()

"""The reward model and ANCHOR's frozen copy under FSDP2 with the shipped ``fsdp.yaml``'s mixed precision
(``mixed_precision: bf16``, so accelerate's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16)``), and
under DeepSpeed's bf16 engine (a module cast whole to bfloat16), on one gloo process (tests/fsdp_bf16_worker.py).
The end-to-end 2-process grid under the shipped YAML is in tests/test_fsdp.py."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def measured() -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    p = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fsdp_bf16_worker.py"), str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_the_head_runs_in_float32_on_bfloat16_parameters(measured):
    """FSDP2 hands the forward bfloat16 parameters, the head's included ('expected m1 and m2 to have the same dtype'
    before the head's weight was cast); the rewards stay float32 and the backward reaches every parameter."""
    assert measured["rewards_dtype"] == "torch.float32"
    assert measured["grad_finite"] is True
    assert measured["deepspeed_bf16"] == ["torch.float32", True]


def test_the_sharded_frozen_copy_keeps_its_hidden_states(measured):
    """fully_shard on the LlamaModel itself renamed its class, and transformers' hidden-state recording is keyed on
    the class name: hidden_states came back None, so ANCHOR at the middle layers could not run. 4 blocks: 5 states."""
    assert measured["ref_layers"] == 5


def test_the_frozen_copy_computes_as_the_student_does(measured):
    """Sharded with the student's policy, the frozen copy's middle-layer states equal the student's before any update
    (ANCHOR's term is exactly 0 at step 0); with float32 parameters against the student's bfloat16 ones they differed
    by about 7e-4."""
    assert measured["anchor_gap"] == 0.0

"""Scale-out: sharding helpers, the shipped accelerate configs, and a real 2-process gloo run on the CPU
(tests/dist_worker.py) compared with the same worker in one process."""

import json
import os
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from w2s_shift import distributed as D

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3", "cpu-2proc")


def _config(name: str) -> str:
    return str(resources.files("w2s_shift.configs").joinpath(f"accelerate/{name}.yaml"))


# ---- single-process units ------------------------------------------------------------------------------


def _fake_state(monkeypatch, rank: int, ws: int) -> None:
    """Make D.state() look like process ``rank`` of ``ws``, splitting with accelerate's own
    PartialState.split_between_processes (the code under test is accelerate's cut plus our own/padded view)."""
    from types import SimpleNamespace

    from accelerate import PartialState

    class Fake(SimpleNamespace):
        split_between_processes = PartialState.split_between_processes

    monkeypatch.setattr(D, "state", lambda: Fake(num_processes=ws, process_index=rank))


def test_split_indices_follow_accelerate_with_padding_at_the_end(monkeypatch):
    got = []
    for r in range(3):
        _fake_state(monkeypatch, r, 3)
        got.append(D.split_indices(7))
    assert [own for own, _ in got] == [[0, 1, 2], [3, 4], [5, 6]]  # contiguous blocks, first n % W one longer
    assert [pad for _, pad in got] == [[0, 1, 2], [3, 4, 6], [5, 6, 6]]  # padded with the last item to ceil(7/3)
    _fake_state(monkeypatch, 3, 4)
    assert D.split_indices(2) == ([], [1])  # fewer items than processes: every process still runs one
    assert D.split_indices(0) == ([], [])
    for n, w in [(31, 2), (10, 4), (5, 8), (61, 2)]:
        owns = []
        for r in range(w):
            _fake_state(monkeypatch, r, w)
            own, pad = D.split_indices(n)
            assert pad[: len(own)] == own and len(pad) == -(-n // w)
            owns += own
        assert sorted(owns) == list(range(n))  # the own blocks cover every index exactly once


def test_split_indices_single_process():
    assert D.split_indices(3) == ([0, 1, 2], [0, 1, 2])


def test_gather_in_order_single_process():
    out = D.gather_in_order([30.0, 10.0, 20.0], [2, 0, 1], 3)
    assert isinstance(out, np.ndarray) and out.tolist() == [10.0, 20.0, 30.0]
    assert D.gather_in_order([{"a": 1}, "x"], [1, 0], 2) == ["x", {"a": 1}]  # non-numbers stay a list
    with pytest.raises(ValueError, match=r"1 missing \[1\], 1 doubled \[0\]"):
        D.gather_in_order([1.0, 2.0], [0, 0], 2)
    with pytest.raises(ValueError, match=r"out of range \[5\]"):
        D.gather_in_order([1.0, 2.0], [0, 5], 1)
    with pytest.raises(ValueError, match="2 values for 1 indices"):
        D.gather_in_order([1.0, 2.0], [0], 2)


def test_single_process_helpers_return_inputs_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert D.world() == (0, 1) and D.is_main_process()
    calls = []
    assert D.sharded(lambda xs: calls.append(list(xs)) or [x * 2 for x in xs], [3, 1, 2]) == [6, 2, 4]
    assert calls == [[3, 1, 2]]  # one call on the whole list, in order
    from w2s_shift.io import read_json, write_json_atomic

    D.run_on_main(write_json_atomic, tmp_path / "m.json", {"ok": 1})
    assert read_json(tmp_path / "m.json") == {"ok": 1}
    with pytest.raises(ZeroDivisionError):
        D.run_on_main(lambda: 1 / 0)
    D.barrier()
    import torch

    assert D.all_mean(torch.tensor(2.5)).item() == 2.5


def test_per_device_batch():
    assert D.per_device_batch(8, 1) == 8 and D.per_device_batch(8, 4) == 2
    with pytest.raises(ValueError, match="batch_size 6 .* not divisible by the 4 processes"):
        D.per_device_batch(6, 4)
    with pytest.raises(ValueError):
        D.per_device_batch(0, 1)


def test_score_sequences_sharded_single_process_equals_score_sequences(tiny_model_dirs, tokenizer):
    import torch
    from transformers import AutoModel

    from w2s_shift.inference import score_sequences
    from w2s_shift.models.reward_model import RewardModel

    torch.manual_seed(0)
    m = RewardModel(AutoModel.from_pretrained(tiny_model_dirs["student"]), 32)
    seqs = [tokenizer(t)["input_ids"][:30] for t in ("a short one", "a somewhat longer sentence here", "mid size text")]
    got = D.score_sequences_sharded(m, seqs, tokenizer.pad_token_id)
    assert got.dtype == np.float64 and np.array_equal(got, score_sequences(m, seqs, tokenizer.pad_token_id))


# ---- accelerate configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,dtype,mp",
    [
        ("ddp", "MULTI_GPU", "bf16"),
        ("fsdp", "FSDP", "bf16"),
        ("deepspeed-zero2", "DEEPSPEED", "bf16"),
        ("deepspeed-zero3", "DEEPSPEED", "bf16"),
        ("cpu-2proc", "MULTI_GPU", "no"),
    ],
)
def test_configs_load_with_accelerates_loader(name, dtype, mp):
    from accelerate.commands.config.config_args import load_config_from_file

    c = load_config_from_file(_config(name))
    assert str(c.distributed_type).split(".")[-1] == dtype and c.mixed_precision == mp
    assert c.compute_environment.value == "LOCAL_MACHINE"


def _launch_env(name: str, n: int) -> dict:
    """The environment ``accelerate launch --config_file NAME --num_processes n`` gives its processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", _config(name), "--num_processes", str(n), "-m", "w2s_shift", "run", "cfg.yaml"]
    )
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join([*defaults.deepspeed_config, "mixed_precision"])
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE", "FSDP"))}


def test_fsdp_config_is_accepted_and_wraps_each_decoder_layer(monkeypatch):
    """The launcher's FSDP settings build accelerate's plugin (FSDP2, full shard, bf16), and its transformer-layer
    auto-wrap picks every LlamaDecoderLayer of a RewardModel once set_layer_wrap_classes has run (not before)."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from transformers import LlamaConfig, LlamaModel

    from w2s_shift.models.reward_model import RewardModel

    env = _launch_env("fsdp", 2)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    model = RewardModel(
        LlamaModel(
            LlamaConfig(
                vocab_size=64,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=1,
            )
        ),
        16,
    )
    before = fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(), model)
    assert not any(before(m) for m in model.modules())  # a plain nn.Module: FSDP would shard it as one unit
    assert D.set_layer_wrap_classes(model) == ["LlamaDecoderLayer"]
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [type(m).__name__ for m in model.modules() if policy(m)] == ["LlamaDecoderLayer"] * 3


@pytest.mark.parametrize("name,stage", [("deepspeed-zero2", 2), ("deepspeed-zero3", 3)])
def test_deepspeed_configs_are_accepted(name, stage, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    env = _launch_env(name, 2)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = DeepSpeedPlugin()
    zo = plugin.deepspeed_config["zero_optimization"]
    assert plugin.zero_stage == stage and zo["stage"] == stage and zo["offload_optimizer"]["device"] == "none"
    # batch sizes, accumulation and clipping are left to the Trainer, so per-device batch = batch_size / W holds
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == "auto"
    assert plugin.deepspeed_config["gradient_clipping"] == "auto"


@pytest.mark.parametrize("name", ["deepspeed-zero2", "deepspeed-zero3"])
def test_deepspeed_accepts_the_filled_config(name, monkeypatch):
    pytest.importorskip(
        "deepspeed",
        reason="deepspeed is not installed (optional; pip install deepspeed on a GPU machine): "
        "DeepSpeed's own config check is not exercised here",
    )
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    for k, v in _launch_env(name, 2).items():
        monkeypatch.setenv(k, v)
    cfg = HfTrainerDeepSpeedConfig(DeepSpeedPlugin().deepspeed_config)
    assert cfg.get_value("zero_optimization.stage") == int(name[-1])


# ---- two gloo processes on the CPU ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_and_two(tiny_model_dirs, tmp_path_factory):
    """Run tests/dist_worker.py once in one process and once under accelerate launch with cpu-2proc.yaml."""
    work = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    worker = [str(ROOT / "tests" / "dist_worker.py"), "--model-dir", tiny_model_dirs["student"], "--work", str(work)]
    one = subprocess.Popen(
        [sys.executable, *worker, "--out", str(work / "one.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    two = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            _config("cpu-2proc"),
            "--main_process_port",
            str(_free_port()),
            *worker,
            "--out",
            str(work / "two.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out1, out2 = one.communicate(timeout=900), two.communicate(timeout=900)  # generous: a loaded 2-core machine
    assert one.returncode == 0, out1[0][-3000:]
    assert two.returncode == 0, out2[0][-3000:]
    rank1 = json.loads((work / "two.rank1.json").read_text())
    return json.loads((work / "one.json").read_text()), json.loads((work / "two.json").read_text()), rank1


def test_two_processes_score_exactly_what_one_process_scores(one_and_two):
    one, two, rank1 = one_and_two
    assert one["world"] == 1 and two["world"] == 2
    a, b = np.array(one["rewards_before"]), np.array(two["rewards_before"])
    assert a.shape == b.shape == (61,)  # 61 sequences: odd, so one shard carried a padding slot
    assert np.array_equal(np.array(rank1["rewards_before"]), b)  # every process holds the full gathered result
    # same weights, different batch composition (padding length): only float rounding may differ
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    # distinct values (pair 0's chosen and rejected share their first 20 tokens, hence 60), so a shifted or
    # doubled index could not pass the comparison above
    assert np.unique(np.round(a, 6)).size == 60
    # scoring that hands back the pooled states too (the mechanism stage's features): the same rewards, the states
    # gathered in input order on every process and equal across one and two processes up to float rounding
    for res in (one, two, rank1):
        assert res["rewards_with_pooled"] == res["rewards_before"]
    p1, p2 = np.array(one["pooled"]), np.array(two["pooled"])
    assert p1.shape == p2.shape and p1.shape[0] == 61 and np.array_equal(np.array(rank1["pooled"]), p2)
    np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-5)
    assert np.unique(np.round(p1[:, 0], 5)).size == 60  # a shifted or doubled index would show
    for res in (one, two, rank1):  # a lost or a doubled index is refused on every process
        assert "1 missing [7]" in res["broken_error"]
        assert "0 missing [], 1 doubled [30]" in res["doubled_error"]
        assert res["marker_seen_after_barrier"] is True  # run_on_main: the file exists when any process returns
    # fn failing on one process: that process re-raises its error, the other raises naming it (no hang)
    assert one["failure_seen"] == "ValueError: boom on the last process"
    assert two["failure_seen"] == "RuntimeError: sharded: process 1 failed: ValueError: boom on the last process"
    assert rank1["failure_seen"] == "ValueError: boom on the last process"
    # a decision from each process's own free memory is the same everywhere (a cache evicted on one rank only, or
    # refused on one rank only, left the other waiting in a collective)
    assert one["agreed"] == [1000, None] and two["agreed"] == rank1["agreed"] == [999, None]


def test_two_processes_split_each_global_batch(one_and_two):
    one, two, _ = one_and_two
    assert one["steps"] == two["steps"] == 12  # 24 pairs / global batch 4 x 2 epochs
    b = two["per_device_batch"]
    assert b == 2
    r0, r1 = two["seen"]
    s1 = one["seen"][0]
    assert len(r0) == len(r1) == len(s1) // 2 == 24
    for k in range(12):
        p0, p1 = r0[k * b : (k + 1) * b], r1[k * b : (k + 1) * b]
        assert not set(p0) & set(p1)  # different pairs on the two processes ...
        assert sorted(p0 + p1) == sorted(s1[k * 4 : (k + 1) * 4])  # ... making up the one-process batch of step k


def test_two_process_training_matches_one_process(one_and_two):
    """Tolerance: final rewards within 1e-4 absolute (measured about 3e-6: float32 all-reduce order); training
    itself moved the rewards by more than 0.1, so the comparison is not trivially met."""
    one, two, _ = one_and_two
    a, b = np.array(one["rewards_after"]), np.array(two["rewards_after"])
    assert np.abs(a - np.array(one["rewards_before"])).max() > 0.1
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
    # the Trainer's logged loss is the mean over processes, hence the one-process loss of the same global batch
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=0, atol=1e-5)
    assert len(two["loss"]) == 12


def test_logged_loss_parts_are_averaged_over_processes(one_and_two):
    one, two, _ = one_and_two
    np.testing.assert_allclose(two["loss_w2s"], one["loss_w2s"], rtol=0, atol=1e-5)


def test_end_process_without_a_process_group_returns_the_code():
    """One process: nothing to end, the caller exits normally with the code."""
    assert D.end_process(3) == 3 and D.end_process(0) == 0


def test_end_process_ends_a_launched_process_that_gloo_would_abort_at_exit():
    """tests/exit_race_worker.py ends each of two gloo processes while gloo's worker thread still has to release its
    last collective. With the interpreter's normal exit, 9 launches of 20 aborted (SIGABRT, "terminate called
    without an active exception"; benchmarks/exit_race.py); with end_process none of 20 did, and none may here.
    Three launches: a return of the teardown would fail this test in about 5 runs of 6."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(3):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        cmd += ["--master_port", str(_free_port()), str(ROOT / "tests" / "exit_race_worker.py"), "end_process"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "terminate called" not in p.stderr, (p.stdout + p.stderr)[-3000:]

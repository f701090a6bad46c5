"""Device selection (cuda, else mps, else cpu; or as the config says) and its precision rule on MPS, tested with
mocks: no Mac was available, MPS itself was never run."""

import pytest
import torch

from w2s_shift.config import RunConfig
from w2s_shift.device import current_device, select_device, use_device
from w2s_shift.models.precision import decide_bf16, precision_lines, resolve_precisions
from w2s_shift.training.args import PairTrainingArguments


@pytest.fixture
def machine(monkeypatch):
    """Pretend the machine has CUDA and/or MPS: machine(cuda=..., mps=...)."""

    def set_(cuda: bool, mps: bool):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    yield set_
    use_device("auto")


@pytest.mark.parametrize(
    "cuda, mps, expected", [(True, True, "cuda"), (False, True, "mps"), (True, False, "cuda"), (False, False, "cpu")]
)
def test_auto_prefers_cuda_then_mps_then_cpu(machine, cuda, mps, expected):
    machine(cuda, mps)
    assert select_device("auto") == expected
    assert use_device("auto") == expected and current_device() == expected


def test_an_explicit_device_is_kept_or_refused(machine):
    machine(True, True)
    assert use_device("cpu") == "cpu" and current_device() == "cpu"
    assert use_device("mps") == "mps"
    machine(False, False)
    with pytest.raises(ValueError, match="device: mps, but torch cannot use Apple's Metal backend"):
        select_device("mps")
    with pytest.raises(ValueError, match="device: cuda, but torch sees no CUDA device"):
        select_device("cuda")
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, mps, got 'tpu'"):
        select_device("tpu")
    with pytest.raises(ValueError, match="device"):
        RunConfig.model_validate({"device": "tpu"})


def test_mps_runs_float32_and_refuses_forced_bfloat16(machine):
    machine(False, True)
    use_device("auto")
    use, reason = decide_bf16("auto")
    assert use is False and reason.startswith("float32: MPS")
    assert decide_bf16(False) == (False, "float32: forced (bf16: false)")
    with pytest.raises(ValueError, match="bf16: true on MPS is not supported"):
        decide_bf16(True)
    cfg = resolve_precisions(RunConfig.model_validate({"device": "auto"}))
    assert cfg.student.bf16 is False
    assert precision_lines(cfg)[1].startswith("student precision: float32 (bf16: auto) on mps (Apple Metal): float32")


def test_the_trainer_is_left_to_use_mps_or_cuda_and_kept_on_cpu_otherwise(machine, tmp_path):
    """use_cpu False lets transformers' TrainingArguments put the model on MPS (or CUDA) itself."""
    for cuda, mps, setting, use_cpu in [
        (False, True, "auto", False),
        (False, False, "auto", True),
        (False, True, "cpu", True),
    ]:
        machine(cuda, mps)
        use_device(setting)
        assert PairTrainingArguments(output_dir=str(tmp_path)).use_cpu is use_cpu


def test_device_is_not_part_of_the_run_identity():
    a, b = RunConfig.model_validate({"device": "auto"}), RunConfig.model_validate({"device": "cpu"})
    assert a.digest("student") == b.digest("student") and a.model_copy(update={"device": "cpu"}).digest() == a.digest()


def test_a_launched_process_owns_its_gpu_before_anything_moves(machine, monkeypatch):
    """Under accelerate launch each process must use GPU LOCAL_RANK; a bare "cuda" meant GPU 0 for every process (its
    frozen trunk, built before the process group, went there). use_device, called when the run resolves its
    precision, now makes LOCAL_RANK's GPU the current one; one process leaves CUDA's current device alone."""
    machine(True, False)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(i))
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert use_device("auto") == "cuda" and calls == [3]
    assert use_device("cpu") == "cpu" and calls == [3]  # the CPU: no GPU to own
    monkeypatch.delenv("LOCAL_RANK")
    assert use_device("cuda") == "cuda" and calls == [3]


def test_one_process_never_trains_through_data_parallel():
    """On a node with several GPUs a plain run got n_gpu = the GPU count, and the Trainer wrapped the model in
    nn.DataParallel (batch x n_gpu, warm-up over most of training). One process now trains on one GPU."""
    args = PairTrainingArguments(output_dir="unused", batch_size=8, report_to=[])
    args._n_gpu = 4  # what TrainingArguments computes for a process that sees 4 GPUs and was not launched
    assert args.n_gpu == 1
    assert args.train_batch_size == args.per_device_train_batch_size == 8
    args._n_gpu = 0  # the CPU
    assert args.n_gpu == 0

"""bf16: auto | true | false: the decision with mocked CPU flags, probe and CUDA; the probe's cache;
the dry-run text; the digest rule; trunk cache, ANCHOR references and the packing check in both precisions;
a tiny end-to-end run that resolves auto to float32."""

import json
import warnings

import pytest
import torch
from conftest import cli_error, pair_objective

from w2s_shift.config import ConfigError, ModelConfig, RunConfig
from w2s_shift.config_io import load_config, preset_names, read_yaml
from w2s_shift.models import precision as P

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Test CPU
flags\t\t: fpu sse2 avx2 avx512f {extra}

processor\t: 1
model name\t: Intel(R) Xeon(R) Test CPU
flags\t\t: fpu sse2 avx2 avx512f {extra}
"""


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A mocked CPU-only machine: set ``.flags`` (None: unknown) and ``.speedup`` (the probe's result); counts
    probe runs in ``.probes``. The probe cache lives in tmp_path."""

    class M:
        flags, speedup, probes, name = frozenset({"avx2", "avx512f"}), 1 / 4.8, 0, "Intel(R) Xeon(R) Test CPU"

    m = M()

    def fake_probe(shape=P.PROBE_SHAPE, reps=P.PROBE_REPS):
        m.probes += 1
        return {
            "float32_ms": 10.0,
            "bfloat16_ms": 10.0 / m.speedup,
            "speedup": m.speedup,
            "shape": list(shape),
            "reps": reps,
            "threads": 1,
        }

    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "read_cpu_info", lambda path=None: (m.name, m.flags))
    monkeypatch.setattr(P, "run_probe", fake_probe)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(P, "_WARNED", set())
    return m


def test_read_cpu_info_parses_name_and_flags(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(CPUINFO.format(extra="avx512_bf16 amx_tile amx_bf16"))
    name, flags = P.read_cpu_info(f)
    assert name == "Intel(R) Xeon(R) Test CPU"
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= flags and "sse2" in flags
    assert P.native_bf16_flags(flags) == ["amx_bf16", "avx512_bf16"]
    f.write_text(CPUINFO.format(extra=""))
    assert P.native_bf16_flags(P.read_cpu_info(f)[1]) == []
    # not Linux (no cpuinfo) or an ARM cpuinfo (no 'flags' line): unknown flags
    assert P.read_cpu_info(tmp_path / "missing")[1] is None
    f.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert P.read_cpu_info(f)[1] is None and P.native_bf16_flags(None) == []


def test_cpu_without_native_bf16_runs_float32(machine):
    assert P.decide_bf16("auto") == (False, "float32: this CPU has no native bfloat16 (probe: bf16 4.8x slower)")


def test_cpu_with_native_bf16_and_a_fast_probe_runs_bf16(machine):
    machine.flags = frozenset({"avx512f", "avx512_bf16", "amx_bf16"})
    machine.speedup = 2.1
    assert P.decide_bf16("auto") == (True, "bfloat16: AMX-BF16/AVX512_BF16 and probe bf16 2.1x faster than float32")


@pytest.mark.parametrize("speedup,use", [(1.29, False), (1.3, True), (0.66, False)])
def test_native_bf16_needs_the_probe_at_least_1_3x_faster(machine, speedup, use):
    machine.flags = frozenset({"avx512_bf16"})
    machine.speedup = speedup
    got, reason = P.decide_bf16("auto")
    assert got is use
    if speedup == 0.66:  # this machine's case: AVX512_BF16 without AMX, bf16 matmul 1.5x slower
        assert (
            reason == "float32: AVX512_BF16 present but probe bf16 1.5x slower than float32 "
            "(bfloat16 only when >= 1.3x faster)"
        )


def test_unknown_cpu_flags_run_float32(machine):
    machine.flags, machine.speedup = None, 3.0  # e.g. macOS: no /proc/cpuinfo, a fast probe is not enough
    use, reason = P.decide_bf16("auto")
    assert use is False and reason.startswith("float32: the CPU's flags are unknown") and "bf16 3.0x faster" in reason


@pytest.mark.parametrize("supported", [True, False])
def test_cuda_follows_is_bf16_supported_and_never_probes(machine, monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert P.decide_bf16("auto") == (
        (True, "bfloat16: CUDA device supports it")
        if supported
        else (False, "float32: this CUDA device does not support bfloat16")
    )
    assert P.decide_bf16(False) == (False, "float32: forced (bf16: false)")
    assert P.decide_bf16(True) == (True, "bfloat16: forced (bf16: true)")
    assert machine.probes == 0


def test_forced_settings_and_the_warn_once_on_a_cpu_without_native_bf16(machine):
    assert P.decide_bf16(False) == (False, "float32: forced (bf16: false)")
    assert machine.probes == 0  # false needs no probe
    with pytest.warns(RuntimeWarning, match=r"no AMX-BF16 or AVX512_BF16 .* bf16 4\.8x slower than float32") as rec:
        assert P.decide_bf16(True) == (
            True,
            "bfloat16: forced (bf16: true) on a CPU without native bfloat16 (probe: bf16 4.8x slower)",
        )
    assert len(rec) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        assert P.decide_bf16(True)[0] is True
    machine.flags = frozenset({"amx_bf16"})  # native: true needs no warning and no probe
    n = machine.probes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert P.decide_bf16(True) == (True, "bfloat16: forced (bf16: true)")
    assert machine.probes == n


def test_bad_setting_is_refused():
    with pytest.raises(ValueError, match="auto, true or false, got 'yes'"):
        P.decide_bf16("yes")
    with pytest.raises(ValueError, match="got 1"):
        P.decide_bf16(1)


def test_probe_is_cached_per_cpu_and_torch_version(machine, tmp_path, monkeypatch):
    P.decide_bf16("auto")
    assert machine.probes == 1
    files = list((tmp_path / "cache" / "precision").glob("bf16-probe-*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert (
        saved["speedup"] == pytest.approx(1 / 4.8) and saved["cpu"] == machine.name and saved["native_bf16_flags"] == []
    )
    assert P.decide_bf16("auto")[0] is False and machine.probes == 1  # a hit: not measured again
    machine.flags = frozenset({"avx2", "avx512f", "avx512_bf16"})  # another CPU (flags): a miss
    P.decide_bf16("auto")
    assert machine.probes == 2
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch: a miss
    P.decide_bf16("auto")
    assert machine.probes == 3
    assert len(list((tmp_path / "cache" / "precision").glob("*.json"))) == 3
    path = P.probe_cache_path(machine.name, machine.flags)
    path.write_text('{"speedup": ')  # a truncated file is measured again and rewritten
    P.decide_bf16("auto")
    assert machine.probes == 4 and json.loads(path.read_text())["speedup"] == pytest.approx(1 / 4.8)


def test_real_probe_is_short_and_consistent():
    r = P.run_probe(reps=3)
    assert r["float32_ms"] > 0 and r["bfloat16_ms"] > 0 and r["threads"] == 1 and r["reps"] == 3
    # speedup is rounded to 3 decimals: 0.0176 is stored as 0.018 where bf16 is ~50x slower
    assert r["speedup"] == pytest.approx(r["float32_ms"] / r["bfloat16_ms"], rel=1e-2, abs=1e-3)
    assert torch.get_num_threads() == 1  # restored (conftest sets 1)


def test_config_setting_defaults_to_auto_in_code_and_every_preset():
    assert ModelConfig(name="x").bf16 == "auto"
    assert RunConfig().teacher.bf16 == "auto" and RunConfig().student.bf16 == "auto"
    for p in preset_names():
        data, _ = read_yaml(p)
        assert data["teacher"]["bf16"] == "auto" and data["student"]["bf16"] == "auto", p
    assert load_config(None, ["teacher.bf16=false", "student.bf16=true"]).teacher.bf16 is False
    assert load_config(None, ["student.bf16=true"]).student.bf16 is True
    with pytest.raises(ConfigError, match="student.bf16"):
        load_config(None, ["student.bf16=maybe"])


def test_digest_holds_the_resolved_precision_not_auto(machine):
    auto = load_config(None, [])
    true = load_config(None, ["teacher.bf16=true", "student.bf16=true"])
    false = load_config(None, ["teacher.bf16=false", "student.bf16=false"])
    machine.flags, machine.speedup = frozenset({"amx_bf16"}), 2.5  # auto resolves to bfloat16 here
    resolved = P.resolve_precisions(auto)
    assert resolved.teacher.bf16 is True and resolved.student.bf16 is True
    assert resolved.digest() == true.digest() == auto.digest()  # auto itself is no part of the identity
    assert resolved.digest("student") == true.digest("student")
    assert resolved.teacher._precision["setting"] == "auto"  # kept for display only
    assert resolved.model_dump(mode="json")["teacher"]["bf16"] is True
    machine.flags = frozenset({"avx2"})  # another machine: auto resolves to float32, a different config
    P._WARNED.clear()
    assert P.resolve_precisions(auto).digest() == false.digest() != true.digest()
    assert auto.digest() == false.digest()


def test_a_run_dir_never_mixes_precisions(machine, tmp_path):
    from w2s_shift.pipeline import RunDirError, claim_run_dir, prepare_run_dir

    machine.flags, machine.speedup = frozenset({"amx_bf16"}), 2.5
    cfg = P.resolve_precisions(load_config(None, [f"output_dir={tmp_path / 'run'}"]))
    claim_run_dir(cfg, prepare_run_dir(cfg, overwrite=False))
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["environment"]["precision"]["student"]["dtype"] == "bfloat16"
    assert info["environment"]["precision"]["student"]["setting"] == "auto"
    forced = load_config(None, [f"output_dir={tmp_path / 'run'}", "teacher.bf16=true", "student.bf16=true"])
    prepare_run_dir(P.resolve_precisions(forced), overwrite=False)  # the same identity: accepted
    machine.flags = frozenset({"avx2"})  # the same config on a machine where auto means float32
    with pytest.raises(RunDirError, match="different config"):
        prepare_run_dir(P.resolve_precisions(load_config(None, [f"output_dir={tmp_path / 'run'}"])), overwrite=False)


def test_dry_run_prints_device_precision_and_reason(machine, capsys):
    from w2s_shift.cli import main

    assert main(["run", "--dry-run", "--set", "student.bf16=false"]) == 0
    out = capsys.readouterr().out
    assert (
        "teacher precision: float32 (bf16: auto) on cpu (Intel(R) Xeon(R) Test CPU): float32: this CPU has no "
        "native bfloat16 (probe: bf16 4.8x slower)"
    ) in out
    assert (
        "student precision: float32 (bf16: false) on cpu (Intel(R) Xeon(R) Test CPU): float32: forced (bf16: false)"
        in out
    )


def _pairs(n):
    from w2s_shift.data.adapters import load_named

    return load_named("ultrafeedback", skip_invalid=True).pairs[:n]


@pytest.mark.parametrize("bf16", [False, True])
def test_trunk_cache_anchor_references_and_packing_check_in_both_precisions(tiny_model_dirs, tmp_path, bf16):
    """The frozen trunk and its cached states, the cached ANCHOR reference states and a frozen-copy reference all
    follow the precision; the cached states equal the frozen copy's outputs; training with either reference
    passes the packing check (run by train_pairs before training) and gives the same losses."""
    from w2s_shift.batching import bf16_autocast
    from w2s_shift.pipeline import Featurizer
    from w2s_shift.training import PairTrainingArguments, make_reference, train_pairs

    dt = torch.bfloat16 if bf16 else torch.float32
    sf = Featurizer(
        ModelConfig(name=tiny_model_dirs["student"], max_length=48, trainable_layers=2, bf16=bf16), "student"
    )
    assert sf.split_mode and {p.dtype for p in sf.trunk.parameters()} == {dt}
    pairs = _pairs(8)
    ds = sf.dataset("train", pairs, [0.8] * 8, with_reference=True)
    assert {s.dtype for pr in ds.states for s in pr} == {dt} and {r.dtype for pr in ds.ref_states for r in pr} == {dt}
    ref = make_reference(sf.base, sf.offset, autocast_bf16=bf16)
    f = sf.features("train", pairs)
    with torch.no_grad(), bf16_autocast(bf16):  # the frozen copy on the cached trunk states == the cached reference
        for i in (0, 9):
            h = ref(inputs_embeds=f["states"][i][None].float(), use_cache=False).last_hidden_state[0]
            cached = ds.ref_states[i % 8][i // 8]
            m = torch.tensor(f["masks"][i], dtype=torch.bool)
            torch.testing.assert_close(
                h[m].to(dt), cached, rtol=1e-5 if not bf16 else 1e-2, atol=1e-5 if not bf16 else 1e-2
            )
    losses = {}
    for mode in ("cached", "frozen_copy"):
        model = sf.new_model(0)
        cfg = PairTrainingArguments(
            num_train_epochs=2,
            batch_size=4,
            learning_rate=1e-2,
            packing=True,
            bf16=bf16,
            logging_steps=1,
        )
        ref = make_reference(sf.base, sf.offset, autocast_bf16=bf16) if mode == "frozen_copy" else None
        hist = train_pairs(
            model,
            ds if mode == "cached" else sf.dataset("train", pairs, [0.8] * 8),
            sf.pad_id,
            cfg,
            str(tmp_path / mode),
            objective=pair_objective(anchor_lambda=1.0, reference_mode=mode, reference=ref),
        )
        losses[mode] = [h["loss"] for h in hist if "loss" in h]
        assert len(losses[mode]) == 4 and all(torch.isfinite(torch.tensor(losses[mode])))
    if bf16:  # bfloat16-rounded cached states: the same start, then rounding differences grow at lr 1e-2
        assert losses["cached"][:2] == pytest.approx(losses["frozen_copy"][:2], rel=1e-2)
    else:
        assert losses["cached"] == pytest.approx(losses["frozen_copy"], rel=1e-5)


def test_tiny_run_with_auto_resolving_to_float32(tiny_model_dirs, tmp_path, machine, capsys):
    """End to end with bf16: auto on a (mocked) CPU without native bfloat16: everything runs in float32, and
    run.json, config.yaml, metrics.json and report.md say so."""
    from w2s_shift.pipeline import run

    machine.name = "Mock CPU without bf16"
    cfg = RunConfig.model_validate(
        {
            "output_dir": str(tmp_path / "run"),
            "data": {
                "source": "ultrafeedback",
                "ood": ["hh-helpful-base"],
                "n_teacher_train": 16,
                "n_student_train": 12,
                "n_test": 10,
                "n_ood": 8,
                "skip_invalid": True,
            },
            "teacher": {"name": tiny_model_dirs["teacher"], "max_length": 48, "epochs": 1, "batch_size": 8},
            "student": {
                "name": tiny_model_dirs["student"],
                "max_length": 48,
                "trainable_layers": 2,
                "epochs": 1,
                "batch_size": 4,
            },
            "methods": [
                "naive",
                {"name": "anchor", "anchor_lambda": 1e-2},
                {"name": "anchor", "anchor_lambda": 1e-2, "reference": "frozen_copy", "label": "anchor-copy"},
            ],
            "bootstrap": 100,
            "drift": False,
        }
    )
    assert cfg.student.bf16 == "auto"
    metrics = run(cfg)
    out = capsys.readouterr().out
    assert (
        "student precision: float32 (bf16: auto) on cpu (Mock CPU without bf16): float32: this CPU has no native "
        "bfloat16 (probe: bf16 4.8x slower)"
    ) in out
    run_dir = tmp_path / "run"
    env = json.loads((run_dir / "run.json").read_text())["environment"]
    assert env["cpu"] == "Mock CPU without bf16" and env["cpu_flags"] == ["avx2", "avx512f"]
    assert env["precision"]["teacher"]["dtype"] == env["precision"]["student"]["dtype"] == "float32"
    assert env["torch"] == torch.__version__ and env["transformers"] and env["gpu"] is None
    assert set(env["torch_threads"]) == {"teacher", "student"}
    assert (
        "bf16: false" in (run_dir / "config.yaml").read_text()
        and "bf16: auto" not in (run_dir / "config.yaml").read_text()
    )
    assert metrics["environment"]["precision"]["student"]["bf16"] is False
    report = (run_dir / "report.md").read_text()
    assert "hardware: CPU Mock CPU without bf16 (flags: avx2, avx512f)" in report
    assert (
        "student precision: float32 (bf16: auto): float32: this CPU has no native bfloat16 (probe: bf16 4.8x slower)"
        in report
    )
    rewards = metrics["cells"][0]
    assert rewards["source"] == "ultrafeedback"
    # a rerun with bf16 forced false is the same config: every stage is reused
    forced = cfg.model_copy(
        update={
            "teacher": cfg.teacher.model_copy(update={"bf16": False}),
            "student": cfg.student.model_copy(update={"bf16": False}),
        }
    )
    run(forced)
    assert "done earlier" in capsys.readouterr().out


def test_a_launched_run_has_the_launchers_precision_or_stops(machine, monkeypatch, capsys):
    """accelerate launch exports its config's mixed_precision and the Trainer applies it over the config's bf16, so
    the shipped GPU configs (mixed_precision: bf16) trained bf16: false models under bfloat16 autocast while the
    reference, the scoring and run.json said float32. Now auto follows the launcher and a contradiction stops."""
    from w2s_shift.cli import main

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    resolved = P.resolve_precisions(load_config(None, []))  # auto on a CPU whose probe says float32
    assert resolved.teacher.bf16 is True and resolved.student.bf16 is True
    assert resolved.student._precision["reason"] == "bfloat16: the launcher's mixed_precision bf16"
    err = cli_error(capsys, ["run", "--dry-run", "--set", "student.bf16=false"])
    assert "student.bf16 is false, but the launcher's accelerate config sets mixed_precision: bf16" in err
    assert "set student.bf16 to true or auto" in err
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert P.resolve_precisions(load_config(None, [])).student.bf16 is False
    err = cli_error(capsys, ["run", "--dry-run", "--set", "teacher.bf16=true"])
    assert "teacher.bf16 is true, but the launcher's accelerate config sets mixed_precision: no" in err
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert "w2s-shift trains in bf16 or float32 only" in cli_error(capsys, ["run", "--dry-run"])
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    err = cli_error(capsys, ["run", "--dry-run", "--set", "student.pure_bf16=true"])
    assert "student.pure_bf16 under FSDP" in err
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    assert main(["run", "--dry-run", "--set", "student.bf16=false"]) == 0  # one process: the config decides

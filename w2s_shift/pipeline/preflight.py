"""Checks before anything trains: every model folder loads (files, tokenizer, config, weights headers, shapes)
and the grid's settings fit the loaded models."""

from __future__ import annotations

import math
from pathlib import Path

from ..config import RunConfig
from ..models.loading import ModelError, untied_lm_head
from .featurizer import SourceContext
from .rundir import log


def load_check(spec: str, *, trust_remote_code: bool = False, allow_pickle: bool = False) -> None:
    """Cheap check that ``spec`` will load, without reading its weights (a broken student was found only after
    the teacher had trained). A hub id must be in the hub cache or on the hub (:func:`check_hub_id`).

    Checks: the folder's files (:func:`~w2s_shift.models.loading.resolve_source`: config.json, tokenizer files,
    pickle, remote code), the tokenizer loads, config.json loads in transformers; a ``.gguf`` file starts with
    the GGUF magic; each ``*.safetensors`` header parses (``safe_open``) and, against the model built from
    config.json on the meta device (no memory), no weight is missing, no shape differs and the embedding has
    a row for every token id (skipped for quantized checkpoints and for models whose checkpoint keys transformers
    renames or fuses on load). NaN weights are found when the model loads (that reads every tensor).

    Raises:
        ModelError: naming ``spec`` and the file, with the reason.
    """
    from ..models.loading import load_tokenizer, resolve_source

    kind, src, kw = resolve_source(spec, allow_pickle, trust_remote_code)
    if kind == "hub":
        check_hub_id(spec)
        return
    if kind == "gguf":
        f = Path(src) / kw["gguf_file"]
        with open(f, "rb") as fh:
            head = fh.read(4)
        if head != b"GGUF":
            raise ModelError(f"{f}: not a GGUF file (it starts with {head!r}, not the magic b'GGUF')")
        check_template(spec, load_tokenizer(spec, trust_remote_code=trust_remote_code))
        return
    folder = Path(src)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: not a Hugging Face model folder (no config.json)")
    tok = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    check_template(spec, tok)
    from accelerate import init_empty_weights
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModel

    try:
        mc = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelError(
            f"{folder}/config.json: transformers cannot read it: {type(e).__name__}: {str(e)[:300]}"
        ) from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if allow_pickle and any(p.suffix in (".bin", ".pt", ".pth", ".ckpt") for p in folder.iterdir()):
            return  # pickle weights: their header cannot be read without unpickling
        raise ModelError(f"{folder}: no weights file (model.safetensors or sharded *.safetensors)")
    shapes = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
        except (SafetensorError, OSError) as e:
            raise ModelError(f"{folder}: {f.name}: not a valid safetensors file, truncated or corrupt ({e})") from None
    if getattr(mc, "quantization_config", None):
        return  # packed quantized tensors: their shapes are not the model's, the load checks them
    try:
        from transformers.conversion_mapping import extract_weight_conversions_for_model

        with init_empty_weights():
            model = AutoModel.from_config(mc, trust_remote_code=trust_remote_code)
        if extract_weight_conversions_for_model(model):
            return  # transformers renames / fuses this model's checkpoint keys on load (e.g. MoE experts)
    except Exception:  # an architecture that cannot be built on the meta device: the load checks the rest
        return
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else None
    legacy = {".gamma": ".weight", ".beta": ".bias"}  # old LayerNorm names transformers still renames on load
    have = {}
    for k, v in shapes.items():
        k = k[len(prefix) :] if prefix and k.startswith(prefix) else k
        have[next((k[: -len(a)] + b for a, b in legacy.items() if k.endswith(a)), k)] = v
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(k for k in expected if k not in have and ".pooler." not in f".{k}")
    if missing and len(missing) < len(expected):  # none matching at all: another naming scheme, left to the load
        raise ModelError(
            f"{folder}: the checkpoint lacks {len(missing)} weight(s) of the model (e.g. {', '.join(missing[:3])}); "
            "refused because they would be initialised at random. Is the weights file complete?"
        )
    wrong = [k for k in expected if k in have and have[k] != expected[k]]
    if wrong:
        k = wrong[0]
        raise ModelError(
            f"{folder}: the weights' shapes do not match config.json ({k}: {list(have[k])} in the file, "
            f"{list(expected[k])} by config.json); the weights file and config.json must come from the same model"
        )
    emb = model.get_input_embeddings()
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None and len(tok) > rows:
        raise ModelError(
            f"{folder}: the tokenizer has {len(tok)} tokens but the model's embedding has {rows} rows; "
            "ids past the table would crash or be misread: the tokenizer does not belong to this model"
        )


def check_template(spec: str, tokenizer) -> None:
    """Render a one-turn conversation with the tokenizer's chat template (if any), so a template that always
    fails stops the run before anything trains (one that fails on some pairs stops at the first of them).

    Raises:
        ModelError: naming ``spec`` and what the template did.
    """
    from ..data.render import render
    from ..data.schema import DataError

    try:
        render("Is this a test?", "Yes.", tokenizer, where=f"{spec} (a one-turn probe conversation)")
    except DataError as e:
        raise ModelError(str(e)) from None


def check_hub_id(spec: str) -> None:
    """Check that the hub id ``spec`` names a model: its config.json is in the hub cache, or the hub has the
    repository (only config.json is fetched; a repository without one, e.g. GGUF only, passes).

    Raises:
        ModelError: not cached and the hub unreachable or offline (``HF_HUB_OFFLINE``), no such repository,
            a gated one, or not a valid id; with the nearest preset names.
    """
    import difflib

    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from ..models.loading import PRESETS

    near = difflib.get_close_matches(spec.lower(), list(PRESETS), n=3, cutoff=0.6)
    hint = f"; nearest preset: {', '.join(near)}" if near else f"; presets: {', '.join(PRESETS)}"
    try:
        hf_hub_download(spec, "config.json", local_files_only=constants.is_offline_mode())
    except LocalEntryNotFoundError:
        raise ModelError(
            f"{spec}: not a preset, a local folder or a model in the hub cache, and the hub cannot be reached "
            f"(offline){hint}"
        ) from None
    except GatedRepoError:
        raise ModelError(f"{spec}: a gated model on the hub: log in (`hf auth login`) with access to it") from None
    except RepositoryNotFoundError:
        raise ModelError(f"{spec}: no such model on the hub, and not a preset or a local folder{hint}") from None
    except EntryNotFoundError:
        return
    except HFValidationError as e:
        raise ModelError(f"{spec}: not a preset, a local folder or a valid hub id ({e}){hint}") from None


def load_check_all(cfg: RunConfig) -> None:
    """:func:`load_check` on every model of the run before any training: the teacher and the student (the ceiling
    and zero-shot reuse the student). Raises ModelError naming the config key (``teacher.name``) and file."""
    for key, mcfg in (("teacher", cfg.teacher), ("student", cfg.student)):
        try:
            load_check(mcfg.name, trust_remote_code=mcfg.trust_remote_code, allow_pickle=mcfg.allow_pickle)
        except ModelError as e:
            raise ModelError(f"{key}.name: {e}") from None
    log(f"preflight: teacher {cfg.teacher.name} and student {cfg.student.name} load-checked")


def preflight(ctx: SourceContext, methods: list) -> None:
    """Checks that need the data or the student model, done before any training: at least one optimizer step per
    trained model (``epochs`` x steps per epoch), anchored layers that train, LoRA target modules that exist, an LM
    head for SEAM and zero-shot.

    Raises:
        ValueError: naming the method or field.
    """
    cfg = ctx.cfg
    trained = [("teacher", cfg.teacher, "teacher_train")]
    trained += [("student", cfg.student, "student_train")] if any(m.method.trains for m in methods) else []
    for role, mcfg, split in trained:  # a tiny fraction of an epoch (1e-320) would still train one step, unsaid
        n = len(ctx.splits[split])
        per_epoch = math.ceil(n / mcfg.batch_size)
        if mcfg.epochs * per_epoch < 1:
            raise ValueError(
                f"{role}.epochs {mcfg.epochs!r} is {mcfg.epochs * per_epoch:.2g} of one optimizer step ({n} {split} "
                f"pairs, batch_size {mcfg.batch_size}: {per_epoch} steps per epoch); training needs at least one "
                f"step: set {role}.epochs to {1 / per_epoch:.3g} or more"
            )
    needs = [m for m in methods if m.method.needs_reference or m.method.needs_lm_head] or cfg.student.lora
    if not needs:
        return
    sf = ctx.student()
    for m in methods:
        if m.method.needs_reference:
            try:
                m.method.drift_layers(m, sf.anchor_layers)  # resolves the anchored layers: frozen ones are refused
            except ValueError as e:
                raise ValueError(f"method {m.display}: {e}") from None
        if m.method.needs_lm_head:
            from ..models.lm import lm_head_weight

            try:
                lm_head_weight(sf.loaded.backbone, untied_lm_head(sf.loaded.backbone))
            except (ValueError, ModelError) as e:
                raise ValueError(f"method {m.display} needs the student's language-model head: {e}") from None
    if cfg.student.lora:
        try:
            sf.new_model(0)
        except ValueError as e:
            raise ValueError(
                f"student.lora.target_modules {list(cfg.student.lora.target_modules)} on {cfg.student.name}: {e}"
            ) from None

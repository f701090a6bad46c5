"""Saving trained students and exporting them as plain Hugging Face reward models.

Two artifacts:

* **Trained state** (:mod:`w2s_shift.models.state`: ``save_trained_state`` / ``load_trained_state``): a
  safetensors file with only the parameters that train plus the scalar ``score`` head. The pipeline keeps one per
  student; an export starts from it.
* **Export** (:func:`export_reward_model`): a folder that ``transformers`` alone loads as
  ``AutoModelForSequenceClassification`` (num_labels = 1) and that gives the same rewards as the
  :class:`~w2s_shift.models.reward_model.RewardModel` it came from.

The pad-token trap (protocol.md, "Known traps"). Our reward is read at the last attention-mask position.
``*ForSequenceClassification`` in transformers reads the rightmost position whose input id is not
``config.pad_token_id``. With pad = eos (usual for Llama-family tokenizers) and a rendered sequence that
ends in eos (chat templates close every turn with it), transformers would read the token *before* the
final eos. The export therefore gives the tokenizer and the config a dedicated pad token
(:data:`EXPORT_PAD_TOKEN`), which no rendered text contains, and adds one embedding row for it when the
vocabulary has no spare row. Padding positions are masked out of attention, so that row never changes a
reward.

Only ``last`` pooling is exportable: BERT-style ``*ForSequenceClassification`` heads read [CLS] through a
pooler, and no transformers class averages over tokens, so mean-pooled (encoder) reward models stay
w2s-shift models.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..batching import pad_sequences
from ..data.render import RENDER_VERSION
from ..io import file_sha256, write_error, write_json_atomic, write_text_atomic
from .export_card import model_card
from .reward_model import PassThroughEmbeddings, RewardModel, last_token_index

EXPORT_PAD_TOKEN = "<|w2s_shift_reward_pad|>"
EXPORT_INFO = "w2s_shift_export.json"


# ---------------------------------------------------------------------------------------------------------
# Full backbone


def _unwrap_peft(bb: nn.Module) -> tuple:
    """(plain backbone, merged?): a deep copy with LoRA merged into the weights when ``bb`` is a peft model."""
    if hasattr(bb, "merge_and_unload") and hasattr(bb, "peft_config"):
        return copy.deepcopy(bb).merge_and_unload(), True
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # peft is a dependency, but a backbone without adapters needs no peft
        return bb, False
    if any(isinstance(m, BaseTunerLayer) for m in bb.modules()):
        raise ValueError(
            "the backbone holds peft adapter layers but is not a PeftModel (adapters injected in place); "
            "wrap it with peft.get_peft_model so that it can be merged"
        )
    return bb, False


def split_head_kind(backbone: nn.Module) -> str | None:
    """'decoder' or 'encoder' when ``backbone`` is a head made by
    :func:`~w2s_shift.models.reward_model.split_decoder`, else None."""
    if isinstance(getattr(backbone, "embed_tokens", None), nn.Identity) and hasattr(backbone, "layers"):
        return "decoder"
    if isinstance(getattr(backbone, "embeddings", None), PassThroughEmbeddings):
        return "encoder"
    return None


def full_backbone(model: RewardModel, base_backbone: nn.Module | None = None, n_top: int | None = None) -> nn.Module:
    """The student's backbone as one full ``AutoModel``, with LoRA merged and a split head put back.

    * peft-wrapped backbone: a deep copy is merged (``merge_and_unload``); the student is not changed.
    * split head (from ``split_decoder(base, n_top)``): a deep copy of ``base_backbone`` whose top
      ``n_top`` layers and final norm (decoders) or top ``n_top`` encoder layers (BERT-style) take the
      head's weights. full(input_ids) then equals head(inputs_embeds=trunk(input_ids)) (tested).
    * otherwise ``model.backbone`` itself is returned (not a copy): do not modify it.

    Args:
        model: a :class:`RewardModel`.
        base_backbone: the pretrained full model the head was split from (needed for a split head only).
        n_top: the number of head layers, checked against the head (default: the head's own count).

    Raises:
        ValueError: a split head without ``base_backbone``, a base of another family or size, or a wrong
            ``n_top``.
    """
    bb, _ = _unwrap_peft(model.backbone)
    kind = split_head_kind(bb)
    if kind is None:
        return bb
    if base_backbone is None:
        raise ValueError(
            "the student's backbone is a split head (its top layers only); pass base_backbone, the full "
            "pretrained model it was split from, to rebuild the full model"
        )
    base_backbone, _ = _unwrap_peft(base_backbone)
    if split_head_kind(base_backbone) is not None:
        raise ValueError("base_backbone is itself a split head; pass the full pretrained model")
    head_layers = list(bb.layers) if kind == "decoder" else list(bb.encoder.layer)
    k = len(head_layers)
    if n_top is not None and n_top != k:
        raise ValueError(f"n_top={n_top} but the student's head has {k} layers")
    mt_head = getattr(bb.config, "model_type", None)
    mt_base = getattr(getattr(base_backbone, "config", None), "model_type", None)
    if mt_head != mt_base:
        raise ValueError(f"base_backbone is a {mt_base!r} model, the student's head a {mt_head!r} one")
    base_layers = list(base_backbone.layers) if kind == "decoder" else list(base_backbone.encoder.layer)
    if k > len(base_layers):
        raise ValueError(f"the student's head has {k} layers, base_backbone only {len(base_layers)}")
    full = copy.deepcopy(base_backbone)
    dst = list(full.layers) if kind == "decoder" else list(full.encoder.layer)
    cut = len(dst) - k
    try:
        for i, layer in enumerate(head_layers):
            dst[cut + i].load_state_dict(layer.state_dict())
        if kind == "decoder":
            full.norm.load_state_dict(bb.norm.state_dict())
    except RuntimeError as e:
        raise ValueError(f"base_backbone does not match the student's head (another size?): {str(e)[:400]}") from None
    return full


# ---------------------------------------------------------------------------------------------------------
# Export


@contextlib.contextmanager
def _quiet_progress():
    """Silence transformers' progress bars (saving/loading shards) for the duration, then restore them."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _no_init():
    try:
        from transformers.initialization import no_init_weights

        return no_init_weights()
    except ImportError:
        return contextlib.nullcontext()


def _our_rewards(full: nn.Module, score: nn.Module, seqs: list, pad_id: int) -> torch.Tensor:
    """Rewards by the RewardModel rule (last attention-mask position), right padding; (N,) float32."""
    ids, am = pad_sequences(seqs, pad_id)
    dev = next(full.parameters()).device
    with torch.no_grad():
        h = full(input_ids=ids.to(dev), attention_mask=am.to(dev), use_cache=False).last_hidden_state
        pooled = h[torch.arange(len(seqs), device=h.device), last_token_index(am.to(dev))]
        return score(pooled.float().to(score.weight.device)).squeeze(-1).float().cpu()


def _hf_rewards(cls_model: nn.Module, seqs: list, pad_id: int) -> torch.Tensor:
    """Rewards by transformers' own pooling (rightmost non-pad id), right padding; (N,) float32."""
    ids, am = pad_sequences(seqs, pad_id)
    with torch.no_grad():
        return cls_model(input_ids=ids, attention_mask=am).logits[:, 0].float().cpu()


def _probe_sequences(tok, eos_id: int | None) -> list:
    """Short sequences for the export check: ending in eos, with an eos inside, of different lengths."""
    a = tok("Human: Is this a probe?\n\nAssistant: Yes, it is.", add_special_tokens=True)["input_ids"]
    b = tok("Human: Short.\n\nAssistant: Ok", add_special_tokens=True)["input_ids"]
    seqs = [list(a), list(b), list(a[:3])]
    if eos_id is not None:
        seqs = [a + [eos_id], b + [eos_id] + b + [eos_id], list(a[:3]) + [eos_id], b]
    return [s for s in seqs if s]


def export_reward_model(
    model: RewardModel,
    tokenizer,
    out_dir: str | os.PathLike,
    base_backbone: nn.Module | None = None,
    n_top: int | None = None,
    dtype: torch.dtype = torch.float32,
    metadata: dict | None = None,
    overwrite: bool = True,
    verify: bool = True,
    max_length: int | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face ``AutoModelForSequenceClassification`` folder (num_labels = 1).

    The folder holds ``config.json`` (``architectures`` = e.g. ``["LlamaForSequenceClassification"]``,
    ``pad_token_id`` = the dedicated pad), ``model.safetensors``, the tokenizer files (with the dedicated pad
    token :data:`EXPORT_PAD_TOKEN`), ``README.md`` (a model card; ``metadata`` says how it was trained) and
    ``w2s_shift_export.json``. Loaded by ``transformers`` alone, it gives the rewards of ``model`` on the
    same token ids (checked before the folder is moved into place when ``verify``, float32 only). It is
    written to a temporary folder beside ``out_dir`` and renamed into place.

    Args:
        model: a :class:`RewardModel` with ``last`` pooling; its backbone may be a split head
            (then give ``base_backbone``) or peft-wrapped (merged).
        tokenizer: the fast tokenizer the student was trained with (not modified).
        out_dir: the folder to create.
        base_backbone, n_top: see :func:`full_backbone`.
        dtype: weights' dtype in the export (float32 reproduces rewards to ~1e-6; bfloat16 halves the size).
        metadata: {name: value} for the model card (method, teacher, source dataset, seed ...).
        overwrite: replace an existing ``out_dir`` (default: yes; the new folder is complete before the old one
            goes, so a rerun of a killed pipeline stage simply writes it again).
        verify: load the written folder with transformers and compare rewards on probe sequences.
        max_length: the tokens per sequence the student was trained at (recorded in ``w2s_shift_export.json``
            with the rendering version :data:`w2s_shift.data.render.RENDER_VERSION`; ``w2s-shift score`` uses it
            unless told otherwise). None: not recorded.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: mean pooling, a model family whose sequence-classification class is not a bias-free
            ``score`` over a base model, a split head without ``base_backbone``, or a failed check.
        FileExistsError: ``out_dir`` exists and not ``overwrite``.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if getattr(model, "pooling", "last") != "last":
        raise ValueError(
            f"only 'last' pooling can be exported: transformers' sequence-classification heads read one token "
            f"(decoders: the last non-pad token; BERT-style encoders: [CLS] through a pooler), none averages over "
            f"tokens, so a {model.pooling!r}-pooled reward model would score differently"
        )
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True to replace it)")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("export needs the fast tokenizer the student was trained with")
    full = full_backbone(model, base_backbone, n_top)
    config = _plain_config(full.config)
    mt = getattr(config, "model_type", "?")
    try:
        cls = AutoModelForSequenceClassification._model_mapping[type(config)]
    except KeyError:
        raise ValueError(
            f"model type {mt!r} has no AutoModelForSequenceClassification class in this transformers"
        ) from None
    prefix = getattr(cls, "base_model_prefix", None)

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"pad_token": EXPORT_PAD_TOKEN})
    pad_id = tok.convert_tokens_to_ids(EXPORT_PAD_TOKEN)
    config.num_labels = 1
    config.id2label, config.label2id = {0: "reward"}, {"reward": 0}
    config.architectures = [cls.__name__]
    config.use_cache = False  # (pad_token_id is set below, once the embedding has a row for it)
    with _no_init():
        cls_model = cls(config)
    base = getattr(cls_model, prefix or "", None)
    score = getattr(cls_model, "score", None)
    if (
        not isinstance(base, nn.Module)
        or type(base) is not type(full)
        or not isinstance(score, nn.Linear)
        or score.bias is not None
        or score.out_features != 1
    ):
        raise ValueError(
            f"{cls.__name__} is not a bias-free `score` head over {type(full).__name__}; export supports "
            "decoder families whose sequence-classification head reads the last non-pad token "
            "(Llama, Qwen2, Qwen3, Mistral, ...)"
        )
    try:
        base.load_state_dict(full.state_dict(), strict=True)
    except RuntimeError as e:
        raise ValueError(f"cannot copy the backbone into {cls.__name__}: {str(e)[:400]}") from None
    with torch.no_grad():
        score.weight.copy_(model.score.weight.detach().to(score.weight.device, score.weight.dtype))
    emb = cls_model.get_input_embeddings()
    if pad_id >= emb.num_embeddings:
        n_old = emb.num_embeddings
        cls_model.resize_token_embeddings(pad_id + 1, mean_resizing=False)
        with torch.no_grad():
            cls_model.get_input_embeddings().weight[n_old:] = 0.0
    for c in {
        id(cls_model.config): cls_model.config,
        id(cls_model.config.get_text_config()): cls_model.config.get_text_config(),
    }.values():
        c.pad_token_id = pad_id
    cls_model = cls_model.to(dtype).eval()

    info = {
        "format": "w2s-shift reward model export",
        "version": 1,
        "architecture": cls.__name__,
        "model_type": mt,
        "num_labels": 1,
        "pooling": "last real token (transformers: rightmost non-pad id)",
        "pad_token": EXPORT_PAD_TOKEN,
        "pad_token_id": pad_id,
        "original_pad_token": tokenizer.pad_token,
        "original_pad_token_id": tokenizer.pad_token_id,
        "embedding_rows_added": max(
            0, cls_model.get_input_embeddings().num_embeddings - full.get_input_embeddings().num_embeddings
        ),
        "rendering": "chat_template" if getattr(tokenizer, "chat_template", None) else "plain_transcript",
        "dtype": str(dtype).replace("torch.", ""),
        "metadata": {str(k): str(v) for k, v in (metadata or {}).items()},
        "max_length": int(max_length) if max_length is not None else None,
        "render_version": RENDER_VERSION,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        with _quiet_progress():
            _saving(cls_model.save_pretrained, str(tmp), path=out_dir / "model.safetensors")
            _saving(tok.save_pretrained, str(tmp), path=out_dir / "tokenizer.json")
            _record_dtype(tmp / "config.json", info["dtype"])
            write_text_atomic(tmp / "README.md", model_card(info, metadata))
            info["files"] = _file_sums(tmp)  # what export_intact checks before an export is kept
            write_json_atomic(tmp / EXPORT_INFO, info)
            if verify:
                _verify(tmp, full, model.score, tokenizer, dtype, AutoModelForSequenceClassification, AutoTokenizer)
        del cls_model
        _umask_modes(tmp)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


#: How a writer outside Python (safetensors, tokenizers: their Rust IO errors) reports a full disk, a quota or the
#: file size limit: the OS error code in its message, e.g. "IoError(Os { code: 28, kind: StorageFull, ... })".
_SPACE_ERRORS = re.compile(r"code: (28|122|27)\b|StorageFull|QuotaExceeded|FileTooLarge|No space left|too large")


def _saving(write, *args, path: Path) -> None:
    """Run ``write(*args)`` (a library's save), turning a failure for want of space into an OSError naming ``path``
    and the free space left (:func:`w2s_shift.io.write_error`), as every result file's writer does.

    Raises:
        OSError: ENOSPC, EDQUOT or EFBIG, from the OS or from a library that reports it in its message."""
    import errno

    try:
        write(*args)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise write_error(e, path) from None
        raise
    except Exception as e:
        m = _SPACE_ERRORS.search(str(e))
        if m is None:
            raise
        code = {"27": errno.EFBIG, "122": errno.EDQUOT, "FileTooLarge": errno.EFBIG, "too large": errno.EFBIG}
        num = code.get(m.group(1) or m.group(0), errno.ENOSPC)
        raise write_error(OSError(num, os.strerror(num)), path) from None


def _plain_config(config):
    """A copy of a backbone's config without what the export does not hold: a ``quantization_config`` (a GGUF
    source's ``quant_method: gguf`` and file name, or any other: the exported weights are plain floats, and loaders
    that read it would treat them as quantized)."""
    config = copy.deepcopy(config)
    for name in ("quantization_config", "_pre_quantization_dtype"):
        if name in config.__dict__:
            delattr(config, name)
    return config


def _record_dtype(config_json: Path, dtype: str) -> None:
    """Write the weights' dtype into config.json under both names loaders read (``dtype``, and ``torch_dtype`` for
    stacks before transformers 5), with no quantization config left.

    Raises:
        OSError: config.json cannot be read or written (its path named)."""
    cfg = json.loads(config_json.read_text(encoding="utf-8"))
    cfg.pop("quantization_config", None)
    cfg["dtype"] = cfg["torch_dtype"] = dtype
    write_json_atomic(config_json, cfg)


def _umask_modes(folder: Path) -> None:
    """Give ``folder`` and its files the modes a plain ``mkdir`` and ``open`` give under the user's umask (the
    temporary folder is created 0700 and some writers make their files 0600), so an export can be shared."""
    mask = os.umask(0)
    os.umask(mask)
    for f in folder.rglob("*"):
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def _verify(folder: Path, full: nn.Module, score: nn.Module, tokenizer, dtype, auto_cls, auto_tok) -> None:
    """Load ``folder`` as a user would and compare its rewards with the student's on probe sequences."""
    try:
        loaded = auto_cls.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False).eval()
        tok = auto_tok.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:
        raise ValueError(
            f"the exported folder does not load with transformers: {type(e).__name__}: {str(e)[:400]}"
        ) from None
    if tok.pad_token != EXPORT_PAD_TOKEN or loaded.config.pad_token_id != tok.pad_token_id:
        raise ValueError(
            f"export check: pad token {tok.pad_token!r} (id {tok.pad_token_id}), config pad_token_id "
            f"{loaded.config.pad_token_id}; expected {EXPORT_PAD_TOKEN!r} in both"
        )
    seqs = _probe_sequences(tokenizer, tokenizer.eos_token_id)
    ours = _our_rewards(full, score, seqs, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    theirs = _hf_rewards(loaded, seqs, tok.pad_token_id)
    if not torch.isfinite(theirs).all():
        raise ValueError("export check: the exported model gives non-finite rewards")
    if dtype == torch.float32:
        diff = (ours - theirs).abs().max().item()
        if diff > 1e-4 * max(1.0, ours.abs().max().item()):
            raise ValueError(
                f"export check: transformers' rewards differ from the student's by up to {diff:.3g} "
                f"(ours {ours.tolist()}, exported {theirs.tolist()})"
            )


def _file_sums(folder: Path) -> dict:
    """{path relative to ``folder``: SHA-256} of every file in it but ``w2s_shift_export.json``."""
    return {
        str(p.relative_to(folder)): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != EXPORT_INFO
    }


def export_intact(folder: str | os.PathLike, info: dict) -> bool:
    """Whether an exported folder still holds exactly the files its ``w2s_shift_export.json`` recorded, byte for
    byte (False for an export written before the files were recorded: it is redone)."""
    files = info.get("files")
    return isinstance(files, dict) and bool(files) and _file_sums(Path(folder)) == files


def read_export_info(folder: str | os.PathLike) -> dict | None:
    """The ``w2s_shift_export.json`` of an exported folder, or None for a folder exported elsewhere."""
    p = Path(folder) / EXPORT_INFO
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

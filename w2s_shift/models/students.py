"""A trainable reward model from a pretrained backbone: a copy of the backbone with a fresh scalar head, its frozen
and trainable parts, dropout, gradient checkpointing and LoRA adapters as the model config asks (one per student:
every seed, method and lambda starts from the same pretrained weights)."""

from __future__ import annotations

import copy

import torch

from .reward_model import RewardModel, disable_dropout


def freeze_backbone(model: RewardModel, trainable_layers: int | None, freeze_embeddings: bool) -> None:
    """Freeze the backbone except its top ``trainable_layers`` layers (and final norm); the head trains."""
    bb = model.backbone
    if trainable_layers is not None:
        layers = getattr(bb, "layers", None)
        if layers is None and hasattr(bb, "encoder"):
            layers = getattr(bb.encoder, "layer", None)
        if layers is None:
            raise ValueError(f"{type(bb).__name__}: cannot find its layers to train only the top {trainable_layers}")
        for p in bb.parameters():
            p.requires_grad_(False)
        for layer in list(layers)[-trainable_layers:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        for name in ("norm", "final_layernorm", "ln_f"):
            if isinstance(getattr(bb, name, None), torch.nn.Module):
                for p in getattr(bb, name).parameters():
                    p.requires_grad_(True)
    if freeze_embeddings:
        emb = bb.get_input_embeddings() if hasattr(bb, "get_input_embeddings") else None
        if isinstance(emb, torch.nn.Module):
            for p in emb.parameters():
                p.requires_grad_(False)


def trainable_model(
    base: torch.nn.Module,
    hidden_size: int,
    mcfg,
    seed: int,
    layer_offset: int = 0,
    cached_trunk: bool = False,
    n_layers: int | None = None,
) -> RewardModel:
    """A student to train: ``base`` copied under a new head (seeded: every method starts from the same head init).

    Args:
        base: the pretrained backbone, or its top blocks when the frozen trunk's states are cached (never changed).
        hidden_size: the head's input width. mcfg: the model config (``trainable_layers``, ``pooling``,
            ``disable_dropout``, ``freeze_embeddings``, ``gradient_checkpointing``, ``lora``).
        seed: transformers' seed for the head. layer_offset: blocks below ``base`` (cached trunk).
        cached_trunk: ``base`` is already only the trainable top (nothing to freeze).
        n_layers: blocks of the whole model (LoRA on the top ``trainable_layers`` of them).

    Raises:
        ValueError: a backbone whose layers cannot be found to train only the top ones.
    """
    import transformers

    transformers.set_seed(seed)
    model = RewardModel(copy.deepcopy(base), hidden_size, pooling=mcfg.pooling, layer_offset=layer_offset)
    if mcfg.disable_dropout:
        disable_dropout(model)
    if not cached_trunk:
        freeze_backbone(model, mcfg.trainable_layers, mcfg.freeze_embeddings)
    if mcfg.gradient_checkpointing:
        model.activation_checkpointing_enable()
    if mcfg.lora:
        from peft import LoraConfig, get_peft_model

        lc = mcfg.lora
        top = None
        if mcfg.trainable_layers and not cached_trunk:  # adapters on the top layers only
            top = list(range(n_layers - mcfg.trainable_layers, n_layers))
        # the head is outside the adapter-wrapped backbone: it trains in full and is saved with the adapters
        # (save_trained_state), so the "untrained, unsaved score head" trap of modules_to_save cannot occur
        model.backbone = get_peft_model(
            model.backbone,
            LoraConfig(
                r=lc.r,
                lora_alpha=lc.alpha,
                lora_dropout=lc.dropout,
                target_modules=list(lc.target_modules),
                layers_to_transform=top,
            ),
        )
        for p in model.score.parameters():
            p.requires_grad_(True)
    return model

"""Reward model: a Hugging Face backbone plus a scalar head read at the last real token.

The last real token is found from the attention mask (the last position whose mask is 1), never by
searching for the pad id: Llama-family tokenizers often set pad = eos, and an eos inside the prompt would
otherwise be read for both chosen and rejected (protocol.md, "Known traps").

Partial fine-tuning on a CPU (or for speed): for decoder families whose layers take ``inputs_embeds``
unchanged (Llama, Qwen2, Qwen3, Mistral), :func:`split_decoder` cuts a backbone into a frozen *trunk*
(embeddings + the first L-k layers) and a trainable *head* (the top k layers + final norm). The trunk's
output is computed once per sequence and reused by every model trained from the same checkpoint; the head
given that output reproduces the full model exactly (tested).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..device import autocast

SPLITTABLE = ("llama", "qwen2", "qwen3", "mistral")
SPLITTABLE_ENCODERS = ("bert", "roberta", "xlm-roberta", "electra")


class PassThroughEmbeddings(nn.Module):
    """Stands in for an encoder's embedding block in a split head: returns ``inputs_embeds`` unchanged."""

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        return inputs_embeds


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position whose attention mask is 1, per row.

    Args:
        attention_mask: (N, T) of 0/1 (left or right padding).

    Returns:
        (N,) long tensor of positions (0 for an all-zero row).
    """
    t = attention_mask.shape[1]
    pos = torch.arange(1, t + 1, device=attention_mask.device)
    return ((attention_mask > 0).long() * pos).argmax(-1)


class RewardModel(nn.Module):
    """r(x, y) = w . h_last(x, y): backbone + bias-free linear head read at the last real token.

    Args:
        backbone: a Hugging Face base model (``AutoModel``) returning ``last_hidden_state`` (N, T, H),
            or a head produced by :func:`split_decoder` that takes ``inputs_embeds``.
        hidden_size: H.
        pooling: ``"last"`` (last real token; default and the protocol's rule) or ``"mean"`` (mean over
            real tokens, an option for encoders).
    """

    def __init__(
        self,
        backbone: nn.Module,
        hidden_size: int,
        pooling: str = "last",
        init_std: float = 0.02,
        layer_offset: int = 0,
    ):
        super().__init__()
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")
        self.backbone = backbone
        self.pooling = pooling
        self.layer_offset = layer_offset  # blocks below the backbone (the cached trunk of a split head)
        self.score = nn.Linear(hidden_size, 1, bias=False)
        nn.init.normal_(self.score.weight, std=init_std)

    def forward(
        self,
        attention_mask: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_layers: list | None = None,
        position_ids: torch.Tensor | None = None,
        last_index: torch.Tensor | None = None,
        **backbone_kwargs,
    ) -> tuple:
        """Rewards and hidden states, from padded rows or from padding-free packed rows.

        Args:
            attention_mask: (N, T) 0/1 for padded rows; None for packed rows.
            input_ids: (N, T) token ids, or
            inputs_embeds: (N, T, H) trunk output (for a split head).
            output_layers: 1-based global block indices whose outputs to return (see :func:`select_layers`);
                None returns the last layer's output only.
            position_ids: (R, L) packed rows only: positions restarting at 0 at each sequence's first token
                (see :func:`pack_sequences`); transformers then builds a block-diagonal causal mask.
            last_index: (S,) packed rows only: flat index row * L + position of each sequence's last token;
                the rewards come out in this order.

        Returns:
            (rewards (N,) or (S,) float32, hidden): hidden is (N, T, H) (packed: (R, L, H)), the last layer's
            output the head reads, or with ``output_layers`` a list of those, one per requested block.

        Raises:
            ValueError: packed rows with mean pooling, or neither an attention mask nor a packed layout.
        """
        packed = last_index is not None
        if packed and self.pooling != "last":
            raise ValueError("packed rows need pooling 'last' (mean pooling reads the attention mask)")
        if not packed and attention_mask is None:
            raise ValueError("RewardModel needs an attention_mask (padded rows) or last_index (packed rows)")

        def run(output_hidden_states: bool):
            return self.backbone(
                input_ids=input_ids,
                inputs_embeds=inputs_embeds,
                use_cache=False,
                attention_mask=None if packed else attention_mask,
                output_hidden_states=output_hidden_states,
                **({"position_ids": position_ids} if position_ids is not None else {}),
                **backbone_kwargs,
            )

        if output_layers is None:
            out, states = run(False), None
        else:
            out, states = layer_states(run, self.backbone, output_layers, self.layer_offset)
        hidden = out.last_hidden_state
        if packed:
            pooled = hidden.reshape(-1, hidden.shape[-1])[last_index]
        elif self.pooling == "last":
            idx = last_token_index(attention_mask)
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
        else:
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        # the head runs in float32 even under autocast: bfloat16 rewards would create ties (counted wrong). Its
        # weight is cast too: FSDP2's bf16 MixedPrecisionPolicy hands the forward a bfloat16 copy of it, and
        # DeepSpeed's bf16 engine stores it in bfloat16 (module.bfloat16()); the gradient flows back through the cast.
        # A copy, not the (N, 1) output's view: FSDP2 hooks a module's outputs for backward and warns on views.
        with autocast(pooled.device.type, enabled=False):
            rewards = F.linear(pooled.float(), self.score.weight.float()).squeeze(-1).clone()
        if output_layers is not None:
            return rewards, states
        return rewards, hidden

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Gradient (activation) checkpointing of the backbone's blocks (transformers'
        ``activation_checkpointing_enable``; the Trainer calls this name too): in training, each block keeps only its
        input and recomputes its activations in the backward pass. Non-reentrant by default
        (``use_reentrant: False``), so frozen embeddings, cached trunk states, LoRA and the hidden states ANCHOR
        reads need no input gradients. The head is a single linear layer and is not checkpointed.

        Raises:
            ValueError: a backbone without transformers' checkpointing (not a ``PreTrainedModel``)."""
        bb = self.backbone
        base = bb.get_base_model() if hasattr(bb, "get_base_model") else bb
        kwargs = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(kwargs, every_n_layers=every_n_layers, offload=offload)
        elif hasattr(base, "gradient_checkpointing_enable") and every_n_layers == 1 and not offload:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # releases before the rename
        else:
            raise ValueError(f"{type(base).__name__} does not support gradient checkpointing (not a PreTrainedModel)")

    gradient_checkpointing_enable = activation_checkpointing_enable  # the older transformers name


def pack_sequences(lengths: list, capacity: int) -> list:
    """First-fit-decreasing packing of sequences into rows of at most ``capacity`` tokens.

    Args:
        lengths: S sequence lengths in tokens, each <= capacity.
        capacity: tokens per row (the trainer uses the batch's longest sequence, so no row is wider than the
            padded batch would be and attention never costs more than with padding).

    Returns:
        rows: lists of sequence indices (longest first inside a row); every index appears exactly once.

    Raises:
        ValueError: a sequence longer than ``capacity``.
    """
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit rows of {capacity}")
    rows: list = []
    room: list = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for r in range(len(rows)):
            if room[r] >= lengths[i]:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def packed_positions(rows: list, lengths: list) -> tuple:
    """Layout of packed rows: ``position_ids`` (R, L) restarting at 0 for each sequence, ``starts`` (S, 2) of
    (row, first position) per sequence and ``last_index`` (S,) = row * L + last position, with L the widest
    row. A row's unused tail gets positions 0, 1, ... of its own (a dummy segment no sequence attends to)."""
    width = max(sum(lengths[i] for i in r) for r in rows)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    starts = torch.zeros((len(lengths), 2), dtype=torch.long)
    last = torch.zeros(len(lengths), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = lengths[i]
            pos[r, at : at + n] = torch.arange(n)
            starts[i, 0], starts[i, 1] = r, at
            last[i] = r * width + at + n - 1
            at += n
        if at < width:
            pos[r, at:] = torch.arange(width - at)
    return pos, starts, last


def can_pack(backbone: nn.Module, pooling: str) -> bool:
    """Whether padding-free packing is exact for this backbone: a causal decoder whose transformers attention
    builds a block-diagonal mask from restarting ``position_ids`` (Llama, Qwen2, Qwen3, Mistral; also under
    LoRA) and last-token pooling. Encoders (bidirectional) are padded: whether their mask follows restarting
    positions depends on the transformers release, and :func:`~w2s_shift.training.check_packing` would have to
    prove it per run."""
    cfg = getattr(backbone, "config", None)
    return pooling == "last" and getattr(cfg, "model_type", None) in SPLITTABLE


def _is_dropout_name(name: str) -> bool:
    return "dropout" in name or name.endswith("pdrop")


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout probability in ``model`` to 0, as TRL's ``RewardConfig(disable_dropout=True)`` does by
    default for reward models: ``nn.Dropout`` modules, float attributes of modules named like a dropout
    probability (``attention_dropout`` of Llama-style attention, BART/OPT's ``dropout`` and
    ``activation_dropout``, GPT-2's ``attn_pdrop``) and the same fields of the model configs that some families
    read at run time (Falcon/Bloom ``hidden_dropout``). On a CPU it also matters for speed: BERT-style
    attention-probability dropout draws a random mask of (N, heads, T, T) per layer and forces the unfused
    attention path (MiniLM-L6 teacher step, 32 x 256 tokens, top 3 layers: 1.64 s with dropout, 0.63 s without).

    Returns:
        the number of dropout sites (modules, attributes, config fields) switched off.
    """
    n = 0
    configs = {}
    for mod in model.modules():
        if isinstance(mod, nn.Dropout) and mod.p > 0:
            mod.p = 0.0
            n += 1
        for name, value in list(vars(mod).items()):
            if type(value) is float and value > 0 and _is_dropout_name(name):
                setattr(mod, name, 0.0)
                n += 1
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            configs[id(cfg)] = cfg
    for cfg in configs.values():
        for name, value in list(vars(cfg).items()):
            if type(value) is float and value > 0 and _is_dropout_name(name):
                setattr(cfg, name, 0.0)
                n += 1
    return n


def num_blocks(backbone: nn.Module) -> int:
    """Number of transformer blocks of a (possibly split) backbone."""
    cfg = getattr(backbone, "config", None)
    n = getattr(cfg, "num_hidden_layers", None)
    if n is None:
        raise ValueError(f"{type(backbone).__name__}: cannot tell its number of layers")
    return int(n)


def select_layers(out, layers: list, offset: int = 0) -> list:
    """Pick block outputs from a Hugging Face output with ``hidden_states`` (output_hidden_states=True).

    Block k (1-based, global) is ``hidden_states[k - offset]``: hidden_states[0] is the input of the first block
    of this module and, as in transformers, the last entry is the final normalized output (what the reward head
    reads), so "the last layer" means the normalized output.

    Args:
        out: model output with ``hidden_states``, a tuple of (N, T, H).
        layers: 1-based global block indices.
        offset: number of blocks below this module (a split head's trunk).

    Raises:
        ValueError: a block that is not in this module (e.g. inside a frozen, cached trunk).
    """
    hs = out.hidden_states
    n = len(hs) - 1
    res = []
    for k in layers:
        j = k - offset
        if not 1 <= j <= n:
            raise ValueError(
                f"layer {k} is not a trainable block (blocks {offset + 1}..{offset + n}); "
                "anchor only layers that train (raise trainable_layers)"
            )
        res.append(hs[j])
    return res


def block_list(module: nn.Module) -> nn.ModuleList | None:
    """The transformer blocks of a backbone (``layers`` of a decoder, ``encoder.layer`` of a BERT-style encoder),
    also under a peft wrapper or a sharding holder; None when there is not exactly one such list."""
    lists = [
        m
        for name, m in module.named_modules()
        if isinstance(m, nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_LISTS
    ]
    return lists[0] if len(lists) == 1 else None


BLOCK_LISTS = ("layers", "layer")


def layer_states(forward, module: nn.Module, layers: list, offset: int = 0) -> tuple:
    """Run ``forward(output_hidden_states)`` and return (its output, the states of ``layers``), as
    :func:`select_layers` would read them from ``hidden_states``, holding only those.

    With gradients off (a reference's forward), ``output_hidden_states=True`` would keep every block's output
    alive until the end of the forward (33 states of (N, T, H) for an 8B model: ~16 GiB at 16 pairs x 1024 tokens in
    float32), where only the anchored ones are needed. There, forward hooks on the requested blocks keep their outputs
    (block j's output is ``hidden_states[j]``; the last block's is read from ``last_hidden_state``, the final
    normalized output, as transformers' last entry is). With gradients on, the blocks' outputs are saved for the
    backward anyway, and ``output_hidden_states`` is used as it is.

    Args:
        forward: called once with ``output_hidden_states`` (bool); returns a Hugging Face output.
        module: the backbone ``forward`` runs (its blocks are hooked). layers, offset: as :func:`select_layers`.

    Returns:
        (output, list of K tensors (N, T, H)).

    Raises:
        ValueError: a layer that is not in this module (as :func:`select_layers`).
    """
    blocks = block_list(module) if not torch.is_grad_enabled() else None
    if blocks is None:
        out = forward(True)
        return out, select_layers(out, layers, offset)
    n = len(blocks)
    local = [k - offset for k in layers]
    bad = [k for k, j in zip(layers, local) if not 1 <= j <= n]
    if bad:
        raise ValueError(
            f"layer {bad[0]} is not a trainable block (blocks {offset + 1}..{offset + n}); "
            "anchor only layers that train (raise trainable_layers)"
        )
    kept: dict = {}

    def keep(j):
        def hook(_mod, _args, output):
            kept[j] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [blocks[j - 1].register_forward_hook(keep(j)) for j in sorted(set(local)) if j < n]
    try:
        out = forward(False)
    finally:
        for h in handles:
            h.remove()
    return out, [out.last_hidden_state if j == n else kept[j] for j in local]


def resolve_layer_spec(spec, n_layers: int) -> list:
    """Layer spec -> 1-based block indices: 'last' -> [L]; 'middle' -> [round(L/2), round(3L/4)] (the paper's
    50% and 75% depth, Le et al. 2026); an explicit list is checked against 1..L.

    Raises:
        ValueError: an index outside 1..L.
    """
    if spec == "last":
        return [n_layers]
    if spec == "middle":
        return sorted({max(1, int(n_layers * 0.5 + 0.5)), max(1, int(n_layers * 0.75 + 0.5))})
    bad = layers_outside(spec, n_layers)
    if bad:
        raise ValueError(f"anchor layers {bad} outside 1..{n_layers}")
    return sorted(set(spec))


def layers_outside(spec, n_layers: int) -> list:
    """The explicit block indices of a layer spec outside 1..L ([] for 'last' and 'middle', which always fit): the
    one depth check, run before a model loads (from a known depth) and when it resolves the spec."""
    return [] if spec in ("last", "middle") else [k for k in spec if not 1 <= k <= n_layers]


def _layers(backbone: nn.Module) -> nn.ModuleList:
    if not hasattr(backbone, "layers"):
        raise ValueError(
            f"{type(backbone).__name__} has no .layers; partial fine-tuning by trunk caching needs a decoder"
        )
    return backbone.layers


def can_split(backbone: nn.Module) -> bool:
    """Whether :func:`split_decoder` supports this backbone: a decoder whose inputs_embeds go straight into
    layer 0, or a BERT-style encoder (embeddings + encoder.layer)."""
    mt = getattr(getattr(backbone, "config", None), "model_type", None)
    if mt in SPLITTABLE:
        return hasattr(backbone, "layers")
    return (
        mt in SPLITTABLE_ENCODERS
        and hasattr(backbone, "embeddings")
        and hasattr(getattr(backbone, "encoder", None), "layer")
    )


def _split_encoder(backbone: nn.Module, n_top: int) -> tuple:
    layers = list(backbone.encoder.layer)
    if not 1 <= n_top <= len(layers):
        raise ValueError(f"trainable_layers must be in 1..{len(layers)}, got {n_top}")
    cut = len(layers) - n_top

    def _sliced(lo: int, hi: int, embeddings: nn.Module) -> nn.Module:
        m = copy.copy(backbone)
        m._modules = dict(backbone._modules)
        m.config = copy.deepcopy(backbone.config)
        m.encoder = copy.copy(backbone.encoder)
        m.encoder._modules = dict(backbone.encoder._modules)
        m.encoder.layer = nn.ModuleList(copy.deepcopy(layers[lo:hi]))
        m.config.num_hidden_layers = hi - lo
        m.embeddings = embeddings
        m.pooler = None
        return m

    trunk = _sliced(0, cut, copy.deepcopy(backbone.embeddings))  # own copy: casting the trunk leaves the original alone
    head = _sliced(cut, len(layers), PassThroughEmbeddings())
    for p in trunk.parameters():
        p.requires_grad_(False)
    return trunk, head


def split_decoder(backbone: nn.Module, n_top: int) -> tuple:
    """Split a backbone into (trunk, head) at layer L - n_top (decoders; BERT-style encoders too, whose head
    gets a pass-through embedding block).

    trunk(input_ids, attention_mask).last_hidden_state is the input of layer L - n_top (no final norm);
    head(inputs_embeds=that, attention_mask) equals backbone(input_ids, attention_mask) (same positions,
    same causal and padding mask). Both are deep copies; the original is not modified.

    Raises:
        ValueError: unsupported model family, or n_top not in 1..L.
    """
    if can_split(backbone) and backbone.config.model_type in SPLITTABLE_ENCODERS:
        return _split_encoder(backbone, n_top)
    if not can_split(backbone):
        raise ValueError(
            f"trunk caching supports model types {SPLITTABLE + SPLITTABLE_ENCODERS}, "
            f"not {getattr(backbone.config, 'model_type', '?')!r}"
        )
    n_layers = len(_layers(backbone))
    if not 1 <= n_top <= n_layers:
        raise ValueError(f"trainable_layers must be in 1..{n_layers}, got {n_top}")
    cut = n_layers - n_top

    def _sliced(lo: int, hi: int, keep_norm: bool) -> nn.Module:
        m = copy.copy(backbone)  # shallow: share nothing mutable below
        m._modules = dict(backbone._modules)
        m.config = copy.deepcopy(backbone.config)
        m.layers = nn.ModuleList(copy.deepcopy(list(backbone.layers)[lo:hi]))
        m.config.num_hidden_layers = hi - lo
        m.config.use_cache = False
        for i, layer in enumerate(m.layers):  # cache slots are indexed by position in the slice
            if hasattr(getattr(layer, "self_attn", None), "layer_idx"):
                layer.self_attn.layer_idx = i
        if getattr(m.config, "layer_types", None):
            m.config.layer_types = list(backbone.config.layer_types)[lo:hi]
        if not keep_norm:
            m.norm = nn.Identity()
        else:
            m.norm = copy.deepcopy(backbone.norm)
        return m

    trunk = _sliced(0, cut, keep_norm=False)
    head = _sliced(cut, n_layers, keep_norm=True)
    # the slices share no module with the original (casting the trunk to bfloat16 must not cast the original's
    # embeddings): every remaining child (embeddings, rotary embedding) is copied
    for m in (trunk, head):
        for name, child in list(m._modules.items()):
            if name not in ("layers", "norm") and child is backbone._modules.get(name):
                m._modules[name] = copy.deepcopy(child)
    head.embed_tokens = nn.Identity()  # never used: the head takes inputs_embeds
    for p in trunk.parameters():
        p.requires_grad_(False)
    return trunk, head

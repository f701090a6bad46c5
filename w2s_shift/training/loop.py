"""Training reward models on the Hugging Face Trainer, each on its method's objective (gold or soft labels, ANCHOR).

:func:`train_pairs` runs :class:`~w2s_shift.training.trainer.PairTrainer` (which overrides ``compute_loss``) on
batches from :class:`~w2s_shift.training.collator.PairCollator` (chosen and rejected of a pair in one forward) in
length-grouped order (:class:`~w2s_shift.training.collator.LengthGroupedPairSampler`), either padded to the batch's
longest sequence or, for causal decoders, packed without padding (``packing``; rows of several sequences whose
``position_ids`` restart, so attention stays within each sequence), so no compute goes to padding on real
variable-length data. It resumes from the last complete checkpoint.

Inputs are either token ids (full model) or cached trunk states (partial fine-tuning of the top layers of
a decoder, see :func:`w2s_shift.models.reward_model.split_decoder`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import torch

from ..batching import module_device
from ..device import autocast
from ..distributed import set_layer_wrap_classes
from ..models.reward_model import can_pack, last_token_index
from .args import PairTrainingArguments
from .collator import PairCollator, PairDataset
from .trainer import PairTrainer


def make_reference(backbone: torch.nn.Module, layer_offset: int = 0, autocast_bf16: bool = False) -> torch.nn.Module:
    """A frozen copy of ``backbone`` (eval mode, no gradients): ANCHOR's reference, taken before training.

    Args:
        layer_offset: blocks below it (a split head's cached trunk), for selecting anchored layers.
        autocast_bf16: the reference will run under bfloat16 autocast (as the trainer runs it when ``bf16``):
            its ``nn.Linear`` weights are then stored in bfloat16 once. Autocast would round them to bfloat16
            at every forward anyway, so the outputs are bit-identical (tested), while the per-step weight casts
            go and the copy's linear weights take half the memory; norms and embeddings stay float32, so the
            residual stream is as the student's. The linear weights are copied straight to bfloat16 (through
            ``deepcopy``'s memo), so the host never holds a float32 copy of them.
    """
    memo = {}
    if autocast_bf16:  # the linear weights are copied straight to bfloat16: no float32 copy of them on the host
        for m in backbone.modules():
            if type(m) is torch.nn.Linear:  # exact type: peft/quantized subclasses keep their own dtype rules
                for p in m.parameters(recurse=False):
                    memo[id(p)] = torch.nn.Parameter(p.detach().to(torch.bfloat16, copy=True), requires_grad=False)
    ref = copy.deepcopy(backbone, memo).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    ref.layer_offset = layer_offset
    ref.autocast_bf16 = bool(autocast_bf16)
    return ref


class PackingMismatchError(ValueError):
    """Packed rows gave other final states than padded rows: this model's attention ignores restarting position_ids."""


@torch.no_grad()
def check_packing(
    model: torch.nn.Module, dataset: PairDataset, pad_id: int, label: str = "model", lengths: tuple = (24, 9, 14, 10)
) -> float:
    """Check padding-free packing on this model before training: packed rows must give the padded rows' states.

    Runs four probe sequences of ``lengths`` tokens built from the first pair's tokens (and cached trunk
    states), repeated as needed, once padded and once packed, in eval mode without autocast (a few dozen
    tokens: cheap even for large models). With the default lengths one packed row always holds two sequences
    and another has an unused tail, so the check cannot pass vacuously.

    Returns:
        the largest relative difference ||h_packed - h_padded|| / ||h_padded|| of the final states the reward
        head reads (one per sequence).

    Raises:
        PackingMismatchError: a difference above 1e-4 (float32 weights; 3e-2 with 16-bit weights), naming the
            model and its attention implementation.
    """
    from types import SimpleNamespace

    if len(dataset) == 0:
        return 0.0
    # four probe sequences of fixed lengths cut from the first pair, its tokens (and cached states) repeated
    # when it is shorter: FFD packing of (24, 9, 14, 10) always puts 14 and 10 in one row and leaves a tail
    # after 9, whatever the data. Any inputs serve: the check is packed == padded on the same inputs.
    first = dataset[0]
    src_ids = first["pair"].chosen.input_ids + first["pair"].rejected.input_ids
    src_states = torch.cat(first["states"]) if "states" in first else None
    probes = []
    for n in lengths:
        idx = [j % len(src_ids) for j in range(n)]
        probes.append(
            (
                SimpleNamespace(input_ids=[src_ids[j] for j in idx], response_mask=[1] * n),
                None if src_states is None else src_states[idx],
            )
        )
    items = []
    for i in range(len(probes) // 2):
        (c, cs), (r, rs) = probes[2 * i], probes[2 * i + 1]
        d = {"pair": SimpleNamespace(chosen=c, rejected=r), "label": first["label"]}
        if src_states is not None:
            d["states"] = (cs, rs)
        items.append(d)
    dev = module_device(model)
    was_training = model.training
    model.eval()
    try:
        pooled = []
        for packing in (False, True):
            batch = PairCollator(pad_id, packing=packing)(items)
            fwd = {k: v.to(dev) for k, v in batch.items() if k not in ("labels", "response_mask")}
            with autocast(dev.type, enabled=False):
                _, hidden = model(**fwd)
            if packing:
                pooled.append(hidden.reshape(-1, hidden.shape[-1])[fwd["last_index"]].float())
            else:
                idx = last_token_index(fwd["attention_mask"])
                pooled.append(hidden[torch.arange(hidden.shape[0], device=dev), idx].float())
    finally:
        model.train(was_training)
    # the states the reward head reads, compared per sequence relative to their norm (a reward difference
    # alone would hide behind a small head)
    diff = float(((pooled[1] - pooled[0]).norm(dim=-1) / pooled[0].norm(dim=-1).clamp_min(1e-12)).max())
    half = any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters())
    tol = 3e-2 if half else 1e-4
    if not diff <= tol:
        bb = getattr(model, "backbone", model)
        cfg = getattr(bb, "config", None)
        raise PackingMismatchError(
            f"{label}: packed rows give final states {diff:.3g} (relative) away from padded rows (tolerance {tol:g}; "
            f"model type {getattr(cfg, 'model_type', '?')}, attention {getattr(cfg, '_attn_implementation', '?')}): "
            "this attention does not separate packed sequences; set packing: false for this model"
        )
    return diff


def checkpoint_damage(path: str) -> str | None:
    """Why the checkpoint folder ``path`` would not load, or None when every file in it reads back: the JSON
    files parse (``trainer_state.json`` as a ``TrainerState``, the resume-state file as a mapping), every
    ``*.safetensors`` header covers its file, and every torch file (``*.pt``, ``*.pth``, ``*.bin``) is a zip
    archive whose members match their CRCs. Cheap next to the load itself: nothing is deserialized."""
    import json
    import zipfile

    import safetensors
    from transformers import TrainerState

    from .trainer import RESUME_STATE_FILE

    for name in sorted(os.listdir(path)):
        f = os.path.join(path, name)
        if not os.path.isfile(f):
            continue
        try:
            if name == "trainer_state.json":
                TrainerState.load_from_json(f)
            elif name == RESUME_STATE_FILE:
                with open(f, encoding="utf-8") as fh:
                    if not isinstance(json.load(fh), dict):
                        return f"{name}: not a JSON object"
            elif name.endswith(".safetensors"):
                with safetensors.safe_open(f, "pt"):
                    pass
            elif name.endswith((".pt", ".pth", ".bin")):
                if not zipfile.is_zipfile(f):
                    return f"{name}: not a complete torch file"
                with zipfile.ZipFile(f) as z:
                    bad = z.testzip()
                if bad is not None:
                    return f"{name}: member {bad} does not match its checksum"
        except Exception as e:  # any failure to read back means the Trainer could not resume from it either
            return f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
    return None


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` that the Trainer finished writing (its
    ``trainer_state.json`` is written last) and that reads back (:func:`checkpoint_damage`), or None.

    A finished checkpoint that does not read back (a truncated or overwritten file) is skipped with one line
    naming it and what is wrong; the next older one is tried, and with none left the stage starts over.
    transformers' ``get_last_checkpoint`` is not used: it also returns a folder the Trainer was still writing."""
    from ..distributed import is_main_process

    if not os.path.isdir(output_dir):
        return None
    steps = sorted(
        (int(name[11:]) for name in os.listdir(output_dir) if name.startswith("checkpoint-") and name[11:].isdigit()),
        reverse=True,
    )
    for step in steps:
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if not os.path.isfile(os.path.join(path, "trainer_state.json")):
            continue  # not finished: the Trainer writes trainer_state.json last
        damage = checkpoint_damage(path)
        if damage is None:
            return path
        if is_main_process():
            print(
                f"[w2s-shift] skipping damaged checkpoint {path} ({damage}); resuming from an older one or the start",
                flush=True,
            )
    return None


def train_pairs(
    model: torch.nn.Module,
    dataset: PairDataset,
    pad_id: int,
    args: PairTrainingArguments,
    output_dir: str | None = None,
    callbacks: list | None = None,
    objective=None,
) -> list:
    """Train ``model`` (a :class:`~w2s_shift.models.reward_model.RewardModel`) on ``dataset`` in place.

    ``args`` are completed from the dataset size: ``warmup_steps`` = int(warmup_ratio x steps per epoch x epochs),
    and with ``checkpoint_fraction`` > 0 a checkpoint every ceil(that share of the steps); ``output_dir`` (when
    given) replaces ``args.output_dir``. ``objective``: what to minimize, a method's
    :class:`~w2s_shift.methods.Objective` (:meth:`w2s_shift.methods.Method.objective`; None: soft Bradley-Terry
    alone). ``packing`` applies only where the model allows it
    (:func:`~w2s_shift.models.reward_model.can_pack`) and is checked first (:func:`check_packing`). When a finished
    checkpoint is in the output folder (a killed run), training resumes from it (model, optimizer, scheduler, RNG
    and data order).

    Returns:
        the Trainer's log history (list of dicts: loss, loss_w2s, loss_anchor, learning_rate, step).

    Raises:
        TrainingDiverged: the loss became NaN/inf (names the step).
        PackingMismatchError: ``packing`` on a model whose attention does not separate packed sequences.
    """
    steps_per_epoch = math.ceil(len(dataset) / args.batch_size)
    steps = args.checkpoint_fraction * steps_per_epoch * args.num_train_epochs
    packing = bool(args.packing and can_pack(getattr(model, "backbone", model), getattr(model, "pooling", "last")))
    args = dataclasses.replace(
        args,
        output_dir=output_dir if output_dir is not None else args.output_dir,
        warmup_steps=int(args.warmup_ratio * steps_per_epoch * args.num_train_epochs),
        save_strategy="steps" if args.checkpoint_fraction > 0 else "no",
        save_steps=max(1, math.ceil(steps)) if args.checkpoint_fraction > 0 else 500,
        packing=packing,
    )
    set_layer_wrap_classes(model)  # FSDP transformer-layer auto-wrap reads model._no_split_modules
    if objective is not None and objective.regularizer is not None:
        objective.regularizer.to(args.device)  # the Trainer moves only the trained model; each process its own
    if args.logging_dir and "tensorboard" in args.report_to:
        os.environ["TENSORBOARD_LOGGING_DIR"] = args.logging_dir  # read by transformers' TensorBoardCallback
    if args.packing:
        check_packing(model, dataset, pad_id, args.label)
    trainer = PairTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=PairCollator(pad_id, args.packing),
        objective=objective,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))
    return list(trainer.state.log_history)

"""The interventional mechanism stages of a trained student (``stages/mechanism-<label>__<set>.json``): on each
evaluation set, its head on features interpolated back to the pretrained ones, and linear probes over its frozen
features and over the pretrained ones (:mod:`w2s_shift.metrics.intervention`). The probes are fitted, and the head's
in-distribution check is made, on the source's teacher-train pairs (gold orientation), which no student trained on
(students train on the student-train split; the ID test split stays for scoring). A student's features on an
evaluation set come from its scoring pass when that ran in this process (equal to the bit to a pass of their own,
which runs otherwise). Writes ``mechanism/<label>.json``;
evaluation only, keyed on the student's training digest, the set's identity and the source data."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from ..distributed import sharded
from ..inference import pooled_states
from ..metrics import intervention as iv
from ..versions import stage_versions
from .featurizer import Featurizer, SourceContext, to_run_device
from .rundir import Stage, log, stage_digest, write_json_on_main

#: the source pairs the probes are fitted on and the head is checked on (gold orientation: chosen over rejected):
#: the teacher's training split, which the students never saw
FIT_SET = "teacher_train"


def pair_key(p) -> str:
    """A pair's id, or without one a digest of its prompt and responses (sha1, 16 hex digits), so that the report
    can tell whether two seeds' outcomes are on the same pairs (resplit_per_seed draws other test pairs)."""
    if p.id is not None:
        return str(p.id)
    return "sha1:" + hashlib.sha1(f"{p.prompt_key()}\0{p.chosen}\0{p.rejected}".encode()).hexdigest()[:16]


def pair_diffs(f: Featurizer, backbone, name: str, pairs: list):
    """(B, H) pooled states of each pair's chosen minus rejected sequence (:func:`pooled_states`), on set ``name``.
    Launched processes each run a share of the sequences (:func:`~w2s_shift.distributed.sharded`; ``backbone`` is
    whole on every process) and every process gets the whole result."""
    feats = f.features(name, pairs)
    seqs, states = feats["seqs"], feats["states"]

    def share(idx: list) -> list:
        h = pooled_states(
            backbone,
            [seqs[i] for i in idx],
            f.pad_id,
            states=None if states is None else [states[i] for i in idx],
            max_tokens=f.mcfg.eval_max_tokens,
            bf16=f.mcfg.bf16,
        )
        return list(h.numpy())

    return chosen_minus_rejected(np.stack(sharded(share, list(range(len(seqs))))))


def chosen_minus_rejected(pooled) -> np.ndarray:
    """(B, H) float64 pair differences from (2B, H) pooled states in the order
    :func:`~w2s_shift.pipeline.featurizer.seqs_of` gives a set's sequences: the B chosen, then the B rejected."""
    h = np.asarray(pooled).astype(np.float64)
    return h[: len(h) // 2] - h[len(h) // 2 :]


def pretrained_diffs(ctx: SourceContext, name: str, pairs: list):
    """:func:`pair_diffs` of the pretrained student on a set, once per source (the same for every seed and method
    unless the splits are drawn per seed)."""
    if name not in ctx.pretrained_diffs:
        sf = ctx.student()
        ctx.pretrained_diffs[name] = pair_diffs(sf, sf.on_device(), name, pairs)
    return ctx.pretrained_diffs[name]


def cell_mechanism(ctx: SourceContext, cell_dir: Path, seed: int, label: str, model_digest: str, model) -> list:
    """The stages of one trained student not done yet, one per evaluation set (``mechanism-<label>__<set>``, keyed on
    the student's training digest, the set's identity and the source data the probes are fitted on), so a new OOD
    target costs its own test (and the fit pairs' features again). ``model``: the student (whole, on any device), or
    None to load it from its saved weights. Every set's result goes into ``mechanism/<label>.json``: "format",
    "fit_set", "fit_pairs", "check" (:func:`~w2s_shift.metrics.intervention.head_check` of its head on the
    pretrained fit features), "head" ("own" / "refit") and per set :func:`~w2s_shift.metrics.intervention.set_outcomes`
    with "ids". Returns the sets done now."""
    from ..io import read_json
    from .score_stage import load_saved_model

    todo = []
    for name in ctx.eval_sets:
        digest = stage_digest(model_digest, ctx.eval_digests[name], ctx.data_digest, stage_versions("mechanism"))
        stage = Stage(cell_dir, f"mechanism-{label}__{name}", digest)
        if not stage.done():
            todo.append((name, stage))
    if not todo:
        return []
    sf = ctx.student()
    if model is None:
        model = load_saved_model(sf, cell_dir, seed, label, model_digest)
    model = to_run_device(model)
    w = model.score.weight.detach().float().cpu().numpy()[0].astype(np.float64)
    fit_pairs = ctx.splits[FIT_SET]
    fit_stu = pair_diffs(sf, model.backbone, FIT_SET, fit_pairs)
    heads = iv.fit_heads(pretrained_diffs(ctx, FIT_SET, fit_pairs), fit_stu, w)
    path = cell_dir / "mechanism" / f"{label}.json"
    try:
        out = read_json(path)
        sets = dict(out["sets"]) if out.get("format") == iv.FILE_FORMAT else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        sets = {}
    check = heads["check"]
    out = {"format": iv.FILE_FORMAT, "alphas": list(iv.ALPHAS), "fit_set": FIT_SET, "fit_pairs": len(fit_pairs)}
    out.update(check=check, head=heads["head"], sets=sets)
    log(
        f"{ctx.name} seed {seed}: mechanism of {label}: its head on the pretrained features of {len(fit_pairs)} "
        f"{FIT_SET} pairs {check['accuracy']:.1f}% (one-sided binomial p {check['p']:.2g}): "
        + ("its own head at a = 0" if heads["head"] == "own" else "not above chance, the head is refit at a = 0 and 1")
    )
    for i, (name, stage) in enumerate(todo):
        if i:  # a stage's seconds are its own set's; the first one's include the shared load and fit
            stage.started = time.time()
        pairs = ctx.eval_sets[name]
        kept = ctx.take_student_pooled((seed, label, model_digest, name))  # by this process's scoring stage
        stu = pair_diffs(sf, model.backbone, name, pairs) if kept is None else chosen_minus_rejected(kept)
        ref = pretrained_diffs(ctx, name, pairs)
        v = sets[name] = {**iv.set_outcomes(heads, w, ref, stu), "ids": [pair_key(p) for p in pairs]}
        write_json_on_main(path, out)
        stage.finish(
            [f"mechanism/{label}.json"],
            model=label,
            dataset=name,
            pairs=len(pairs),
            # the probes' fit pairs as the student encodes them (read into the report's truncation table)
            cut_counts={k: v for k, v in sf.cut_counts.items() if k == FIT_SET},
        )
        log(
            f"{ctx.name} seed {seed}: mechanism of {label} on {name}: accuracy {v['interpolation'][-1]:.1f} -> "
            f"{v['interpolation'][0]:.1f} with its head on the pretrained features; probe on its features "
            f"{v['probe']['student']:.1f} vs {v['probe']['pretrained']:.1f} on the pretrained ones"
        )
    return [name for name, _ in todo]

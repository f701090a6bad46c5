"""The interventional mechanism stages of a trained student (``stages/mechanism-<label>__<set>.json``): on each
evaluation set, its head on features interpolated back to the pretrained ones, and linear probes fitted on the source's
student-train pairs (gold orientation) over its frozen features and over the pretrained ones
(:mod:`w2s_shift.metrics.intervention`). Writes ``mechanism/<label>.json``; evaluation only, keyed on the student's
training digest and the set's identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..distributed import sharded
from ..inference import pooled_states
from ..metrics import intervention as iv
from ..versions import stage_versions
from .featurizer import Featurizer, SourceContext, to_run_device
from .rundir import Stage, log, stage_digest, write_json_on_main

FIT_SET = "student_train"  # the source pairs the probes are fitted on (gold orientation: chosen over rejected)


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

    h = np.stack(sharded(share, list(range(len(seqs))))).astype(np.float64)
    b = len(pairs)
    return h[:b] - h[b:]


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
    target costs its own test only. ``model``: the student (whole, on any device), or None to load it from its saved
    weights. Every set's result goes into ``mechanism/<label>.json``. Returns the sets done now."""
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
    probe_ref = iv.fit_probe(pretrained_diffs(ctx, FIT_SET, fit_pairs))
    probe_stu = iv.fit_probe(pair_diffs(sf, model.backbone, FIT_SET, fit_pairs))
    path = cell_dir / "mechanism" / f"{label}.json"
    try:
        out = read_json(path)
        out["sets"] = dict(out["sets"])
    except (OSError, ValueError, KeyError, TypeError):
        out = {"alphas": list(iv.ALPHAS), "fit_set": FIT_SET, "sets": {}}
    for name, stage in todo:
        pairs = ctx.eval_sets[name]
        ref, stu = pretrained_diffs(ctx, name, pairs), pair_diffs(sf, model.backbone, name, pairs)
        m_stu = stu @ w
        at0 = iv.correct(iv.interpolation_margins(ref, w, m_stu, 0.0))
        p_ref, p_stu = iv.correct(ref @ probe_ref), iv.correct(stu @ probe_stu)
        v = out["sets"][name] = {
            "interpolation": iv.interpolation_curve(ref, w, m_stu),
            "probe": {"pretrained": float(p_ref.mean()), "student": float(p_stu.mean())},
            # per pair, in percent: the interpolation gain (a = 0 minus a = 1) and the probe gain (student minus
            # pretrained features), for intervals over seeds and pairs in the report
            "interpolation_gain": (at0 - iv.correct(m_stu)).tolist(),
            "probe_gain": (p_stu - p_ref).tolist(),
        }
        write_json_on_main(path, out)
        stage.finish([f"mechanism/{label}.json"], model=label, dataset=name, pairs=len(pairs))
        log(
            f"{ctx.name} seed {seed}: mechanism of {label} on {name}: accuracy {v['interpolation'][-1]:.1f} -> "
            f"{v['interpolation'][0]:.1f} with its head on the pretrained features; probe on its features "
            f"{v['probe']['student']:.1f} vs {v['probe']['pretrained']:.1f} on the pretrained ones"
        )
    return [name for name, _ in todo]

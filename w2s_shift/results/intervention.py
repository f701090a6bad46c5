"""The mechanism by intervention of one source, over its seeds: per trained student and evaluation set, from each
cell's ``mechanism/<label>.json`` (written by :mod:`w2s_shift.pipeline.intervene`; estimators:
:mod:`w2s_shift.metrics.intervention`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import read_json
from ..metrics.intervention import seeds_pairs_effect


def intervention_effects(run_dir: Path, cells: list) -> list:
    """Per (student, set) of the source's cells, sorted by student, ID before OOD, then set:
    {"model", "set", "ood" (bool), "acc_student" (its head on its features, a = 1), "acc_pretrained_features" (its
    head on the pretrained features, a = 0), "probe_student", "probe_pretrained" (accuracy of a fresh probe on each,
    pp), "interpolation_gain", "probe_gain" (:func:`w2s_shift.metrics.intervention.seeds_pairs_effect` over seeds,
    then pairs: mean, 95% interval, MDE, in pp)}; means over the seeds that have the file. [] without files."""
    data: dict = {}
    for c in cells:
        sets = {c["id"], *c.get("ood", [])}  # the sets of this report (a file may keep a target removed since)
        for f in sorted((Path(run_dir) / c["dir"] / "mechanism").glob("*.json")):
            d = read_json(f)
            for name, v in d["sets"].items():
                if name in sets:
                    data.setdefault((f.stem, name), []).append(v)
    ood = {n for c in cells for n in c.get("ood", [])}
    out = []
    for (label, name), vs in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][1] in ood, kv[0][1])):
        out.append(
            {
                "model": label,
                "set": name,
                "ood": name in ood,
                "acc_student": float(np.mean([v["interpolation"][-1] for v in vs])),
                "acc_pretrained_features": float(np.mean([v["interpolation"][0] for v in vs])),
                "probe_student": float(np.mean([v["probe"]["student"] for v in vs])),
                "probe_pretrained": float(np.mean([v["probe"]["pretrained"] for v in vs])),
                "interpolation_gain": seeds_pairs_effect([np.asarray(v["interpolation_gain"]) for v in vs], n=1000),
                "probe_gain": seeds_pairs_effect([np.asarray(v["probe_gain"]) for v in vs], n=1000),
            }
        )
    return out

"""Synthetic worlds for the interventional mechanism test (w2s_shift.metrics.intervention), shared by
tests/test_intervention.py: the pretrained features of each pair (chosen minus rejected, what the reward head reads)
and, per seed, a W2S student's and a gold-trained ceiling's features and heads, put through the functions the
pipeline calls (fit_heads, set_outcomes) into the mechanism files' layout.

Directions: u carries the preference in every domain; v, a spurious cue (e.g. length), tracks it in the source and
is reversed out of distribution. One test split shared by the seeds (as in a run without resplit_per_seed); each
seed draws its own training noise."""

from __future__ import annotations

import numpy as np
from scipy.stats import special_ortho_group

from w2s_shift.metrics import intervention as I

H, U, V = 16, 0, 1
N_PAIRS = 400
SHIFT_U, SHIFT_V = 2.0, 3.0  # mean of the chosen-minus-rejected features along u and v (noise SD sqrt(2))
SOURCE_SETS, OOD_SET = ("fit", "src"), "ood"


def pretrained(rng) -> dict:
    """Pretrained pair features (N_PAIRS, H) of the fit pairs, the ID test pairs and the OOD pairs."""
    out = {}
    for name, v_shift in (("fit", SHIFT_V), ("src", SHIFT_V), (OOD_SET, -SHIFT_V)):
        d = rng.normal(0.0, 2**0.5, (N_PAIRS, H))
        d[:, U] += SHIFT_U
        d[:, V] += v_shift
        out[name] = d
    return out


def flip_rotation(rng) -> np.ndarray:
    """An orthogonal rotation (H, H), det +1: a half turn in the (u, v) plane and a random rotation of the rest."""
    r = np.zeros((H, H))
    r[U, U] = r[V, V] = -1.0
    r[2:, 2:] = special_ortho_group.rvs(H - 2, random_state=rng)
    return r


def _unit(i: int) -> np.ndarray:
    e = np.zeros(H)
    e[i] = 1.0
    return e


def _drift(d: np.ndarray, rng) -> np.ndarray:
    """Features that lost information: a fraction (0.1-0.3, drawn per seed) of the u direction kept, the rest
    replaced by noise (the feature distortion of Kumar et al. 2022)."""
    out = d.copy()
    out[:, U] = rng.uniform(0.1, 0.3) * d[:, U] + rng.normal(0.0, 2**0.5, len(d))
    return out


def models(world: str, seed: int, ref: dict) -> dict:
    """{"w2s": (features by set, head), "ceiling": (...)} of one seed in one world:

    - "representation" (positive control): the W2S student's OOD features lost information (:func:`_drift`); its
      head reads u. The ceiling keeps the pretrained features.
    - "rotated" (negative control): both models' features are the pretrained ones under one rotation
      (:func:`flip_rotation`): no information lost. The W2S head reads u and the spurious v (it learned the weak
      labels' cue), the ceiling's u, each in the rotated coordinates it was fitted to.
    - "head" (negative control): the features stay pretrained; the W2S head reads u and v, the ceiling's u.
    - "shared" (negative control for the student alone): fine-tuning itself distorts the OOD features, the same in
      both models (as in "representation", for the ceiling too); the W2S head reads u and v, the ceiling's u.
    """
    rng = np.random.default_rng(1000 + seed)
    spurious, good = _unit(U) + 2.0 * _unit(V), _unit(U)
    noise = lambda: rng.normal(0.0, 0.05, H)  # noqa: E731 - each head's own training noise
    if world == "representation":
        drifted = _drift(ref[OOD_SET], rng)
        return {"w2s": ({**ref, OOD_SET: drifted}, good + noise()), "ceiling": (dict(ref), good + noise())}
    if world == "shared":
        feats = {**ref, OOD_SET: _drift(ref[OOD_SET], rng)}
        return {"w2s": (feats, spurious + noise()), "ceiling": (feats, good + noise())}
    if world == "rotated":
        r = flip_rotation(rng)
        feats = {k: v @ r.T for k, v in ref.items()}
        return {"w2s": (feats, r @ spurious + noise()), "ceiling": (feats, r @ good + noise())}
    if world == "head":
        return {"w2s": (dict(ref), spurious + noise()), "ceiling": (dict(ref), good + noise())}
    raise ValueError(world)


def mechanism_files(world: str, seeds=(0, 1, 2)) -> list:
    """Per seed, {label: mechanism file} as pipeline/intervene.py writes them (fit_heads, set_outcomes)."""
    ref = pretrained(np.random.default_rng(7))
    out = []
    for s in seeds:
        files = {}
        for label, (feats, w) in models(world, s, ref).items():
            heads = I.fit_heads(ref["fit"], feats["fit"], w)
            sets = {
                n: {**I.set_outcomes(heads, w, ref[n], feats[n]), "ids": list(range(N_PAIRS))} for n in ("src", OOD_SET)
            }
            files[label] = {"head": heads["head"], "check": heads["check"], "sets": sets}
        out.append(files)
    return out


def rows(world: str, seeds=(0, 1, 2), n_boot: int = 1000) -> dict:
    """:func:`~w2s_shift.metrics.intervention.mechanism_rows` of a world, keyed by (model, set)."""
    got = I.mechanism_rows(mechanism_files(world, seeds), "ceiling", {OOD_SET}, n_boot=n_boot)
    return {(r["model"], r["set"]): r for r in got}

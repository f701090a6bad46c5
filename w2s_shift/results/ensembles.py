"""Seed ensembles as models, from the rewards the run already has (evaluation only, nothing retrained).

For each trained model of a source with two or more seeds, its seeds' rewards on each evaluation set are
standardized per seed (r' = (r - mean) / std over the set's chosen and rejected responses, so no seed dominates by
its scale) and combined per response: ``<label>/mean`` (the mean over seeds) and ``<label>/min`` (the worst case
over seeds, the conservative ensemble of Coste et al. 2024, "Reward Model Ensembles Help Mitigate
Overoptimization"). A pair is right when the ensemble prefers the chosen response (a tie is wrong). The ensembles get
the run's metrics: accuracy with a 95% interval, and for the W2S students WRG, AOG and NTS against the teacher's mean
ensemble, from one joint bootstrap over pairs (:func:`w2s_shift.metrics.stats.joint_bootstrap`).

Whether the seeds' disagreement flags errors under shift: per pair, the standard deviation over seeds of the
standardized margin; its AUROC for the mean ensemble's wrong pairs (0.5: no signal; Mann-Whitney U / (n_wrong
n_right), ties counted half), per set, ID against each OOD target (Lakshminarayanan et al. 2017 use ensemble
disagreement as uncertainty).

Ensembles need the same test pairs in every seed: a run with ``data.resplit_per_seed`` has none (said, not faked).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.stats import mannwhitneyu

from ..methods import is_w2s_student, method_of
from ..metrics.stats import joint_bootstrap
from .cells import LEVEL, values_and_ci
from .files import reward_rows

KINDS = ("mean", "min")


def _standardized(chosen: np.ndarray, rejected: np.ndarray) -> tuple:
    both = np.concatenate([chosen, rejected])
    sd = both.std()
    mu, sd = both.mean(), (sd if sd > 0 else 1.0)
    return (chosen - mu) / sd, (rejected - mu) / sd


def disagreement_auroc(disagreement: np.ndarray, wrong: np.ndarray) -> float | None:
    """AUROC of ``disagreement`` (n,) for the pairs marked ``wrong`` (n,) bool: P(a wrong pair disagrees more than a
    right one), ties counted half; None when every pair is right or every pair is wrong."""
    disagreement, wrong = np.asarray(disagreement, dtype=np.float64), np.asarray(wrong, dtype=bool)
    n_wrong, n_right = int(wrong.sum()), int((~wrong).sum())
    if not n_wrong or not n_right:
        return None
    u = mannwhitneyu(disagreement[wrong], disagreement[~wrong], alternative="two-sided").statistic
    return float(u / (n_wrong * n_right))


def source_ensembles(run_dir: Path, cells: list, n_boot: int = 2000, seed: int = 0) -> dict | None:
    """The seed ensembles of one source's cells.

    Returns:
        None with fewer than two seeds; {"skipped": reason} when the seeds' test pairs differ; else
        {"seeds": [...], "members": [label, ...], "datasets": [ID, *OOD], "id",
         "accuracy": {ensemble: {set: [pp, lo, hi]}},
         "metrics": {W2S ensemble: {"WRG", "AOG_mean", "NTS": [pp, lo, hi]}},
         "disagreement_auroc": {label: {set: AUROC or None}}}, ensembles named ``<label>/mean`` and ``<label>/min``.

    Raises:
        ValueError: a rewards file missing or damaged (named).
    """
    cells = sorted(cells, key=lambda c: c["seed"])
    if len(cells) < 2:
        return None
    id_name, oods = cells[0]["id"], list(cells[0]["ood"])
    datasets = [id_name, *oods]
    methods = {m["label"]: m for m in cells[0]["methods"]}
    trained = [m for m in cells[0]["models"] if m == "teacher" or getattr(method_of(methods.get(m, {})), "trains", 0)]
    members = [m for m in trained if all(m in c["models"] and set(datasets) <= set(c["datasets"]) for c in cells)]
    if "teacher" not in members:
        return None
    std: dict = {m: {} for m in members}  # model -> set -> (S, n) standardized chosen, rejected
    for d in datasets:
        ids0 = None
        for m in members:
            cs, rs = [], []
            for c in cells:
                ids, ch, rj = reward_rows(Path(run_dir) / c["dir"], m, d)
                if ids0 is None:
                    ids0 = ids
                elif ids != ids0:
                    return {"skipped": f"the seeds' {d} pairs differ (data.resplit_per_seed?): no ensemble of them"}
                a, b = _standardized(ch, rj)
                cs.append(a)
                rs.append(b)
            std[m][d] = (np.stack(cs), np.stack(rs))
    correct, auroc = {}, {}
    for m in members:
        for kind in KINDS:
            comb = np.mean if kind == "mean" else np.min
            correct[f"{m}/{kind}"] = {d: comb(std[m][d][0], 0) - comb(std[m][d][1], 0) > 0 for d in datasets}
        auroc[m] = {
            d: disagreement_auroc((std[m][d][0] - std[m][d][1]).std(0), ~correct[f"{m}/mean"][d]) for d in datasets
        }
    w2s = [f"{m}/{k}" for m in members if m != "teacher" and is_w2s_student(methods.get(m)) for k in KINDS]
    boot = joint_bootstrap(correct, id_name, oods, w2s, teacher="teacher/mean", n_boot=n_boot, seed=seed, level=LEVEL)
    acc, acc_ci = values_and_ci(boot["accuracy"])
    out_acc = {e: {d: [acc[e][d], *(acc_ci[e][d] or [None, None])] for d in datasets} for e in correct}
    out_metrics = {}
    for e, tree in boot["metrics"].items():
        vals, cis = values_and_ci(tree)
        out_metrics[e] = {k: [vals[k], *(cis[k] or [None, None])] for k in ("WRG", "AOG_mean", "NTS")}
    return {
        "seeds": [c["seed"] for c in cells],
        "members": members,
        "datasets": datasets,
        "id": id_name,
        "accuracy": out_acc,
        "metrics": out_metrics,
        "disagreement_auroc": auroc,
    }

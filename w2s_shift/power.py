"""How many test pairs and seeds a run needs to decide each of the paper's claims at the margin, from a pilot run:
``python -m w2s_shift.power RUN_DIR [--margin 3.8] [--seed-sd 2] [--max-seeds 10]``.

From the pilot's claims (:func:`w2s_shift.metrics.claims.paper_claims`), each primary comparison gives its
variance components (:func:`w2s_shift.metrics.significance.seed_pair_interval`): one seed's test-pair variance v
(pp^2 at the pilot's n pairs per set), the part c of it that seeds on the same test pairs share, and the seed
spread S^2.
The training variance is the ANOVA estimate s_u^2 = max(0, S^2 - (v - c)) (Searle, Casella & McCulloch 1992, Ch. 4);
with a one-seed pilot it cannot be estimated: ``--seed-sd`` is assumed (said in the output), and all of the pair
variance is taken as shared by the seeds (one test split: the conservative reading). With k seeds and
every test set scaled by r = n' / n:

    V(k, r) = s_u^2 / k + (v - c) / (r k) + c / r,
    MDE(k, r) = (t_{0.975, df} + t_{0.80, df}) sqrt(V),  df = V^2 / ((s_u^2/k + (v - c)/(r k))^2 / (k - 1))

(Bloom 1995; Satterthwaite 1946). A claim is decidable at margin m when every primary comparison has MDE <= m: an
effect of m is then found with 80% power, and a null one gives an interval inside (-m, m) about as often. For each
seed count the smallest n' (ID pairs; OOD sets scaled alike) is reported with its cost: the pilot's measured stage
seconds scaled (training by seeds, scoring by pairs and seeds), and GPU hours from ``w2s-shift plan``'s timing model
(:func:`w2s_shift.plan.gpu_seconds`) where the run's student is a shape the planner knows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .metrics.claims import MARGIN_PP, paper_claims

#: ID test pairs tried (OOD sets scale with them)
PAIR_GRID = (100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000)


def mde(var_seed: float, var_pairs: float, cov: float, k: int, r: float) -> float:
    """MDE (pp, 80% power, two-sided 5%) of a seed mean over k seeds with every test set r times the pilot's, from
    the training variance ``var_seed``, one seed's test-pair variance ``var_pairs`` and its shared part ``cov``
    (pp^2, at the pilot's sizes). k = 1: test-pair noise only, normal quantiles."""
    from scipy import stats as st

    own = max(var_pairs - cov, 0.0) / (r * k)
    v_seed = var_seed / k + own
    v = v_seed + cov / r
    if v <= 0:
        return 0.0
    df = v**2 / (v_seed**2 / (k - 1)) if k > 1 and v_seed > 0 else np.inf
    q = (st.t.ppf(0.975, df) + st.t.ppf(0.8, df)) if np.isfinite(df) else (st.norm.ppf(0.975) + st.norm.ppf(0.8))
    return float(q * v**0.5)


def components(stat: dict, seed_sd: float) -> tuple:
    """(training variance, test-pair variance, shared part, assumed) of one comparison of the pilot (pp^2)."""
    v, c = stat["var_pairs"], stat["cov_shared"]
    if stat["n_seeds"] > 1:
        return max(0.0, stat["seed_sd"] ** 2 - (v - c)), v, c, False
    return seed_sd**2, v, v, True  # one seed's pairs are every seed's pairs (one split)


def requirements(claims: list, n_id: int, margin: float, seed_sd: float, max_seeds: int = 10) -> dict:
    """{claim: {"rows": [what], "assumed_seed_sd": bool, "by_seeds": {k: ID pairs needed or None}}} for the
    claims with primary comparisons."""
    out = {}
    for c in claims:
        prim = [r for r in c["rows"] if r["primary"]]
        if not prim:
            continue
        comps = [components(r["stat"], seed_sd) for r in prim]
        need = {}
        for k in range(2, max_seeds + 1):
            need[k] = next(
                (n for n in PAIR_GRID if all(mde(vs, vp, cv, k, n / n_id) <= margin for vs, vp, cv, _ in comps)),
                None,
            )
        out[c["claim"]] = {
            "rows": [r["what"] for r in prim],
            "assumed_seed_sd": any(a for *_, a in comps),
            "mde_now": max(r["stat"]["mde"] for r in prim),
            "by_seeds": need,
        }
    return out


def pilot_costs(run_dir: Path, metrics: dict) -> dict:
    """Measured seconds of the pilot, from the stage markers: {"train": s, "score": s, "cells": n, "seeds": k}."""
    train = score = 0.0
    for c in metrics["cells"]:
        for name, st in (c.get("stages") or {}).items():
            sec = float((st or {}).get("seconds") or 0.0) if isinstance(st, dict) else 0.0
            if name.startswith("score-"):
                score += sec
            else:
                train += sec
    seeds = len({c["seed"] for c in metrics["cells"]})
    return {"train": train, "score": score, "cells": len(metrics["cells"]), "seeds": seeds}


def gpu_hours(run_dir: Path, cells: int, eval_pairs: int) -> float | None:
    """GPU hours of the run's config with ``cells`` cells and ``eval_pairs`` scored pairs per cell
    (:func:`w2s_shift.plan.gpu_seconds`, one GPU); None when the planner does not know the student."""
    from .plan import Plan, gpu_seconds, resolve

    try:
        shape, fields = resolve(str(run_dir / "config.yaml"))
    except (ValueError, OSError):
        return None
    fields = {**fields, "cells": cells, "eval_pairs": eval_pairs}
    try:
        plan = Plan(shape, **fields)
        plan.check()
    except (TypeError, ValueError):
        return None
    return gpu_seconds(plan) / 3600


def power_report(run_dir: Path, margin: float = MARGIN_PP, seed_sd: float = 2.0, max_seeds: int = 10) -> str:
    """The text ``python -m w2s_shift.power`` prints: per source and claim, the seeds and ID test pairs needed."""
    from .results import open_run
    from .results.verdicts import claim_cells

    run_dir = Path(run_dir)
    metrics = open_run(run_dir).metrics  # the one reader of a finished run: its format and numbers checked
    costs = pilot_costs(run_dir, metrics)
    by_source: dict = {}
    for c in metrics["cells"]:
        by_source.setdefault(c["source"], []).append(c)
    lines = [
        f"Pilot {run_dir}: {costs['cells']} cells, {costs['seeds']} seed(s); margin m = {margin:g} pp; a claim is "
        "decidable when each primary comparison's MDE (80% power) <= m.",
    ]
    for src, cs in by_source.items():
        n_id = len(claim_cells(run_dir, cs[:1])[0]["ids"][cs[0]["id"]])
        n_ood = [len(v) for d, v in claim_cells(run_dir, cs[:1])[0]["ids"].items() if d != cs[0]["id"]]
        claims = paper_claims(claim_cells(run_dir, cs), cs[0]["methods"], n_boot=400, margin=margin)
        req = requirements(claims, n_id, margin, seed_sd, max_seeds)
        lines.append(f"\n{src}: {n_id} ID pairs, OOD {', '.join(map(str, n_ood))} in the pilot")
        for key, r in req.items():
            shown = 0
            lines.append(
                f"  ({key}) MDE now {r['mde_now']:.1f} pp"
                + (
                    f" (seed SD assumed {seed_sd:g} pp: a 1-seed pilot cannot measure it)"
                    if r["assumed_seed_sd"]
                    else ""
                )
            )
            if all(n is None for n in r["by_seeds"].values()):
                lines.append(
                    f"    not reachable with <= {max_seeds} seeds and {PAIR_GRID[-1]:,} ID pairs: the seed spread "
                    "alone exceeds what that many seeds average down"
                )
            for k, n in r["by_seeds"].items():
                if n is None:
                    continue
                scale = n / n_id
                sec = (costs["train"] + costs["score"] * scale) * k / max(costs["seeds"], 1)
                eval_pairs = int(round(scale * (n_id + sum(n_ood))))
                gh = gpu_hours(run_dir, len(by_source) * k, eval_pairs)
                lines.append(
                    f"    {k} seeds: {n} ID pairs (OOD x{scale:.2g}); pilot hardware {sec / 3600:.1f} h"
                    + (f"; GPU {gh:.2g} h (plan's timing model)" if gh is not None else "")
                )
                shown += 1
                if shown == 3:  # the fewest seeds that reach it, and two more (fewer pairs each)
                    break
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m w2s_shift.power", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--margin", type=float, default=MARGIN_PP, help="m in pp (default: the paper's 3.8)")
    ap.add_argument("--seed-sd", type=float, default=2.0, help="training SD (pp) assumed for a 1-seed pilot")
    ap.add_argument("--max-seeds", type=int, default=10)
    a = ap.parse_args(argv)
    print(power_report(a.run_dir, a.margin, a.seed_sd, a.max_seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

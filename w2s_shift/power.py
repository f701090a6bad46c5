"""How many test pairs and seeds a run needs to decide each of the paper's claims at the margin, from a pilot run:
``python -m w2s_shift.power RUN_DIR [--margin 3.8] [--seed-sd 2] [--max-seeds 10]`` (``w2s-shift plan --power``).

From the pilot's claims (:func:`w2s_shift.metrics.claims.paper_claims`), each primary comparison gives its
variance components (:func:`w2s_shift.metrics.significance.seed_pair_interval`, pp^2 at the pilot's n pairs per
set): one seed's own test-pair variance v_own, the part c that seeds on the same test pairs share, and the seed
spread S^2. The training variance is the ANOVA estimate s_u^2 = max(0, S^2 - v_own) (Searle, Casella & McCulloch
1992, Ch. 4); a one-seed pilot cannot estimate it, so ``--seed-sd`` is assumed (said in the output) and all of its
pair variance is read as shared by the seeds (one test split: pair noise that more seeds do not average away). With
k seeds and every test set scaled by r = n' / n:

    theta = s_u^2 + v_own / r (the per-seed spread),  shared c / r,
    MDE(k, r) = design_mde(theta, v_own / r, c / r, k, alpha = 0.05 / family size)

(:func:`w2s_shift.metrics.significance.design_mde`: the true difference the claims' interval finds with 80% power,
at Holm's first step). A claim is decidable at margin m when every primary comparison has MDE <= m: an effect of m
is then found with at least 80% power, while a null effect gives an interval inside (-m, m) at a rate the output
does not claim. For each seed count the smallest n' (ID test pairs; OOD sets scaled alike) is reported with its
cost, or why none: the training variance alone (MDE with unlimited pairs) exceeds m at that k, or the pairs needed
exceed what the datasets hold (ID: the source's pairs not used for training; OOD: each target's pairs), when more
seeds are the way. Costs: the pilot's measured stage seconds scaled (training by seeds, scoring by pairs and seeds)
on the pilot's own hardware (named), and GPU hours from ``w2s-shift plan``'s timing model
(:func:`w2s_shift.plan.gpu_seconds`: one H100/H200 SXM, 989 TFLOP/s bf16 peak at 40% MFU) where the run's student is
a shape the planner knows.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from .metrics.claims import ALPHA, MARGIN_PP, paper_claims, pooled_metric
from .metrics.significance import design_mde
from .metrics.stats import MIN_GAP_PP

#: ID test pairs tried (OOD sets scale with them)
PAIR_GRID = (100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000)


def mde(var_seed: float, var_own: float, cov: float, k: int, r: float, alpha: float = ALPHA) -> float:
    """MDE (pp, 80% power, two-sided ``alpha``) of the claims' interval over k seeds with every test set r times the
    pilot's, from the training variance ``var_seed`` and one seed's own and shared test-pair variances ``var_own``,
    ``cov`` (pp^2 at the pilot's sizes); r = inf: unlimited pairs (the training variance alone). k = 1: the normal
    test on the pair variance. NaN when nothing varies."""
    own, shared = (0.0, 0.0) if math.isinf(r) else (var_own / r, cov / r)
    return design_mde(var_seed + own, own, shared, k, alpha)


def components(stat: dict, seed_sd: float) -> tuple:
    """(training variance, own test-pair variance, shared part, assumed) of one comparison of the pilot (pp^2)."""
    if stat["n_seeds"] > 1:
        return max(0.0, stat["s2"] - stat["var_own"]), stat["var_own"], stat["cov_shared"], False
    return seed_sd**2, 0.0, stat["var_pairs"], True  # one seed's pairs are every seed's pairs (one split)


def gap_pass_chance(
    gap: float,
    var_seed: float,
    var_own: float,
    cov: float,
    k: int,
    r: float = 1.0,
    level: float = 0.95,
    floor: float = MIN_GAP_PP,
) -> float:
    """Chance that each of k new seeds passes the weak-to-strong gap check (:func:`w2s_shift.metrics.stats.gap_check`:
    ceiling - teacher >= 5 pp on the ID test pairs with its 95% interval's lower end above 0), when one failed seed
    withholds every verdict of its source (docs/protocol.md).

    Model (the claims' seeds x pairs model, :func:`w2s_shift.metrics.significance.seed_pair_interval`): seed s's gap
    estimate is X_s = gap + u_s + w + e_s, with training noise u_s (variance ``var_seed``), test-pair noise w that
    every seed on the one split shares (``cov`` / r) and e_s its own (``var_own`` / r); all in pp^2 at the pilot's
    pairs, r = the new test sets' size over the pilot's. A seed passes when X_s >= max(5, z sqrt((var_own + cov) / r)),
    z = 1.96: the percentile interval read as the normal one on that seed's pair variance (``floor`` 0 and gap =
    accuracy - 50: the check that the teacher beats chance). Conditioning on w,

        P(all k pass) = integral phi(w) Phi((gap + w - need) / sqrt(var_seed + var_own / r))^k dw

    (scipy's quad over w ~ N(0, cov / r)). ``tests/test_power.py`` checks it against the rate at which simulated
    binary test pairs pass the real check.

    Returns:
        a probability in [0, 1].
    """
    from scipy import integrate
    from scipy import stats as st

    pair = (var_own + cov) / r
    need = max(floor, float(st.norm.isf((1 - level) / 2)) * math.sqrt(pair))
    sd_own, sd_shared = math.sqrt(var_seed + var_own / r), math.sqrt(cov / r)
    if sd_own == 0:  # every seed gives the same estimate: they pass or fail together
        return float(st.norm.sf(need - gap, scale=sd_shared)) if sd_shared > 0 else float(gap >= need)
    if sd_shared == 0:
        return float(st.norm.sf(need - gap, scale=sd_own) ** k)
    each = lambda w: st.norm.pdf(w, scale=sd_shared) * st.norm.sf(need - gap - w, scale=sd_own) ** k  # noqa: E731
    return float(min(1.0, integrate.quad(each, -8 * sd_shared, 8 * sd_shared, limit=200)[0]))


def outlook(stat: dict, seed_sd: float, ks: tuple, scales: tuple, floor: float = MIN_GAP_PP) -> dict:
    """:func:`gap_pass_chance` for each seed count in ``ks`` at each test-set scale in ``scales``, from a pilot's
    :func:`~w2s_shift.metrics.significance.seed_pair_interval` of the checked quantity (pp): {"value": its seed mean,
    "seed_sd": training SD (pp), "pair_se": one seed's test-pair SE (pp), "assumed": whether the seed SD is
    ``seed_sd`` (a 1-seed pilot), "chance": {(k, r): probability}}."""
    vs, vo, cv, assumed = components(stat, seed_sd)
    return {
        "value": stat["value"],
        "seed_sd": math.sqrt(vs),
        "pair_se": math.sqrt(vo + cv),
        "assumed": assumed,
        "chance": {(k, r): gap_pass_chance(stat["value"], vs, vo, cv, k, r, floor=floor) for k in ks for r in scales},
    }


def gap_outlook(claim_cells_: list, ceiling: str, seed_sd: float, ks: tuple, scales: tuple) -> dict | None:
    """:func:`outlook` of the pilot's weak-to-strong gap: the ceiling's WRG (ceiling - teacher on the ID test pairs)
    as the claims estimate it (:func:`~w2s_shift.metrics.claims.pooled_metric`); None when no cell has the
    ceiling."""
    stat = pooled_metric(claim_cells_, ceiling, None, "WRG", n_boot=400)
    return None if stat is None else outlook(stat, seed_sd, ks, scales)


def teacher_outlook(claim_cells_: list, seed_sd: float, ks: tuple, scales: tuple, n_boot: int = 400) -> dict:
    """:func:`outlook` of the other precondition of a verdict, the teacher's ID accuracy above chance (its 95%
    interval clear of 50% in every seed): the teacher's accuracy minus 50 pp per seed, with test-pair bootstrap
    replicates that resample the same pairs in every seed on them (:func:`~w2s_shift.metrics.stats.
    bootstrap_weights`), through :func:`~w2s_shift.metrics.significance.seed_pair_interval`, at floor 0."""
    from .metrics.significance import seed_pair_interval
    from .metrics.stats import bootstrap_weights

    cells = claim_cells_
    keys = [tuple(c["ids"][c["id"]]) for c in cells]  # seeds on the same pairs share their resampling
    group = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    points, reps = np.empty(len(cells)), np.empty((n_boot, len(cells)))
    for key, g in group.items():
        seeds = [s for s, other in enumerate(keys) if other == key]
        x = np.array([cells[s]["correct"]["teacher"][cells[s]["id"]] for s in seeds], dtype=np.float64)  # (k_g, n)
        points[seeds] = 100.0 * x.mean(axis=1) - 50
        reps[:, seeds] = np.concatenate([w @ x.T for w in bootstrap_weights(len(key), n_boot, g)]) * 100 / len(key) - 50
    stat = seed_pair_interval(points, reps, groups=[group[key] for key in keys])
    return outlook(stat, seed_sd, ks, scales, floor=0.0)


def requirements(
    claims: list, n_id: int, margin: float, seed_sd: float, max_seeds: int = 10, max_scale: float = math.inf
) -> dict:
    """Per claim with primary comparisons: {"rows": [what], "family": Holm family size, "alpha": its first step,
    "assumed_seed_sd": bool, "mde_now": pp, "by_seeds": {k: ID pairs needed (within the data) or None},
    "beyond_data": {k: ID pairs needed beyond ``max_scale`` x the pilot's (the data's limit) or None},
    "unlimited": {k: MDE with unlimited pairs (pp)}}, k from 2 to ``max_seeds``."""
    out = {}
    for c in claims:
        prim = [r for r in c["rows"] if r["primary"]]
        if not prim:
            continue
        alpha = ALPHA / len(c["rows"])
        comps = [components(r["stat"], seed_sd) for r in prim]
        need, beyond, unlimited = {}, {}, {}
        for k in range(2, max_seeds + 1):
            # NaN: no training variance, so unlimited pairs detect any effect (0); max() would keep a NaN first
            unlimited[k] = max(
                0.0 if math.isnan(u) else u for u in (mde(vs, vo, cv, k, math.inf, alpha) for vs, vo, cv, _ in comps)
            )
            n = None
            if not unlimited[k] > margin:
                ok = (
                    m
                    for m in PAIR_GRID
                    if all(mde(vs, vo, cv, k, m / n_id, alpha) <= margin for vs, vo, cv, _ in comps)
                )
                n = next(ok, None)
            need[k] = n if n is not None and n <= max_scale * n_id else None
            beyond[k] = n if n is not None and n > max_scale * n_id else None
        mdes = [r["stat"]["mde"] for r in prim if math.isfinite(r["stat"]["mde"])]
        out[c["claim"]] = {
            "rows": [r["what"] for r in prim],
            "family": len(c["rows"]),
            "alpha": alpha,
            "assumed_seed_sd": any(a for *_, a in comps),
            "mde_now": max(mdes) if mdes else math.nan,
            "by_seeds": need,
            "beyond_data": beyond,
            "unlimited": unlimited,
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


def data_limit(cell: dict, n_id: int, n_ood: dict) -> tuple:
    """(largest scale r of the pilot's test sets the datasets allow, text naming the binding limits) from a cell's
    data summary (metrics.json ``cells[].data``): ID, the source's valid pairs not used for training; each OOD
    target, its valid pairs less those removed for a source prompt. (inf, "") when the summary is missing."""
    data = cell.get("data") or {}
    limits = []
    try:
        splits = data["splits"]
        free = int(data["source"]["pairs"]) - int(splits.get("teacher_train", 0)) - int(splits.get("student_train", 0))
        limits.append((free / n_id, f"ID {free:,}"))
    except (KeyError, TypeError, ValueError):
        pass
    for name, o in (data.get("ood") or {}).items():
        if name in n_ood and n_ood[name] > 0 and isinstance(o, dict) and "pairs" in o:
            avail = int(o["pairs"]) - int(o.get("prompt_overlap_removed") or 0)
            limits.append((avail / n_ood[name], f"OOD {name} {avail:,}"))
    if not limits:
        return math.inf, ""
    return min(x for x, _ in limits), ", ".join(t for _, t in limits)


def gap_lines(cells: list, ccells: list, n_id: int, max_scale: float, seed_sd: float, max_seeds: int) -> list:
    """The power report's lines on the two preconditions of one source's verdicts, per seed: the weak-to-strong gap
    (each pilot seed's check, what a failed seed means, :func:`gap_outlook`) and the teacher above chance
    (:func:`teacher_outlook`), each outlook for 2, 3, 5 and ``max_seeds`` seeds at the pilot's ID pairs and at the
    most the data holds."""
    ks = tuple(sorted({k for k in (2, 3, 5, max_seeds) if k <= max_seeds}))
    scales = (1.0, max_scale) if math.isfinite(max_scale) and max_scale > 1 else (1.0,)

    def chance(look: dict, of: str) -> str:
        sd = f"seed SD {look['seed_sd']:.1f} pp" + (" assumed (a 1-seed pilot has none)" if look["assumed"] else "")
        per = "; ".join(
            f"{round(r * n_id):,} ID pairs"
            + (" (the most the data holds)" if r > 1 else "")
            + ": "
            + ", ".join(f"{k} seeds {100 * look['chance'][(k, r)]:.0f}%" for k in ks)
            for r in scales
        )
        return (
            f"    chance that every seed of a new run passes, from the pilot's {of} ({sd}, one seed's test-pair SE "
            f"{look['pair_se']:.1f} pp; estimates plugged in): {per}"
        )

    teacher = teacher_outlook(ccells, seed_sd, ks, scales)
    beats = "; ".join(
        f"seed {c.get('seed')} {c['accuracy']['teacher'][c['id']]:.1f}% "
        + ("passed" if c.get("teacher_beats_chance_id") else "failed")
        for c in cells
        if c.get("accuracy")
    )
    out = [
        f"  teacher above chance (each seed: its ID accuracy's 95% interval above 50%; w2s_gap_check.py requires it): "
        f"{beats}",
        chance(teacher, f"teacher accuracy {50 + teacher['value']:.1f}%"),
    ]
    checks = [(c.get("seed"), c.get("gap_check")) for c in cells]
    ceiling = next((g.get("ceiling") for _, g in checks if g), None)
    if not ceiling:
        return [
            *out,
            "  gap check: no ceiling in the grid, so the gap is not checked and the claims are decided without it; add "
            "the ceiling method to check it (w2s_gap_check.py requires one)",
        ]
    seen = "; ".join(
        f"seed {s} {g['gap_pp']:+.1f} [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}] {'passed' if g['passed'] else 'failed'}"
        for s, g in checks
        if g
    )
    out.append(
        f"  gap check (each seed: {ceiling} - teacher >= {MIN_GAP_PP:g} pp on the ID pairs with its 95% interval above "
        f"0; one seed failing withholds every verdict of the source): {seen}"
    )
    if any(g and not g["passed"] for _, g in checks):
        out.append(
            "    a failed seed stays in this run: its verdicts are withheld whatever seeds are added (run "
            "--until-decided stops there); deciding needs a new run whose every seed shows the gap"
        )
    look = gap_outlook(ccells, ceiling, seed_sd, ks, scales)
    return out if look is None else [*out, chance(look, f"gap {look['value']:+.1f} pp")]


def _hardware(metrics: dict) -> str:
    env = metrics.get("environment") or {}
    if env.get("gpu"):
        return f"GPU {env['gpu']}"
    flags = env.get("cpu_flags")
    return f"CPU {env.get('cpu') or 'unknown'}" + (f" ({', '.join(flags)})" if flags else "")


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
        "decidable when each primary comparison's MDE <= m. MDE: the true difference (pp of accuracy, as WRG, AOG "
        "and NTS are) that the claims' interval (seeds x pairs, docs/protocol.md) finds with 80% power at Holm's "
        "first step (alpha 0.05 / the claim's family size). Pairs: ID test pairs per seed; every OOD set is scaled "
        f"by the same factor. Hours: 'pilot hardware' = the pilot's measured stage seconds on {_hardware(metrics)}, "
        "scaled; 'GPU' = w2s-shift plan's timing model, one H100/H200 SXM (989 TFLOP/s bf16 peak, 40% MFU).",
    ]
    for src, cs in by_source.items():
        ids = claim_cells(run_dir, cs[:1])[0]["ids"]
        n_id = len(ids[cs[0]["id"]])
        n_ood = {d: len(v) for d, v in ids.items() if d != cs[0]["id"]}
        max_scale, held = data_limit(cs[0], n_id, n_ood)
        ccells = claim_cells(run_dir, cs)
        claims = paper_claims(ccells, cs[0]["methods"], n_boot=400, margin=margin)
        req = requirements(claims, n_id, margin, seed_sd, max_seeds, max_scale)
        ood_text = ", ".join(f"{d} {n:,}" for d, n in n_ood.items())
        lines.append(
            f"\n{src}: {n_id:,} ID pairs, OOD {ood_text} in the pilot"
            + (f"; the datasets hold {held} pairs to test on (x{max_scale:.1f} at most)" if held else "")
        )
        lines += gap_lines(cs, ccells, n_id, max_scale, seed_sd, max_seeds)
        for key, r in req.items():
            now = f"{r['mde_now']:.1f} pp" if math.isfinite(r["mde_now"]) else "– (nothing varies)"
            lines.append(
                f"  ({key}) MDE now {now}; Holm family of {r['family']} (alpha {r['alpha']:.3g})"
                + (
                    f"; seed SD assumed {seed_sd:g} pp (a 1-seed pilot cannot measure it)"
                    if r["assumed_seed_sd"]
                    else ""
                )
            )
            if not math.isfinite(r["mde_now"]):
                lines.append("    nothing varies between these models in the pilot: no projection")
                continue
            first = next((k for k, n in r["by_seeds"].items() if n is not None), None)
            short = [k for k in r["unlimited"] if first is None or k < first]
            for k in short[:2] + (short[-1:] if len(short) > 2 else []):
                if r["beyond_data"][k] is not None:
                    later = [n for j in r["unlimited"] if j > k for n in (r["by_seeds"][j], r["beyond_data"][j]) if n]
                    then = (  # what the seeds after k would change, said where there are any
                        "; more seeds need fewer pairs"
                        if any(n < r["beyond_data"][k] for n in later)
                        else f"; as many at {max(r['unlimited'])} seeds"
                        if later
                        else ""
                    )
                    why = (
                        f"needs {r['beyond_data'][k]:,} ID pairs (x{r['beyond_data'][k] / n_id:.1f}), more than the "
                        f"datasets hold{then}"
                    )
                elif r["unlimited"][k] > margin:
                    why = f"training noise alone gives MDE {r['unlimited'][k]:.1f} pp with unlimited pairs"
                else:
                    why = f"more than {PAIR_GRID[-1]:,} ID pairs"
                lines.append(f"    {k} seeds: not reachable ({why})")
            if first is None:
                shared = all(u <= margin for u in r["unlimited"].values())
                lines.append(
                    f"    not reachable with <= {max_seeds} seeds within the data"
                    + (
                        ": the test pairs' noise, shared by every seed on one split, does not average over seeds; "
                        "a larger test set is needed"
                        if shared
                        else ""
                    )
                )
            shown = 0
            for k, n in r["by_seeds"].items():
                if n is None:
                    continue
                scale = n / n_id
                sec = (costs["train"] + costs["score"] * scale) * k / max(costs["seeds"], 1)
                eval_pairs = int(round(scale * (n_id + sum(n_ood.values()))))
                gh = gpu_hours(run_dir, len(by_source) * k, eval_pairs)
                lines.append(
                    f"    {k} seeds: {n:,} ID pairs per seed (each OOD set x{scale:.1f}); pilot hardware "
                    f"{sec / 3600:.1f} h" + (f"; GPU {gh:.2g} h" if gh is not None else "")
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
    import sys

    from .results.errors import RunDirError

    try:
        if not (math.isfinite(a.margin) and 0 < a.margin <= 100):
            raise ValueError(f"--margin must be a number of percentage points above 0 and at most 100, got {a.margin}")
        if not (math.isfinite(a.seed_sd) and a.seed_sd >= 0):
            raise ValueError(f"--seed-sd must be a number of percentage points >= 0, got {a.seed_sd}")
        if a.max_seeds < 2:
            raise ValueError(f"--max-seeds must be at least 2 (one seed decides nothing), got {a.max_seeds}")
        print(power_report(a.run_dir, a.margin, a.seed_sd, a.max_seeds))
    except (RunDirError, ValueError) as e:  # bad input: one line, exit 2, as the w2s-shift commands
        print(f"w2s-shift: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

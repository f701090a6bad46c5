"""False decisions, power and seeds used by ``w2s-shift run --until-decided`` (:mod:`w2s_shift.metrics.sequential`)
against a fixed design of N seeds, on the correlated world of benchmarks/interval_coverage.py (one shared test split
of n pairs, each pair's difficulty shared by every model and seed, 15% contested pairs, a per-pair effect of each
method shared by its seeds, a training effect per (method, seed) giving the seed SD below; its ``simulate`` and
``components`` are reused as they are).

Each replicate draws N seeds of two methods a, b; look j uses the first k_j seeds (k = 2..N), the claims' seeds x
pairs interval of acc(a) - acc(b) (= WRG(a) - WRG(b)) at the look's level (variance components from the pairs,
:func:`w2s_shift.metrics.significance.gpq_critical`), and the claim-row rule of
:func:`w2s_shift.metrics.sequential.sequential_decisions`: ruled out when the interval lies inside (-m, +m),
m = 3.8 pp, a direction when it excludes 0, else one more seed; the first decision stops. A true effect delta shifts
every seed's difference by delta (as interval_coverage.py measures power). Rules compared:

- uncorrected: every look at 0.05 (what looking again without a rule does);
- Bonferroni: 0.05 / J at each of the J looks (the simple valid fallback);
- O'Brien-Fleming, union: Lan & DeMets' O'Brien-Fleming-type spending at t = k / N, each look at its increment
  (the union bound: valid whatever the looks' dependence);
- O'Brien-Fleming, group-sequential: the same spending, each look at the nominal level of Lan & DeMets' boundary
  under the canonical joint normal of the looks (larger at the last look).

Printed per (N, n, seed SD): the false-decision rate under the null (a direction declared at some look) +- its
Monte Carlo SE against 5% + 2 SE; the rate of "ruled out" when the true effect is exactly m (also a false
decision); the power (the right direction declared by N seeds) at 3.8 / 6 / 10 pp and the expected seeds, against
the fixed design's power at N seeds (interval at 0.05, decided only at N).

    .venv/bin/python benchmarks/sequential_design.py           # about 5 minutes on 2 cores (the committed table)
    .venv/bin/python benchmarks/sequential_design.py --smoke   # seconds
    .venv/bin/python benchmarks/sequential_design.py --json benchmarks/results/sequential_design-DATE.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table, write_json  # noqa: E402
from interval_coverage import components, cpu_class, simulate  # noqa: E402

#: true effects (pp) of the power columns; the margin m
EFFECTS = (3.8, 6.0, 10.0)
MARGIN = 3.8
FIRST = 2
ALPHA = 0.05
RULES = ("uncorrected", "bonferroni", "obf-union", "obf-group-sequential")


def rule_levels(last: int) -> dict:
    """{rule: [level at each look k = FIRST..last]}."""
    from w2s_shift.metrics.sequential import look_plan

    looks = last - FIRST + 1
    return {
        "uncorrected": [ALPHA] * looks,
        "bonferroni": [x["alpha"] for x in look_plan(FIRST, last, ALPHA, "bonferroni")],
        **{
            f"obf-{b}": [x["alpha"] for x in look_plan(FIRST, last, ALPHA, "obrien-fleming", b)]
            for b in ("union", "group-sequential")
        },
    }


def looks_of(rng, reps: int, n: int, last: int, sd: float, levels: dict, chunk: int = 250) -> tuple:
    """(means (R, J) seed means at the looks, {level: (R, J) half-widths}) for ``reps`` simulated nulls of ``last``
    seeds, each look's interval at every level any rule uses there."""
    from w2s_shift.metrics.significance import gpq_critical

    ks = list(range(FIRST, last + 1))
    means, comps = [], {k: [] for k in ks}
    for start in range(0, reps, chunk):
        a, b = simulate(rng, min(chunk, reps - start), n, last, sd)
        row = []
        for k in ks:
            comp = components(a[:, :k], b[:, :k])
            comps[k].append(comp)
            row.append(comp["d"].mean(axis=1))
        means.append(np.stack(row, axis=1))
    means = np.concatenate(means)
    half = {}
    for j, k in enumerate(ks):
        s2, v, c = (np.concatenate([p[key] for p in comps[k]]) for key in ("s2", "v", "c"))
        for lev in sorted({levels[r][j] for r in levels}):
            half.setdefault(lev, np.zeros(means.shape))[:, j] = gpq_critical(s2, np.maximum(v - c, 0.0), c, k, lev)
    return means, half


def run_row(rng, last: int, n: int, sd: float, reps: int) -> dict:
    from w2s_shift.metrics.sequential import ABOVE, BELOW, RULED, sequential_decisions

    levels = rule_levels(last)
    means, half = looks_of(rng, reps, n, last, sd, levels)
    ks = np.arange(FIRST, last + 1)
    se = lambda p: float(np.sqrt(max(p * (1 - p), ALPHA * (1 - ALPHA)) / reps))  # noqa: E731
    out = {"max_seeds": last, "id_pairs": n, "seed_sd": sd, "replicates": reps, "levels": levels, "rules": {}}
    for rule, lev in levels.items():
        q = np.stack([half[x][:, j] for j, x in enumerate(lev)], axis=1)
        res = {}
        for delta in (0.0, MARGIN, *EFFECTS):
            dec, look = sequential_decisions(means + delta, q, MARGIN)
            seeds = ks[look]
            res[f"{delta:g}"] = {
                "direction": float(np.mean((dec == ABOVE) | (dec == BELOW))),
                "right": float(np.mean(dec == ABOVE)),
                "ruled_out": float(np.mean(dec == RULED)),
                "expected_seeds": float(seeds.mean()),
            }
        false = res["0"]["direction"]
        out["rules"][rule] = {
            "false_decision": false,
            "mc_se": se(false),
            "false_ruled_out_at_m": res[f"{MARGIN:g}"]["ruled_out"],
            "by_effect": res,
        }
    qn = half[ALPHA][:, -1]
    out["fixed"] = {
        f"{d:g}": {
            "right": float(np.mean(means[:, -1] + d - qn > 0)),
            "direction": float(np.mean(np.abs(means[:, -1] + d) > qn)),
            "ruled_out": float(np.mean((means[:, -1] + d - qn > -MARGIN) & (means[:, -1] + d + qn < MARGIN))),
        }
        for d in (0.0, MARGIN, *EFFECTS)
    }
    out["limit"] = ALPHA + 2 * se(ALPHA)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000, help="simulated replicates per setting")
    ap.add_argument("--smoke", action="store_true", help="200 replicates, two settings")
    ap.add_argument("--json", default=None, help="a JSON file for the table")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="the date recorded in the JSON")
    a = ap.parse_args(argv)
    reps = 200 if a.smoke else a.reps
    grid = (
        [(4, 250, 0), (4, 2000, 4)]
        if a.smoke
        else [(last, n, sd) for last in (5, 8) for n in (250, 2000) for sd in (0, 2, 4)]
    )
    rng = np.random.default_rng(51)
    rows, table, t0 = [], [], time.time()
    for last, n, sd in grid:
        row = run_row(rng, last, n, sd, reps)
        rows.append(row)
        for rule in RULES:
            r = row["rules"][rule]
            by = r["by_effect"]
            table.append(
                [
                    last,
                    n,
                    sd,
                    rule,
                    f"{100 * r['false_decision']:.1f}% ± {100 * r['mc_se']:.1f}",
                    "yes" if r["false_decision"] <= row["limit"] else "NO",
                    f"{100 * r['false_ruled_out_at_m']:.1f}%",
                    f"{by['0']['expected_seeds']:.2f}",
                    *(f"{100 * by[f'{e:g}']['right']:.0f}% / {by[f'{e:g}']['expected_seeds']:.2f}" for e in EFFECTS),
                    " / ".join(f"{100 * row['fixed'][f'{e:g}']['right']:.0f}%" for e in EFFECTS),
                ]
            )
            print(table[-1], f"({time.time() - t0:.0f} s)", flush=True)
    head = [
        "N",
        "pairs",
        "seed SD (pp)",
        "rule",
        "false decisions at 0 ± MC SE",
        "<= 5% + 2 SE",
        "ruled out at m",
        "E[seeds] at 0",
        *(f"power / E[seeds] at {e:g} pp" for e in EFFECTS),
        "fixed N: power at " + " / ".join(f"{e:g}" for e in EFFECTS),
    ]
    print(f"\n{reps} replicates per setting; looks at k = {FIRST}..N; m = {MARGIN} pp:\n")
    print(markdown_table(head, table))
    if a.json:
        write_json(
            a.json,
            {
                "replicates": reps,
                "date": a.date,
                "seconds": round(time.time() - t0, 1),
                "first_seeds": FIRST,
                "margin": MARGIN,
                "alpha": ALPHA,
                "rows": rows,
                "environment": {**environment(), "cpu_class": cpu_class()},
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

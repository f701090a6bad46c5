"""Null rejection and power of the claims' seeds x pairs interval
(:func:`w2s_shift.metrics.significance.seed_pair_interval`, used by :func:`w2s_shift.metrics.claims.pooled_metric`)
on simulated data as hard as real: k seeds of two methods a, b scored on ONE shared test split of n pairs, where

- each pair has a difficulty shared by every model and seed: 60% easy (logit N(2, 1)), 25% hard (N(-1.5, 1)),
  15% contested (N(0, 0.3), near 50/50);
- each method has a per-pair effect shared by all its seeds (logit N(0, 1)): a pair that favours a favours it in
  every seed, so the seeds' test-pair errors are correlated;
- each (method, seed) has a training effect, a logit shift N(0, sigma) with sigma set so that the seed SD of the
  accuracy difference is 0, 2 or 4 pp;
- each (method, seed, pair) outcome is a Bernoulli draw of sigmoid(difficulty + pair effect + training effect).

Under the null a and b are exchangeable, so the true difference over pairs and seeds is 0. Printed per (k, n, seed
SD): the share of 95% intervals of acc(a) - acc(b) (= WRG(a) - WRG(b)) that exclude 0, with its Monte Carlo SE,
for four rules: test pairs only (normal, the rule before seeds were counted), Satterthwaite (the t interval with
Satterthwaite df from S^2 and the tie fallback, the rule before this benchmark), t on k - 1 df (the same variance,
the always-valid fallback) and the generalized interval in use.
The variance components are the test-pair bootstrap's (its n_boot -> infinity limit, computed exactly from the
pairs: one resampling shared by the seeds); ``--check`` also runs the full ``pooled_metric`` path (its own
bootstrap) on a subsample and prints its rejection rate beside. Power: the share of intervals excluding 0 when every
simulated mean is shifted by a true effect delta; the measured 80%-power effect (at 5% and at Holm's first step in a
family of 3) is compared with :func:`~w2s_shift.metrics.significance.design_mde` at the simulated components, and the
before rule's Bloom MDE (median of the reported values) with its measured 80%-power effect.

    .venv/bin/python benchmarks/interval_coverage.py                # about 3 minutes on 2 cores (the committed table)
    .venv/bin/python benchmarks/interval_coverage.py --smoke        # seconds
    .venv/bin/python benchmarks/interval_coverage.py --json benchmarks/results/interval_coverage-DATE.json
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table, write_json  # noqa: E402

#: the simulated world: pair difficulty mixture (share, logit mean, logit SD), per-method pair effect SD (logit)
MIXTURE = ((0.60, 2.0, 1.0), (0.25, -1.5, 1.0), (0.15, 0.0, 0.3))
PAIR_EFFECT_SD = 1.0
#: true effects (pp) at which power is reported
EFFECTS = (2.0, 3.8, 6.0)


def _difficulty(rng, size) -> np.ndarray:
    shares = np.array([m[0] for m in MIXTURE])
    which = rng.choice(len(MIXTURE), size=size, p=shares / shares.sum())
    mu = np.array([m[1] for m in MIXTURE])[which]
    sd = np.array([m[2] for m in MIXTURE])[which]
    return mu + sd * rng.standard_normal(size)


def seed_logit_sd(seed_sd_pp: float) -> float:
    """The logit SD of a (method, seed) training effect that gives the accuracy difference a seed SD of
    ``seed_sd_pp``: d acc / d shift = E[p (1 - p)] over the world's pairs (200,000 drawn), and the difference of two
    independent shifts has sqrt(2) times their SD."""
    rng = np.random.default_rng(12345)
    eta = _difficulty(rng, 200_000) + PAIR_EFFECT_SD * rng.standard_normal(200_000)
    p = 1 / (1 + np.exp(-eta))
    return seed_sd_pp / (100 * np.sqrt(2) * float(np.mean(p * (1 - p))))


def simulate(rng, nulls: int, n: int, k: int, seed_sd: float) -> tuple:
    """(a, b): (nulls, k, n) bool correctness of the two methods on one shared split per null (the module
    docstring's world)."""
    mu = _difficulty(rng, (nulls, 1, n))
    sigma = seed_logit_sd(seed_sd)
    out = []
    for _ in range(2):
        eta = mu + PAIR_EFFECT_SD * rng.standard_normal((nulls, 1, n)) + sigma * rng.standard_normal((nulls, k, 1))
        out.append(rng.random((nulls, k, n)) < 1 / (1 + np.exp(-eta)))
    return out[0], out[1]


def components(a, b) -> dict:
    """Per null, the seed_pair_interval inputs from the pairs: "d" (nulls, k) per-seed differences (pp), "s2" (ddof
    1), "v" the mean over seeds of one seed's bootstrap variance, "c" the mean bootstrap covariance between seeds
    (one resampling shared, floored at 0), "v_mean" the bootstrap variance of the seed mean (pp^2), "discordant" the
    share of pairs on which a and b differ."""
    diff = a.astype(np.float32) - b.astype(np.float32)
    n, k = diff.shape[2], diff.shape[1]
    d = 100.0 * diff.mean(axis=2, dtype=np.float64)
    centred = diff - diff.mean(axis=2, keepdims=True)
    cov = np.einsum("rsi,rti->rst", centred, centred, dtype=np.float64) * (1e4 / n / n)  # plug-in bootstrap
    v = np.einsum("rss->r", cov) / k
    c = np.maximum(0.0, (cov.sum(axis=(1, 2)) - v * k) / (k * (k - 1)))
    return {
        "d": d,
        "s2": d.var(axis=1, ddof=1),
        "v": v,
        "c": c,
        "v_mean": cov.sum(axis=(1, 2)) / k**2,
        "discordant": float(np.mean(diff != 0)),
    }


def half_widths(comp: dict, k: int, alpha: float = 0.05) -> dict:
    """(nulls,) half-widths of the three rules (see the module docstring) at two-sided ``alpha``."""
    from scipy import stats as st

    from w2s_shift.metrics.significance import gpq_critical

    s2, v, c, vm = comp["s2"], comp["v"], comp["c"], comp["v_mean"]
    var = s2 / k + c
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(s2 > 0, var**2 / ((s2 / k) ** 2 / (k - 1)), np.inf)
    tie = (s2 <= 1e-9 * vm) & (c < (1 - 1e-6) * vm)  # the earlier rule's fallback for tied seeds
    var, df = np.where(tie, vm, var), np.where(tie, k - 1.0, df)
    return {
        "pairs_only": st.norm.isf(alpha / 2) * np.sqrt(vm),
        "satterthwaite": st.t.isf(alpha / 2, df) * np.sqrt(var),
        "t_k1": st.t.isf(alpha / 2, k - 1) * np.sqrt(s2 / k + c),
        "bloom_mde": (st.t.isf(alpha / 2, df) + st.t.ppf(0.8, df)) * np.sqrt(var),
        "generalized": gpq_critical(s2, np.maximum(v - c, 0.0), c, k, alpha),
    }


def rejection(mean, q, delta=0.0) -> np.ndarray:
    """Share of intervals mean + delta +- q that exclude 0, per delta (D,)."""
    delta = np.atleast_1d(delta)
    return (np.abs(mean[None, :] + delta[:, None]) > q[None, :]).mean(axis=1)


def effect_at(mean, q, power: float = 0.8, steps: int = 4000) -> float:
    """The smallest true effect (pp; a grid of ``steps`` up to the largest half-width plus 4 SD of the means,
    linear between points) found with ``power``."""
    grid = np.linspace(0.0, float(np.max(q)) + 4 * float(np.std(mean)) + 1e-9, steps)
    pw = rejection(mean, q, grid)
    i = int(np.argmax(pw >= power))
    if pw[i] < power:
        return float("nan")
    if i == 0:
        return 0.0
    x0, x1, y0, y1 = grid[i - 1], grid[i], pw[i - 1], pw[i]
    return float(x0 + (power - y0) * (x1 - x0) / (y1 - y0))


def null_cells(rng, n: int, seed_sd: float, k: int) -> list:
    """One simulated null in :func:`w2s_shift.metrics.claims.pooled_metric`'s cell form (the teacher at 50% on ID;
    one OOD set of 20 pairs, the same 10 right for every model, which WRG does not read)."""
    a, b = simulate(rng, 1, n, k, seed_sd)
    half = np.arange(20) < 10
    return [
        {
            "id": "id",
            "ood": ["o"],
            "ids": {"id": list(range(n)), "o": list(range(20))},
            "correct": {
                "teacher": {"id": np.arange(n) % 2 == 0, "o": half},
                "a": {"id": a[0, s], "o": half},
                "b": {"id": b[0, s], "o": half},
            },
        }
        for s in range(k)
    ]


def pooled_check(rng, n: int, seed_sd: float, k: int, nulls: int, n_boot: int) -> float:
    """Share of ``nulls`` simulated nulls whose pooled_metric interval of WRG(a) - WRG(b) excludes 0."""
    from w2s_shift.metrics.claims import pooled_metric

    hits = 0
    for r in range(nulls):
        s = pooled_metric(null_cells(rng, n, seed_sd, k), "a", "b", "WRG", n_boot=n_boot, seed=r)
        hits += s["ci"][0] > 0 or s["ci"][1] < 0
    return hits / nulls


def run_row(rng, k: int, n: int, sd: float, nulls: int, chunk: int = 250) -> dict:
    from w2s_shift.metrics.significance import design_mde

    parts = []
    for start in range(0, nulls, chunk):
        comp = components(*simulate(rng, min(chunk, nulls - start), n, k, sd))
        parts.append(comp)
    comp = {
        key: (
            np.concatenate([p[key] for p in parts]) if key != "discordant" else float(np.mean([p[key] for p in parts]))
        )
        for key in parts[0]
    }
    mean = comp["d"].mean(axis=1)
    hw, hw3 = half_widths(comp, k), half_widths(comp, k, 0.05 / 3)
    se = lambda p: float(np.sqrt(max(p * (1 - p), 0.05 * 0.95) / nulls))  # noqa: E731
    rates = {
        rule: float(rejection(mean, hw[rule])[0]) for rule in ("pairs_only", "satterthwaite", "t_k1", "generalized")
    }
    theta, v_own, c = (
        float(comp["s2"].mean()),
        float(np.mean(np.maximum(comp["v"] - comp["c"], 0))),
        float(comp["c"].mean()),
    )
    return {
        "seeds": k,
        "id_pairs": n,
        "seed_sd": sd,
        "nulls": nulls,
        **rates,
        "both": rates["generalized"],
        "mc_se": se(rates["generalized"]),
        "limit": 0.05 + 2 * se(0.05),
        "power": {f"{e:g}": float(rejection(mean, hw["generalized"], e)[0]) for e in EFFECTS},
        "power_satterthwaite": {f"{e:g}": float(rejection(mean, hw["satterthwaite"], e)[0]) for e in EFFECTS},
        "effect_80": effect_at(mean, hw["generalized"]),
        "design_mde": design_mde(theta, v_own, c, k),
        "effect_80_holm3": effect_at(mean, hw3["generalized"]),
        "design_mde_holm3": design_mde(theta, v_own, c, k, 0.05 / 3),
        "satterthwaite_effect_80": effect_at(mean, hw["satterthwaite"]),
        "t_k1_effect_80": effect_at(mean, hw["t_k1"]),
        "bloom_mde_median": float(np.median(hw["bloom_mde"])),
        "components": {
            "theta": theta,
            "v_own": v_own,
            "c": c,
            "discordant": comp["discordant"],
            "seed_sd_measured": float(np.sqrt(max(theta - v_own, 0.0))),
        },
    }


def cpu_class() -> str:
    """The CPU's bf16 class from /proc/cpuinfo (amx_bf16, avx512_bf16, or none)."""
    try:
        flags = set(re.findall(r"\b(amx_bf16|avx512_bf16)\b", Path("/proc/cpuinfo").read_text()))
    except OSError:
        return "unknown"
    return "amx_bf16" if "amx_bf16" in flags else ("avx512_bf16" if flags else "none")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nulls", type=int, default=4000, help="simulated nulls per setting")
    ap.add_argument("--check", type=int, default=0, help="nulls per setting through pooled_metric (0: none)")
    ap.add_argument("--check-pairs", type=int, nargs="+", default=[250], help="the pair counts --check runs at")
    ap.add_argument("--n-boot", type=int, default=200, help="bootstrap replicates of the --check nulls")
    ap.add_argument("--smoke", action="store_true", help="200 nulls, two settings")
    ap.add_argument("--json", default=None, help="a JSON file for the table")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="the date recorded in the JSON")
    a = ap.parse_args(argv)
    nulls = 200 if a.smoke else a.nulls
    grid = (
        [(2, 250, 0), (2, 250, 4)]
        if a.smoke
        else [(k, n, sd) for k in (2, 3, 5) for n in (250, 2000) for sd in (0, 2, 4)]
    )
    rng = np.random.default_rng(50)
    rows, table, t0 = [], [], time.time()
    for k, n, sd in grid:
        row = run_row(rng, k, n, sd, nulls)
        if a.check and n in a.check_pairs:
            row["pooled_metric"] = pooled_check(rng, n, sd, k, a.check, a.n_boot)
            row["pooled_metric_nulls"] = a.check
        rows.append(row)
        ok = "yes" if row["generalized"] <= row["limit"] else "NO"
        table.append(
            [
                k,
                n,
                sd,
                f"{100 * row['pairs_only']:.1f}%",
                f"{100 * row['satterthwaite']:.1f}%",
                f"{100 * row['t_k1']:.1f}%",
                f"{100 * row['generalized']:.1f}% ± {100 * row['mc_se']:.1f}",
                ok,
                *(f"{100 * row['power'][f'{e:g}']:.0f}%" for e in EFFECTS),
                f"{row['effect_80']:.2f} / {row['design_mde']:.2f}",
                f"{row['t_k1_effect_80']:.2f}",
                f"{row['effect_80_holm3']:.2f} / {row['design_mde_holm3']:.2f}",
                f"{row['satterthwaite_effect_80']:.2f} / {row['bloom_mde_median']:.2f}",
            ]
            + ([f"{100 * row['pooled_metric']:.1f}%" if "pooled_metric" in row else "–"] if a.check else [])
        )
        print(table[-1], f"({time.time() - t0:.0f} s)", flush=True)
    head = [
        "seeds",
        "pairs",
        "seed SD (pp)",
        "pairs only",
        "Satterthwaite (before)",
        "t, k - 1 df",
        "generalized (now) ± MC SE",
        "<= 5% + 2 SE",
        *(f"power at {e:g} pp" for e in EFFECTS),
        "80%-power effect: measured / design_mde",
        "t, k - 1 df: measured",
        "same, Holm of 3",
        "before: measured / Bloom MDE (median)",
    ] + (["pooled_metric check"] if a.check else [])
    print(f"\n{nulls} nulls per setting; share of 95% intervals excluding 0 under the null; power and effects in pp:\n")
    print(markdown_table(head, table))
    if a.json:
        env = {**environment(), "cpu_class": cpu_class()}
        write_json(
            a.json,
            {
                "nulls": nulls,
                "date": a.date,
                "seconds": round(time.time() - t0, 1),
                "world": {"mixture": MIXTURE, "pair_effect_sd": PAIR_EFFECT_SD},
                "rows": rows,
                "environment": env,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

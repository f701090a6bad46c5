"""Coverage of the claims' seeds-and-pairs interval (:func:`w2s_shift.metrics.claims.pooled_metric`) on simulated
true nulls: two methods with no true difference, k seeds on one shared ID split, a share of pairs on which they
disagree, and a training effect u ~ N(0, seed SD) pp on each seed's difference. Printed: the share of 95% intervals
of WRG(a) - WRG(b) that exclude 0 (nominal 5%), for the test-pair-only interval (the earlier rule) and for the
seeds-and-pairs interval, at each number of ID pairs, seed SD and number of seeds. Monte Carlo standard error of a
5% share: sqrt(0.05 x 0.95 / nulls) (1.0 point at 500 nulls).

    .venv/bin/python benchmarks/interval_coverage.py                 # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/interval_coverage.py --nulls 300 --n-boot 100   # 70 s (the committed table)
    .venv/bin/python benchmarks/interval_coverage.py --smoke         # seconds
    .venv/bin/python benchmarks/interval_coverage.py --json benchmarks/results/interval_coverage-DATE.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table, write_json  # noqa: E402

from w2s_shift.metrics.claims import pooled_metric  # noqa: E402


def null_cells(rng, n: int, seed_sd: float, k: int, discordant: float = 0.17) -> list:
    """k seeds of two methods a, b with no true difference on n shared ID pairs (one OOD set of 20 pairs, the same 10
    right for every model). A pair is discordant with probability ``discordant`` and then goes to a with probability
    1/2 + u / (2 discordant), so seed s's expected accuracy difference is its training effect u (pp / 100)."""
    cells = []
    for _ in range(k):
        u = rng.normal(0.0, seed_sd) / 100
        dis = rng.random(n) < discordant
        a_wins = rng.random(n) < np.clip(0.5 + u / (2 * discordant), 0, 1)
        both = rng.random(n) < 0.7
        half = np.arange(20) < 10  # the OOD set: the same 10 of 20 right for every model (WRG does not read it)
        corr = {
            "teacher": {"id": rng.random(n) < 0.5, "o": half},
            "a": {"id": np.where(dis, a_wins, both), "o": half},
            "b": {"id": np.where(dis, ~a_wins, both), "o": half},
        }
        cells.append({"id": "id", "ood": ["o"], "ids": {"id": list(range(n)), "o": list(range(20))}, "correct": corr})
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nulls", type=int, default=500, help="simulated nulls per setting")
    ap.add_argument("--n-boot", type=int, default=200, help="test-pair bootstrap replicates per null")
    ap.add_argument("--smoke", action="store_true", help="20 nulls, 30 replicates, one setting per axis")
    ap.add_argument("--json", default=None, help="a JSON file for the table")
    a = ap.parse_args(argv)
    nulls, n_boot = (20, 30) if a.smoke else (a.nulls, a.n_boot)
    pairs, sds, seeds = ([250], [0, 4], [2]) if a.smoke else ([250, 2000], [0, 2, 4], [2, 3])
    rng = np.random.default_rng(40)
    rows, out = [], []
    for k in seeds:
        for n in pairs:
            for sd in sds:
                old = new = 0
                for r in range(nulls):
                    s = pooled_metric(null_cells(rng, n, sd, k), "a", "b", "WRG", n_boot=n_boot, seed=r)
                    old += s["ci_pairs"][0] > 0 or s["ci_pairs"][1] < 0
                    new += s["ci"][0] > 0 or s["ci"][1] < 0
                out.append({"seeds": k, "id_pairs": n, "seed_sd": sd, "pairs_only": old / nulls, "both": new / nulls})
                rows.append([k, n, sd, f"{100 * old / nulls:.1f}%", f"{100 * new / nulls:.1f}%"])
                print(rows[-1], flush=True)
    print(f"\n{nulls} nulls per setting, {n_boot} bootstrap replicates; share of 95% intervals excluding 0:\n")
    print(markdown_table(["seeds", "ID pairs", "seed SD (pp)", "test pairs only", "seeds and pairs"], rows))
    if a.json:
        write_json(a.json, {"nulls": nulls, "n_boot": n_boot, "rows": out, "environment": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

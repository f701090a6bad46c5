"""Benchmark: where should an over-long response lose tokens, its middle or its start?

Both rules keep the response's last token and the end-of-turn markup (where the reward is read) and the prompt's
most recent tokens; they differ only in which response tokens survive: ``middle`` keeps the first floor(k/2) and
last ceil(k/2) of the k allowed tokens, ``start`` keeps the last k. The run trains the quickstart's weak teacher
(all-MiniLM-L6-v2, 300 gold pairs) and a gold-label MiniLM "ceiling" on 500 pairs, both at max_length 128, under
each rule, and scores them on the ID test split and on targets with long responses (HH helpful-online: ~80% of
pairs have a response cut at 128 tokens). The same pairs are scored under both rules, so the difference is paired.

MiniLM, not the SmolLM2 student, so that it runs in minutes on a CPU; the rule is the same for every model.

    python benchmarks/truncation_side.py                    # seeds 0 1, into runs/truncation_side/ (git-ignored)
    python benchmarks/truncation_side.py --seeds 0 --out /tmp/trunc

Prints one table (accuracy per rule, and start - middle with a paired 95% bootstrap interval over pairs) and
writes it as JSON next to the run directories.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np


def _config(out: Path, seeds: list) -> dict:
    model = {
        "name": "minilm-l6",
        "max_length": 128,
        "trainable_layers": 3,
        "pooling": "mean",
        "epochs": 3,
        "batch_size": 16,
        "learning_rate": 3.0e-4,
        "head_lr_multiplier": 10,
        "bf16": "auto",
    }
    return {
        "output_dir": str(out),
        "seeds": seeds,
        "data": {
            "source": "hh-helpful-base",
            "ood": ["hh-helpful-online", "ultrafeedback"],
            "split_fractions": [0.2, 0.4, 0.4],
            "n_teacher_train": 300,
            "n_student_train": 500,
            "n_test": 500,
            "n_ood": 300,
            "skip_invalid": True,
        },
        "teacher": model,
        "student": model,
        "methods": ["ceiling"],
    }


def _correct(cell: Path, model: str, dataset: str) -> np.ndarray:
    rows = [json.loads(x) for x in (cell / "rewards" / f"{model}__{dataset}.jsonl").read_text().splitlines() if x]
    return np.array([r["reward_chosen"] > r["reward_rejected"] for r in rows], dtype=float)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=Path("runs") / "truncation_side")
    ap.add_argument("--bootstrap", type=int, default=2000)
    args = ap.parse_args(argv)

    import w2s_shift.pipeline as pipeline
    import w2s_shift.pipeline.featurizer as featurizer
    from w2s_shift.config import RunConfig
    from w2s_shift.data.render import RESPONSE_CUTS, encode_pairs

    wall = {}
    for cut in RESPONSE_CUTS:
        featurizer.encode_pairs = functools.partial(encode_pairs, response_cut=cut)  # this benchmark's only change
        t = time.time()
        pipeline.run(RunConfig.model_validate(_config(args.out / cut, args.seeds)))
        wall[cut] = round(time.time() - t, 1)
    featurizer.encode_pairs = encode_pairs

    rng = np.random.default_rng(0)
    rows = []
    for seed in args.seeds:
        for model in ("teacher", "ceiling"):
            for ds in ("hh-helpful-base", "hh-helpful-online", "ultrafeedback"):
                c = {
                    cut: _correct(args.out / cut / "hh-helpful-base" / f"seed{seed}", model, ds)
                    for cut in RESPONSE_CUTS
                }
                d = c["start"] - c["middle"]
                boots = [d[rng.integers(0, d.size, d.size)].mean() for _ in range(args.bootstrap)]
                rows.append(
                    {
                        "seed": seed,
                        "model": model,
                        "dataset": ds,
                        "n": int(d.size),
                        "middle": 100 * c["middle"].mean(),
                        "start": 100 * c["start"].mean(),
                        "start_minus_middle": 100 * d.mean(),
                        "ci95": [100 * float(np.percentile(boots, 2.5)), 100 * float(np.percentile(boots, 97.5))],
                    }
                )
    print("| seed | model | dataset | n | middle | start | start - middle [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['model']} | {r['dataset']} | {r['n']} | {r['middle']:.2f} | {r['start']:.2f} | "
            f"{r['start_minus_middle']:+.2f} [{r['ci95'][0]:+.1f}, {r['ci95'][1]:+.1f}] |"
        )
    mean = float(np.mean([r["start_minus_middle"] for r in rows]))
    print(f"mean start - middle over {len(rows)} (seed, model, dataset) cells: {mean:+.2f} pp; wall {wall} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "truncation_side.json").write_text(
        json.dumps({"rows": rows, "mean_start_minus_middle": mean, "wall_seconds": wall}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

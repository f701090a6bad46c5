"""Metrics from the saved per-pair rewards, and the Markdown report with the paper's table layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .evaluate import bootstrap_ci, pairwise_accuracy, w2s_metrics
from .io import read_jsonl, write_text_atomic


def load_rewards(run_dir: Path, model: str, dataset: str) -> tuple:
    """(chosen rewards (B,), rejected rewards (B,)) of ``model`` on ``dataset`` from the run's rewards file."""
    rows = read_jsonl(run_dir / "rewards" / f"{model}__{dataset}.jsonl")
    return np.array([r["reward_chosen"] for r in rows]), np.array([r["reward_rejected"] for r in rows])


def build_metrics(cfg, run_dir: Path, id_name: str, ood_names: list, data_summary: dict, timings: dict) -> dict:
    """Accuracies (pp) with 95% bootstrap intervals for every model and test set, and WRG/AOG/NTS/PGR per
    student method (the ceiling is reported but is not a W2S method)."""
    datasets = [id_name, *ood_names]
    models = ["teacher", *[m.display for m in cfg.methods]]
    acc, ci, n = {}, {}, {}
    for mdl in models:
        acc[mdl], ci[mdl] = {}, {}
        for k, d in enumerate(datasets):
            c, r = load_rewards(run_dir, mdl, d)
            acc[mdl][d] = pairwise_accuracy(c, r)
            ci[mdl][d] = bootstrap_ci(c > r, n_boot=cfg.bootstrap, seed=cfg.seed + k)
            n[d] = int(c.size)
    ceiling = next((m.display for m in cfg.methods if m.name == "ceiling"), None)
    per_method = {m.display: w2s_metrics(acc, id_name, ood_names, "teacher", m.display, ceiling)
                  for m in cfg.methods if m.name != "ceiling"}
    t_lo, _ = ci["teacher"][id_name]
    labels = read_jsonl(run_dir / "teacher_labels.jsonl")
    q = np.array([r["q"] for r in labels])
    return {
        "id": id_name,
        "ood": ood_names,
        "n_pairs": n,
        "accuracy": acc,
        "accuracy_ci95": ci,
        "metrics": per_method,
        "teacher_beats_chance_id": bool(t_lo > 50.0),
        "teacher_labels": {"n": int(q.size), "mean_q": float(q.mean()), "agree_with_gold": float(100 * np.mean(q > 0.5))},
        "data": data_summary,
        "timings_seconds": {k: round(v, 1) for k, v in timings.items()},
        "config": {"teacher": cfg.teacher.name, "student": cfg.student.name, "source": cfg.data.source.display,
                   "methods": [m.model_dump() for m in cfg.methods]},
    }


def _f(x, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def format_table(metrics: dict) -> str:
    """The results table in Markdown: accuracy [95% CI] per test set, then WRG, AOG, NTS, PGR (pp)."""
    id_name, oods = metrics["id"], metrics["ood"]
    datasets = [id_name, *oods]
    head = ["model"] + [f"{d} acc" for d in datasets] + ["WRG"] + [f"AOG {d}" for d in oods] + ["AOG mean", "NTS", f"PGR {id_name}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mdl, accs in metrics["accuracy"].items():
        cells = [mdl]
        for d in datasets:
            lo, hi = metrics["accuracy_ci95"][mdl][d]
            cells.append(f"{accs[d]:.2f} [{lo:.1f}, {hi:.1f}]")
        m = metrics["metrics"].get(mdl)
        if m is None:
            cells += ["–"] * (len(head) - len(cells))
        else:
            cells.append(_f(m["WRG"], True))
            cells += [_f(m["AOG"][d], True) for d in oods]
            cells += [_f(m["AOG_mean"], True), _f(m["NTS"], True), _f(m["PGR"].get(id_name))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(run_dir: Path, metrics: dict) -> str:
    """Write ``report.md`` (table, data, labels, timings) atomically; return the table text."""
    table = format_table(metrics)
    d = metrics["data"]
    lines = [
        f"# W2S reward models under preference shift: {metrics['config']['source']}",
        "",
        f"Teacher `{metrics['config']['teacher']}`, student `{metrics['config']['student']}`. Pairwise accuracy in "
        "percentage points (ties count as wrong) with 95% bootstrap intervals over pairs; WRG, AOG, NTS in pp "
        "(Le et al. 2026); PGR = (student - teacher) / (ceiling - teacher) on the ID test split (n/a when the "
        "ceiling does not beat the teacher).",
        "",
        table,
        "",
        "## Data",
        f"- splits (by prompt, no prompt in two): {d['splits']}",
        f"- source rows skipped as invalid: {d['source']['invalid_rows_skipped']['skipped']} "
        f"{d['source']['invalid_rows_skipped']['by_reason']}; duplicate prompts removed: {d['source']['duplicate_prompts_removed']}",
    ]
    for name, o in d["ood"].items():
        lines.append(f"- OOD {name}: {o['used']} pairs used; invalid rows skipped {o['invalid_rows_skipped']['skipped']}; "
                     f"prompts overlapping the source removed {o['prompt_overlap_removed']}")
    tl = metrics["teacher_labels"]
    lines += [
        f"- test pairs: {metrics['n_pairs']}",
        "",
        "## Teacher labels",
        f"- teacher beats chance on the ID test split with its 95% interval clear of 50%: "
        f"{'yes' if metrics.get('teacher_beats_chance_id') else 'NO'}",
        f"- {tl['n']} soft labels on student-train, mean q {tl['mean_q']:.3f}, agreeing with gold on {tl['agree_with_gold']:.1f}% of pairs",
        "",
        "## Rendering and truncation",
        "- one rule for teacher and student: the tokenizer's chat template when it has one, else a plain "
        "'Human: ... Assistant: ...' transcript; over-long pairs lose their oldest prompt tokens first",
    ]
    for stage, info in metrics.get("stages", {}).items():
        if "rendering" in info or "truncated_pairs" in info:
            lines.append(f"- {stage}: chat template {info.get('rendering')}; truncated pairs {info.get('truncated_pairs')}")
    lines += [
        "",
        "## Time",
        f"- stages (s): {metrics['timings_seconds']}; wall {metrics.get('wall_seconds')} s",
    ]
    write_text_atomic(run_dir / "report.md", "\n".join(lines) + "\n")
    return table

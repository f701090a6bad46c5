"""The CPU regime search: which source, teacher strength and student depth give a weak-to-strong setting here.

Every configuration declared in ``benchmarks/regime_search/search.yaml`` (source x teacher strength x student depth,
run order cheapest first) is an ordinary ``w2s-shift run`` config: naive, ANCHOR (lambda 1 on the relative error,
last layer) and the gold ceiling, one seed. The script writes each as ``<out>/configs/<id>.yaml`` and runs it with
the library's own ``run`` in a child process (``python -m w2s_shift run CONFIG``): a killed search, run again with
the same arguments, resumes each run from its finished stages, and a finished configuration is only re-read.

Selection numbers come only from gold validation pairs carved from the source's student-train pool
(:func:`w2s_shift.pipeline.prepare.gold_validation_pairs`: the pool's pairs beyond ``data.n_student_train``, none
sharing a prompt with the pairs the student trains on; the prompt split keeps them apart from teacher-train and
test). They are written to ``<out>/validation/<source>.jsonl`` (checked to load back as the same pairs) and each
run scores every model on that file as its only evaluation target besides the ID test split
(``data.remove_ood_overlap: false``, so the file's source prompts are kept). The run's own split of the source is
untouched: teacher-train, student-train and test are the ones an ordinary run of the same config has. The script
reads only ``rewards/<model>__validation.jsonl`` and the drift on the validation pairs; never the test split's or
an OOD set's numbers.

Per configuration (``<out>/runs/<id>/``): the ceiling - teacher gap with its paired 95% bootstrap interval
(:func:`w2s_shift.metrics.stats.gap_check`), naive's WRG and PGR with joint bootstrap intervals
(:func:`~w2s_shift.metrics.stats.joint_bootstrap`), ANCHOR's last-layer drift over naive's, wall minutes (the run
directory's ``timings.json``, every attempt summed) and per training the steps, seconds and pairs/s, beside
``w2s-shift plan``'s FLOP count for it (the achieved CPU FLOP rate: what ``plan --mfu`` needs for this CPU).
The preconditions (declared in search.yaml) are written into the results file before anything runs; the results
file (JSON and Markdown) is rewritten after every configuration, so partial results are usable.

    .venv/bin/python benchmarks/regime_search.py --out runs/regime-search          # hours; resumable
    .venv/bin/python benchmarks/regime_search.py --smoke --out /tmp/rs-smoke --results /tmp/rs-smoke/results.json

``--smoke`` runs the same code on tiny random-init models (benchmarks/gpu_evidence.py's ``smoke_models``) and tiny
sizes (search.yaml's ``smoke``); ``--only ID...`` runs some configurations (the others stay "pending").
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
SEARCH = HERE / "regime_search" / "search.yaml"
VALIDATION = "validation"  # the label of the validation pair file in every run


def load_search(path: Path = SEARCH) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def config_id(i: int, source: str, teacher: str, depth: str) -> str:
    return f"{i + 1:02d}-{source}-{teacher}-{depth}"


def declared(search: dict) -> list:
    """The declared configurations in run order: [{"id", "source", "teacher", "depth"}]."""
    return [
        {"id": config_id(i, s, t, d), "source": s, "teacher": t, "depth": d}
        for i, (s, t, d) in enumerate(search["configurations"])
    ]


def _set(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def _merge(dst: dict, src: dict) -> dict:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def run_config(search: dict, c: dict, val_file: Path, run_dir: Path, smoke: dict | None = None) -> dict:
    """The run config (a dict) of configuration ``c``: search.yaml's base, its source, teacher strength and depth,
    the validation file as the only evaluation target; ``smoke``: tiny models and sizes on top."""
    import copy

    cfg = copy.deepcopy(search["base"])
    t, d = search["teachers"][c["teacher"]], search["depths"][c["depth"]]
    _merge(cfg, {k: v for k, v in t.items() if k in ("data", "teacher")})
    _merge(cfg, {"student": d["student"]})
    cfg["output_dir"] = str(run_dir)
    cfg["data"]["source"] = c["source"]
    cfg["data"]["ood"] = [{"path": str(val_file), "label": VALIDATION}]
    if smoke:
        cfg["teacher"]["name"], cfg["student"]["name"] = smoke["teacher_dir"], smoke["student_dir"]
        cfg["teacher"]["bf16"] = cfg["student"]["bf16"] = False
        for k, v in {
            **smoke["sizes"],
            **smoke["teachers"][c["teacher"]],
            **smoke["depths"][c["depth"]],
        }.items():
            _set(cfg, k, v)
    return cfg


# ---- the validation pairs ----------------------------------------------------------------------------------


def write_validation(cfg_dict: dict, n_pairs: int, path: Path) -> dict:
    """Carve ``n_pairs`` gold validation pairs from the source's student-train pool of the run config ``cfg_dict``
    and write them to ``path`` (JSONL, prompt / chosen / rejected / id), unchanged bytes when they are already
    there; the file is read back and must give the same pairs.

    Returns:
        {"file", "pairs", "sha256", "pool_train_pairs", "shares_prompt_with_train": 0, "in_test": 0}.

    Raises:
        ValueError: as gold_validation_pairs (too small a pool); the file does not load back as the same pairs.
    """
    from w2s_shift.config import RunConfig
    from w2s_shift.data.resolve import resolve_dataset
    from w2s_shift.data.splits import prompt_keys
    from w2s_shift.pipeline.prepare import gold_validation_pairs, prepare_data

    cfg = RunConfig.model_validate({**cfg_dict, "data": {**cfg_dict["data"], "ood": ["ultrafeedback"]}})
    val, train = gold_validation_pairs(cfg, n_pairs, cfg.data.sources[0], cfg.seeds[0])
    splits, _, _ = prepare_data(cfg, cfg.data.sources[0], cfg.seeds[0])
    keys = set(prompt_keys(val))
    overlap = {k: len(keys & set(prompt_keys(splits[k]))) for k in ("teacher_train", "student_train", "test")}
    if any(overlap.values()):
        raise ValueError(f"validation pairs share prompts with the run's splits: {overlap}")
    rows = []
    for i, p in enumerate(val):
        rows.append({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "id": p.id or f"val-{i}"})
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    back = resolve_dataset(str(path)).pairs
    same = [(p.prompt, p.chosen, p.rejected) for p in val] == [(p.prompt, p.chosen, p.rejected) for p in back]
    if not same:
        raise ValueError(f"{path} does not load back as the validation pairs it was written from")
    return {
        "file": str(path),
        "pairs": len(val),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "student_train_pairs": len(train),
        "prompts_shared_with": overlap,
    }


# ---- one configuration's numbers ---------------------------------------------------------------------------


def _correct(cell: Path, model: str) -> tuple:
    rows = [json.loads(x) for x in (cell / "rewards" / f"{model}__{VALIDATION}.jsonl").read_text().splitlines() if x]
    return [r.get("id") for r in rows], [1.0 if r["reward_chosen"] > r["reward_rejected"] else 0.0 for r in rows]


def _last_layer_drift(cm: dict, label: str) -> float | None:
    d = ((cm.get("drift") or {}).get(label) or {}).get("final", {}).get(VALIDATION)
    if not d:
        return None
    return float(d[max(d, key=int)]["rel_sq_err"])


def validation_numbers(run_dir: Path, pre: dict, n_boot: int) -> dict:
    """The selection numbers of a finished run, from its validation rewards and drift only."""
    from w2s_shift.metrics.stats import accuracy_interval, gap_check, joint_bootstrap

    m = json.loads((run_dir / "metrics.json").read_text())
    cm = m["cells"][0]
    cell = run_dir / cm["dir"]
    labels = {x["name"]: x["label"] for x in cm["methods"]}
    naive, anchor, ceiling = labels["naive"], labels["anchor"], labels["ceiling"]
    ids, correct = {}, {}
    for model in ("teacher", naive, anchor, ceiling):
        ids[model], correct[model] = _correct(cell, model)
    if len({tuple(v) for v in ids.values()}) != 1:
        raise ValueError(f"{cell}: the models' validation rewards are not on the same pairs in the same order")
    level = float(pre["level"])
    gap = gap_check(
        correct[ceiling], correct["teacher"], n_boot=n_boot, seed=0, level=level, min_gap_pp=pre["gap_min_pp"]
    )
    jb = joint_bootstrap(
        {k: {VALIDATION: v} for k, v in correct.items()},
        VALIDATION,
        [VALIDATION],
        [naive, anchor],
        ceiling=ceiling,
        n_boot=n_boot,
        seed=0,
        level=level,
    )
    acc = {k: v[VALIDATION] for k, v in jb["accuracy"].items()}
    wrg = jb["metrics"][naive]["WRG"]
    pgr = jb["metrics"][naive]["PGR"][VALIDATION]
    dn, da = _last_layer_drift(cm, naive), _last_layer_drift(cm, anchor)
    lo_t, hi_t = accuracy_interval(correct["teacher"], n_boot=n_boot, seed=0, level=level)
    return {
        "pairs": len(correct["teacher"]),
        "accuracy": {k: {"value": round(v["value"], 2), "ci": [round(x, 2) for x in v["ci"]]} for k, v in acc.items()},
        "teacher_beats_chance": bool(lo_t > 50.0),
        "gap": {"value": round(gap["gap_pp"], 2), "ci": [round(x, 2) for x in gap["ci"]]},
        "naive_wrg": {"value": round(wrg["value"], 2), "ci": [round(x, 2) for x in wrg["ci"]]},
        "naive_pgr": {
            "value": None if pgr["value"] is None else round(pgr["value"], 3),
            "ci": None if pgr["ci"] is None else [round(x, 3) for x in pgr["ci"]],
        },
        "anchor_wrg": {
            k: (round(v, 2) if k == "value" else [round(x, 2) for x in v])
            for k, v in jb["metrics"][anchor]["WRG"].items()
        },
        "drift_last_layer": {"naive": dn, "anchor": da},
        "drift_ratio": None if not dn or da is None else round(da / dn, 3),
    }


def qualifies(v: dict, pre: dict) -> tuple:
    """(qualifies, why) under the declared preconditions only."""
    g, lo, w = v["gap"]["value"], v["gap"]["ci"][0], v["naive_wrg"]["value"]
    fails = []
    if g < pre["gap_min_pp"]:
        fails.append(f"gap {g:+.2f} < {pre['gap_min_pp']:g} pp")
    if lo <= pre["gap_ci_low_above_pp"]:
        fails.append(f"gap interval low {lo:+.2f} <= {pre['gap_ci_low_above_pp']:g}")
    if w <= pre["naive_wrg_above_pp"]:
        fails.append(f"naive WRG {w:+.2f} <= {pre['naive_wrg_above_pp']:g}")
    if fails:
        return False, "; ".join(fails)
    return True, f"gap {g:+.2f} >= {pre['gap_min_pp']:g} with interval low {lo:+.2f} > 0; naive WRG {w:+.2f} > 0"


def training_costs(run_dir: Path, cfg_dict: dict) -> dict:
    """Per training of the run (teacher and each student): steps, seconds, pairs/s from its trainer log, and
    ``w2s-shift plan``'s FLOP count of the student trainings, with the achieved CPU FLOP rate; the run
    directory's stage seconds and wall time summed over every attempt (timings.json)."""
    m = json.loads((run_dir / "metrics.json").read_text())
    cm = m["cells"][0]
    cell = run_dir / cm["dir"]
    timings = json.loads((run_dir / "timings.json").read_text()) if (run_dir / "timings.json").is_file() else {}
    trainings = []
    for label in ["teacher", *[x["label"] for x in cm["methods"] if x["name"] != "zero_shot"]]:
        log = cell / "logs" / f"{label}.jsonl"
        if not log.is_file():
            continue
        rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        last = next((r for r in reversed(rows) if "train_runtime" in r), None)
        if last is None:
            continue
        steps = max((r.get("step", 0) for r in rows), default=0)
        trainings.append(
            {
                "model": label,
                "seconds": round(float(last["train_runtime"]), 1),
                "pairs_per_s": last.get("train_samples_per_second"),
                "steps": steps,
                "seconds_per_step": round(float(last["train_runtime"]) / steps, 3) if steps else None,
            }
        )
    flops = student_flops(cfg_dict)
    for t in trainings:
        if t["model"] != "teacher" and flops and t["seconds"]:
            t["plan_flops"] = flops
            t["achieved_gflop_per_s"] = round(flops / t["seconds"] / 1e9, 1)
    return {
        "wall_seconds": timings.get("wall_seconds"),
        "attempts": timings.get("runs"),
        "stage_seconds": (timings.get("cells") or {}).get(cm["dir"]),
        "trainings": trainings,
    }


def student_flops(cfg_dict: dict) -> float | None:
    """``w2s-shift plan``'s FLOPs of one naive student's training (6 N tokens for trained blocks, every sequence
    counted at max_length: an upper bound), or None where the planner does not know the student's shape."""
    try:
        from w2s_shift.config import RunConfig
        from w2s_shift.plan import Plan, gpu_flops, known_shape, run_defaults, shape_from_config_json

        cfg = RunConfig.model_validate(cfg_dict)
        shape = known_shape(cfg.student.name) or shape_from_config_json(cfg.student.name)
        d = run_defaults(cfg, shape)
        keep = (
            "seq_len",
            "batch_size",
            "grad_accum",
            "precision",
            "epochs",
            "pairs",
            "trainable_layers",
            "trunk_cache",
        )
        plan = Plan(shape, method="naive", students=1, eval_pairs=0, **{k: d[k] for k in keep if k in d})
        return float(gpu_flops(plan)["train"])
    except Exception:  # noqa: BLE001 -- a cost figure the planner cannot give is left out, not fatal
        return None


# ---- the results file --------------------------------------------------------------------------------------


def cpu_class() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), platform.processor()
    )
    flags = sorted({f for f in ("amx_bf16", "avx512_bf16") if f in text.split()})
    return {
        "model": model,
        "cores": os.cpu_count(),
        "bf16_flags": flags,
        "class": f"{os.cpu_count()}-core {model}, " + (", ".join(flags) if flags else "no native bfloat16 (float32)"),
    }


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def new_results(search: dict, smoke: bool, out: Path) -> dict:
    pre = dict(search["preconditions"])
    return {
        "what": "CPU regime search: a weak-to-strong setting (ceiling - teacher gap, naive WRG) on validation pairs",
        "date": search["date"],
        "smoke": smoke,
        "search_file": str(SEARCH.relative_to(ROOT)),
        "search_sha256": hashlib.sha256(SEARCH.read_bytes()).hexdigest(),
        "preconditions": {
            **pre,
            "declared_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "code_commit": _git_commit(),
            "rule": (
                f"qualifies when the ceiling - teacher gap on the validation pairs is >= {pre['gap_min_pp']:g} pp "
                f"with its paired {pre['level']:.0%} bootstrap interval's low end > {pre['gap_ci_low_above_pp']:g}, "
                "and "
                f"naive's WRG (naive - teacher) on the same pairs is > {pre['naive_wrg_above_pp']:g} pp; nothing else "
                "(no OOD number, no test-split number, no claim) selects"
            ),
        },
        "validation": {
            "pairs_per_source": search["smoke"]["validation_pairs"] if smoke else search["validation_pairs"],
            "how": (
                "gold_validation_pairs(config): the source's student-train pool (data.split_fractions, data.seed) "
                "minus the pairs the student trains on (data.n_student_train) and any pair sharing a prompt with "
                "them; written as a pair file that each run scores as its only evaluation target besides the ID "
                "test split (remove_ood_overlap off); the test split's and OOD numbers are never read"
            ),
            "files": {},
        },
        "cpu": cpu_class(),
        "out": str(out),
        "configurations": [
            {
                **c,
                "status": "pending",
                "teacher_what": search["teachers"][c["teacher"]]["what"],
                "depth_what": search["depths"][c["depth"]]["what"],
            }
            for c in declared(search)
        ],
    }


def _fmt_ci(x: dict | None, nd: int = 2, sign: bool = True) -> str:
    if not x or x.get("value") is None:
        return "–"
    f = f"{{:{'+' if sign else ''}.{nd}f}}"
    s = f.format(x["value"])
    if x.get("ci"):
        s += " [" + ", ".join(f.format(v) for v in x["ci"]) + "]"
    return s


def estimate(results: dict, search: dict) -> dict | None:
    """Minutes: each pending configuration costs the mean of the finished ones of its depth, else the first finished
    configuration's minutes x the depths' declared cost ratio."""
    rows = results["configurations"]
    done = [r for r in rows if r["status"] == "done" and r.get("minutes")]
    if not done:
        return None
    first = done[0]
    unit = first["minutes"] / search["depths"][first["depth"]]["cost"]
    per_depth: dict = {}
    for r in done:
        per_depth.setdefault(r["depth"], []).append(r["minutes"])
    left = 0.0
    for r in rows:
        if r["status"] != "done":
            ms = per_depth.get(r["depth"])
            left += sum(ms) / len(ms) if ms else unit * search["depths"][r["depth"]]["cost"]
    spent = sum(r["minutes"] for r in done)
    return {
        "from": f"{len(done)} finished configuration(s); first: {first['id']} in {first['minutes']:.1f} min",
        "minutes_done": round(spent, 1),
        "minutes_left": round(left, 1),
        "minutes_total": round(spent + left, 1),
    }


def markdown(results: dict) -> str:
    pre = results["preconditions"]
    lines = [
        f"# Regime search, {results['date']}" + (" (smoke: tiny random-init models)" if results["smoke"] else ""),
        "",
        f"CPU: {results['cpu']['class']}. Declared in `{results['search_file']}` (sha256 "
        f"{results['search_sha256'][:12]}), preconditions written {pre['declared_utc']} UTC at code "
        f"{(pre.get('code_commit') or '?')[:10]}, before any configuration ran.",
        "",
        f"**Preconditions**: {pre['rule']}. Tie-break: {pre['tie_break']}.",
        "",
        f"**Validation split**: {results['validation']['pairs_per_source']} pairs per source; "
        + results["validation"]["how"]
        + ".",
        "",
        "| # | source | teacher | student depth | val pairs | teacher acc | gap [95%] | naive WRG [95%] | PGR [95%] | "
        "drift ratio (ANCHOR / naive, last layer) | minutes (wall) | CPU minutes | qualifies | why |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["configurations"]:
        n = r["id"][:2]
        if r["status"] != "done":
            status = r["status"].replace("|", "/").replace("\n", " ")
            lines.append(f"| {n} | {r['source']} | {r['teacher']} | {r['depth']} | | | | | | | | | – | {status} |")
            continue
        v = r["validation"]
        lines.append(
            f"| {n} | {r['source']} | {r['teacher']} | {r['depth']} | {v['pairs']} | "
            f"{_fmt_ci(v['accuracy']['teacher'], sign=False)} | {_fmt_ci(v['gap'])} | {_fmt_ci(v['naive_wrg'])} | "
            f"{_fmt_ci(v['naive_pgr'], 2)}"
            + (
                " [undefined: gap within noise]"
                if v["naive_pgr"]["value"] is not None and not v["naive_pgr"]["ci"]
                else ""
            )
            + " | "
            + (f"{v['drift_ratio']:.2f}x" if v["drift_ratio"] is not None else "–")
            + f" | {r['minutes']:.1f} | {r.get('cpu_minutes', 0):.1f} | "
            + f"{'yes' if r['qualifies'] else 'no'} | {r['why']} |"
        )
    lines.append("")
    q = results.get("qualifying") or []
    lines.append(
        f"Qualifying: {', '.join(q)}; chosen by the tie-break: {results.get('chosen')}."
        if q
        else "Qualifying so far: none."
    )
    if len(q) > 1:  # wall minutes carry the machine's load: show what each was measured under
        loads = []
        for r in (r for r in results["configurations"] if r["id"] in q):
            la = [x for a in r.get("attempts", []) for x in a.get("load_average_5min") or []]
            span = f", 5-min load {min(la):.1f}-{max(la):.1f} on {results['cpu'].get('cores', '?')} cores" if la else ""
            loads.append(f"{r['id'][:2]} {r['minutes']:.1f} wall / {r.get('cpu_minutes', 0):.1f} CPU min{span}")
        lines.append("Tie-break inputs: " + "; ".join(loads) + ".")
    lines += read_after_choice(results)
    est = results.get("estimate")
    if est:
        lines.append(
            f"Time: {est['minutes_done']:.0f} min done, about {est['minutes_left']:.0f} min left, "
            f"{est['minutes_total']:.0f} min in all ({est['from']})."
        )
    lines += [
        "",
        "Teacher strengths: " + "; ".join(f"{k}: {v}" for k, v in results.get("teachers", {}).items()) + ".",
        "Student depths: " + "; ".join(f"{k}: {v}" for k, v in results.get("depths", {}).items()) + ".",
        "Accuracy, gap and WRG in % / pp on the validation pairs; PGR = (naive - teacher) / (ceiling - teacher); "
        "intervals: paired percentile bootstrap over validation pairs. Minutes (wall): the run directory's time over "
        "every attempt; CPU minutes: user + system time of the run processes whose end the search saw (less "
        "disturbed by other jobs on a shared machine; the 5-minute load average at each attempt's start and end "
        "is in the JSON). Per-training costs (steps, s/step, pairs/s, plan's FLOPs and the achieved GFLOP/s) are in "
        "the JSON beside this file.",
    ]
    return "\n".join(lines) + "\n"


#: seeds of the evidence run a chosen configuration becomes (the issue's least), and the training SD assumed for one
#: validation seed (the evidence-w2s pilot measured 2.9 pp for its gap over 2 seeds)
READ_SEEDS, READ_SEED_SD = 5, 2.0


def read_after_choice(results: dict) -> list:
    """Lines read after the choice, never a precondition or tie-break: for each finished configuration, the chance
    that every one of ``READ_SEEDS`` seeds passes the checks a verdict needs in each seed (w2s_gap_check.py: the gap
    >= 5 pp with its interval above 0, the teacher's interval above 50%) on as many test pairs as its validation
    pairs, from its one validation seed (:func:`w2s_shift.power.gap_pass_chance`; the pair SE from the interval's
    width, all pair noise shared by the seeds of one split, training SD ``READ_SEED_SD`` assumed)."""
    from w2s_shift.power import gap_pass_chance

    rows = []
    for r in results["configurations"]:
        if r["status"] != "done":
            continue
        v = r["validation"]

        def chance(x: dict, shift: float, floor: float) -> float | None:
            if x.get("value") is None or not x.get("ci"):
                return None
            se = (x["ci"][1] - x["ci"][0]) / (2 * 1.959964)
            return gap_pass_chance(x["value"] - shift, READ_SEED_SD**2, 0.0, se**2, READ_SEEDS, floor=floor)

        gap, teacher = chance(v["gap"], 0.0, 5.0), chance(v["accuracy"]["teacher"], 50.0, 0.0)
        fmt = lambda p: "–" if p is None else f"{100 * p:.0f}%"  # noqa: E731
        rows.append(f"{r['id'][:2]} gap {fmt(gap)}, teacher {fmt(teacher)}")
    if not rows:
        return []
    return [
        "",
        f"Read after the choice (not a precondition, never used to choose): the chance that all {READ_SEEDS} seeds of "
        "an evidence run pass the per-seed checks its verdicts need (w2s_gap_check.py: gap >= 5 pp with its interval "
        "above 0; the teacher's interval above 50%), on as many test pairs, from each configuration's one validation "
        f"seed (training SD {READ_SEED_SD:g} pp assumed; `w2s_shift.power.gap_pass_chance`): " + "; ".join(rows) + ".",
    ]


def write_results(results: dict, path: Path, search: dict) -> None:
    rows = results["configurations"]
    q = [r for r in rows if r["status"] == "done" and r.get("qualifies")]
    results["qualifying"] = [r["id"] for r in q]
    results["chosen"] = min(q, key=lambda r: r["minutes"])["id"] if q else None
    results["estimate"] = estimate(results, search)
    results["teachers"] = {k: v["what"] for k, v in search["teachers"].items()}
    results["depths"] = {k: v["what"] for k, v in search["depths"].items()}
    results["updated_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    path.parent.mkdir(parents=True, exist_ok=True)
    for p, text in (
        (path, json.dumps(results, indent=1, default=str) + "\n"),
        (path.with_suffix(".md"), markdown(results)),
    ):
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, p)


# ---- running ------------------------------------------------------------------------------------------------

_CHILD: subprocess.Popen | None = None
_STOPPING: int | None = None


def _die_with_parent() -> None:
    """In the child: SIGTERM when the search process dies, however it dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _stop(signum, frame):
    """SIGTERM / SIGINT: stop the run in progress (its finished stages stay for the resume), then exit. The child
    is signalled, not waited for here: the main thread's wait for it returns once it has ended."""
    global _STOPPING
    _STOPPING = signum
    if _CHILD is None:
        raise SystemExit(128 + signum)
    try:
        os.kill(_CHILD.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def run_one(cfg_path: Path, log_path: Path) -> int:
    """``python -m w2s_shift run CFG`` in a child process (it resumes a killed run), output to ``log_path``."""
    global _CHILD
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} w2s-shift run {cfg_path}\n")
        log.flush()
        _CHILD = subprocess.Popen(
            [sys.executable, "-m", "w2s_shift", "run", str(cfg_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=_die_with_parent,
        )
        rc = _CHILD.wait()
        _CHILD = None
    if _STOPPING is not None:
        raise SystemExit(128 + _STOPPING)
    return rc


def _children_cpu() -> float:
    """User + system CPU seconds of this process's finished children (the runs)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tail(path: Path, n: int = 3) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.is_file() else []
    return " / ".join(lines[-n:])[-400:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=str(ROOT / "runs" / "regime-search"), help="run directories, configs, validation files"
    )
    ap.add_argument(
        "--results",
        default=None,
        help="results JSON (default benchmarks/results/regime_search-<date>.json; the .md beside it)",
    )
    ap.add_argument(
        "--search", default=str(SEARCH), help="the declared search (default benchmarks/regime_search/search.yaml)"
    )
    ap.add_argument("--only", nargs="*", default=None, help="configuration numbers or ids to run (others stay pending)")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny random-init models and sizes: tests the script, measures nothing"
    )
    ap.add_argument("--tokenizer", default=None, help="--smoke: a tokenizer folder (default: one trained in code)")
    a = ap.parse_args(argv)
    search = load_search(Path(a.search))
    out = Path(a.out).resolve()
    res_path = Path(a.results) if a.results else HERE / "results" / f"regime_search-{search['date']}.json"
    pre = search["preconditions"]

    results = new_results(search, a.smoke, out)
    if res_path.is_file():  # resume: the preconditions and the configuration list must be the declared ones
        old = json.loads(res_path.read_text())
        keys = ("gap_min_pp", "gap_ci_low_above_pp", "naive_wrg_above_pp", "level", "tie_break")
        if (
            any(old["preconditions"].get(k) != pre[k] for k in keys)
            or [r["id"] for r in old["configurations"]] != [r["id"] for r in results["configurations"]]
            or old.get("smoke") != a.smoke
        ):
            print(
                f"{res_path}: written by another declaration of the search (preconditions, configurations or "
                "--smoke differ); move it away to start a new search",
                file=sys.stderr,
            )
            return 2
        results["preconditions"] = old["preconditions"]
        results["validation"]["files"] = old["validation"].get("files", {})
        results["configurations"] = old["configurations"]
    write_results(results, res_path, search)  # the preconditions are on disk before anything runs
    print(f"preconditions declared in {res_path}: {results['preconditions']['rule']}", flush=True)

    handlers = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _search(a, search, results, res_path, out)
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)


def _search(a, search: dict, results: dict, res_path: Path, out: Path) -> int:
    pre = search["preconditions"]
    smoke = None
    if a.smoke:
        from gpu_evidence import smoke_models

        dirs = smoke_models(out / "smoke-models", a.tokenizer)
        smoke = {**search["smoke"], "teacher_dir": dirs["teacher"], "student_dir": dirs["student"]}
    n_val = search["smoke"]["validation_pairs"] if a.smoke else search["validation_pairs"]
    n_boot = None
    only = set(a.only) if a.only is not None else None
    import yaml

    for row in results["configurations"]:
        if (
            only is not None
            and row["id"] not in only
            and row["id"][:2] not in only
            and str(int(row["id"][:2])) not in only
        ):
            continue
        run_dir = out / "runs" / row["id"]
        val_file = out / "validation" / f"{row['source']}.jsonl"
        cfg = run_config(search, row, val_file, run_dir, smoke)
        n_boot = int(cfg.get("bootstrap", 2000))
        cfg_path = out / "configs" / f"{row['id']}.yaml"
        cfg_text = yaml.safe_dump(cfg, sort_keys=False)
        cfg_sha = hashlib.sha256(cfg_text.encode()).hexdigest()
        if row["status"] == "done" and row.get("config_sha256") == cfg_sha and (run_dir / "metrics.json").is_file():
            print(f"{row['id']}: finished earlier ({row['minutes']:.1f} min), kept", flush=True)
            continue
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(cfg_text)
        row.update(config=str(cfg_path), config_sha256=cfg_sha, run_dir=str(run_dir), status="running")
        t0 = time.time()
        try:
            results["validation"]["files"][row["source"]] = write_validation(cfg, n_val, val_file)
        except ValueError as e:
            row["status"] = f"failed: {e}"
            write_results(results, res_path, search)
            continue
        write_results(results, res_path, search)
        print(
            f"[{time.strftime('%H:%M:%S')}] {row['id']}: running (log {out / 'logs' / (row['id'] + '.log')})",
            flush=True,
        )
        cpu0, load0 = _children_cpu(), os.getloadavg()[1]
        try:
            rc = run_one(cfg_path, out / "logs" / f"{row['id']}.log")
        except SystemExit:
            row["status"] = "interrupted (its finished stages are kept: running the search again resumes it)"
            write_results(results, res_path, search)
            raise
        attempt = {
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
            "wall_seconds": round(time.time() - t0, 1),
            "cpu_seconds": round(_children_cpu() - cpu0, 1),
            "load_average_5min": [round(load0, 2), round(os.getloadavg()[1], 2)],
            "exit": rc,
        }
        row["attempts"] = [*row.get("attempts", []), attempt]
        if rc != 0 or not (run_dir / "metrics.json").is_file():
            row["status"] = f"failed (exit {rc}): {_tail(out / 'logs' / (row['id'] + '.log'))}"
            print(f"  {row['status']}", flush=True)
            write_results(results, res_path, search)
            continue
        v = validation_numbers(run_dir, pre, n_boot)
        ok, why = qualifies(v, pre)
        costs = training_costs(run_dir, cfg)
        row.update(
            status="done",
            validation=v,
            qualifies=ok,
            why=why,
            costs=costs,
            minutes=round((costs["wall_seconds"] or (time.time() - t0)) / 60, 2),
            cpu_minutes=round(sum(x["cpu_seconds"] for x in row["attempts"]) / 60, 2),
        )
        write_results(results, res_path, search)
        print(
            f"  done in {row['minutes']:.1f} min: gap {_fmt_ci(v['gap'])}, naive WRG {_fmt_ci(v['naive_wrg'])}, "
            f"qualifies {'yes' if ok else 'no'} ({why})",
            flush=True,
        )
        if results["estimate"]:
            print(f"  estimate: {results['estimate']}", flush=True)
    print(markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

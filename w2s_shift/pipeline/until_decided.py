"""``w2s-shift run CONFIG --until-decided --max-seeds N``: the grid run again with one more seed at a time until every
primary claim is decided or N seeds are reached, each look's claims decided at the alpha a spending function gives it
(:mod:`w2s_shift.metrics.sequential`; the rules: docs/protocol.md, "Adding seeds until decided").

Each look is a plain :func:`w2s_shift.pipeline.run` with the seeds so far: finished stages are reused (their
markers are keyed on their inputs), so adding a seed trains only that seed's teacher and students, and a killed or
rerun loop replays its earlier looks from the stages on disk (the claims' bootstrap is seeded, so they decide the
same). The run directory's config then differs from the looks' only in ``seeds``, which the loop accepts without
``--overwrite``. The looks, each claim's verdict at each, the frozen verdicts and why the loop stopped go to
``RUN/sequential.json``; metrics.json is the last look's (its claims at the fixed 95% level), and the report, redrawn
after each look, shows the frozen verdicts at its top (:func:`w2s_shift.report.sections.sequential_blocks`).
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from ..config import RunConfig
from ..distributed import run_on_main
from ..io import read_json
from ..metrics.claims import ALPHA, MARGIN_PP
from ..metrics.sequential import DECIDED, decide_at, frozen_verdicts, look_plan, stop_reason
from ..results.verdicts import source_claims
from ..runlock import holding
from .grid import run
from .rundir import changed_fields, log, stale_stages, write_json_on_main

#: the spending function and the reading of each look's level the loop uses (benchmarks/sequential_design.py)
SPENDING = "obrien-fleming"
BOUNDARY = "union"
FILE = "sequential.json"
#: the most seeds --max-seeds may ask for
MAX_SEEDS = 100


def check_flags(until_decided: bool, max_seeds: int | None, dry_run: bool) -> None:
    """The command line's sequential flags, checked before the config loads.

    Raises:
        ValueError: --until-decided with --dry-run or without --max-seeds; --max-seeds without --until-decided;
            --max-seeds below 2 or above :data:`MAX_SEEDS`.
    """
    if until_decided and dry_run:
        raise ValueError(
            "--until-decided trains one seed after another until the claims are decided, so it cannot be a "
            "--dry-run: check the config with `w2s-shift run CONFIG --dry-run` alone"
        )
    if until_decided and max_seeds is None:
        raise ValueError("--until-decided needs --max-seeds N, the most seeds the loop may reach (N >= 2)")
    if max_seeds is not None and not until_decided:
        raise ValueError("--max-seeds is the limit of --until-decided: give both, or neither")
    if max_seeds is not None and max_seeds < 2:
        raise ValueError(f"--max-seeds must be 2 or more (a look needs 2 seeds for training noise), got {max_seeds}")
    if max_seeds is not None and max_seeds > MAX_SEEDS:
        raise ValueError(
            f"--max-seeds must be at most {MAX_SEEDS}, got {max_seeds}: every seed trains each student again, and the "
            f"early looks of a longer plan spend almost none of the error rate (at {MAX_SEEDS} seeds the first look "
            "is at alpha ~1e-43)"
        )


def first_look_seeds(cfg: RunConfig, max_seeds: int) -> int:
    """Seeds at the first look: the config's, at least 2 (one seed holds no training noise).

    Raises:
        ValueError: ``max_seeds`` below that (named with the config's seeds).
    """
    first = max(2, len(cfg.seeds))
    if max_seeds < first:
        why = f"the config's {len(cfg.seeds)} seeds {cfg.seeds}" if len(cfg.seeds) >= 2 else "the 2 seeds a look needs"
        raise ValueError(
            f"--max-seeds {max_seeds} is below {why}: --max-seeds is the most seeds the loop may reach, so give "
            f"--max-seeds {first} or more"
        )
    return first


def seed_list(cfg: RunConfig, k: int) -> list:
    """The config's seeds, extended to ``k`` (never cut) by the next integers above the largest."""
    seeds = list(cfg.seeds)
    while len(seeds) < k:
        seeds.append(max(seeds, default=-1) + 1)
    return seeds


def _plan(cfg: RunConfig, max_seeds: int, alpha: float) -> dict:
    first = first_look_seeds(cfg, max_seeds)
    return {
        "first_seeds": first,
        "max_seeds": max_seeds,
        "alpha": alpha,
        "spending": SPENDING,
        "boundary": BOUNDARY,
        "margin": MARGIN_PP,
        "looks": look_plan(first, max_seeds, alpha, SPENDING, BOUNDARY),
    }


def _check_plan(out: Path, plan: dict, overwrite: bool) -> None:
    """Refuse a run directory whose sequential.json holds another plan (changing N or alpha after looking at results
    breaks the error rate), unless ``overwrite``."""
    f = out / FILE
    if not f.exists():
        return
    try:
        old = read_json(f)["plan"]
        if not isinstance(old, dict):
            raise TypeError(old)
    except (OSError, ValueError, KeyError, TypeError):
        if overwrite:
            log(f"until-decided: --overwrite: {f} is not a w2s-shift sequential record; a new plan replaces it")
            return
        raise ValueError(f"{f}: not a w2s-shift sequential record; use another --output-dir or --overwrite") from None
    keys = ("first_seeds", "max_seeds", "alpha", "spending", "boundary", "margin")
    diff = [f"{k} {old.get(k)} -> {plan[k]}" for k in keys if old.get(k) != plan[k]]
    if diff and not overwrite:
        raise ValueError(
            f"{f}: this run directory's seeds were added under another plan ({', '.join(diff)}); a plan changed after "
            "looking at the results no longer keeps the error rate: rerun with the earlier --max-seeds (and seeds), "
            "or use another --output-dir (--overwrite starts a new plan here)"
        )
    if diff:
        log(f"until-decided: --overwrite: the earlier plan ({', '.join(diff)}) is replaced")


def _only_seeds_differ(out: Path, cfg: RunConfig) -> bool:
    """Whether the run directory's config.yaml differs from ``cfg`` in ``seeds`` alone, with no finished stage of
    other code (then the loop's own change of seeds needs no ``--overwrite``)."""
    try:
        old = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    return (
        isinstance(old, dict)
        and changed_fields(old, cfg.model_dump(mode="json")) == ["seeds"]
        and not (stale_stages(out))
    )


def look_claims(out: Path, metrics: dict, alpha: float) -> dict:
    """{"source/claim": claim decided at ``alpha``} of every source of a run's metrics
    (:func:`w2s_shift.results.verdicts.source_claims`, then :func:`w2s_shift.metrics.sequential.decide_at`)."""
    out_claims = {}
    sources = list(dict.fromkeys(c["source"] for c in metrics["cells"]))
    for src in sources:
        cells = [c for c in metrics["cells"] if c["source"] == src]
        methods = list({m["label"]: m for c in cells for m in c["methods"]}.values())
        claims = source_claims(out, cells, methods)
        for c in decide_at(claims or [], alpha):
            out_claims[f"{src}/{c['claim']}"] = c
    return out_claims


def _finite(x):
    """A number for JSON: None where it is not finite (an MDE where nothing varies, or at an early look's tiny
    alpha, whose interval and MDE are infinite)."""
    return float(x) if x is not None and math.isfinite(x) else None


def _row(r: dict) -> dict:
    s = r["stat"]
    return {
        "what": r["what"],
        "primary": r["primary"],
        "value": _finite(s["value"]),
        "ci": [_finite(x) for x in s["ci"]],
        "p_holm": _finite(r["p_holm"]),
        "mde": _finite(s["mde"]),
        "status": r["status"],
    }


def run_until_decided(cfg: RunConfig, max_seeds: int, overwrite: bool = False, wait: bool = False) -> dict:
    """Run the grid at k = the first look's seeds, decide the claims at that look's alpha, and add one seed at a time
    until no claim is open (:data:`w2s_shift.metrics.sequential.OPEN`) or ``max_seeds`` is reached.

    Args:
        cfg: the run config (its seeds start the loop; fewer than 2 are extended to 2); max_seeds: N, the most seeds.
        overwrite, wait: as :func:`w2s_shift.pipeline.run` (the first look; later looks differ from the directory's
            config only in seeds and need no overwrite); overwrite also replaces an earlier sequential plan.

    Returns:
        the sequential record written to ``RUN/sequential.json``: {"plan": {first_seeds, max_seeds, alpha, spending,
        boundary, margin, looks: [{look, seeds, t, spent, alpha}]}, "looks": [{look, seeds, seed_list, alpha, spent,
        claims: {source/claim: verdict}, rows: {source/claim: [{what, primary, value, ci, p_holm, mde, status}]}}]
        (a number that is not finite written as null), "verdicts": {source/claim: {verdict, seeds, open}},
        "stopped": why, "seeds_used": k}.

    Raises:
        ValueError: max_seeds below the first look's seeds; a run directory holding another sequential plan; and
            whatever :func:`w2s_shift.pipeline.run` raises.
    """
    from ..report import write_report  # matplotlib, loaded when a run starts

    plan = _plan(cfg, max_seeds, ALPHA)
    out = Path(cfg.output_dir)
    _check_plan(out, plan, overwrite)
    record = {"plan": plan, "looks": [], "verdicts": {}, "stopped": None, "seeds_used": None}
    for j, look in enumerate(plan["looks"]):
        seeds = seed_list(cfg, look["seeds"])
        cfg_k = cfg.model_copy(update={"seeds": seeds})
        log(
            f"until-decided: look {j + 1} of {len(plan['looks'])}: seeds {seeds}, alpha {look['alpha']:.4g} (spent "
            f"{look['spent']:.4g} of {plan['alpha']:g})"
        )
        metrics = run(cfg_k, overwrite=overwrite or _only_seeds_differ(out, cfg_k), wait=wait)
        claims = look_claims(out, metrics, look["alpha"])
        record["looks"].append(
            {
                "look": look["look"],
                "seeds": look["seeds"],
                "seed_list": seeds,
                "alpha": look["alpha"],
                "spent": look["spent"],
                "claims": {k: c["verdict"] for k, c in claims.items()},
                "rows": {k: [_row(r) for r in c["rows"]] for k, c in claims.items()},
            }
        )
        record["verdicts"] = frozen_verdicts(record["looks"])
        record["seeds_used"] = look["seeds"]
        record["stopped"] = stop_reason(record["verdicts"], look["seeds"], max_seeds)
        with holding(out, wait=wait, command="run --until-decided"):
            write_json_on_main(out / FILE, record)
            run_on_main(write_report, out, metrics)  # the report shows the frozen verdicts beside the look's rows
        log(
            "until-decided: "
            + "; ".join(
                f"{k} {v['verdict']}" + (f" (decided at {v['seeds']} seeds)" if v["verdict"] in DECIDED else "")
                for k, v in record["verdicts"].items()
            )
        )
        if record["stopped"]:
            break
    log(f"until-decided: stopped: {record['stopped']}; record in {out / FILE}")
    return record

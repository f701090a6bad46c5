"""``w2s-shift export RUN_DIR LABEL...``: trained students of a finished run saved as Hugging Face reward models
(``<source>/seed<k>/export/<label>/``, :func:`w2s_shift.models.export.export_reward_model`) from their saved
weights: nothing is trained or scored again, and ``metrics.json``, the report and targets added with ``evaluate``
stay as they are."""

from __future__ import annotations

import os
from pathlib import Path

from ..results import FinishedRun, RunDirError, exportable_labels, open_run
from .featurizer import SourceContext
from .rundir import log, refuse_links_out_of
from .score_stage import export_students


def _plan(run: FinishedRun, labels: list, sources: list | None, seeds: list | None) -> list:
    """[(source config entry, cell dict, [labels])] to export; every name checked first."""
    avail = exportable_labels(run.cells)
    wanted = avail if list(labels) == ["all"] else list(dict.fromkeys(labels))
    unknown = [x for x in wanted if x not in avail]
    if not wanted or unknown:
        raise RunDirError(
            f"{run.path}: {'no trained student ' + ', '.join(map(repr, unknown)) if unknown else 'no label given'} "
            f"in this run; it can export {', '.join(avail) or 'nothing (no trained students)'} (or all)"
        )
    by_name = {s.display: s for s in run.config.data.sources}
    for s in sources or []:
        if s not in by_name:
            raise RunDirError(f"{run.path}: --source {s!r} is not a source of this run ({', '.join(by_name)})")
    run_seeds = sorted({c["seed"] for c in run.cells})
    for k in seeds or []:
        if k not in run_seeds:
            raise RunDirError(f"{run.path}: --seed {k} is not a seed of this run ({', '.join(map(str, run_seeds))})")
    plan = []
    for c in run.cells:
        if (sources and c["source"] not in sources) or (seeds is not None and c["seed"] not in seeds):
            continue
        here = [m["label"] for m in c.get("methods") or [] if m.get("label") in wanted]
        if here:
            plan.append((by_name[c["source"]], c, here))
    return plan


def export_run(
    run_dir: str | os.PathLike,
    labels: list,
    sources: list | None = None,
    seeds: list | None = None,
    dry_run: bool = False,
    wait: bool = False,
) -> list:
    """Export trained students of a finished run from their saved weights, holding the run directory's lock.

    Args:
        run_dir: a finished run directory. labels: student labels (``w2s-shift run --dry-run`` and the report list
            them) or ``["all"]``. sources, seeds: only these cells (default: every cell that has the student).
        dry_run: list the folders that would be written, write nothing.
        wait: wait for another command holding the run directory to finish instead of refusing.

    Returns:
        [Path] of the export folders (written, or that would be written), one per (cell, label).

    Raises:
        RunDirError: not a finished run (:func:`w2s_shift.results.open_run`), a label, source or seed the run does
            not have (the ones it has are listed), a student whose saved weights are missing or are not those the
            run trained (digest), or another process holding the run directory (and not ``wait``).
    """
    from ..runlock import holding

    run = open_run(run_dir, config=True)
    plan = _plan(run, labels, sources, seeds)
    folders = [run.cell_dir(c) / "export" / x for _, c, here in plan for x in here]
    if dry_run:
        return folders
    refuse_links_out_of(run.path)  # the check of every writer: nothing is written through a link out of the run
    for _, c, here in plan:  # every student's weights are there before anything is written
        for x in here:
            if not (run.cell_dir(c) / "models" / f"{x}.json").is_file():
                raise RunDirError(
                    f"{run.cell_dir(c) / 'models' / (x + '.json')}: the saved weights of {x} are missing; rerun "
                    "`w2s-shift run` on this directory to train it again"
                )
    with holding(run.path, wait=wait, command="export"):
        run = open_run(run_dir, config=True)  # read again under the lock: a rerun may have retrained since
        plan = _plan(run, labels, sources, seeds)
        import transformers

        transformers.logging.set_verbosity_error()
        methods = run.config.expanded_methods()
        contexts: dict = {}
        for src, c, here in plan:
            if src.display not in contexts:  # one per source: its data and models load once
                contexts[src.display] = SourceContext(run.config, src, run.path)
            ctx = contexts[src.display]
            export_students(ctx, run.cell_dir(c), c["seed"], [m for m in methods if m.display in here], labels=here)
    log(f"exported {len(folders)} reward model(s); metrics.json and the report are unchanged")
    return [Path(f) for f in folders]

"""``w2s-shift evaluate RUN_DIR NAME_OR_FILE...``: score a finished run's models on new OOD targets, no training.

Every model of every cell (``RUN/<source>/seed<k>/``) is scored on each new evaluation set: the teacher and each
trained student from their saved weights (``models/<label>.safetensors``, loaded into a model built as the run
built it), the zero-shot student (if the run had it) from the pretrained strong model. The new sets are resolved
by :func:`w2s_shift.data.resolve.dataset_ref_for` (the rule of every command) and loaded as ``data.ood`` entries
of a config are (:func:`w2s_shift.pipeline.prepare_data`): the same loader, the same removal of pairs whose prompt
is in the source (counted). Every remaining pair is scored unless ``n_pairs`` (``--n-pairs N``) asks for a subsample
of N with ``data.seed`` (the run's ``data.n_ood`` is not applied: a benchmark is scored whole). With ``n_pairs`` equal
to the run's ``data.n_ood``, a target added here gets the pairs, and the models the rewards, that it would have had
as one more ``data.ood`` entry of the run's config.

Each (model, target) of a cell is the scoring stage ``run`` itself uses (:func:`w2s_shift.pipeline.score_stage.
cell_scores`, marker ``stages/score-<model>__<target>.json``, keyed on the model's training digest and the target's
identity): a rerun skips finished ones and a killed evaluate resumes from the first unfinished one. A target whose
file changed is refused (the sha256 recorded in ``evaluated_targets``). At the end every cell's metrics,
``RUN/metrics.json`` (with ``evaluated_targets``), ``report.md`` and ``report.html`` are rebuilt with the new targets
as OOD targets (:func:`w2s_shift.report.build_cell_metrics`, :func:`~w2s_shift.report.aggregate`,
:func:`~w2s_shift.report.write_report`). ``config.yaml`` and ``run.json`` are not changed.

A RewardBench target (format ``rewardbench2`` or ``rewardbench``, e.g. ``hf:allenai/reward-bench-2``) is scored pair
by pair like any other and also by the benchmark's rules (:mod:`w2s_shift.metrics.rewardbench`): its entry of
``evaluated_targets`` gets ``"rewardbench": {cell dir: {model label: scores}}`` (the overall score, per-subset
scores, RewardBench 1's sections; rows with pairs left out by ``--n-pairs`` or the prompt-overlap removal are not
scored and counted in ``rows_incomplete``).
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import __version__
from ..config import RunConfig, reserved_set_name
from ..data.resolve import dataset_files, dataset_ref_for, resolve_dataset, with_skip_hint
from ..data.schema import DataError
from ..device import use_device
from ..io import files_sha256, read_json, read_jsonl, write_json_atomic
from ..methods import get_method
from ..metrics.rewardbench import SCORERS
from ..report import write_report
from ..results import METRICS_FORMAT, aggregate, build_cell_metrics, open_run
from .featurizer import SourceContext
from .intervene import cell_mechanism
from .rundir import RunDirError, fault, load_input_cache, refuse_links_out_of, stale_stages
from .score_stage import cell_scores

MAX_N_PAIRS = 10**8  # the bound of data.n_ood


def _log(msg: str) -> None:
    print(f"[w2s-shift] evaluate: {msg}", flush=True)


def _file_sha256(paths: list) -> str | None:
    """sha256 (hex) of the files' bytes, in order; None when there is no file (a hub dataset)."""
    return files_sha256([Path(p) for p in paths])


def _read_run(run_dir: Path) -> tuple:
    """(config, metrics) of a finished run directory (:func:`w2s_shift.results.open_run`, with its config)."""
    run = open_run(run_dir, config=True)
    return run.config, run.metrics


def _check_targets(
    cfg: RunConfig, metrics: dict, refs: list, n_pairs: int | None = None, headline: bool = False
) -> tuple:
    """Split the requested targets into new ones and ones this command added earlier (skipped).

    Returns:
        (new refs, names skipped because an earlier evaluate added them with the same file content)

    Raises:
        ValueError: a target that is a source of the run, already a configured OOD target, given twice, added
            earlier from a file whose content has changed, with another ``n_pairs`` or another role (side or
            headline), or whose name is taken by another dataset of the run.
    """
    # names become file names (rewards/<model>__<name>.jsonl): compared up to case, one file on macOS
    known = {r.display.casefold(): ("source", r) for r in cfg.data.sources}
    known.update(
        {
            r.display.casefold(): ("OOD target (data.ood in config.yaml)", r)
            for r in cfg.data.ood
            if r.display.casefold() not in known
        }
    )
    earlier = {e["name"]: e for e in metrics.get("evaluated_targets") or []}
    earlier_folded = {n.casefold(): n for n in earlier}
    names = [ref.display for ref in refs]
    twice = next((n for i, n in enumerate(names) if n.casefold() in {m.casefold() for m in names[:i]}), None)
    if twice is not None:
        first = next(m for m in names if m.casefold() == twice.casefold())
        raise ValueError(
            f"target {twice!r} is given twice" + ("" if first == twice else f" (as {first!r}: names equal up to case)")
        )
    new, skipped, seen = [], [], {}
    for ref in refs:
        name = ref.display
        why = reserved_set_name(name)
        if why:
            raise ValueError(f"target {name!r} ({ref.identity()[1]}) {why}; rename the file")
        if name not in earlier and name.casefold() in earlier_folded:
            raise ValueError(
                f"target {name!r}: the run already has a target {earlier_folded[name.casefold()]!r} added by "
                "`w2s-shift evaluate`, a name equal up to case (one file on a case-insensitive filesystem); "
                "rename the file"
            )
        seen[name] = ref
        for r in cfg.data.sources:
            if r.identity() == ref.identity():
                raise ValueError(
                    f"target {name!r} is the source dataset {r.display!r} of this run (its students are "
                    "trained on it); give a dataset that is not a source"
                )
        for r in cfg.data.ood:
            if r.identity() == ref.identity():
                raise ValueError(
                    f"target {name!r} is already an OOD target of this run (data.ood in config.yaml); "
                    "its results are in the report"
                )
        if name in earlier:
            e = earlier[name]
            same = e.get("identity") == list(ref.identity()) and e.get("sha256") == _file_sha256(dataset_files(ref))
            if not same:
                raise ValueError(
                    f"target {name!r} was added to this run earlier by `w2s-shift evaluate` from "
                    f"{e.get('path') or e.get('name')} (sha256 {e.get('sha256')}); the data given now is "
                    "different (other file or content): give it another file name"
                )
            before = e.get("n_pairs", e.get("n_ood") or "all")  # older runs recorded the data.n_ood applied
            if before != (n_pairs or "all"):
                raise ValueError(
                    f"target {name!r} was added to this run earlier with --n-pairs {before}; "
                    f"to score it with --n-pairs {n_pairs or 'all'}, give it another file name"
                )
            role = e.get("role", "headline")  # runs before side targets added every set to the headline
            if role != ("headline" if headline else "side"):
                raise ValueError(
                    f"target {name!r} was added to this run earlier as a {role} target; to change its role, "
                    f"`w2s-shift evaluate RUN_DIR --remove {name}` and add it again"
                    + (" with --headline" if headline else " without --headline")
                    + " (its rewards are reused)"
                )
            skipped.append(name)
            continue
        if name.casefold() in known:
            kind, other = known[name.casefold()]
            raise ValueError(
                f"target {name!r}: the run already has a {kind} named {other.display!r} "
                f"({other.identity()[1]}); rename the file"
            )
        new.append(ref)
    return new, skipped


def saved_models(cfg: RunConfig, cell_dir: Path, cm: dict) -> list:
    """[(label, scoring kind, training digest)] of a cell's models: "teacher", a trained student's method name
    (its digest from ``models/<label>.json``, checked against the weights there) or "pretrained" (zero-shot: the
    student config's digest, :func:`w2s_shift.pipeline.stages.student_digest`).

    Raises:
        RunDirError: a trained model's weights (``models/<label>.safetensors`` and its ``.json``) are missing, or
            the weights file is damaged (:func:`_check_header`).
    """
    from .stages import pretrained_digest

    kinds = {m["label"]: m.get("name") for m in cm.get("methods", [])}
    out = []
    for label in cm["models"]:
        name = "teacher" if label == "teacher" else kinds.get(label)
        if name != "teacher" and not get_method(name).trains:
            out.append((label, "pretrained", pretrained_digest(cfg, name)))
            continue
        w, meta = cell_dir / "models" / f"{label}.safetensors", cell_dir / "models" / f"{label}.json"
        try:
            digest = read_json(meta)["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            digest = None
        if not w.is_file() or digest is None:
            raise RunDirError(
                f"{w}: the saved weights of {label} (or {meta.name}) are missing: `evaluate` scores saved "
                "models and never trains; rerun `w2s-shift run` on this directory to recreate them"
            )
        _check_header(w, digest)
        out.append((label, name, digest))
    return out


def _check_header(path: Path, digest: str) -> None:
    """A saved model's weights file opens as a w2s-shift trained-state safetensors file of training digest ``digest``
    (its header only; no tensor is read), so a damaged or swapped one is refused before any model is scored and
    any file written.

    Raises:
        RunDirError: naming the file, what is wrong, and how to recreate it.
    """
    from ..models.state import saved_weights_problem

    wrong = saved_weights_problem(path, digest)
    if wrong:
        raise RunDirError(
            f"{wrong}: the saved weights are damaged or not this model's; `evaluate` never trains: rerun "
            "`w2s-shift run` on this directory to train the model again"
        )


def evaluate_run(
    run_dir,
    targets: list,
    fmt: str | None = None,
    skip_invalid: bool | None = None,
    n_pairs: int | None = None,
    headline: bool = False,
    remove: list | None = None,
    wait: bool = False,
) -> dict:
    """Score every model of a finished run on new evaluation sets and add them to its results; trains nothing.

    A set added here is a side target by default: its accuracies and AOGs are reported beside the grid's, while the
    headline (AOG mean, NTS, the claims) stays that of the OOD targets the grid declared; ``headline`` adds the sets
    as headline targets instead. ``remove`` takes sets added here out again (their rewards files stay, so adding one
    back rescores nothing).

    Args:
        run_dir: a finished run directory (``run.json``, ``config.yaml``, ``metrics.json`` and its cells).
        targets: dataset names (``w2s-shift data list``) or pair files, resolved as ``data.ood`` entries are.
        fmt: row format of the files (default prompt_chosen_rejected); not allowed with a dataset name.
        skip_invalid: skip and count invalid rows of the targets instead of stopping at the first; None: the run's
            own ``data.skip_invalid`` (the source is always loaded with the run's setting, as in the run).
        n_pairs: pairs scored per target (a subsample with ``data.seed``); None: every pair left after the
            prompt-overlap removal. Memory does not grow with it: scoring runs in forwards of at most the models'
            ``eval_max_tokens`` padded tokens; time grows linearly (each model scores each pair once).
        headline: add the targets as headline OOD targets (in AOG mean, NTS and the claims) instead of side ones.
        remove: names of sets an earlier evaluate added, taken out of metrics.json and the report (first).
        wait: wait for another command holding the run directory to finish instead of refusing.

    Reads config.yaml (the run's settings: data.seed, data.remove_ood_overlap, models, bootstrap),
    metrics.json, each cell's ``models/`` and the source data (for the prompt overlap). Writes, each file
    atomically and while holding the run directory's lock: per cell ``rewards/<model>__<target>.jsonl``, the
    students' ``drift/<label>.json`` (final drift on the target added), ``stages/score-<model>__<target>.json`` and
    ``metrics.json``; ``RUN/metrics.json`` (the new targets in every cell's "ood" and in ``evaluated_targets``:
    name, identity, path, sha256 of the file(s), format, per source the pairs used and the prompt overlap
    removed), ``report.md``, ``report.html`` and ``plots/``. A target added by an earlier evaluate with the same
    content is skipped (nothing is rescored; with only such targets nothing is written). All inputs are checked
    before anything is written.

    Returns:
        the run's metrics dict as written to ``metrics.json`` (unchanged when every target was skipped), with
        "evaluate": {"added": [names], "skipped": [names]} (not written).

    Raises:
        RunDirError: not a finished run directory, a symbolic link in it to outside it, finished stages computed by
            other code (:func:`~w2s_shift.pipeline.rundir.stale_stages`, as ``run`` refuses them), another process
            holds its lock (and not ``wait``), or saved weights missing.
        DataError: a missing file, an unknown dataset name, or an invalid row (file, row and field named).
        ValueError: a target that is the source or already a target (also up to case), given twice, named like an
            internal split or a best-of-n set (``bon-``), or with no pairs left after the prompt-overlap removal;
            an earlier target given again with another role; ``--format`` with a dataset name; ``n_pairs`` below 1
            or above 10^8; a name to remove that no evaluate added (a declared OOD target is the config's: rerun
            without it).
        ModelError: the run's teacher or student model cannot be loaded.
    """
    from ..runlock import holding

    run_dir = Path(run_dir)
    if not targets and not remove:
        raise ValueError("give at least one dataset name or pair file to evaluate (or --remove NAME)")
    if n_pairs is not None and (
        isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 1 <= n_pairs <= MAX_N_PAIRS
    ):
        raise ValueError(f"--n-pairs must be a whole number from 1 to {MAX_N_PAIRS:,} or 'all', got {n_pairs!r}")
    _read_run(run_dir)  # refuse a non-run before the lock creates anything
    refuse_links_out_of(run_dir)  # the check of every writer: nothing is written through a link out of the run
    stale = stale_stages(run_dir)
    if stale:  # as `run` refuses them: new rewards beside results of other code would mix two versions
        raise RunDirError(
            f"{run_dir}: {len(stale)} finished stage(s) were computed by other w2s-shift code than this one "
            f"({', '.join(stale[:4])}{', ...' if len(stale) > 4 else ''}); `evaluate` would add results of this "
            f"code beside them: rerun `w2s-shift run {run_dir / 'config.yaml'} --output-dir {run_dir} --overwrite` "
            "first (stages with unchanged inputs and code are kept)"
        )
    with holding(run_dir, wait=wait, command="evaluate"):
        if remove:
            _remove(run_dir, list(remove))
        if not targets:
            return {**_read_run(run_dir)[1], "evaluate": {"added": [], "skipped": [], "removed": list(remove)}}
        return _evaluate(run_dir, targets, fmt, skip_invalid, n_pairs, headline)


def _remetric(cell_dir: Path, cm: dict, bootstrap: int, **changes) -> dict:
    """A cell's metrics rebuilt from its files with ``changes`` (its "ood", "side", "data") applied, written to
    ``cell_dir/metrics.json``; every computed key is recomputed."""
    cell = {
        **cm,
        **changes,
        "timings": cm.get("timings_seconds") or {},
        "stages": {p.stem: read_json(p) for p in sorted((cell_dir / "stages").glob("*.json"))},
    }
    new = build_cell_metrics(cell_dir, cell, bootstrap, cm["seed"])
    write_json_atomic(cell_dir / "metrics.json", new)
    return new


def _write_run(run_dir: Path, metrics: dict, cells: list, entries: list) -> dict:
    """``RUN/metrics.json`` with ``cells`` and the evaluated targets ``entries``, then the report."""
    out = {**metrics, "metrics_format": METRICS_FORMAT, "cells": cells, "aggregate": aggregate(cells)}
    out["evaluated_targets"] = entries
    write_json_atomic(run_dir / "metrics.json", out)
    print(write_report(run_dir, out), flush=True)
    return out


def _remove(run_dir: Path, names: list) -> None:
    """Take sets added by earlier evaluates out of the run's metrics and report (a name given twice counts once)."""
    cfg, metrics = _read_run(run_dir)
    entries = metrics.get("evaluated_targets") or []
    added = {e["name"] for e in entries}
    declared = {r.display for r in cfg.data.ood}
    for n in names:
        if n not in added:
            raise ValueError(
                f"{n!r} was not added to {run_dir} by `w2s-shift evaluate`"
                + (
                    " (it is an OOD target of config.yaml: rerun the grid without it)"
                    if n in declared
                    else f"; added sets: {', '.join(sorted(added)) or 'none'}"
                )
            )
    gone, names = set(names), list(dict.fromkeys(names))  # a name given twice counts once
    cells = []
    for cm in metrics["cells"]:
        data = dict(cm.get("data") or {})
        data["ood"] = {k: v for k, v in (data.get("ood") or {}).items() if k not in gone}
        if "shortfalls" in data:
            data["shortfalls"] = [x for x in data["shortfalls"] if x.get("split") not in {f"ood:{n}" for n in gone}]
        cells.append(
            _remetric(
                run_dir / cm.get("dir", f"{cm['source']}/seed{cm['seed']}"),
                cm,
                cfg.bootstrap,
                ood=[t for t in cm["ood"] if t not in gone],
                side=[t for t in cm.get("side") or [] if t not in gone],
                data=data,
            )
        )
    _write_run(run_dir, metrics, cells, [e for e in entries if e["name"] not in gone])
    _log(f"removed {', '.join(names)} from {run_dir} (metrics.json, report.md, report.html); rewards files kept")


def _evaluate(
    run_dir: Path, targets: list, fmt: str | None, skip_invalid: bool | None, n_pairs: int | None, headline: bool
) -> dict:
    t0 = time.time()
    cfg, metrics = _read_run(run_dir)  # under the lock: no other command writes metrics.json until this one has
    fault("evaluate:read")
    load_input_cache(run_dir)  # the run's inputs are not hashed again while unchanged
    if skip_invalid is None:
        skip_invalid = cfg.data.skip_invalid
    use_device(cfg.device)
    refs, skipped = _check_targets(cfg, metrics, [dataset_ref_for(t, fmt) for t in targets], n_pairs, headline)
    for name in skipped:
        _log(f"{name}: already added to this run by an earlier evaluate (same data); skipped, nothing rescored")
    if not refs:
        _log(f"nothing to do: {run_dir}/metrics.json and the report are unchanged")
        return {**metrics, "evaluate": {"added": [], "skipped": skipped}}
    names = [r.display for r in refs]
    if not skip_invalid:  # without --skip-invalid an invalid row of a new target stops here (as `score` does)
        for ref in refs:
            try:
                resolve_dataset(ref)
            except DataError as e:
                raise with_skip_hint(e, ref=ref) from None
    # the run's config with the new targets as its only OOD targets: prepare_data loads, filters and subsamples them
    # exactly as it does configured ones
    d = cfg.data.model_dump(mode="json")
    d.update(
        ood=[r.model_dump(mode="json") for r in refs],
        skip_invalid=bool(cfg.data.skip_invalid or skip_invalid),
        n_ood=n_pairs,
    )
    ecfg = RunConfig.model_validate({**cfg.model_dump(mode="json"), "data": d})
    import transformers

    transformers.logging.set_verbosity_error()

    # every input is checked before anything is written: data of every source, and every cell's saved weights
    contexts = _source_contexts(ecfg, run_dir, names, n_pairs)
    plan = []
    for i, cm in enumerate(metrics["cells"]):
        if cm.get("source") not in contexts:
            raise RunDirError(
                f"{run_dir / 'metrics.json'}: cell {cm.get('dir')} has source {cm.get('source')!r}, "
                f"which is not a source of config.yaml"
            )
        cell_dir = run_dir / cm.get("dir", f"{cm['source']}/seed{cm['seed']}")
        plan.append((i, cm, cell_dir, saved_models(cfg, cell_dir, cm)))

    sha = {r.display: _file_sha256(dataset_files(r)) for r in refs}
    scorers = {r.display: SCORERS[r.format] for r in refs if r.format in SCORERS and not r.name}
    rb: dict = {n: {} for n in scorers}  # RewardBench target -> {cell dir: {model label: its scores}}
    new_cells = []
    for src_name, ctx in contexts.items():
        for _, cm, cell_dir, models in [p for p in plan if p[1]["source"] == src_name]:
            _score_cell(ctx, cm, cell_dir, models, names, scorers, rb)
        # rebuild the cells of this source with the new targets (every computed key is recomputed)
        for i, cm, cell_dir, _ in [p for p in plan if p[1]["source"] == src_name]:
            data = dict(cm.get("data") or {})
            data["ood"] = {**(data.get("ood") or {}), **{n: ctx.summary["ood"][n] for n in names}}
            short = [x for x in ctx.summary.get("shortfalls") or [] if x.get("split") in {f"ood:{n}" for n in names}]
            if short:  # a new target with fewer pairs than --n-pairs, listed as prepare_data lists configured ones
                data["shortfalls"] = [*(data.get("shortfalls") or []), *short]
            role = {"ood": [*cm["ood"], *names]} if headline else {"side": [*(cm.get("side") or []), *names]}
            new_cells.append((i, _remetric(cell_dir, cm, cfg.bootstrap, data=data, **role)))
        contexts[src_name] = None  # free this source's models before the next
    new_cells = [c for _, c in sorted(new_cells, key=lambda x: x[0])]
    entries = [_entry(ref, sha, skip_invalid, n_pairs, headline, new_cells, rb, t0) for ref in refs]
    out = _write_run(run_dir, metrics, new_cells, [*(metrics.get("evaluated_targets") or []), *entries])
    _log(
        f"added {'headline OOD' if headline else 'side'} target(s) {', '.join(names)} to {run_dir} (metrics.json, "
        "report.md, report.html) in "
        f"{time.time() - t0:.0f} s; nothing was trained"
    )
    return {**out, "evaluate": {"added": names, "skipped": skipped}}


def _source_contexts(ecfg, run_dir: Path, names: list, n_pairs: int | None) -> dict:
    """{source name: its SourceContext} for the config with the new targets as OOD targets, each target's counts
    logged; a row error without --skip-invalid names that option."""
    contexts = {}
    for src in ecfg.data.sources:
        try:
            ctx = SourceContext(ecfg, src, run_dir)
        except DataError as e:
            if e.row is not None and not ecfg.data.skip_invalid:
                raise DataError(
                    e.path, e.row, e.field, e.reason + " (--skip-invalid skips and counts such rows)"
                ) from None
            raise
        contexts[ctx.name] = ctx
        for n in names:
            s = ctx.summary["ood"][n]
            _log(
                f"{ctx.name}: target {n}: {s['pairs']} valid pairs, {s['prompt_overlap_removed']} removed because "
                f"their prompt is in the source, {s['used']} scored ("
                + ("all of them" if n_pairs is None else f"--n-pairs {n_pairs}")
                + ")"
                + (
                    f", {s['invalid_rows_skipped']['skipped']} invalid rows skipped"
                    if s["invalid_rows_skipped"]["skipped"]
                    else ""
                )
            )
    return contexts


def _score_cell(ctx, cm: dict, cell_dir: Path, models: list, names: list, scorers: dict, rb: dict) -> None:
    """One cell's saved models scored on the new targets (RewardBench targets' scores added to ``rb``), and the
    mechanism test on them when the run has one."""
    for n in names:  # target by target, so a killed evaluate resumes from its last finished target
        scored = [  # the stages `run` uses: one per (model, target)
            cell_scores(ctx, cell_dir, cm["seed"], label, kind, digest, sets=[n]) for label, kind, digest in models
        ]
        if not any(scored):
            _log(f"{ctx.name} seed {cm['seed']}: {n} scored earlier, reusing its rewards")
        if n in scorers:  # the benchmark's own rules on the pair rewards just written
            rows = {lab: read_jsonl(cell_dir / "rewards" / f"{lab}__{n}.jsonl") for lab, _, _ in models}
            rb[n][cm.get("dir", f"{cm['source']}/seed{cm['seed']}")] = {
                lab: scorers[n](ctx.eval_sets[n], *([x[k] for x in r] for k in ("reward_chosen", "reward_rejected")))
                for lab, r in rows.items()
            }
    if ctx.cfg.mechanism:  # the students' interventional mechanism test on the new targets too
        for label, kind, digest in models:
            if kind not in ("teacher", "pretrained"):
                cell_mechanism(ctx, cell_dir, cm["seed"], label, digest, None)


def _entry(ref, sha: dict, skip_invalid, n_pairs, headline: bool, new_cells: list, rb: dict, t0: float) -> dict:
    """The ``evaluated_targets`` entry of one added target."""
    n = ref.display
    return {
        "name": n,
        "identity": list(ref.identity()),
        "ref": ref.model_dump(mode="json"),
        "path": str(Path(ref.path).resolve()) if ref.path else None,
        "files": [str(f) for f in dataset_files(ref)],
        "sha256": sha[n],
        "format": ref.format,
        "skip_invalid": bool(skip_invalid),
        "n_pairs": n_pairs or "all",
        "role": "headline" if headline else "side",
        "per_source": {
            c["source"]: {k: c["data"]["ood"][n][k] for k in ("pairs", "prompt_overlap_removed", "used")}
            for c in new_cells
        },
        **({"rewardbench": rb[n]} if n in rb else {}),
        "added_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "w2s_shift_version": __version__,
        "seconds": round(time.time() - t0, 1),
    }

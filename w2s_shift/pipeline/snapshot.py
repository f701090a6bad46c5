"""A run still going, read through its finished seeds: ``w2s-shift snapshot RUN OUT``.

A long grid (``evidence-w2s``: about 90 min a seed on a 2-core CPU) writes ``metrics.json`` and its report only at
the end, but each cell writes ``<source>/seed<k>/metrics.json`` last, when it is done. A snapshot copies the seeds
whose cell of every source is done into OUT (the cells' ``models/`` and ``checkpoints/`` as hard links where the disk
allows: the snapshot only reads them), with the run's config at those seeds, and runs the grid there: every stage
of those cells is reused (their digests are the run's), so it writes OUT's ``metrics.json`` and report in seconds,
and ``plan --power OUT`` reads the pilot. RUN is only read, never locked or written, so its run goes on. A stage a
copied cell lacks (a cell left by an older config, say) is computed in OUT, and the log says so. The run's side
work is not repeated: OUT's config reports to no tracker, exports nothing and runs no best-of-n (none of them enter
a stage's digest). A snapshot that fails leaves OUT as it found it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from .rundir import RunDirError, log

#: a cell's folders a snapshot only reads: hard links instead of copies
LINKED = ("models", "checkpoints")


def finished_seeds(run_dir: Path, cfg) -> list:
    """The seeds of ``cfg`` whose cell of every source holds its ``metrics.json`` (a cell writes it last)."""
    names = [ref.display for ref in cfg.data.sources]
    return [s for s in cfg.seeds if all((run_dir / n / f"seed{s}" / "metrics.json").is_file() for n in names)]


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file of ``src`` into ``dst`` (a copy where the file system has no hard links)."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            try:
                os.link(Path(root) / f, target / f)
            except OSError:
                shutil.copy2(Path(root) / f, target / f)


def snapshot(run_dir: Path, out: Path) -> dict:
    """Copy the finished seeds of the run in ``run_dir`` to ``out`` and run the grid there (stages reused).

    Returns:
        the snapshot's metrics (as :func:`w2s_shift.pipeline.run`).

    Raises:
        RunDirError: ``run_dir`` is not a run (no config.yaml or run.json), has no finished seed, or has every seed
            finished (read it, or let it write its metrics.json); ``out`` exists and is not empty, or is inside
            ``run_dir``. Whatever the grid raises in OUT (OUT then removed, or emptied when it was an empty folder).
    """
    from ..config_io import load_config

    run_dir, out = Path(run_dir).resolve(), Path(out).resolve()
    for name in ("config.yaml", "run.json"):
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir}: not a w2s-shift run directory: {name} is missing")
    if out == run_dir or run_dir in out.parents:
        raise RunDirError(f"{out}: inside the run directory {run_dir}; give a folder outside it")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirError(f"{out}: exists and is not an empty folder; give a new one")
    cfg = load_config(str(run_dir / "config.yaml"))
    seeds = finished_seeds(run_dir, cfg)
    if not seeds:
        raise RunDirError(f"{run_dir}: no seed is finished yet (no <source>/seed<k>/metrics.json); wait for one")
    if seeds == list(cfg.seeds):  # a metrics.json of an earlier run with fewer seeds is no sign: only the cells are
        done = "read it as it is (`w2s-shift report`, `plan --power`)"
        if _metrics_seeds(run_dir) != set(seeds):
            done = "resume it (`w2s-shift run`: every stage is reused) to write its metrics.json, then read it"
        raise RunDirError(f"{run_dir}: every seed is finished; {done}")
    top = out  # the highest folder of OUT's path that the snapshot makes, removed if it fails
    while not top.parent.exists():
        top = top.parent
    made = not out.exists()
    try:
        return _snapshot(run_dir, out, cfg, seeds)
    except BaseException:
        for p in [top] if made else list(out.iterdir()):  # unlinks the hard links, never RUN's files
            try:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError:  # what cannot be removed stays; the snapshot's own error is the one to tell
                pass
        raise


def _metrics_seeds(run_dir: Path) -> set | None:
    """The seeds of the cells in RUN's metrics.json (None when it is missing or unreadable)."""
    from ..io import read_json

    try:
        return {c["seed"] for c in read_json(run_dir / "metrics.json")["cells"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _snapshot(run_dir: Path, out: Path, cfg, seeds: list) -> dict:
    from ..config_io import load_config
    from .grid import run

    out.mkdir(parents=True, exist_ok=True)
    for ref in cfg.data.sources:
        for s in seeds:
            cell, dst = run_dir / ref.display / f"seed{s}", out / ref.display / f"seed{s}"
            skip = lambda d, names, top=cell: [n for n in names if Path(d) == top and n in LINKED]  # noqa: E731
            shutil.copytree(cell, dst, ignore=skip)
            for name in LINKED:
                if (cell / name).is_dir():
                    _link_tree(cell / name, dst / name)
    if (run_dir / "inputs.json").is_file():  # the data files' hashes, so the snapshot need not hash them again
        shutil.copy2(run_dir / "inputs.json", out / "inputs.json")
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    data.update(seeds=seeds, output_dir=str(out), report_to=[], export="none")
    data["bon"] = {**(data.get("bon") or {}), "enabled": False}
    (out / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    log(f"snapshot of {run_dir}: seeds {seeds} of {list(cfg.seeds)} finished; reading them in {out}")
    return run(load_config(str(out / "config.yaml")), overwrite=True)

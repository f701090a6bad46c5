"""Experiment tracking through transformers' own Trainer integrations (``report_to``: ``tensorboard``, ``wandb``).

TensorBoard: transformers' ``TensorBoardCallback`` writes ``<cell>/tensorboard/<model>/``.

Weights & Biases: transformers' ``WandbCallback`` logs each training (loss, learning rate, our loss parts). It keeps
one wandb run per process and never finishes it, so :func:`prepare_wandb` (called when a model's
:class:`~w2s_shift.training.args.PairTrainingArguments` are built) finishes the previous model's run and names the
next one: one wandb run per trained model, named ``<source>/seed<k>/<model>``, grouped by grid cell
(group ``<source>/seed<k>``), with an id derived from the run directory, cell and model (so a resumed training
continues its run: ``resume="allow"``). The project is ``$WANDB_PROJECT`` (default ``w2s-shift``) and
the files go to ``$WANDB_DIR`` (default: the run directory, ``RUN/wandb/``). When the grid has finished,
:func:`log_summaries` writes each trained model's final ID/OOD metrics (accuracy with its 95% interval per set; for
W2S students WRG, AOG per target, AOG mean, NTS, PGR) into its run's summary. ``WANDB_MODE=offline`` works without
an account or network (``wandb sync`` uploads later).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

TRACKERS = ("tensorboard", "wandb")


def check_report_to(report_to: list) -> None:
    """Refuse a tracker whose package is not installed, before anything runs.

    Raises:
        ValueError: naming the tracker and the pip extra that installs it.
    """
    if "tensorboard" in report_to and not (
        importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")
    ):
        raise ValueError("report_to tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'")
    if "wandb" in report_to and not importlib.util.find_spec("wandb"):
        raise ValueError("report_to wandb needs the wandb package: pip install -e '.[wandb]'")


def check_wandb_credentials(report_to: list) -> None:
    """With ``report_to`` wandb, refuse a run that wandb would stop at the first training (its UsageError, after the
    data had loaded): no ``WANDB_API_KEY``, no ``wandb login`` entry for its host in the netrc file (``$NETRC``,
    default ``~/.netrc``) and ``WANDB_MODE`` not offline or disabled. Checked when a run starts, not when a config is
    read (``evaluate`` reads a wandb run's config and logs nothing).

    Raises:
        ValueError: saying how to log in or to log offline."""
    if "wandb" not in report_to:
        return
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("//")[-1].split("/")[0].split(":")[0]
    try:
        if host in (Path(os.environ.get("NETRC") or Path.home() / ".netrc")).read_text(encoding="utf-8"):
            return
    except (OSError, ValueError):
        pass
    raise ValueError(
        f"report_to wandb: no Weights & Biases credentials for {host} (WANDB_API_KEY, or `wandb login`, which writes "
        "~/.netrc) and WANDB_MODE is not offline, so wandb would stop the run when the first model trains; log in, "
        "or set WANDB_MODE=offline to log without an account (`wandb sync` uploads later)"
    )


def wandb_run_id(run_dir: str | os.PathLike, group: str, model: str) -> str:
    """A wandb run id (16 hex digits) for one model of one cell of one run directory: stable across reruns."""
    key = f"{Path(run_dir).resolve()}|{group}|{model}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _project() -> str:
    return os.environ.get("WANDB_PROJECT") or "w2s-shift"


def init_wandb_run(run_dir: Path, group: str, model: str):
    """Start (or resume) the wandb run of one model of one cell."""
    import wandb

    return wandb.init(
        project=_project(),
        dir=os.environ.get("WANDB_DIR") or str(run_dir),
        id=wandb_run_id(run_dir, group, model),
        name=f"{group}/{model}",
        group=group,
        resume="allow",
    )


def prepare_wandb(args) -> None:
    """Before a model trains with ``report_to`` wandb: finish the wandb run left open by the previous model and start
    this model's (its name, group, id and folder from ``args.logging_dir``, ``RUN/<source>/seed<k>/tensorboard/<model>``
    as the pipeline sets it); transformers' WandbCallback then logs into the run already started, as it does for a
    run a user starts. Idempotent (the arguments are rebuilt once before training); without such a logging_dir
    only the previous run is finished; only the main process (rank 0) starts runs. No-op when wandb is not installed
    (the config check refuses that earlier)."""
    try:
        import wandb
    except ImportError:
        return
    from .distributed import world

    log_dir = Path(args.logging_dir) if args.logging_dir else None
    ok = log_dir is not None and log_dir.parent.name == "tensorboard" and world()[0] == 0
    cell = log_dir.parent.parent if ok else None
    group = f"{cell.parent.name}/{cell.name}" if ok else None
    if ok and wandb.run is not None and wandb.run.id == wandb_run_id(cell.parent.parent, group, log_dir.name):
        return
    if wandb.run is not None:
        wandb.finish()
    if ok:
        args.run_name = f"{group}/{log_dir.name}"
        init_wandb_run(cell.parent.parent, group, log_dir.name)


def finish_wandb() -> None:
    """Finish the wandb run still open (the last trained model's, with the summaries :func:`log_summaries` wrote),
    as wandb's own exit hook would; a process of a launched run ends without running exit hooks
    (:func:`w2s_shift.distributed.end_process`). No-op when wandb was never imported or no run is open."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()

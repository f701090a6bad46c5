"""One writer per run directory: an OS file lock on ``RUN_DIR/.lock`` held for the whole run.

The lock is ``flock(2)`` (``fcntl.flock``, exclusive) on an open file: the kernel drops it when the holding
process exits in any way (normal end, exception, ``kill -9``), so a lock left by a dead process never blocks.
The file itself stays (deleting a lock file races with a process about to lock it); it records the holder's
PID, host and start time so that a refused run can name who holds the directory.

Only the main process of a distributed run (global rank 0, from the launcher's ``RANK``) takes the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".lock"


class RunLockError(RuntimeError):
    """The run directory is held by another live process (its PID is in the message)."""


def _holder(path: Path) -> tuple:
    """Who holds ``path``, from what it wrote there: (its command or None, "PID 123 on host h since 2026-12-02
    03:04:05 UTC")."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        cmd = info.get("command")
        who = f"PID {int(info['pid'])} on host {info.get('host', '?')} since {info.get('started', '?')}"
        return (cmd if isinstance(cmd, str) else None), who
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, "a process whose PID is not yet recorded"


def _refusal(run_dir: Path, command: str, holder: str | None, who: str) -> str:
    """The message of a refused writer: who holds the directory, and what this command can do about it."""
    other = f"another w2s-shift {holder}" if holder else "another w2s-shift command"
    if command in ("run", "select"):  # they choose their output directory
        advice = "wait for it to finish (--wait) or use another output_dir"
    else:
        advice = (
            f"wait for it to finish (`w2s-shift {command} ... --wait`) or run `w2s-shift {command}` again once it has"
        )
    return f"{run_dir}: {other} ({who}) is writing to this run directory; {advice}"


class RunLock:
    """Exclusive lock on ``run_dir/.lock``; use as a context manager or ``acquire()`` / ``release()``.

    Args:
        run_dir: the run directory (created if missing).
        wait: block until the holder finishes instead of refusing at once.
        command: the w2s-shift command taking it (recorded for a refused one's message, which it words).
    """

    def __init__(self, run_dir: str | os.PathLike, wait: bool = False, command: str = "run"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.wait = wait
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock (waiting when ``wait``) and record this process in the lock file.

        Raises:
            RunLockError: another process holds it and not ``wait``: names that process's PID.
            OSError: the directory or lock file cannot be created.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder, who = _holder(self.path)
                if not self.wait:
                    raise RunLockError(_refusal(self.run_dir, self.command, holder, who)) from None
                by = f"w2s-shift {holder}, {who}" if holder else who
                print(
                    f"[w2s-shift] {self.run_dir}: held by {by}; waiting for it to finish (--wait)",
                    file=sys.stderr,
                    flush=True,
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(
                fd,
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "command": self.command,
                        "host": socket.gethostname(),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    }
                ).encode(),
                0,
            )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (closing the file releases it); the file stays."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(run_dir: str | os.PathLike, wait: bool = False, command: str = "run") -> RunLock | None:
    """The held lock of ``run_dir`` on the main process; None on the other ranks of a distributed run."""
    if int(os.environ.get("RANK", 0)) != 0:
        return None
    return RunLock(run_dir, wait=wait, command=command).acquire()


def acquire_run_dir(run_dir: str | os.PathLike, wait: bool = False, command: str = "run") -> RunLock | None:
    """:func:`lock_run_dir` with the errors every writer of a run directory gives.

    Raises:
        RunDirError: another live process holds the directory (its PID named), or the lock file cannot be created.
    """
    from .results.errors import RunDirError

    try:
        return lock_run_dir(run_dir, wait=wait, command=command)
    except RunLockError as e:
        raise RunDirError(str(e)) from None
    except OSError as e:
        raise RunDirError(f"{run_dir}: cannot write to the run directory: {e}") from None


#: Files that make a folder a run directory (``run`` writes run.json first, metrics.json when it ends).
RUN_DIR_MARKERS = ("run.json", "metrics.json")


def enclosing_run_dir(path: str | os.PathLike) -> Path | None:
    """The nearest folder at or above ``path`` (resolved; ``path`` itself need not exist) that holds run.json or
    metrics.json: the run directory a file written at ``path`` would land in, or None."""
    p = Path(os.path.abspath(os.path.expanduser(path)))
    for d in [p, *p.parents]:
        if any((d / m).is_file() for m in RUN_DIR_MARKERS):
            return d
    return None


@contextmanager
def holding(run_dir: str | os.PathLike, wait: bool = False, command: str = "run") -> Iterator[RunLock | None]:
    """The run directory's lock held for the block (:func:`acquire_run_dir`; ``command`` the w2s-shift command
    taking it), released however the block ends."""
    lock = acquire_run_dir(run_dir, wait=wait, command=command)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def hold_at(point: str) -> None:
    """For the concurrency tests: with ``W2S_SHIFT_HOLD=<point>``, create ``<point>.held`` in the folder
    ``W2S_SHIFT_HOLD_DIR`` and wait until ``<point>.go`` appears there (at most 300 s). Points: ``report:read``,
    ``evaluate:read``, ``bon:read`` (a writer of a run directory that has read metrics.json and not yet written)."""
    if os.environ.get("W2S_SHIFT_HOLD") != point:
        return
    folder = Path(os.environ.get("W2S_SHIFT_HOLD_DIR", "."))
    (folder / f"{point}.held").touch()
    deadline = time.time() + 300
    while not (folder / f"{point}.go").exists() and time.time() < deadline:
        time.sleep(0.05)

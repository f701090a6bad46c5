"""Progress bars in logs: when stderr is not a terminal (a file, a pipe, a CI log), tqdm's carriage-return frames
become at most one line per bar every 30 seconds, plus its final line.

tqdm (ours and the Trainer's) redraws a bar by writing ``"\\r" + frame`` to ``sys.stderr`` and ends it with
``"\\n"``; in a file every redraw is kept. :class:`LogStream` wraps stderr for the duration of a command
(:func:`log_progress`): a frame is written as its own line only when ``interval`` seconds have passed since that
bar's (the text before its first ``:`` or ``|``) last line, or when the bar ends (its last frame, the one a terminal
would show; for a ``leave=False`` bar, which a terminal erases, its last frame too). A bar that ends within
``interval`` seconds is one line. Everything that is not a frame passes as is.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator

INTERVAL_S = 30.0


class LogStream:
    """A text stream that turns tqdm frames written to ``stream`` into rate-limited lines (see the module).

    Args:
        stream: the stream written to (stderr).
        interval: seconds between two lines of one bar.
        clock: the time source (seconds; tests pass a fake one).
    """

    def __init__(self, stream, interval: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.stream, self.interval, self.clock = stream, interval, clock
        self.started: dict = {}  # bar key -> time of its first frame or its last line
        self.written: dict = {}  # bar key -> the progress its last line showed (:meth:`_count`)
        self.pending: tuple | None = None
        self.after_frame, self.last_key = False, ""  # (key, frame) of the last frame not written as a line

    @staticmethod
    def _key(frame: str) -> str:
        cut = [i for i in (frame.find(":"), frame.find("|")) if i >= 0]
        return frame[: min(cut)].strip() if cut else ""

    @staticmethod
    def _count(frame: str) -> tuple:
        """What a frame says of the progress (its percentage and n/total), not its timing or bar width."""
        return tuple(re.findall(r"\d+%|\d[\d.]*[kMG]?/\d[\d.]*[kMG]?", frame)) or (frame,)

    def write(self, s: str) -> int:
        if not s:
            return 0
        if s.startswith("\r"):
            frame = s.lstrip("\r").rstrip()
            if not frame:  # a bar with leave=False clearing itself: it closed, its last frame as a line
                self._close()
                return len(s)
            key, now = self._key(frame), self.clock()
            self.after_frame, self.last_key = True, key
            if key not in self.started:
                self.started[key] = now
            if self._count(frame) == self.written.get(key):  # the same count redrawn (tqdm's close): nothing new
                self.pending = None
            elif now - self.started[key] >= self.interval:
                self.stream.write(frame + "\n")
                self.started[key], self.written[key], self.pending = now, self._count(frame), None
            else:
                self.pending = (key, frame)
            return len(s)
        if self.after_frame and s.startswith("\n"):  # the bar closed: its final frame as a line (once)
            self._close()
            s = s[1:]
        self.after_frame = False
        return self.stream.write(s) if s else 0

    def _close(self) -> None:
        """The last bar ended: write its last frame unless already written; forget the bar."""
        if self.pending is not None:
            self.stream.write(self.pending[1] + "\n")
        key = self.pending[0] if self.pending else self.last_key
        self.started.pop(key, None)
        self.written.pop(key, None)
        self.pending = None

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, fileno, ... of the wrapped stream
        return getattr(self.stream, name)


def leave_bars() -> bool:
    """tqdm's ``leave`` for a bar a terminal should erase: False on a terminal, True in a log (so that tqdm writes
    the bar's final state, 100%, as its last line)."""
    return isinstance(sys.stderr, LogStream) or not (getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())


@contextlib.contextmanager
def log_progress(interval: float = INTERVAL_S) -> Iterator[None]:
    """While the block runs, ``sys.stderr`` is a :class:`LogStream` when it is not a terminal (else unchanged)."""
    real = sys.stderr
    isatty = getattr(real, "isatty", None)
    if isatty is not None and isatty():
        yield
        return
    sys.stderr = LogStream(real, interval)
    try:
        yield
    finally:
        if sys.stderr.pending is not None:  # a bar left open (an error stopped it): its last frame
            real.write(sys.stderr.pending[1] + "\n")
        sys.stderr = real

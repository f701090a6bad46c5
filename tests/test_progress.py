"""Progress bars in non-terminal logs: at most one line per bar every 30 s plus its final line, no carriage-return
frames; a terminal keeps tqdm's own bar."""

import io
import sys

from tqdm import tqdm

from w2s_shift.cli import main
from w2s_shift.progress import LogStream, log_progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_120_s_bar_is_four_lines_not_a_frame_per_step():
    out, clock = io.StringIO(), Clock()
    stream = LogStream(out, 30.0, clock)
    bar = tqdm(total=120, desc="scoring naive", file=stream, mininterval=0, miniters=1, ascii=True, ncols=60)
    for _ in range(120):  # one step a second
        clock.t += 1.0
        bar.update(1)
    bar.close()
    print("other output", file=stream)
    lines = out.getvalue().split("\n")
    assert "\r" not in out.getvalue()
    bars = [ln for ln in lines if ln.startswith("scoring naive")]
    assert [ln.split(":")[1].split("%")[0].strip() for ln in bars] == ["25", "50", "75", "100"]
    assert lines[len(bars)] == "other output"


def test_a_short_bar_is_one_line():
    out, clock = io.StringIO(), Clock()
    stream = LogStream(out, 30.0, clock)
    for _ in tqdm(range(50), desc="Map", file=stream, mininterval=0, miniters=1, ascii=True):
        clock.t += 0.1
    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("Map: 100%")


def test_the_cli_wraps_stderr_only_when_it_is_not_a_terminal(monkeypatch):
    seen = []
    monkeypatch.setattr("w2s_shift.commands.cmd_data_list", lambda a: seen.append(type(sys.stderr).__name__) or 0)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert main(["data", "list"]) == 0
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["data", "list"]) == 0
    assert seen == ["LogStream", "StringIO"]
    with log_progress():
        assert sys.stderr is tty


def test_a_bar_that_erases_itself_leaves_its_last_line_in_a_log():
    """The scoring bars use leave=False (a terminal erases them): in a log each still leaves its final line."""
    out, clock = io.StringIO(), Clock()
    stream = LogStream(out, 30.0, clock)
    for desc in ("teacher scores pandalm", "naive scores pandalm"):
        for _ in tqdm(range(5), desc=desc, file=stream, mininterval=0, miniters=1, ascii=True, leave=False):
            clock.t += 1.0
    lines = out.getvalue().splitlines()
    assert [ln.split("|")[0] for ln in lines] == ["teacher scores pandalm: 100%", "naive scores pandalm: 100%"]


def test_scoring_bars_end_at_100_percent_in_a_log(monkeypatch):
    """inference's bars erase themselves on a terminal; in a log tqdm writes their final state (leave=True)."""
    import torch

    from w2s_shift.inference import score_sequences

    class Tiny(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return input_ids.float().sum(1), None

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with log_progress():
        score_sequences(Tiny(), [[1, 2, 3]] * 40, pad_id=0, max_tokens=12, desc="tiny scores x")
    assert err.getvalue().splitlines()[-1].startswith("tiny scores x: 100%")

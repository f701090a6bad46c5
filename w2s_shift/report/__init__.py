"""Metrics of a grid run and its report: per-cell metrics with paired bootstrap intervals, aggregation over
seeds, ``report.md`` + a self-contained ``report.html`` + ``plots/*.png``, and a side-by-side comparison of runs.

A run directory holds one cell per (source dataset, seed): ``RUN/<source>/seed<k>/`` with ``rewards/``,
``teacher_labels.jsonl``, ``logs/`` and ``drift/`` (see :func:`build_cell_metrics`). Metrics follow Le et al.
2026 (arXiv 2605.25629): WRG, AOG, NTS in percentage points (pp); PGR from Burns et al. 2023 (a ratio).

Modules (a run's files are read by :mod:`w2s_shift.results`): :mod:`.cells` (per-cell metrics), :mod:`.cuts` (length
baseline, truncation, SEAM effect), :mod:`.seeds` (aggregation over seeds), :mod:`.tables` (Markdown/HTML
tables), :mod:`.plots` (matplotlib), :mod:`.render` (``report.md``/``report.html``), :mod:`.comparison`
(comparing runs).
"""

from .cells import NO_GAP, build_cell_metrics, cell_gap_check
from .comparison import compare
from .cuts import cell_label_effect, cell_length_baseline, cell_truncation
from .render import write_report
from .seeds import aggregate

__all__ = [
    "NO_GAP",
    "aggregate",
    "build_cell_metrics",
    "cell_gap_check",
    "cell_length_baseline",
    "cell_label_effect",
    "cell_truncation",
    "compare",
    "write_report",
]

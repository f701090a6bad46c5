"""The report of a grid run: ``report.md`` + a self-contained ``report.html`` + ``plots/*.png`` rendered from the
results :mod:`w2s_shift.results` computes (metrics per cell with paired bootstrap intervals, aggregation over seeds,
claims), and a side-by-side comparison of runs. Metrics follow Le et al. 2026 (arXiv 2605.25629): WRG, AOG, NTS in
percentage points (pp); PGR from Burns et al. 2023 (a ratio).

Modules: :mod:`.tables` (Markdown/HTML tables), :mod:`.plots` (matplotlib), :mod:`.claims` (the claims' and
competitors' tables), :mod:`.intervention` (the mechanism's table), :mod:`.render` (``report.md``/``report.html``),
:mod:`.comparison` (comparing runs).
"""

from .comparison import compare
from .page import write_report

__all__ = ["compare", "write_report"]

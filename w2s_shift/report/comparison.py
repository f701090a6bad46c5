"""Side-by-side comparison of runs (:func:`compare`)."""

from __future__ import annotations

from pathlib import Path

from ..results import RunDirError, open_run
from .seeds import aggregate
from .tables import md_table, nested_get

# ---- comparing runs -------------------------------------------------------------------------------------


def _run_metrics(run_dir: Path) -> dict:
    """A run's metrics aggregated over seeds (:func:`w2s_shift.results.open_run` reads it)."""
    run = open_run(run_dir)
    try:
        return run.metrics.get("aggregate") or aggregate(run.cells)
    except (KeyError, TypeError) as e:
        raise RunDirError(
            f"{run.path / 'metrics.json'}: not a w2s-shift grid metrics file ({type(e).__name__}: {e})"
        ) from None


def _ms(st) -> str:
    if not isinstance(st, dict) or st.get("mean") is None:
        return "–"
    return f"{st['mean']:.2f}" + (f" ± {st['std']:.2f}" if st.get("std") is not None else "")


def compare(run_dirs: list) -> str:
    """One Markdown table comparing runs side by side: rows (source, model), for each run the ID accuracy,
    OOD mean accuracy (pp) and NTS (pp); mean ± std over seeds where a run has several.

    Raises:
        ValueError: no run given. RunDirError: a run directory that is missing or has no readable grid metrics.json.
    """
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    runs = [(Path(r), _run_metrics(Path(r))) for r in run_dirs]
    names = [p.name or str(p) for p, _ in runs]
    if len(set(names)) < len(names):
        names = [str(p) for p, _ in runs]
    head = ["source", "model"]
    for n in names:
        head += [f"{n} ID acc", f"{n} OOD acc", f"{n} NTS"]
    rows, seen = [], []
    for _, agg in runs:
        for src, a in agg.items():
            for mdl in a["models"]:
                if (src, mdl) not in seen:
                    seen.append((src, mdl))
    for src, mdl in seen:
        r = [src, mdl]
        for _, agg in runs:
            a = agg.get(src)
            if a is None or mdl not in a["models"]:
                r += ["–"] * 3
                continue
            r += [
                _ms(nested_get(a, "accuracy", mdl, a["id"])),
                _ms(nested_get(a, "accuracy_ood_mean", mdl)),
                _ms(nested_get(a, "metrics", mdl, "NTS")) if mdl != "teacher" else "–",
            ]
        rows.append(r)
    return md_table(head, rows)

"""Side-by-side comparison of runs (:func:`compare`)."""

from __future__ import annotations

from pathlib import Path

from ..metrics.registry import MODEL_METRICS
from ..results import RunDirError, open_run
from ..results.seeds import aggregate
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


def _ms(st, digits: int = 2) -> str:
    """A stat over seeds as "value ± std" (a model metric's own combination when it has one, else the mean)."""
    v = st.get("value", st.get("mean")) if isinstance(st, dict) else None
    if v is None:
        return "–"
    return f"{v:.{digits}f}" + (f" ± {st['std']:.{digits}f}" if st.get("std") is not None else "")


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
    shown = list(MODEL_METRICS.values())
    head = ["source", "model"]
    for n in names:
        head += [f"{n} ID acc", f"{n} OOD acc", f"{n} NTS", *[f"{n} {mt.title} ID" for mt in shown]]
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
                r += ["–"] * (3 + len(shown))
                continue
            r += [
                _ms(nested_get(a, "accuracy", mdl, a["id"])),
                _ms(nested_get(a, "accuracy_ood_mean", mdl)),
                _ms(nested_get(a, "metrics", mdl, "NTS")) if mdl != "teacher" else "–",
                *[_ms(nested_get(a, "model_metrics", mt.name, mdl, a["id"]), mt.digits) for mt in shown],
            ]
        rows.append(r)
    return md_table(head, rows)

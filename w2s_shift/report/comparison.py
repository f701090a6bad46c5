"""Side-by-side comparison of runs (:func:`compare`)."""

from __future__ import annotations

from pathlib import Path

from ..metrics.registry import MODEL_METRICS
from ..results import RunDirError, open_run
from ..results.seeds import aggregate
from .tables import md_table, nested_get

# ---- comparing runs -------------------------------------------------------------------------------------


def _run_metrics(run_dir: Path) -> tuple:
    """(a run's metrics aggregated over seeds, what it was scored on: {source: (data seed, {dataset: test pairs})});
    :func:`w2s_shift.results.open_run` reads it."""
    run = open_run(run_dir)
    seed = ((run.metrics.get("config") or {}).get("data") or {}).get("seed")
    try:
        sets = {c.get("source", c.get("id")): (seed, c.get("n_pairs")) for c in run.cells}
        return run.metrics.get("aggregate") or aggregate(run.cells), sets
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
    OOD mean accuracy (pp) and NTS (pp); mean ± std over seeds where a run has several. Runs scored on other test
    sets (another data seed, OOD targets or test-set size) are named below the table: their columns differ by the
    test pairs as well as by the models.

    Raises:
        ValueError: no run given. RunDirError: a run directory that is missing or has no readable grid metrics.json.
    """
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    read = [(Path(r), *_run_metrics(Path(r))) for r in run_dirs]
    runs = [(p, agg) for p, agg, _ in read]
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
    table = md_table(head, rows)
    sets = [s for *_, s in read]
    if all(s == sets[0] for s in sets):
        return table
    said = "; ".join(
        f"{n}: "
        + ", ".join(
            f"{src} ("
            + ("" if seed is None else f"data.seed {seed}; ")
            + ", ".join(f"{d} {k}" for d, k in (pairs or {}).items())
            + ")"
            for src, (seed, pairs) in s.items()
        )
        for n, s in zip(names, sets)
    )
    return (
        f"{table}\n\nThese runs are not scored on the same test sets ({said}): a difference between their columns "
        "mixes the models with the test pairs."
    )

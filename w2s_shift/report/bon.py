"""The report's best-of-n section: per source, a table of each model's gain in gold reward from best-of-n over a
random pick, and the over-optimization plot (gold gain against KL_bon, one panel per prompt set: ID and each OOD
target), from ``RUN/bon.json`` (:func:`w2s_shift.results.bon.read_bon`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import file_slug, write_bytes_atomic
from ..results.bon import read_bon, versus


def _by_model(curves: list, set_name: str) -> dict:
    """{model: [curves of its seeds]} on one set, models in the order of the file."""
    out: dict = {}
    for c in curves:
        if c.set == set_name:
            out.setdefault(c.model, []).append(c)
    return out


def bon_table(src, set_name: str) -> tuple:
    """(head, rows) for one prompt set: per model, gold(n) - gold(1) in gold standard deviations (the SD of the gold
    reward over all candidates of the set) at each n, and its gold at the largest n minus the teacher's, paired over
    prompts, with the seeds-and-pairs interval and its MDE (:func:`~w2s_shift.results.bon.versus`). Gains: one
    seed: value [95% bootstrap interval over prompts]; several: mean ± SD over seeds."""
    info = src.sets[set_name]
    sd = info.gold_sd or 1.0
    models = _by_model(src.curves, set_name)
    first = next(iter(models.values()))[0]
    cols = [j for j, n in enumerate(first.n) if n > 1]  # n = 1 is a random pick: no gain, for every model
    head = ["model", *[f"n={first.n[j]} (KL {first.kl[j]:.2f})" for j in cols], f"vs teacher at n={first.n[-1]}"]
    rows = []
    for m, cs in models.items():
        cells = []
        for j in cols:
            vals = [c.gain[j] / sd for c in cs]
            if len(cs) == 1:
                iv = cs[0].gain_ci[j]
                cells.append(f"{vals[0]:+.3f}" + (f" [{iv[0] / sd:+.3f}, {iv[1] / sd:+.3f}]" if iv else ""))
            else:
                cells.append(f"{np.mean(vals):+.3f} ± {np.std(vals, ddof=1):.3f}")
        v = None if m == "teacher" else versus([c for c in src.curves if c.set == set_name], m, "teacher")
        cells.append(
            ""
            if v is None
            else f"{v['value'] / sd:+.3f} [{v['ci'][0] / sd:+.3f}, {v['ci'][1] / sd:+.3f}] (MDE {v['mde'] / sd:.3f})"
        )
        oracle_in = sorted({o.cell for o in src.oracles if o.model == m})
        if oracle_in:
            m = f"{m} (oracle{' in ' + ', '.join(oracle_in) if len({c.seed for c in cs}) > 1 else ''})"
        rows.append([m, *cells])
    return head, rows


def _plot(src, source: str, labels=()) -> bytes:
    """``labels``: the run's model labels, so each model has its colour of the report's other figures."""
    from .plots import model_colors, new_figure, png_bytes

    cols = model_colors([*labels, *(c.model for c in src.curves)])
    names = list(src.sets)
    fig, axes = new_figure(len(names), width=5.0)
    for ax, name in zip(axes, names):
        sd = src.sets[name].gold_sd or 1.0
        for m, cs in _by_model(src.curves, name).items():
            kl = np.array(cs[0].kl)
            y = np.mean([np.array(c.gain) / sd for c in cs], axis=0)
            (line,) = ax.plot(kl, y, marker="o", ms=3, color=cols[m], label=m)
            if len(cs) == 1 and all(iv is not None for iv in cs[0].gain_ci):
                lo = [iv[0] / sd for iv in cs[0].gain_ci]
                hi = [iv[1] / sd for iv in cs[0].gain_ci]
                ax.fill_between(kl, lo, hi, color=line.get_color(), alpha=0.12)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"{source} → {name}" if name != source else f"{name} (ID)", fontsize=10)
        ax.set_xlabel("KL_bon = log n − (n − 1)/n (nats)")
        ax.set_ylabel("gold gain over a random pick (gold SD)")
    axes[0].legend(fontsize=8)
    return png_bytes(fig)


EXPLAIN = (
    ". Each cell: the expected gold reward of the model's best-of-n pick minus that of a random pick (n = 1, the "
    "same for every model), exactly over all subsets of the N samples (not one draw), in standard deviations of the "
    "gold reward over the set's candidates; KL_bon = log n − (n − 1)/n (Gao et al. 2022). A curve that rises then "
    "falls is over-optimization. The last column: the model's expected gold at the largest n minus the teacher's, "
    "paired over the same prompts and candidates, in the same unit, with the claims' interval: over seeds and "
    "prompts with several seeds; with one seed over prompts only (training noise not covered: descriptive); MDE: "
    "the smallest true difference it detects with 80% power. "
)


def bon_blocks(run_dir: Path, source: str, written: set, labels=()) -> list:
    """The best-of-n blocks of one source (nothing when the run has no bon.json or not this source); the plot is
    written to ``plots/<source>-bon.png`` and added to ``written``; ``labels``: the source's model labels
    (:func:`~w2s_shift.report.plots.source_labels`), for the colours of the report's other figures."""
    res = read_bon(run_dir)
    if res is None or source not in res.sources:
        return []
    stale = res.stale_models(run_dir)
    if stale:
        return [
            ("h3", "Best-of-n against a gold judge"),
            (
                "p",
                f"**Out of date:** bon.json scored models that were trained again since ({', '.join(stale[:3])}"
                f"{', ...' if len(stale) > 3 else ''}); `w2s-shift bon {run_dir}` scores the current ones (the "
                "candidates and the gold's rewards are reused).",
            ),
        ]
    src = res.sources[source]
    st = res.settings
    pol = f"policy `{res.policy}`" if res.policy else "responses from files"
    if src.replaced:
        pol += f" (replacing the sampled prompt sets {', '.join(src.replaced)})"
    sets = ", ".join(f"{k} ({v.prompts} prompts x {v.samples})" for k, v in src.sets.items())
    blocks = [
        ("h3", "Best-of-n against a gold judge"),
        (
            "p",
            f"Candidates: {pol}"
            + (
                f", temperature {st.get('temperature')}, top-p {st.get('top_p')}, at most {st.get('max_new_tokens')} "
                "new tokens"
                if res.policy
                else ""
            )
            + f"; sets {sets}. Gold judge: {res.judge}"
            + (
                " (a synthetic gold as in Gao et al. 2022: it judges like the ceiling, so the ceiling is not a fair "
                "proxy here)"
                if res.judge.startswith("synthetic")
                else ""
            )
            + "".join(
                f". **Oracle:** {o.model} of {o.cell} is the gold judge itself ({o.why}): its curve is the judge "
                "picking by its own rewards, an upper bound, not a proxy's result"
                for o in src.oracles
            )
            + EXPLAIN
            + (
                "One seed: [95% percentile bootstrap interval over prompts]."
                if len({c.seed for c in src.curves}) == 1
                else "Mean ± SD over seeds."
            ),
        ),
    ]
    for name in src.sets:
        head, rows = bon_table(src, name)
        blocks += [("p", f"**{name}**" + (" (ID)" if name == source else "")), ("table", head, rows)]
    rel = f"plots/{file_slug(source)}-bon.png"
    data = _plot(src, source, labels)
    write_bytes_atomic(Path(run_dir) / rel, data)
    written.add(rel)
    blocks.append(("img", rel, data, f"{source}: best-of-n over-optimization curves (gold gain vs KL)"))
    return blocks


def bon_pointer() -> list:
    """The one line a report without best-of-n results shows."""
    return [
        (
            "p",
            "Best-of-n against a gold judge was not run here: `w2s-shift bon RUN_DIR` adds it to a finished run "
            "(the `downstream` preset runs it; see docs/best-of-n.md).",
        )
    ]

"""``report.md``, a self-contained ``report.html`` and ``plots/*.png`` of a run (:func:`write_report`)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from ..data.render import TRUNCATION_RULE
from ..io import file_slug, write_bytes_atomic, write_text_atomic
from ..results import exportable_labels
from ..results.bon import read_bon
from ..results.seeds import aggregate
from .bon import bon_blocks, bon_pointer
from .plots import PLOTS, source_labels
from .sections import (
    claims_blocks,
    competitor_blocks,
    ensemble_blocks,
    intervention_blocks,
    rewardbench_blocks,
    sequential_blocks,
)
from .tables import (
    Source,
    diff_table,
    drift_table,
    gap_blocks,
    html_table,
    inline_html,
    length_blocks,
    main_table,
    md_table,
    metric_notes,
    model_metric_table,
    side_table,
    truncation_blocks,
)

_CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1500px;
padding:0 16px;color:#1b1b1b;line-height:1.45}
h1{font-size:1.5em;border-bottom:2px solid #ddd;padding-bottom:4px}h2{font-size:1.25em;margin-top:1.8em;
border-bottom:1px solid #e5e5e5}h3{font-size:1.05em;margin-top:1.4em}
.tw{overflow-x:auto;margin:8px 0 14px}table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #d6d6d6;padding:3px 7px;vertical-align:top}th{background:#f1f3f5;text-align:center}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}tbody tr:nth-child(even){background:#fafafa}
.ci{color:#777;font-size:11px}code{background:#f3f3f3;padding:0 3px;border-radius:3px}
figure{margin:10px 0 22px}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:12px;color:#555}
p.note,li{font-size:13.5px}
"""  # noqa: E501 (CSS kept byte-identical: report.html output unchanged)


def _render(blocks: list, title: str) -> tuple:
    """(Markdown text, self-contained HTML text) of the report blocks."""
    md, ht = [], []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            md.append("#" * int(kind[1]) + " " + b[1])
            ht.append(f"<{kind}>{inline_html(b[1])}</{kind}>")
        elif kind == "p":
            md.append(b[1])
            ht.append(f"<p class=note>{inline_html(b[1])}</p>")
        elif kind == "ul":
            md.append("\n".join(f"- {x}" for x in b[1]))
            ht.append("<ul>" + "".join(f"<li>{inline_html(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            md.append(md_table(b[1], b[2]))
            ht.append(html_table(b[1], b[2]))
        elif kind == "img":
            _, rel, data, caption = b
            md.append(f"![{caption}]({rel})")
            ht.append(
                f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
                f'{base64.b64encode(data).decode("ascii")}"><figcaption>{inline_html(caption)}</figcaption></figure>'
            )
        md.append("")
    page = (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(ht) + "\n</body></html>\n"
    )
    return "\n".join(md), page


def _name(v) -> str | None:
    if isinstance(v, dict):
        return v.get("name")
    return v if isinstance(v, str) else None


def _kv(v) -> str:
    """A metrics value as text: a dict as ``key value, ...`` (nested in parentheses), floats to 4 digits."""
    if isinstance(v, dict):
        if not v:
            return "none"
        return ", ".join(f"{k} {f'({_kv(x)})' if isinstance(x, dict) and len(x) > 1 else _kv(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _cell_details(c: dict) -> list:
    """Data, teacher labels, rendering and time of one cell, as list items."""
    items = []
    d = c.get("data") or {}
    if d.get("splits"):
        how = (
            f"resplit for this seed (split seed {d.get('split_seed')})"
            if d.get("resplit_per_seed")
            else f"one split for every seed (data.seed {d['split_seed']})"
            if "split_seed" in d
            else None
        )
        items.append(f"splits (by prompt, no prompt in two): {_kv(d['splits'])}" + (f"; {how}" if how else ""))
    if d.get("shortfalls"):
        items.append(
            "requested sizes not met: "
            + "; ".join(f"{x['split']} {x['available']} of {x['requested']}" for x in d["shortfalls"])
        )
    src = d.get("source") or {}
    sk = src.get("invalid_rows_skipped") or {}
    if src:
        items.append(
            f"source rows skipped as invalid: {sk.get('skipped', 0)}"
            + (f" ({_kv(sk['by_reason'])})" if sk.get("by_reason") else "")
            + f"; duplicate prompts removed: {src.get('duplicate_prompts_removed', 0)}"
        )
    for name, o in (d.get("ood") or {}).items():
        osk = (o.get("invalid_rows_skipped") or {}).get("skipped", 0)
        items.append(
            f"OOD {name}: {o.get('used')} pairs used; invalid rows skipped {osk}; "
            f"prompts overlapping the source removed {o.get('prompt_overlap_removed', 0)}"
        )
    items.append(f"test pairs: {_kv(c['n_pairs'])}")
    lo, hi = c["accuracy_ci95"]["teacher"][c["id"]]
    items.append(
        f"teacher beats chance on the ID test split with its 95% interval clear of 50%: "
        f"{'yes' if c['teacher_beats_chance_id'] else '**NO**'} ({lo:.1f}–{hi:.1f})"
    )
    tl = c.get("teacher_labels")
    if tl:
        items.append(
            f"teacher soft labels: {tl['n']} on student-train, mean q {tl['mean_q']:.3f}, agreeing with gold on "
            f"{tl['agree_with_gold']:.1f}% of pairs, ECE {tl['ece']:.2f} pp"
        )
    for stage, info in (c.get("stages") or {}).items():
        if isinstance(info, dict) and ("rendering" in info or "truncated_pairs" in info):
            items.append(
                f"{stage}: chat template {_kv(info.get('rendering'))}; "
                f"truncated pairs {_kv(info.get('truncated_pairs'))}"
            )
    if c.get("rendering"):
        items.append(f"rendering: {_kv(c['rendering'])}")
    if c.get("truncated_pairs"):
        items.append(f"truncated pairs: {_kv(c['truncated_pairs'])}")
    for m, v in c.get("training", {}).items():  # the anchor term's weight in the loss
        if v.get("anchor_ratio_mean") is not None:
            items.append(
                f"{m}: λ × L_anchor / L_w2s over training mean {v['anchor_ratio_mean']:.3g}, last "
                f"{v['anchor_ratio_last']:.3g}; λ mean {v['anchor_lambda_mean']:.3g}, "
                f"last {v['anchor_lambda_last']:.3g}; "
                f"batch drift (relative squared error) last {v['anchor_drift_last']:.3g}"
            )
    runtime = {
        m: v["summary"].get("train_runtime")
        for m, v in c.get("training", {}).items()
        if v.get("summary", {}).get("train_runtime") is not None
    }
    if runtime:
        items.append("training runtime (s): " + ", ".join(f"{m} {t:.1f}" for m, t in runtime.items()))
    if c.get("timings_seconds"):
        items.append(f"stages (s): {_kv(c['timings_seconds'])}")
    return items


def write_report(run_dir: Path, metrics: dict) -> str:
    """Write ``report.md``, a self-contained ``report.html`` (inline CSS, PNGs as data: URIs) and
    ``plots/<source>-<kind>.png`` atomically; return the main Markdown table(s).

    Args:
        run_dir: the run directory.
        metrics: {"cells": [build_cell_metrics(...), ...], "aggregate": aggregate(cells) (recomputed when
            absent), and optionally "config" (with "teacher"/"student"), "wall_seconds"}.

    Plots without data are skipped (no λ plot with fewer than two λ values, no layer plot with one anchored
    layer set, no drift plot without drift files); PNGs of this report's kinds left from an earlier report
    and not redrawn are removed.

    Raises:
        ValueError: ``metrics`` lacks "cells" (a metrics.json of an older version) or has no cell.
    """
    run_dir = Path(run_dir)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("cells"), list):
        raise ValueError("metrics has no 'cells' list (a metrics.json from an older w2s-shift version?)")  # noqa: TRY004
    cells = metrics["cells"]
    if not cells:
        raise ValueError("metrics has no cells")
    agg = metrics.get("aggregate") or aggregate(cells)
    cfg = metrics.get("config") or {}
    teacher, student = _name(cfg.get("teacher")), _name(cfg.get("student"))
    title = "W2S reward models under preference shift"
    blocks: list = [("h1", title)]
    intro = (
        (f"Teacher `{teacher}`, student `{student}`. " if teacher and student else "")
        + "Pairwise accuracy in percentage points (ties count as wrong). WRG = Acc_s(ID) − Acc_t(ID), AOG = "
        "Acc_s(OOD) − Acc_t(OOD) per target and averaged, NTS = AOG − max(0, Acc_t(ID) − Acc_s(ID)) (Le et al. "
        "2026), in pp; PGR = (student − teacher) / (ceiling − teacher) on the ID test split (n/a unless the ceiling "
        "beats the teacher there by >= 5 pp with a paired interval above 0, the gap check; its interval "
        "leaves out the bootstrap resamples where PGR is undefined, shows "
        "their share, and is n/a when they exceed 5%). One seed: value [95% paired bootstrap interval over pairs, "
        "ID and OOD "
        "resampled independently]; several seeds: mean ± standard deviation over seeds. Bold: best AOG mean and "
        "NTS among the W2S students."
    )
    blocks.append(("p", intro))
    summary_at, summary = len(blocks), []
    by_source: dict = {}
    for c in cells:
        by_source.setdefault(c["source"], []).append(c)
    plots_dir = run_dir / "plots"
    written, tables = set(), []
    for src, cs in by_source.items():
        s = Source(src, cs, agg[src])
        seeds = ", ".join(str(x) for x in s.agg["seeds"])
        blocks.append(("h2", f"Source {src} (ID), OOD: {', '.join(s.ood)}; seed{'s' if s.multi else ''} {seeds}"))
        head, rows = main_table(s)
        blocks.append(("table", head, rows))
        tables.append(f"### {src} (seed{'s' if s.multi else ''} {seeds})\n\n" + md_table(head, rows))
        blocks += _source_blocks(run_dir, s, summary)
        figs = _plots(run_dir, s, written)
        if figs:
            blocks += [("h3", "Plots"), *figs]
        blocks += bon_blocks(run_dir, src, written, source_labels(s))
    blocks += rewardbench_blocks(metrics)
    if read_bon(run_dir) is None:
        blocks += bon_pointer()
    # at the top: the gap, the claims' verdicts and what the comparisons can see, per source, then the verdicts of
    # seeds added until decided, which supersede the per-look claims tables
    top = [("h2", "What this run shows"), ("ul", summary)] if summary else []
    top += sequential_blocks(run_dir, sorted({c["seed"] for c in cells}))
    blocks[summary_at:summary_at] = top
    blocks += _details_blocks(metrics)
    kinds = tuple(k for k, _, _ in PLOTS)
    if plots_dir.is_dir():
        for p in plots_dir.glob("*.png"):
            if f"plots/{p.name}" not in written and p.stem.endswith(tuple("-" + k for k in kinds)):
                p.unlink()
    md, page = _render(blocks, title)
    write_text_atomic(run_dir / "report.md", md)
    write_text_atomic(run_dir / "report.html", page)
    return "\n\n".join(tables)


def _source_blocks(run_dir: Path, s: Source, summary: list) -> list:
    """The blocks of one source after its main table: warnings, side targets, gap and length checks, truncation,
    paired differences, per-model metrics, drift, the mechanism, the claims (their summary lines appended to
    ``summary``) and the competitors."""
    blocks: list = []
    methods = s.agg.get("methods") or s.cells[0]["methods"]
    if not all(s.agg["teacher_beats_chance_id"]):
        blocks.append(
            (
                "p",
                (
                    "**Warning:** the teacher does not beat chance on the ID test split in every seed (95% "
                    "interval includes 50%); its labels carry little signal and W2S gains are not "
                    "interpretable."
                ),
            )
        )
    st = side_table(s)
    if st:
        blocks += [
            ("h3", "Side targets"),
            (
                "p",
                f"Sets added with `w2s-shift evaluate` ({', '.join(s.side)}): scored beside the grid's declared "
                "OOD targets, outside AOG mean, NTS and the claims (`evaluate --headline` makes a set a headline "
                "target; `evaluate --remove NAME` takes one out).",
            ),
            ("table", *st),
        ]
    blocks += gap_blocks(s) + length_blocks(s)
    blocks += truncation_blocks(s)
    dt = diff_table(s)
    if dt:
        base, h, r = dt
        blocks += [
            ("h3", f"Paired differences against {base}"),
            (
                "p",
                f"Student minus `{base}` on the same test pairs, in pp (Δ WRG = Δ acc on the ID set, "
                f"Δ AOG per target = Δ acc on it). "
                + (
                    "One seed: value [95% paired bootstrap interval]; * marks an interval that excludes 0, "
                    "uncorrected for the many comparisons of this table (descriptive: the claims table below "
                    "is the test, with seed noise, families and Holm)."
                    if not s.multi
                    else "Mean ± std over seeds."
                ),
            ),
            ("table", h, r),
        ]
    h, r, shown = model_metric_table(s)
    if shown:
        blocks += [
            ("h3", "Calibration, agreement and other per-model metrics"),
            (
                "p",
                metric_notes(shown, s.multi),
            ),
            ("table", h, r),
        ]
    dr = drift_table(s)
    if dr:
        blocks += [
            ("h3", "Representation drift from the pretrained reference (end of training)"),
            (
                "p",
                "Response tokens; relative squared error Σ‖h − h_ref‖² / Σ‖h_ref‖² and linear CKA "
                "(Kornblith et al. 2019) per block (1-based; the last row per model is the final normalized "
                "output)." + (" Means over seeds." if s.multi else ""),
            ),
            ("table", *dr),
        ]
    mech = s.agg.get("drift_vs_aog")
    if mech and mech.get("overall"):
        blocks += [("h3", "Drift vs OOD gain (descriptive)"), ("p", mechanism_text(mech))]
    blocks += intervention_blocks(run_dir, s.cells)
    blocks += ensemble_blocks(run_dir, s.cells)
    blocks += claims_blocks(run_dir, s.cells, methods, summary=summary)
    blocks += competitor_blocks(run_dir, s.cells, methods)
    return blocks


def _plots(run_dir: Path, s: Source, written: set) -> list:
    """Draw one source's plots into ``plots/<source>-<kind>.png`` (atomically); their relative paths are added to
    ``written``. Returns the report's image blocks."""
    figs = []
    for kind, fn, caption in PLOTS:
        data = fn(s)
        if data is None:
            continue
        rel = f"plots/{file_slug(s.name)}-{kind}.png"
        write_bytes_atomic(run_dir / rel, data)
        written.add(rel)
        figs.append(("img", rel, data, f"{s.name}: {caption}"))
    return figs


def _details_blocks(metrics: dict) -> list:
    """The closing blocks: data, teacher labels, rendering and time per cell, the exportable students, the targets
    ``evaluate`` added, and the environment."""
    blocks: list = [("h2", "Data, teacher labels, rendering and time per cell")]
    blocks.append(
        (
            "p",
            (
                "Rendering: one rule for teacher and student, the tokenizer's chat template when it has one, "
                "else a plain 'Human: ... Assistant: ...' transcript; " + TRUNCATION_RULE + "."
            ),
        )
    )
    cells = metrics["cells"]
    for c in cells:
        blocks += [("h3", f"{c['source']} seed {c['seed']} (`{c.get('dir')}`)"), ("ul", _cell_details(c))]
    this = metrics.get("wall_seconds_this_run")
    wall = f"wall time: {metrics.get('wall_seconds')} s" + (
        f" over every run of this directory (the last one {this} s)"
        if this not in (None, metrics.get("wall_seconds"))
        else ""
    )
    blocks.append(("ul", [wall]))
    exportable = exportable_labels(cells)
    if exportable:
        blocks.append(
            (
                "p",
                "Trained students that `w2s-shift export RUN_DIR LABEL` saves as Hugging Face reward models "
                "(`<source>/seed<k>/export/<label>/`, from the saved weights; nothing retrained or rescored): "
                + ", ".join(f"`{x}`" for x in exportable)
                + ".",
            )
        )
    added = [e for e in metrics.get("evaluated_targets") or [] if isinstance(e, dict)]
    if (
        added
    ):  # OOD targets added to a finished run by `w2s-shift evaluate` (w2s_shift.pipeline.evaluate): scored, not trained
        blocks.append(
            (
                "ul",
                [
                    f"OOD target {e.get('name')} added after the run by `w2s-shift evaluate` from "
                    f"`{e.get('path') or e.get('name')}` (sha256 {str(e.get('sha256'))[:12]}; per source: "
                    + ", ".join(
                        f"{s} {v.get('used')} pairs used, {v.get('prompt_overlap_removed')} removed for a "
                        "prompt in the source"
                        for s, v in (e.get("per_source") or {}).items()
                    )
                    + "); its models were scored, not retrained"
                    for e in added
                ],
            )
        )
    if isinstance(metrics.get("environment"), dict):  # hardware, versions, precisions (w2s_shift.models.precision)
        from ..models.precision import environment_lines

        blocks.append(("ul", environment_lines(metrics["environment"])))
    return blocks


def mechanism_text(mech: dict) -> str:
    """One paragraph on the drift-vs-AOG rank correlation of a source (:mod:`w2s_shift.metrics.mechanism`)."""

    def fmt(r):
        if not r:
            return "undefined"
        ci = f" [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]" if r.get("ci") else ""
        return f"{r['rho']:+.2f}{ci} (n = {r['n']}{'' if r.get('ci') else ', too few points for an interval'})"

    o = mech["overall"]
    verdict = (
        "negative, as the paper's mechanism predicts"
        if o.get("ci") and o["ci"][1] < 0
        else "positive, against the mechanism"
        if o.get("ci") and o["ci"][0] > 0
        else "its interval holds 0: the mechanism is not shown here"
        if o.get("ci")
        else "too few points for an interval: the mechanism is not tested here"
    )
    per = "; ".join(f"{t} {fmt(r)}" for t, r in mech["per_target"].items())
    return (
        "Spearman rank correlation between each W2S student's final last-layer drift on an OOD target (relative "
        "squared error) and its AOG there, one point per student, seed and target, with a 95% percentile "
        f"bootstrap interval over the points: ρ = {fmt(o)}, {verdict}. Per target: {per}."
    )

"""The report's matplotlib figures (accuracy, λ sweep, anchored layers, drift, training curves) as PNG bytes."""

from __future__ import annotations

import io
import zlib

import numpy as np

from ..methods import is_baseline, method_of
from .tables import Source


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def new_figure(ncols: int, width: float = 6.0, height: float = 4.2):
    from matplotlib.figure import (
        Figure,  # object API: no pyplot global state, no GUI backend
    )

    fig = Figure(figsize=(width * ncols, height))
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _err(v, iv) -> list:
    if v is None or iv is None:
        return [[0.0], [0.0]]
    return [[max(v - iv[0], 0.0)], [max(iv[1] - v, 0.0)]]


def _acc_ylim(ax, pts: list) -> None:
    """Accuracy axis from just below chance (or the lowest bound) to above the highest interval bound."""
    pts = [p for p in pts if p[0] is not None]
    if pts:
        lo = min(p[1][0] if p[1] else p[0] for p in pts)
        hi = max(p[1][1] if p[1] else p[0] for p in pts)
        ax.set_ylim(max(0.0, min(lo, 50.0) - 5), min(100.0, hi) + 3)
    ax.axhline(50, color="gray", ls=":", lw=1)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# one colour per model in every figure: the usual labels and method names a fixed one, any other label a colour
# from a stable hash into PALETTE (crc32, so the same in every process; no greys, the teacher's colour)
FIXED_COLORS = {
    "teacher": "#7f7f7f",
    "naive": "#1f77b4",
    "confidence": "#ff7f0e",
    "seam": "#9467bd",
    "anchor": "#d62728",
    "ceiling": "#2ca02c",
    "zero_shot": "#8c564b",
    "l2sp": "#e377c2",
    "wise_ft": "#bcbd22",
    "grm": "#17becf",
}
PALETTE = (
    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
    "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194", "#6baed6", "#fd8d3c", "#74c476",
    "#9e9ac8", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
)  # fmt: skip


def _key(label: str) -> str:
    return str(label).strip().lower().replace("-", "_")


def model_colors(labels, reserved=()) -> dict:
    """{label: colour} for ``labels``: a fixed colour for the usual labels (teacher, naive, confidence, seam,
    anchor, ceiling, zero_shot and the competitors), the others from a stable hash into :data:`PALETTE`, moved to
    the next free colour when two would share one, so distinct labels get distinct colours (until the palette
    runs out). A figure passes every label of its run (:func:`source_labels`), not only the ones it draws, so a
    label has the same colour in each of the run's figures. ``reserved``: colours the hashed labels avoid."""
    labels = list(dict.fromkeys(str(x) for x in labels))
    out = {lab: FIXED_COLORS[_key(lab)] for lab in labels if _key(lab) in FIXED_COLORS}
    used = set(out.values()) | set(reserved)
    for lab in sorted(x for x in labels if x not in out):
        i = zlib.crc32(_key(lab).encode()) % len(PALETTE)
        for j in range(len(PALETTE)):
            if PALETTE[(i + j) % len(PALETTE)] not in used:
                i = (i + j) % len(PALETTE)
                break
        out[lab] = PALETTE[i]
        used.add(PALETTE[i])
    return out


def source_labels(s: Source) -> list:
    """Every model label of a source: its report rows, its methods and the students in its cells' curves."""
    extra = [lab for c in s.cells for sec in ("training", "drift") for lab in c.get(sec, {})]
    return [*s.rows, *s.methods, *extra]


def _source_colors(s: Source, more=()) -> dict:
    """The run's colours (:func:`model_colors` over :func:`source_labels`); ``more``: labels a figure draws that
    the source may not list (normally none, so the mapping is the run's)."""
    return model_colors([*source_labels(s), *more])


def _color_ticks(ax, labels: list, cols: dict) -> None:
    """Tick labels (model labels) drawn in their model's colour."""
    for tick, lab in zip(ax.get_xticklabels(), labels):
        if lab in cols:
            tick.set_color(cols[lab])


def _err_note(s: Source) -> str:
    return "error bars: ± std over seeds" if s.multi else "error bars: 95% bootstrap interval"


def _plot_accuracy(s: Source) -> bytes | None:
    rows = [m for m in s.rows if s.get("accuracy", m, s.id)[0] is not None]
    if not rows:
        return None
    fig, (ax,) = new_figure(1, width=max(7.0, 0.45 * len(rows) * len(s.datasets) + 2), height=4.5)
    w = 0.8 / len(s.datasets)
    for j, (d, col) in enumerate(zip(s.datasets, _colors(len(s.datasets)))):
        for i, m in enumerate(rows):
            v, iv, _ = s.get("accuracy", m, d)
            if v is None:
                continue
            ax.bar(
                i + (j - (len(s.datasets) - 1) / 2) * w,
                v,
                w,
                color=col,
                yerr=_err(v, iv),
                capsize=2,
                label=(f"{d} (ID)" if d == s.id else d) if i == 0 else None,
            )
    ax.set_xticks(range(len(rows)), rows, rotation=25, ha="right")
    _color_ticks(ax, rows, _source_colors(s))
    ax.set_ylabel("pairwise accuracy (%)")
    _acc_ylim(ax, [s.get("accuracy", m, d) for m in rows for d in s.datasets])
    ax.set_title(f"{s.name}: ID and OOD accuracy ({_err_note(s)}; dotted: chance)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="test set", title_fontsize=8)
    return png_bytes(fig)


def _anchor_groups(s: Source) -> dict:
    """ANCHOR students grouped by anchored layers (and fine-tuning mode when several are used)."""
    anchors = [m for lab, m in s.methods.items() if getattr(method_of(m), "needs_reference", False) and lab in s.w2s]
    several_ft = len({m.get("finetune") for m in anchors if m.get("finetune")}) > 1
    groups: dict = {}
    for m in anchors:
        spec = m.get("layer_spec") or "last"
        key = (
            spec
            + (f" {m.get('anchor_layers')}" if spec == "custom" else "")
            + (f", {m.get('finetune') or '?'}" if several_ft else "")
        )
        key += ", λ auto" if m.get("anchor_lambda_mode") == "auto" else ""  # no place on a fixed-λ axis
        groups.setdefault(key, []).append(m)
    for ms in groups.values():
        ms.sort(key=lambda m: float(m.get("anchor_lambda") or 0.0))
    return groups


def _naive(s: Source) -> str | None:
    return next((lab for lab in s.w2s if is_baseline(s.methods[lab])), None)


def _plot_lambda(s: Source) -> bytes | None:
    groups = {k: ms for k, ms in _anchor_groups(s).items() if not k.endswith("λ auto")}
    lams = sorted({float(m.get("anchor_lambda") or 0.0) for ms in groups.values() for m in ms})
    if len(lams) < 2:
        return None
    fig, (ax1, ax2) = new_figure(2)
    naive = _naive(s)
    cols = _source_colors(s)
    # a λ line is a group of students, not one model: its colour is the group's one student's when it has one,
    # else a hashed colour no model of the run has
    gcols = model_colors([f"anchor ({k})" for k in groups], reserved=cols.values())
    for key, ms in groups.items():
        col = cols[ms[0]["label"]] if len(ms) == 1 else gcols[f"anchor ({key})"]
        x = [float(m.get("anchor_lambda") or 0.0) for m in ms]
        for ax, sec, keys, ls, what in (
            (ax1, "accuracy", (s.id,), "-", "ID"),
            (ax1, "accuracy_ood_mean", (), "--", "OOD mean"),
            (ax2, "metrics", ("NTS",), "-", "NTS"),
        ):
            pts = [s.get(sec, m["label"], *keys) for m in ms]
            y = [p[0] for p in pts]
            e = np.array([_err(p[0], p[1]) for p in pts])[:, :, 0].T
            ax.errorbar(
                x,
                y,
                yerr=e,
                color=col,
                ls=ls,
                marker="o",
                ms=4,
                capsize=3,
                elinewidth=0.8,
                alpha=0.9,
                label=f"{key}: {what}",
            )
    if naive:
        for ax, sec, keys, ls, what in (
            (ax1, "accuracy", (s.id,), "-", "ID"),
            (ax1, "accuracy_ood_mean", (), "--", "OOD mean"),
            (ax2, "metrics", ("NTS",), "-", "NTS"),
        ):
            v = s.get(sec, naive, *keys)[0]
            if v is not None:
                ax.axhline(v, color=cols.get(naive, "gray"), ls=ls, lw=1, label=f"{naive}: {what}")
    pos = [v for v in lams if v > 0]
    for ax in (ax1, ax2):
        ax.set_xscale("symlog", linthresh=min(pos) if pos else 1e-6)
        ax.set_xticks(lams, [f"{v:g}" for v in lams], rotation=30)
        ax.set_xlim(
            -0.5 * min(pos) if (0.0 in lams and pos) else min(pos) / 3 if pos else -1.0,
            max(lams) * 3 if max(lams) > 0 else 1.0,
        )
        ax.set_xlabel("ANCHOR λ (symlog; 0 = no anchor)")
        ax.legend(fontsize=7)
    ax2.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("pairwise accuracy (%)")
    ax2.set_ylabel("NTS (pp)")
    ax1.set_title(f"{s.name}: accuracy vs λ ({_err_note(s)})", fontsize=10)
    ax2.set_title(f"{s.name}: net transfer score vs λ", fontsize=10)
    return png_bytes(fig)


def _plot_layers(s: Source) -> bytes | None:
    groups = _anchor_groups(s)
    if len(groups) < 2:
        return None
    naive = _naive(s)
    bars = ([(naive, "naive")] if naive else []) + [
        (
            m["label"],
            f"{key}\nλ={float(m.get('anchor_lambda') or 0):g}" if m.get("anchor_lambda_mode") != "auto" else key,
        )
        for key, ms in groups.items()
        for m in ms
    ]
    fig, (ax1, ax2) = new_figure(2, width=max(6.0, 0.9 * len(bars) + 2))
    x = np.arange(len(bars))
    for off, sec, keys, what, col in (
        (-0.2, "accuracy", (s.id,), "ID", "C0"),
        (0.2, "accuracy_ood_mean", (), "OOD mean", "C1"),
    ):
        for i, (lab, _) in enumerate(bars):
            v, iv, _ = s.get(sec, lab, *keys)
            if v is not None:
                ax1.bar(i + off, v, 0.4, color=col, yerr=_err(v, iv), capsize=2, label=what if i == 0 else None)
    for i, (lab, _) in enumerate(bars):
        v, iv, _ = s.get("metrics", lab, "NTS")
        if v is not None:
            ax2.bar(i, v, 0.6, color="C2" if v >= 0 else "C3", yerr=_err(v, iv), capsize=2)
    _acc_ylim(
        ax1, [s.get(sec, lab, *k) for lab, _ in bars for sec, k in (("accuracy", (s.id,)), ("accuracy_ood_mean", ()))]
    )
    cols = _source_colors(s)
    for ax in (ax1, ax2):
        ax.set_xticks(x, [b[1] for b in bars], fontsize=8)
        _color_ticks(ax, [b[0] for b in bars], cols)
    ax2.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("pairwise accuracy (%)")
    ax2.set_ylabel("NTS (pp)")
    ax1.legend(fontsize=8)
    ax1.set_title(f"{s.name}: anchored layers ({_err_note(s)})", fontsize=10)
    ax2.set_title(f"{s.name}: NTS per anchored layer set", fontsize=10)
    return png_bytes(fig)


def _final_drift_point(c: dict, lab: str) -> tuple:
    """(mean rel. sq. err, mean CKA) of the final output layer over the OOD targets in the drift file (all
    datasets when none is OOD)."""
    d = c["drift"][lab]
    last = str(d["layers"][-1]) if d["layers"] else None
    dsets = [x for x in d["final"] if x in c["ood"]] or list(d["final"])
    e = [d["final"][x].get(last, {}).get("rel_sq_err") for x in dsets]
    k = [d["final"][x].get(last, {}).get("cka") for x in dsets]
    e, k = [v for v in e if v is not None], [v for v in k if v is not None]
    return (float(np.mean(e)) if e else None), (float(np.mean(k)) if k else None)


# label offsets (points) and alignment, taken in turn by points in order of position, so neighbours' labels part
OFFSETS = (((4, 4), "left"), ((4, -10), "left"), ((-4, 4), "right"), ((-4, -10), "right"))


def _annotate(points: list, ax) -> None:
    """Point labels ``(text, x, y)`` with alternating small offsets (:data:`OFFSETS`), in order of x then y, so
    labels of points that lie close together do not print over each other."""
    for i, (text, x, y) in enumerate(sorted(points, key=lambda p: (p[1], p[2]))):
        off, ha = OFFSETS[i % len(OFFSETS)]
        ax.annotate(text, (x, y), fontsize=7, xytext=off, textcoords="offset points", ha=ha)


def _plot_drift(s: Source) -> bytes | None:
    pts = []
    for c in s.cells:
        for lab in c.get("drift", {}):
            e, k = _final_drift_point(c, lab)
            y = c.get("accuracy_ood_mean", {}).get(lab)
            if y is not None and (e is not None or k is not None):
                pts.append((lab, c["seed"], e, k, y))
    if not pts:
        return None
    cols = _source_colors(s, [p[0] for p in pts])
    col = {lab: cols[lab] for lab in dict.fromkeys(p[0] for p in pts)}
    fig, (ax1, ax2) = new_figure(2)
    first_seed = s.cells[0]["seed"]
    for i, ax in enumerate((ax1, ax2)):
        for lab, _, *xs, y in pts:
            if xs[i] is not None:
                ax.scatter([xs[i]], [y], color=col[lab], s=30)
        _annotate([(lab, xs[i], y) for lab, seed, *xs, y in pts if seed == first_seed and xs[i] is not None], ax)
    if all(p[2] is None or p[2] > 0 for p in pts) and any(p[2] is not None for p in pts):
        ax1.set_xscale("log")
    for ax in (ax1, ax2):
        ax.margins(0.12)
    for n, c_ in col.items():
        ax1.scatter([], [], color=c_, label=n)
    ax1.legend(fontsize=8)
    ax1.set_xlabel("relative squared drift of the final output (OOD mean)")
    ax2.set_xlabel("linear CKA to the reference (OOD mean)")
    for ax in (ax1, ax2):
        ax.set_ylabel("OOD mean pairwise accuracy (%)")
    ax1.set_title(f"{s.name}: representation drift vs OOD accuracy", fontsize=10)
    ax2.set_title(f"{s.name}: similarity to the pretrained reference", fontsize=10)
    return png_bytes(fig)


SHORT_CURVE = 20  # logged steps up to which a loss curve is drawn with large markers


def _plot_training(s: Source) -> bytes | None:
    c = s.cells[0]
    curves = {m: v for m, v in c.get("training", {}).items() if v.get("step")}
    if not curves:
        return None
    anchor = {m: v for m, v in curves.items() if any(x for x in v.get("loss_anchor", []) if x)}
    during = {lab: d["during"] for lab, d in c.get("drift", {}).items() if d.get("during")}
    n = 1 + bool(anchor) + bool(during)
    fig, axes = new_figure(n)
    cols = _source_colors(s)
    for m, v in curves.items():
        n_steps = len(v["step"])
        axes[0].plot(
            v["step"],
            v["loss"],
            color=cols[m],
            ls="--" if m == "teacher" else "-",
            # a short run's few logged steps as clear markers, not a lone dot
            marker="." if n_steps > SHORT_CURVE else "o",
            ms=None if n_steps > SHORT_CURVE else 5,
            label=m if n_steps > 1 else f"{m} (1 logged step)",
        )
    axes[0].set_ylabel("training loss")
    axes[0].set_title(f"{s.name} seed {c['seed']}: loss per step", fontsize=10)
    i = 1
    if anchor:
        for m, v in anchor.items():
            pts = [(st, x) for st, x in zip(v["step"], v["loss_anchor"]) if x]
            ms = 3 if len(pts) > SHORT_CURVE else 5
            axes[i].plot([p[0] for p in pts], [p[1] for p in pts], color=cols[m], marker="o", ms=ms, label=m)
        axes[i].set_yscale("log")
        axes[i].set_ylabel("ANCHOR term L_anchor (MSE, or relative error when normalized)")
        axes[i].set_title("anchor term per step", fontsize=10)
        i += 1
    if during:
        for lab, rows in during.items():
            layers = c["drift"][lab]["layers"]
            last = str(layers[-1]) if layers else None
            by_step: dict = {}
            for r in rows:
                v = (r.get(last) or {}).get("rel_sq_err") if last else None
                if v is not None:
                    by_step.setdefault(int(r["step"]), []).append(v)
            st = sorted(by_step)
            ms = 3 if len(st) > SHORT_CURVE else 5
            axes[i].plot(st, [np.mean(by_step[k]) for k in st], color=cols[lab], marker="o", ms=ms, label=lab)
        axes[i].set_ylabel("relative squared drift (final output)")
        axes[i].set_title("drift during training (mean over probe sets)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return png_bytes(fig)


def _plot_drift_aog(s: Source) -> bytes | None:
    mech = s.agg.get("drift_vs_aog")
    if not mech or not mech.get("overall"):
        return None
    pts = mech["points"]
    cols = _source_colors(s, [p["label"] for p in pts])
    col = {lab: cols[lab] for lab in dict.fromkeys(p["label"] for p in pts)}
    targets = list(dict.fromkeys(p["target"] for p in pts))
    marks = dict(zip(targets, "osD^vP*X"))
    fig, (ax,) = new_figure(1, width=7.0)
    for p in pts:
        ax.scatter([p["drift"]], [p["aog"]], color=col[p["label"]], marker=marks.get(p["target"], "o"), s=30)
    for n, c_ in col.items():
        ax.scatter([], [], color=c_, label=n)
    for t, mk in marks.items():
        ax.scatter([], [], color="grey", marker=mk, label=t)
    if all(p["drift"] > 0 for p in pts):
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap within a decade
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    o = mech["overall"]
    ci = f" [{o['ci'][0]:+.2f}, {o['ci'][1]:+.2f}]" if o.get("ci") else ""
    ax.set_xlabel("final last-layer drift on the target (relative squared error)")
    ax.set_ylabel("AOG on the target (pp)")
    ax.set_title(f"{s.name}: drift vs OOD gain, Spearman ρ = {o['rho']:+.2f}{ci}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_bytes(fig)


def drift_per_block(s: Source, dsets: list) -> dict:
    """{student label: (blocks, drift)}: the final relative squared drift at each reported block (1-based; the
    last is the final normalized output), averaged over ``dsets`` (and over seeds, as :meth:`Source.get` gives),
    for every student whose drift file reports at least 3 blocks (students that train more than their top
    blocks); blocks without a positive value on any of ``dsets`` are left out."""
    out = {}
    for lab, layers in s.drift_layers().items():
        if len(layers) < 3:
            continue
        xs, ys = [], []
        for layer in layers:
            vals = [s.get("drift_final", lab, d, str(layer), "rel_sq_err")[0] for d in dsets]
            vals = [v for v in vals if v is not None and v > 0]
            if vals:
                xs.append(layer)
                ys.append(float(np.mean(vals)))
        if xs:
            out[lab] = (xs, ys)
    return out


def _plot_drift_blocks(s: Source) -> bytes | None:
    """Drift per block (:func:`drift_per_block`, log scale) on the ID set and averaged over the OOD sets, so a
    reader sees where fine-tuning moves representations and where anchoring stops it."""
    panels = [(f"{s.id} (ID)", drift_per_block(s, [s.id])), ("OOD sets (mean)", drift_per_block(s, s.datasets[1:]))]
    labs = list(dict.fromkeys(lab for _, lines in panels for lab in lines))
    if not labs:
        return None
    col = _source_colors(s, labs)
    fig, axes = new_figure(2, width=6.0)
    for ax, (title, lines) in zip(axes, panels):
        for lab, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="o", ms=3, color=col[lab], label=lab, ls="--" if lab == s.ceiling else "-")
        ax.set_yscale("log")
        ax.set_xlabel("block (1-based; the last point is the final normalized output)")
        ax.set_ylabel("relative squared drift from the pretrained reference")
        ax.set_title(f"{s.name}: drift per block, {title}", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_bytes(fig)


PLOTS = (
    ("accuracy", _plot_accuracy, "ID vs OOD pairwise accuracy per model"),
    ("lambda", _plot_lambda, "ANCHOR λ ablation: ID / OOD mean accuracy and NTS"),
    ("layers", _plot_layers, "ANCHOR layer ablation"),
    ("drift", _plot_drift, "Representation drift vs OOD accuracy"),
    ("drift-blocks", _plot_drift_blocks, "Drift per block, from the first trainable block to the output"),
    ("drift-aog", _plot_drift_aog, "Drift vs AOG, one point per W2S student, seed and OOD target"),
    ("training", _plot_training, "Training curves"),
)

"""Report tables: a source's view of its cells (:class:`Source`), the Markdown blocks and tables built from
it, and Markdown/HTML table rendering."""

from __future__ import annotations

import html
import re

from ..data.render import TRUNCATION_RULE
from ..methods import is_w2s_student, table_text
from ..metrics.stats import (
    MAX_UNDEFINED,
)
from ..results.cells import NO_GAP

# ---- views of one source: single seed (value + 95% CI) or several (mean ± std) -------------------------------


def nested_get(tree, *keys):
    """``tree[k1][k2]...`` of nested dicts; None where a key is missing or a level is not a dict."""
    for k in keys:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


class Source:
    """One source's cells and aggregate; ``get`` returns (value, (lo, hi) or None, kind) with kind "ci"
    (one seed: the 95% bootstrap interval) or "std" (several seeds: mean and mean ± std)."""

    def __init__(self, name: str, cells: list, agg: dict):
        self.name, self.cells, self.agg = name, sorted(cells, key=lambda c: c["seed"]), agg
        self.multi = len(self.cells) > 1
        self.id = agg["id"]
        self.ood = agg["ood"]
        self.datasets = [self.id, *self.ood]
        self.side = agg.get("side") or []
        self.methods = {m["label"]: m for m in agg["methods"]}
        self.ceiling, self.zero_shot = agg.get("ceiling"), agg.get("zero_shot")
        self.w2s = [lab for lab, m in self.methods.items() if is_w2s_student(m) and lab in agg["models"]]
        rest = [m for m in agg["models"] if m not in ("teacher", *self.w2s, self.ceiling, self.zero_shot)]
        self.rows = ["teacher", *self.w2s, *[x for x in (self.ceiling, self.zero_shot) if x in agg["models"]], *rest]

    def get(self, section: str, *keys) -> tuple:
        if self.multi:
            st = nested_get(self.agg, section, *keys)
            v = st.get("value", st.get("mean")) if isinstance(st, dict) else None  # model metrics: their combination
            if v is None:
                return None, None, "std"
            sd = st["std"] or 0.0
            return v, (v - sd, v + sd), "std"
        c = self.cells[0]
        if section == "accuracy":
            return nested_get(c, "accuracy", *keys), nested_get(c, "accuracy_ci95", *keys), "ci"
        if section == "accuracy_ood_mean":
            return nested_get(c, "accuracy_ood_mean", *keys), nested_get(c, "accuracy_ood_mean_ci95", *keys), "ci"
        if section in ("metrics", "differences"):
            return nested_get(c, section, keys[0], *keys[1:]), nested_get(c, section, keys[0], "ci95", *keys[1:]), "ci"
        if section == "side_targets":  # keys: "accuracy" or "AOG", then model and target
            return (
                nested_get(c, section, *keys),
                nested_get(c, section, f"{keys[0]}_ci95", *keys[1:]),
                "ci",
            )
        if section == "drift_final":
            return nested_get(c, "drift", keys[0], "final", *keys[1:]), None, "ci"
        return nested_get(c, section, *keys), None, "ci"

    def drift_layers(self) -> dict:
        """{student label: the blocks its drift file reports (1-based; the last is the final output)}, in the order
        the cells list them; {} without drift files."""
        out: dict = {}
        for c in self.cells:
            for lab, d in c.get("drift", {}).items():
                out.setdefault(lab, d["layers"])
        return out

    def fmt(self, section: str, *keys, signed: bool = False, digits: int = 2, star: bool = False) -> str:
        v, iv, kind = self.get(section, *keys)
        if v is None:
            return "n/a"
        f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
        if kind == "std":
            st = nested_get(self.agg, section, *keys)
            return f.format(v) + (f" ± {st['std']:.{digits}f}" if st.get("std") is not None else "")
        if iv is None:
            return f.format(v)
        g = f"{{:+.{max(digits - 1, 1)}f}}" if signed else f"{{:.{max(digits - 1, 1)}f}}"
        mark = "*" if star and (iv[0] > 0 or iv[1] < 0) else ""
        return f"{f.format(v)}{mark} [{g.format(iv[0])}, {g.format(iv[1])}]"


def _n_pairs(s: Source, dataset: str) -> str:
    """The pairs scored on ``dataset``: "500", or "498-500" when the seeds' cells differ; "?" when not recorded."""
    ns = sorted({c.get("n_pairs", {}).get(dataset) for c in s.cells} - {None})
    return "?" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def main_table(s: Source) -> tuple:
    """(header, rows) of the paper's table: accuracy per test set, WRG, AOG per target and mean, NTS, PGR (ID)."""
    head = (
        ["model", "method"]
        + [f"{d} (ID) acc, n={_n_pairs(s, d)}" if d == s.id else f"{d} acc, n={_n_pairs(s, d)}" for d in s.datasets]
        + ["WRG"]
        + [f"AOG {d}" for d in s.ood]
        + ["AOG mean", "NTS", "PGR (ID)"]
    )
    best = {}
    for key in ("AOG_mean", "NTS"):
        vals = [(s.get("metrics", lab, key)[0], lab) for lab in s.w2s]
        vals = [x for x in vals if x[0] is not None]
        top = max(vals)[0] if vals else None
        if len(vals) > 1 and sum(v == top for v, _ in vals) == 1:  # bold a unique best only
            best[key] = max(vals)[1]
    rows = []
    for mdl in s.rows:
        cells = [mdl, table_text(s.methods.get(mdl)) if mdl != "teacher" else "weak teacher"]
        cells += [s.fmt("accuracy", mdl, d) for d in s.datasets]
        if mdl in s.w2s:
            cells.append(s.fmt("metrics", mdl, "WRG", signed=True))
            cells += [s.fmt("metrics", mdl, "AOG", d, signed=True) for d in s.ood]
            for key in ("AOG_mean", "NTS"):
                txt = s.fmt("metrics", mdl, key, signed=True)
                cells.append(f"**{txt}**" if best.get(key) == mdl else txt)
            cells.append(_pgr_cell(s, mdl))
        else:
            cells += ["–"] * (len(head) - len(cells))
        rows.append(cells)
    return head, rows


def side_table(s: Source) -> tuple | None:
    """(header, rows) of the side targets (sets added with ``evaluate`` without ``--headline``): accuracy per
    model and AOG per W2S student on each, in pp; None without side targets. They are outside AOG mean, NTS and
    the claims, which stay those of the grid's declared OOD targets."""
    if not s.side:
        return None
    head = ["model", *[f"{d} acc, n={_n_pairs(s, d)}" for d in s.side], *[f"AOG {d}" for d in s.side]]
    rows = []
    for mdl in s.rows:
        cells = [mdl, *[s.fmt("side_targets", "accuracy", mdl, d) for d in s.side]]
        if mdl in s.w2s:
            cells += [s.fmt("side_targets", "AOG", mdl, d, signed=True) for d in s.side]
        else:
            cells += ["–"] * len(s.side)
        rows.append(cells)
    return head, rows


def _pgr_cell(s: Source, mdl: str) -> str:
    """PGR (ID) of a student; "undefined (no W2S gap)" where the cell fails the gap check (every seed failing),
    else the value with the failing seeds named. One seed: also the share of bootstrap replicates where PGR is
    undefined (the ceiling not above the teacher on the resample) when any is, and the interval n/a above
    ``MAX_UNDEFINED`` (5%) of them."""
    failed = [c["seed"] for c in s.cells if (c.get("gap_check") or {}).get("passed") is False]
    if failed and len(failed) == len(s.cells):
        return "undefined (no W2S gap)"
    txt = s.fmt("metrics", mdl, "PGR", s.id)
    txt += f" (undefined in seed{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))})" if failed else ""
    share = None if s.multi else nested_get(s.cells[0], "metrics", mdl, "PGR_undefined_share", s.id)
    if not share or nested_get(s.cells[0], "metrics", mdl, "PGR", s.id) is None:
        return txt
    if share > MAX_UNDEFINED:
        return f"{txt} [n/a: undefined in {100 * share:.0f}% of resamples]"
    return f"{txt} ({100 * share:.1f}% of resamples undefined)"


def gap_blocks(s: Source) -> list:
    """Report blocks of the weak-to-strong gap check of every cell of a source."""
    items, failing = [], False
    for c in s.cells:
        g = c.get("gap_check")
        if "gap_check" not in c:
            items.append(f"seed {c['seed']}: not computed (a metrics.json of an older w2s-shift version)")
            continue
        if g is None:
            items.append(f"seed {c['seed']}: no ceiling in this cell, the gap check cannot run")
            continue
        lo, hi = g["ci"]
        what = (
            f"seed {c['seed']}: `{g['ceiling']}` − teacher on {c['id']} (ID) = {g['gap_pp']:+.2f} pp "
            f"[{lo:+.2f}, {hi:+.2f}], {g['n']} pairs"
        )
        if g["passed"]:
            items.append(f"{what}: passes (≥ {g['min_gap_pp']:g} pp, interval above 0)")
        else:
            failing = True
            items.append(f"{what}: **{NO_GAP}**")
    blocks = [("h3", "Weak-to-strong gap check")]
    if failing:
        blocks.append(("p", f"**Warning: {NO_GAP}** (in the seeds marked below)."))
    blocks += [
        (
            "p",
            (
                f"The strong ceiling must beat the weak teacher on the ID test split by at least "
                f"{next((c['gap_check']['min_gap_pp'] for c in s.cells if c.get('gap_check')), 5.0):g} pp "
                "with the lower end of the paired 95% bootstrap interval (test pairs resampled, both models on "
                "the same pairs) above 0; otherwise PGR is undefined in that cell."
            ),
        ),
        ("ul", items),
    ]
    return blocks


def length_blocks(s: Source) -> list:
    """Report blocks of the "longer response wins" baseline of every cell of a source."""
    cells = [c for c in s.cells if c.get("length_baseline")]
    if not cells:
        return []
    thr = cells[0]["length_baseline"]["length_driven_pp"]
    blocks = [
        ("h3", 'Length baseline: "longer response wins"'),
        (
            "p",
            (
                "Length = characters of the response text. First row: accuracy (%) of preferring the longer "
                "response (equal lengths count 1/2). Model rows: agreement (%) with longer-wins (pairs on which "
                "the model prefers the longer response; equal lengths count 1/2) and the Pearson correlation r "
                "of the reward margin with len(chosen) − len(rejected). Flags: a model agreeing with "
                f"longer-wins on ≥ {thr:g}% of a set is length-driven; a gap, WRG or AOG (model − teacher) is "
                "explained by length when it is positive with no gain on the pairs whose rejected response is "
                "longer, or negative with no loss on the pairs whose chosen response is longer, and only where "
                "its paired 95% bootstrap interval over test pairs excludes 0 (shown in brackets)."
            ),
        ),
    ]
    for c in cells:
        lb = c["length_baseline"]
        ds = list(lb["datasets"])
        head = ["seed " + str(c["seed"])] + [f"{d}{' (ID)' if d == c['id'] else ''}" for d in ds]
        rows = [["longer wins (accuracy)"] + [f"{lb['datasets'][d]['longer_wins_accuracy']:.1f}" for d in ds]]
        for m in c["models"]:
            r = [m]
            for d in ds:
                per = lb["datasets"][d]
                corr = per["margin_length_corr"].get(m)
                r.append(
                    f"{per['agreement'][m]:.1f} / r {'n/a' if corr is None else f'{corr:+.2f}'}"
                    + (" **length-driven**" if m in per["length_driven"] else "")
                )
            rows.append(r)
        blocks.append(("table", head, rows))
        blocks.append(
            (
                "ul",
                [f"**{f}**" for f in lb["flags"]] or ["no gap, WRG or AOG explained by length; no length-driven model"],
            )
        )
    return blocks


def _split_name(c: dict, d: str) -> str:
    """A split's name in the truncation table: "(ID)", a headline target as is, "(side)", or "(training)"."""
    if d == c["id"]:
        return f"{d} (ID)"
    if d in c["datasets"]:
        return d
    return f"{d} (side)" if d in (c.get("side") or []) else f"{d} (training)"


def _seam_effect_text(e: dict) -> str:
    """The line of an older metrics.json's SEAM effect (numbers without the method's text)."""
    from ..methods import get_method

    return get_method("seam").label_cut({}, {"effect": e})["text"]


def truncation_blocks(s: Source) -> list:
    """Report blocks: the share of pairs whose response was cut, per seed, model role and split, and what each
    method that built its own labels says of them (:func:`w2s_shift.results.cuts.cell_label_effect`)."""

    rows = []
    for c in s.cells:
        for role, per in (c.get("truncation") or {}).items():
            for d, t in per.items():
                name = _split_name(c, d)
                rows.append(
                    [
                        str(c["seed"]),
                        role,
                        name,
                        str(t["pairs"]),
                        f"{100 * t['truncated'] / t['pairs']:.1f}" if t["pairs"] else "0.0",
                        f"{100 * t['prompt_cut_share']:.1f}",
                        f"{100 * t['response_cut_share']:.1f}",
                    ]
                )
    blocks = []
    if rows:
        blocks += [
            ("h3", "Truncation"),
            (
                "p",
                f"Rendering rule: {TRUNCATION_RULE}. Shares (%) of the pairs of each split whose chosen or "
                "rejected sequence was truncated, lost prompt tokens, or lost response tokens (the response "
                "was cut; its end is always kept), per model role (each role at its own max_length).",
            ),
            ("table", ["seed", "model", "split", "pairs", "truncated %", "prompt cut %", "response cut %"], rows),
        ]
    items, warn = [], False
    for c in s.cells:  # "seam_effect": metrics.json files written before any method could build labels
        for lab, e in (c.get("label_effect") or c.get("seam_effect") or {}).items():
            warn |= bool(e.get("warn"))
            items.append(f"seed {c['seed']}, {lab}: {e.get('text') or _seam_effect_text(e)}")
    if items:
        blocks += [
            ("h3", "Labels the methods built"),
            *(
                [
                    (
                        "p",
                        "**Warning:** in the runs marked below, the labels a method built hardly differ from those "
                        "it was meant to improve on.",
                    )
                ]
                if warn
                else []
            ),
            ("ul", items),
        ]
    return blocks


def diff_table(s: Source) -> tuple | None:
    """(baseline label, head, rows) of the paired differences of each W2S student vs the baseline (with
    95% intervals; * where the interval excludes 0); None without differences."""
    base = next((c["differences"][k]["vs"] for c in s.cells for k in c.get("differences", {})), None)
    labs = [lab for lab in s.w2s if lab != base and s.get("differences", lab, "NTS")[0] is not None]
    if base is None or not labs:
        return None
    head = ["model"] + [f"Δ acc {d}" for d in s.datasets] + ["Δ AOG mean", "Δ NTS"]
    rows = []
    for lab in labs:
        rows.append(
            [lab]
            + [s.fmt("differences", lab, "accuracy", d, signed=True, star=True) for d in s.datasets]
            + [s.fmt("differences", lab, k, signed=True, star=True) for k in ("AOG_mean", "NTS")]
        )
    return base, head, rows


def metric_notes(shown: list, multi: bool) -> str:
    """One sentence per shown metric: its title, description, which direction is better, and (several seeds) how
    it is combined over them."""
    better = {True: " (higher is better)", False: " (lower is better)", None: ""}
    return (
        "; ".join(
            f"{mt.title}: {mt.description}{better[mt.higher_is_better]}"
            + (f", {mt.over_seeds} over seeds ± standard deviation" if multi else "")
            for mt in shown
        )
        + "."
    )


def model_metric_table(s: Source) -> tuple:
    """(head, rows, metrics): every registered per-model metric (:data:`w2s_shift.metrics.registry.MODEL_METRICS`)
    per model and dataset; "–" where a metric skips the model (the teacher's agreement with itself)."""
    from ..metrics.registry import MODEL_METRICS

    shown = [mt for mt in MODEL_METRICS.values() if any(mt.name in (c.get("model_metrics") or {}) for c in s.cells)]
    head = ["model"] + [f"{mt.title} {d}" for mt in shown for d in s.datasets]
    rows = []
    for mdl in s.rows:
        r = [mdl]
        for mt in shown:
            skip = mdl == "teacher" and not mt.teacher
            r += ["–" if skip else s.fmt("model_metrics", mt.name, mdl, d, digits=mt.digits) for d in s.datasets]
        rows.append(r)
    return head, rows, shown


def drift_table(s: Source) -> tuple | None:
    """(head, rows): final drift per model, anchored layer and dataset as "relative squared error / CKA";
    None without drift files."""
    layers_of = s.drift_layers()
    if not layers_of:
        return None
    shown = {*s.datasets, *s.side}  # a drift file keeps the sets taken out with evaluate --remove
    dsets = [
        d
        for d in dict.fromkeys(d for c in s.cells for v in c.get("drift", {}).values() for d in v["final"])
        if d in shown
    ]
    head = ["model", "layer"] + [f"{d} rel. sq. err / CKA" for d in dsets]
    rows = []
    for lab, layers in layers_of.items():
        for i, layer in enumerate(layers):
            name = f"{layer}" + (" (final output)" if i == len(layers) - 1 else "")
            r = [lab, name]
            for d in dsets:
                e, _, _ = s.get("drift_final", lab, d, str(layer), "rel_sq_err")
                k, _, _ = s.get("drift_final", lab, d, str(layer), "cka")
                r.append("n/a" if e is None else f"{e:.3g} / {k:.4f}" if k is not None else f"{e:.3g} / n/a")
            rows.append(r)
    return head, rows


# ---- Markdown and HTML tables --------------------------------------------------------------------------------


def md_table(head: list, rows: list) -> str:
    """A Markdown pipe table: header ``head`` (n names), ``rows`` (lists of n values, written with str)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def inline_html(text: str) -> str:
    """HTML-escaped ``text`` with Markdown `code` and **bold** turned into <code> and <b>."""
    t = html.escape(str(text), quote=False)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


_CELL = re.compile(r"^(.*?)\s(\[[^\]]*\])$")


def _html_cell(x, tag: str = "td") -> str:
    t = str(x)
    num = bool(re.match(r"^\**[+\-−]?\d", t))
    m = _CELL.match(t)
    inner = (
        f"{inline_html(m.group(1))}<br><span class=ci>{inline_html(m.group(2))}</span>"
        if m and tag == "td"
        else inline_html(t)
    )
    return f"<{tag}{' class=num' if num and tag == 'td' else ''}>{inner}</{tag}>"


def html_table(head: list, rows: list) -> str:
    """An HTML table in a scrolling div; a cell "value [lo, hi]" shows its interval on a second line, numbers
    get class ``num``."""
    out = ["<div class=tw><table><thead><tr>" + "".join(_html_cell(h, "th") for h in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(_html_cell(x) for x in r) + "</tr>" for r in rows]
    return "\n".join(out) + "</tbody></table></div>"

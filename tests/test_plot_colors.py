"""Plot colours fixed per model: the same label has the same colour in every figure of a run (the best-of-n
plot's included), distinct labels get distinct colours, short training curves are markers, point labels part; the
report prints dicts as text."""

import pytest
from matplotlib.colors import to_hex
from test_report import make_cell

from w2s_shift.report import plots
from w2s_shift.report.plots import FIXED_COLORS, model_colors, source_labels
from w2s_shift.report.tables import Source
from w2s_shift.results import aggregate, build_cell_metrics


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function builds, in order (png_bytes is replaced, so nothing is rendered)."""
    figs = []

    def keep(fig):
        figs.append(fig)
        return b"png"

    monkeypatch.setattr(plots, "png_bytes", keep)
    return figs


@pytest.fixture
def source(tmp_path):
    d, cell = make_cell(tmp_path / "run")
    m = build_cell_metrics(d, cell, bootstrap=50, seed=0)
    return Source("uf", [m], aggregate([m])["uf"])


def _line_colors(fig) -> dict:
    """{legend label: colour} of the lines and point sets of a figure's axes."""
    out = {}
    for ax in fig.axes:
        for ln in ax.get_lines():
            if not ln.get_label().startswith("_"):
                out.setdefault(ln.get_label(), to_hex(ln.get_color()))
        for col in ax.collections:
            if not col.get_label().startswith("_") and len(col.get_facecolors()):
                out.setdefault(col.get_label(), to_hex(col.get_facecolors()[0]))
    return out


def test_a_label_has_one_colour_in_every_figure(source, figures):
    assert plots._plot_training(source) == b"png"
    assert plots._plot_drift(source) == b"png"
    training, drift = (_line_colors(f) for f in figures)
    shared = {"naive", "anchor-1e-4"}
    assert shared <= set(training) and shared <= set(drift)
    for lab in shared:
        assert training[lab] == drift[lab]
    assert training["naive"] == FIXED_COLORS["naive"] and training["teacher"] == FIXED_COLORS["teacher"]
    # the accuracy figure's tick labels are the models' names in the same colours
    plots._plot_accuracy(source)
    ticks = {t.get_text(): to_hex(t.get_color()) for t in figures[-1].axes[0].get_xticklabels()}
    assert ticks["naive"] == training["naive"] and ticks["anchor-1e-4"] == drift["anchor-1e-4"]


def test_the_best_of_n_plot_uses_the_run_colours(source, figures):
    from types import SimpleNamespace

    from w2s_shift.report.bon import _plot

    curve = SimpleNamespace(set="uf", model="anchor-1e-2", seed=0, kl=[0.0, 0.3], gain=[0.0, 0.1], gain_ci=[None])
    src = SimpleNamespace(sets={"uf": SimpleNamespace(gold_sd=1.0)}, curves=[curve])
    _plot(src, "uf", source_labels(source))
    (line,) = figures[-1].axes[0].get_lines()[:1]
    assert to_hex(line.get_color()) == model_colors(source_labels(source))["anchor-1e-2"]


def test_distinct_labels_get_distinct_colours_and_the_mapping_is_stable(source):
    labels = source_labels(source)
    cols = model_colors(labels)
    assert len(set(cols.values())) == len(cols) == len(set(labels))
    assert model_colors(list(reversed(labels))) == cols  # not the order of the labels
    many = [f"method-{i}" for i in 30 * [0] + list(range(20))]
    assert len(set(model_colors(many).values())) == 20


def test_a_short_run_curve_is_drawn_with_markers(source, figures):
    c = source.cells[0]
    c["training"] = {"naive": {"step": [12], "loss": [0.6]}, "teacher": {"step": [10, 20], "loss": [0.7, 0.6]}}
    plots._plot_training(source)
    lines = {ln.get_label(): ln for ln in figures[-1].axes[0].get_lines()}
    one = lines["naive (1 logged step)"]
    assert one.get_marker() == "o" and one.get_markersize() >= 5


def test_point_labels_are_offset_in_turn(figures):
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    plots._annotate([("a", 1.0, 1.0), ("b", 1.0, 1.0), ("c", 1.0, 1.0)], ax)
    offsets = [t.xyann for t in ax.texts]
    assert len(set(offsets)) == 3


def test_the_report_prints_no_raw_python_dicts(tmp_path):
    from w2s_shift.report import write_report

    d, cell = make_cell(tmp_path / "run")
    m = build_cell_metrics(d, cell, bootstrap=50, seed=0)
    write_report(tmp_path / "run", {"cells": [m], "aggregate": aggregate([m]), "wall_seconds": 1.0})
    md = (tmp_path / "run" / "report.md").read_text()
    assert "{'" not in md and "'}" not in md
    assert "- splits (by prompt, no prompt in two): teacher_train 40, student_train 4, test 10" in md
    assert "- source rows skipped as invalid: 1 (empty 1); duplicate prompts removed: 2" in md
    assert "- test pairs: uf 10, hh 10, shp 10" in md

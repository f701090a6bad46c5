"""Truncation shares and SEAM's principle effect in metrics.json and the report, read from hand-made stage markers."""

import json

import pytest
from test_report import METHODS, RIGHT, make_cell

from w2s_shift.data.render import TRUNCATION_RULE
from w2s_shift.io import write_json_atomic
from w2s_shift.methods import method_entry
from w2s_shift.pipeline.grid import method_dict
from w2s_shift.report import write_report
from w2s_shift.results import aggregate, build_cell_metrics, cell_label_effect, cell_truncation

SEAM = {
    "label": "seam",
    "name": "seam",
    "anchor_lambda": 0.0,
    "anchor_layers": "last",
    "layer_spec": "last",
    "finetune": "top_layers",
    "seam_stage": "seam-3-1",
}


def _cc(pairs, truncated, prompt_cut, response_cut):
    """A render.cut_counts dict."""
    return {
        "pairs": pairs,
        "truncated": truncated,
        "prompt_cut": prompt_cut,
        "response_cut": response_cut,
        "response_cut_share": response_cut / pairs,
        "render_version": 3,
    }


TEACHER_CC = {
    "student_train": _cc(4, 4, 3, 1),
    "uf": _cc(10, 6, 5, 3),
    "hh": _cc(10, 2, 2, 0),
    "shp": _cc(10, 5, 4, 1),
    "teacher_train": _cc(40, 30, 20, 10),
}
# the first student marker by name (anchor-1e-4) gives student_train and uf; naive adds hh and shp (its uf is ignored)
STUDENT_CC = {
    "student-anchor-1e-4": {"student_train": _cc(4, 4, 4, 2), "uf": _cc(10, 8, 7, 4)},
    "student-naive": {"uf": _cc(10, 1, 1, 1), "hh": _cc(10, 5, 5, 5), "shp": _cc(10, 0, 0, 0)},
}
EFFECT = {
    "pairs": 4,
    "principle_margin_differs_share": 0.25,
    "label_differs_from_naive_share": 0.75,
    "warning": "SEAM: a principle changed ...",
}


def _seam_cell(root, markers: bool = True):
    right = {**RIGHT, "seam": {"uf": 7, "hh": 5, "shp": 7}}
    d, cell = make_cell(root, right=right)
    cell["methods"] = [*METHODS, SEAM]
    if markers:
        st = d / "stages"
        write_json_atomic(st / "teacher.json", {"digest": "t", "outputs": [], "cut_counts": TEACHER_CC})
        for name, cc in STUDENT_CC.items():
            write_json_atomic(st / f"{name}.json", {"digest": "s", "outputs": [], "cut_counts": cc})
        write_json_atomic(st / "student-zero-shot.json", {"digest": "z", "outputs": []})  # no cut counts
        write_json_atomic(st / "seam-3-1.json", {"digest": "x", "outputs": [], "exit_share": 0.5, "effect": EFFECT})
    return d, cell


def test_truncation_and_seam_effect_in_cell_metrics(tmp_path):
    d, cell = _seam_cell(tmp_path / "run")
    m = build_cell_metrics(d, cell, bootstrap=200, seed=0)  # no cell["stages"]: read from RUN/uf/seed0/stages/
    tr = m["truncation"]
    assert list(tr) == ["teacher", "student"]
    assert list(tr["teacher"]) == ["uf", "hh", "shp", "student_train", "teacher_train"]  # evaluation sets first
    assert tr["teacher"]["uf"] == {"pairs": 10, "truncated": 6, "prompt_cut_share": 0.5, "response_cut_share": 0.3}
    assert tr["teacher"]["teacher_train"]["response_cut_share"] == 0.25
    assert tr["student"]["uf"] == {"pairs": 10, "truncated": 8, "prompt_cut_share": 0.7, "response_cut_share": 0.4}
    assert (
        tr["student"]["hh"]["response_cut_share"] == 0.5 and tr["student"]["student_train"]["prompt_cut_share"] == 1.0
    )
    eff = m["label_effect"]["seam"]
    assert {k: v for k, v in eff.items() if k != "text"} == {
        "stage": "seam-3-1",
        "pairs": 4,
        "principle_margin_differs_share": 0.25,
        "label_differs_from_naive_share": 0.75,
        "warn": True,
    }
    json.dumps(m, allow_nan=False)


def test_markers_from_the_cell_dict_and_info_file_fallback(tmp_path):
    d, cell = _seam_cell(tmp_path / "run", markers=False)
    assert cell_truncation(d, cell, ["uf"]) is None and cell_label_effect(d, cell, cell["methods"]) is None
    # the pipeline passes the markers in cell["stages"]; an effect only in the info file; no "seam_stage" key
    cell["stages"] = {"teacher": {"cut_counts": {"uf": _cc(8, 2, 2, 1)}}, "seam-3-1": {"exit_share": 0.5}}
    write_json_atomic(
        d / "seam_labels__3-1.info.json",
        {"effect": {"pairs": 4, "principle_margin_differs_share": 0.75, "label_differs_from_naive_share": 0.5}},
    )
    methods = [*METHODS, {k: v for k, v in SEAM.items() if k != "seam_stage"}]
    assert cell_truncation(d, cell, ["uf"]) == {
        "teacher": {"uf": {"pairs": 8, "truncated": 2, "prompt_cut_share": 0.25, "response_cut_share": 0.125}}
    }
    eff = cell_label_effect(d, cell, methods)["seam"]
    assert eff["principle_margin_differs_share"] == 0.75 and eff["warn"] is False  # 50% is not below 50%
    cell["stages"]["teacher"]["cut_counts"]["uf"]["pairs"] = "8"
    with pytest.raises(ValueError, match="'pairs' must be a count"):
        cell_truncation(d, cell, ["uf"])


def test_report_shows_response_cut_shares_and_seam_warning(tmp_path):
    run = tmp_path / "run"
    d, cell = _seam_cell(run)
    m = build_cell_metrics(d, cell, bootstrap=200, seed=0)
    write_report(run, {"cells": [m], "aggregate": aggregate([m])})
    md = (run / "report.md").read_text()
    assert "| seed | model | split | pairs | truncated % | prompt cut % | response cut % |" in md
    assert "| 0 | teacher | uf (ID) | 10 | 60.0 | 50.0 | 30.0 |" in md
    assert "| 0 | student | hh | 10 | 50.0 | 50.0 | 50.0 |" in md
    assert "| 0 | teacher | teacher_train (training) | 40 | 75.0 | 50.0 | 25.0 |" in md
    assert (
        "seed 0, seam: a principle margin differs from the plain margin on 25.0% of 4 student-train pairs; "
        "the label differs from Naive's by > 0.01 on 75.0%"
    ) in md
    assert "**warning: below 50%, SEAM's labels are close to Naive's**" in md
    assert TRUNCATION_RULE in md and "oldest" not in md and "prompt cut first" not in md
    # a metrics.json written before methods declared their label cut: "seam_effect", numbers only; the same line
    old = {k: v for k, v in m.items() if k != "label_effect"}
    old["seam_effect"] = {"seam": {k: v for k, v in m["label_effect"]["seam"].items() if k != "text"}}
    write_report(run, {"cells": [old], "aggregate": aggregate([old])})
    assert (run / "report.md").read_text() == md


def test_method_dict_names_the_label_stage():
    m = method_entry(dict(name="seam", seam_nodes=2, seam_exit_margin=0.5))
    assert method_dict(m, "top_layers")["label_stage"] == m.method.label_stage(m) == "seam-2-0.5"
    assert "seam_stage" not in method_dict(method_entry(dict(name="naive")), "top_layers")

"""A per-model metric added from outside the package, in this one file: registered with ``register_metric``, it is
computed into metrics.json, combined over seeds by its own rule, shown in the report and in ``compare``, and
appears in the notebook API's ``load_run(...).model_metrics`` frame and the W&B summary; nothing else changes."""

import json

import numpy as np
import pytest
from conftest import tiny_grid_dict

from w2s_shift.metrics.registry import MODEL_METRICS, register_metric, unregister_metric


def _mean_abs_margin(margins, teacher_margins):
    """Mean |reward margin|: how decided the model is, whatever its accuracy."""
    return float(np.mean(np.abs(margins)))


@pytest.fixture(scope="module")
def run_with_metric(tiny_model_dirs, lm_student_dir, tmp_path_factory):
    """A two-seed tiny grid run with ``mean_abs_margin`` registered (median over seeds); unregistered after."""
    from w2s_shift.config import RunConfig
    from w2s_shift.pipeline import run

    register_metric(
        "mean_abs_margin",
        title="mean |margin|",
        description="mean absolute reward margin (nats)",
        over_seeds="median",
        digits=3,
    )(_mean_abs_margin)
    try:
        out = tmp_path_factory.mktemp("metric") / "r"
        d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, out, ["pandalm"], ["naive", "ceiling"])
        d["seeds"] = [0, 1]
        run(RunConfig.model_validate(d))
        yield out
    finally:
        unregister_metric("mean_abs_margin")


def _margins(cell_dir, model, dataset):
    rows = [json.loads(x) for x in (cell_dir / "rewards" / f"{model}__{dataset}.jsonl").read_text().splitlines()]
    return np.array([r["reward_chosen"] - r["reward_rejected"] for r in rows])


def test_a_metric_registered_outside_the_package_appears_everywhere(run_with_metric):
    from w2s_shift import load_run
    from w2s_shift.report import compare
    from w2s_shift.results.summaries import summary_of

    out = run_with_metric
    assert "mean_abs_margin" in MODEL_METRICS
    metrics = json.loads((out / "metrics.json").read_text())
    cells = sorted(metrics["cells"], key=lambda c: c["seed"])
    per_seed = []
    for c in cells:
        got = c["model_metrics"]["mean_abs_margin"]["naive"]["pandalm"]
        want = float(np.mean(np.abs(_margins(out / c["dir"], "naive", "pandalm"))))
        assert got == pytest.approx(want, rel=1e-12)  # computed from the rewards files
        per_seed.append(got)
    st = metrics["aggregate"]["ultrafeedback"]["model_metrics"]["mean_abs_margin"]["naive"]["pandalm"]
    assert st["value"] == pytest.approx(float(np.median(per_seed))) and st["values"] == per_seed
    report = (out / "report.md").read_text()
    assert "mean \\|margin\\| pandalm" in report or "mean |margin| pandalm" in report
    assert "mean |margin|: mean absolute reward margin (nats), median over seeds" in report
    frame = load_run(out).model_metrics
    row = frame[(frame.metric == "mean_abs_margin") & (frame.model == "naive") & (frame.dataset == "pandalm")]
    assert sorted(row.value) == sorted(per_seed)
    assert summary_of(cells[0], "naive")["mean_abs_margin/pandalm"] == per_seed[0]
    assert "mean |margin| ID" in compare([out])
    # the built-in metrics go the same way: ECE for every model, agreement with the teacher for all but the teacher
    assert cells[0]["model_metrics"]["agreement_with_teacher"]["teacher"]["pandalm"] is None
    assert set(frame.metric) == {"ece", "agreement_with_teacher", "mean_abs_margin"}


def test_a_metric_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        register_metric("ece", title="ECE")(_mean_abs_margin)
    with pytest.raises(ValueError, match="letters, digits and '_'"):
        register_metric("mean/abs", title="x")(_mean_abs_margin)
    with pytest.raises(ValueError, match="over_seeds must be mean or median"):
        register_metric("x_metric", title="x", over_seeds="max")(_mean_abs_margin)
    assert "x_metric" not in MODEL_METRICS

"""A method is one object: a new one is added in one file from outside the package (tests/label_smoothed_method.py)
or through the ``w2s_shift.methods`` entry point group, and runs through the whole pipeline; no code outside
``w2s_shift/methods/`` branches on a method's name, label source or loss name; a bare ``anchor`` acts; the lambda
controller is its own unit."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_grid_dict

PKG = Path(__file__).resolve().parents[1] / "w2s_shift"


@pytest.fixture(autouse=True)
def _registries_restored():
    """Each test here leaves the method and loss registries as it found them: a method registered by one test
    (importing tests/label_smoothed_method.py registers ``smoothed``) must not show in another test's list of
    known methods."""
    from w2s_shift.losses import LOSSES
    from w2s_shift.methods import METHODS

    methods, losses = dict(METHODS), dict(LOSSES)
    yield
    for reg, saved in ((METHODS, methods), (LOSSES, losses)):
        reg.clear()
        reg.update(saved)
    for mod in ("label_smoothed_method", "clipped_labels_method"):  # the next import registers it again
        sys.modules.pop(mod, None)


def test_label_smoothed_loss_hand_computed():
    import label_smoothed_method as ext

    from w2s_shift.losses import soft_bradley_terry

    d, q = torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0])
    # eps 0.5: targets 0.75 and 0.25; BCE(sigmoid(0), 0.75) = log 2; BCE(sigmoid(2), 0.25) = softplus(2) - 0.25 * 2
    want = (torch.log(torch.tensor(2.0)) + torch.nn.functional.softplus(torch.tensor(2.0)) - 0.5) / 2
    assert ext.label_smoothed_bt(d, q, smoothing=0.5).item() == pytest.approx(want.item(), rel=1e-6)
    assert ext.label_smoothed_bt(d, q, smoothing=0.0).item() == pytest.approx(soft_bradley_terry(d, q).item())


def test_a_method_registered_from_outside_runs_in_a_grid_and_is_reported(tiny_model_dirs, tmp_path):
    import label_smoothed_method  # noqa: F401  (registers "smoothed")

    from w2s_shift.config import ConfigError, RunConfig
    from w2s_shift.config_io import load_config
    from w2s_shift.pipeline import run

    methods = ["naive", {"name": "smoothed", "smoothing": 0.3}, "ceiling"]
    cfg = RunConfig.model_validate(
        tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], methods)
    )
    assert cfg.methods[1].smoothing == 0.3 and cfg.methods[1].display == "smoothed"
    run(cfg)
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    entry = next(x for x in m["cells"][0]["methods"] if x["name"] == "smoothed")
    assert entry == {"label": "smoothed", "name": "smoothed", "finetune": "top_layers", "smoothing": 0.3}
    assert m["config"]["methods"][1] == {"name": "smoothed", "label": None, "seeds": None, "smoothing": 0.3}
    assert "smoothed" in m["cells"][0]["metrics"]  # a W2S student: WRG/AOG/NTS computed
    assert "| smoothed | smoothed, ε=0.3, top_layers |" in (tmp_path / "r" / "report.md").read_text()
    rewards = {}
    for lab in ("naive", "smoothed"):
        rows = (tmp_path / "r" / "ultrafeedback" / "seed0" / "rewards" / f"{lab}__ultrafeedback.jsonl").read_text()
        rewards[lab] = [json.loads(r)["reward_chosen"] for r in rows.splitlines()]
    assert rewards["naive"] != rewards["smoothed"]  # its own loss acted
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods:\n  - naive\n  - {name: smoothed, smoothing: 2}\n")
    with pytest.raises(ConfigError, match=r"methods\.1\.smoothing: Input should be less than or equal to 1"):
        load_config(str(bad))
    bad.write_text("methods:\n  - {name: naive, smoothing: 0.1}\n")  # another method's setting is refused
    with pytest.raises(ConfigError, match=r"methods\.0\.smoothing: Extra inputs are not permitted"):
        load_config(str(bad))


def test_a_method_from_an_entry_point(tmp_path, monkeypatch):
    import w2s_shift.methods as methods

    (tmp_path / "shout_method.py").write_text(
        "from w2s_shift.methods import Method\n"
        "METHOD = Method(name='shout', display='shout', description='naive, louder')\n"
    )
    dist = tmp_path / "shout_method-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-method\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[w2s_shift.methods]\nshout = shout_method:METHOD\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(methods, "_entry_points_loaded", False)
    monkeypatch.delitem(methods.METHODS, "shout", raising=False)
    try:
        assert methods.get_method("shout").description == "naive, louder"
        assert methods.method_entry({"name": "shout"}).display == "shout"
    finally:
        methods.METHODS.pop("shout", None)


def test_no_method_name_label_or_loss_string_branches_outside_methods():
    """Behaviour outside w2s_shift/methods/ goes through the method's hooks: no comparison of a string literal that
    is a method name, a label source or a loss name."""
    words = "naive|anchor|confidence|seam|ceiling|zero_shot|gold|soft_bt|bt|label_smoothed_bt"
    cmp = re.compile(rf"""(==|!=|\bin\b|\bnot in\b)\s*[\(\[{{]?\s*["']({words})["']|["']({words})["']\s*(==|!=)""")
    attr = re.compile(r"\.(labels|loss)\s*(==|!=|in\b)")
    hits = []
    for f in sorted(PKG.rglob("*.py")):
        if f.parent.name == "methods":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if cmp.search(line) or attr.search(line):
                hits.append(f"{f.relative_to(PKG)}:{i}: {line.strip()}")
    assert not hits, "\n".join(hits)
    # the check can fail: it finds such a branch
    assert cmp.search('if m.name == "seam":') and attr.search("if m.method.labels == x:")


def test_bare_anchor_acts_and_raw_mse_needs_a_lambda(tiny_model_dirs, tmp_path):
    from w2s_shift.config import ConfigError, RunConfig
    from w2s_shift.config_io import load_config
    from w2s_shift.methods import method_entry
    from w2s_shift.methods.anchor import DEFAULT_LAMBDA
    from w2s_shift.pipeline import run

    assert method_entry("anchor").anchor_lambda == DEFAULT_LAMBDA == 1.0 and method_entry("anchor").anchor_normalize
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], ["naive", "anchor"]
    )
    d["student"].update(learning_rate=3e-3, epochs=2)
    run(RunConfig.model_validate(d))
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    drift = {lab: json.loads((cell / "drift" / f"{lab}.json").read_text()) for lab in ("naive", "anchor")}
    top = str(max(int(k) for k in drift["naive"]["final"]["ultrafeedback"]))
    last = {lab: drift[lab]["final"]["ultrafeedback"][top]["rel_sq_err"] for lab in drift}
    assert last["anchor"] < 0.75 * last["naive"], last  # cuts last-layer drift by more than 25%
    from safetensors.torch import load_file

    w = {lab: load_file(str(cell / "models" / f"{lab}.safetensors")) for lab in ("naive", "anchor")}
    assert any(not torch.equal(w["naive"][k], w["anchor"][k]) for k in w["naive"])
    bad = tmp_path / "raw.yaml"
    bad.write_text("methods:\n  - {name: anchor, anchor_normalize: false}\n")
    with pytest.raises(ConfigError, match=r"methods\.0: Value error, anchor_normalize: false .* paper used 0\.0001"):
        load_config(str(bad))
    bad.write_text("methods:\n  - {name: anchor, anchor_normalize: false, anchor_lambda: 1.0e-4}\n")
    assert load_config(str(bad)).methods[0].anchor_lambda == 1e-4


def test_lambda_controller_update_rule_once_per_step_and_its_state():
    from w2s_shift.losses import adaptive_anchor_lambda
    from w2s_shift.methods.anchor_term import AnchorLambda

    assert AnchorLambda(0.5).value(3, torch.ones(1), torch.ones(1)) == 0.5  # fixed: a float, never moves
    drifts = [0.04, 0.01, 0.02, 0.05, 0.0]  # one per optimizer step, two micro-batches each
    a = AnchorLambda(1.0, auto=True, target=0.02, k=0.1)
    want, seen = 1.0, []
    for step, dr in enumerate(drifts):
        for _ in range(2):  # per micro-batch sums: err = dr * ref, ref = 2
            seen.append(float(a.value(step, torch.tensor([dr * 2.0]), torch.tensor([2.0]))))
        assert seen[-1] == seen[-2] == pytest.approx(want)  # both micro-batches of a step use one lambda
        want = adaptive_anchor_lambda(want, dr, 0.02, 0.1)
    assert seen[2] == pytest.approx(1.02) and seen[4] == pytest.approx(1.02 * 0.98)
    # a checkpoint after step 2 (before step 3) and a fresh controller that loads it continue identically
    b = AnchorLambda(1.0, auto=True, target=0.02, k=0.1)
    for step, dr in enumerate(drifts[:3]):
        for _ in range(2):
            b.value(step, torch.tensor([dr * 2.0]), torch.tensor([2.0]))
    b.end_step(3)
    state = json.loads(json.dumps(b.state_dict()))
    c = AnchorLambda(1.0, auto=True, target=0.02, k=0.1)
    c.load_state_dict(state)
    assert float(c.value(3, torch.tensor([0.1]), torch.tensor([2.0]))) == pytest.approx(seen[6])
    for bad in ({}, {"lambda": float("nan")}, {"lambda": -1.0}, {"lambda": "x"}):
        with pytest.raises(ValueError, match="checkpoint lambda state"):
            AnchorLambda(1.0, auto=True).load_state_dict(bad)


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    yield
    sys.modules.pop("shout_method", None)


def test_an_entry_may_train_on_some_seeds_only(tiny_model_dirs, tmp_path):
    """A lambda sweep on one seed beside a core grid on two: the entry's students exist in seed 0's cell only,
    and the aggregate over seeds holds its one value."""
    from w2s_shift.config import RunConfig
    from w2s_shift.pipeline import describe_grid, run

    methods = ["naive", {"name": "anchor", "anchor_lambda": [0.1, 10.0], "seeds": [0]}]
    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], methods)
    d["seeds"] = [0, 1]
    cfg = RunConfig.model_validate(d)
    assert "2 teacher run(s), 4 student stage(s)" in describe_grid(cfg)
    m = run(cfg)
    labels = {c["seed"]: [x["label"] for x in c["methods"]] for c in m["cells"]}
    assert labels == {0: ["naive", "anchor-lam1e-1", "anchor-lam1e1"], 1: ["naive"]}
    assert not (tmp_path / "r" / "ultrafeedback" / "seed1" / "models" / "anchor-lam1e1.safetensors").exists()
    wrg = m["aggregate"]["ultrafeedback"]["metrics"]["anchor-lam1e1"]["WRG"]
    assert wrg["values"][1] is None and wrg["mean"] == wrg["values"][0]
    d["methods"] = ["naive", {"name": "anchor", "seeds": [2]}]
    with pytest.raises(ValueError, match=r"method anchor: seeds \[2\] are not run seeds"):
        RunConfig.model_validate(d)


def _plugin(name, targets=None, loss=None):
    """A method from outside the package: the naive student with its own targets or pairwise loss."""
    from w2s_shift.methods import Method, MethodConfig, Objective, register_method

    class Plugin(Method):
        config = MethodConfig

        def targets(self, cfg, teacher_q, built_q=None):
            return targets(teacher_q) if targets else list(teacher_q)

        def objective(self, cfg, layers=None, reference=None):
            return Objective(loss) if loss else super().objective(cfg, layers, reference)

    return register_method(Plugin(name=name, display=name, description="a test plugin", loss="soft_bt"))


def _run_plugin(tiny_model_dirs, tmp_path, name, capsys):
    import yaml

    from w2s_shift.cli import main

    d = tiny_grid_dict(tiny_model_dirs["teacher"], tiny_model_dirs["student"], tmp_path / "r", ["pandalm"], [name])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d), encoding="utf-8")
    code = main(["run", str(tmp_path / "c.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "unexpected error" not in err, err
    assert not list((tmp_path / "r").rglob(f"models/{name}.safetensors"))
    return err


def test_a_plugin_whose_loss_raises_is_named(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """The loss of an entry-point method raising: "unexpected error (RuntimeError) ... please report it", with no
    word of which method; now exit 2 naming the method, its module and its loss."""

    def broken_loss(margin, q, *, alpha=0.0, seed=0, reduction="sum"):
        raise RuntimeError("shapes do not broadcast")

    monkeypatch.delenv("W2S_SHIFT_DEBUG", raising=False)
    _plugin("brokenloss", loss=broken_loss)
    err = _run_plugin(tiny_model_dirs, tmp_path, "brokenloss", capsys)
    assert "method brokenloss (test_method_extension): its pairwise loss" in err and "broken_loss" in err, err
    assert "raised RuntimeError: shapes do not broadcast" in err


@pytest.mark.parametrize("bad, shown", [(1.5, "1.5"), (float("nan"), "nan"), (-0.25, "-0.25")])
def test_plugin_soft_labels_outside_0_1_are_refused(tiny_model_dirs, tmp_path, monkeypatch, capsys, bad, shown):
    monkeypatch.delenv("W2S_SHIFT_DEBUG", raising=False)
    _plugin("badlabels", targets=lambda q: [*q[:2], bad, *q[3:]])
    err = _run_plugin(tiny_model_dirs, tmp_path, "badlabels", capsys)
    assert f"method badlabels (test_method_extension): soft label {shown} for student training pair 3" in err, err
    assert "in [0, 1]" in err


def test_a_method_that_builds_its_own_labels_is_one_file(tiny_model_dirs, lm_student_dir, tmp_path, monkeypatch):
    """tests/clipped_labels_method.py declares its label stage, the stage's version, the fields its marker records
    and its line in the report; the grid runs it, its stage is versioned (a rerun reuses it; a new label_version
    makes the stage and its student stale, and only them)."""
    import clipped_labels_method as ext

    from w2s_shift.config import RunConfig
    from w2s_shift.pipeline import run, stale_stages

    methods = ["naive", {"name": "clipped", "clip": 0.49}]
    cfg = RunConfig.model_validate(
        tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp_path / "r", ["pandalm"], methods)
    )
    run(cfg)
    cell = tmp_path / "r" / "ultrafeedback" / "seed0"
    marker = json.loads((cell / "stages" / "clipped-0.49.json").read_text())
    assert marker["versions"]["labels-clipped"] == 1 and marker["pairs"] == 12
    info = json.loads((cell / "labels__clipped-0.49.info.json").read_text())
    rows = [json.loads(x) for x in (cell / "labels__clipped-0.49.jsonl").read_text().splitlines()]
    assert [min(max(r["teacher_q"], 0.49), 0.51) for r in rows] == pytest.approx([r["q"] for r in rows])
    share = sum(r["q"] != r["teacher_q"] for r in rows) / len(rows)
    assert info["clipped_share"] == marker["clipped_share"] == pytest.approx(share) and share > 0
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())["cells"][0]
    assert metrics["label_effect"]["clipped"]["stage"] == "clipped-0.49"
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"seed 0, clipped: {100 * share:.1f}% of 12 teacher labels clipped to [0.49, 0.51]" in report
    assert stale_stages(tmp_path / "r") == []
    monkeypatch.setattr(ext.METHOD, "label_version", 2)
    assert stale_stages(tmp_path / "r") == ["ultrafeedback/seed0/clipped-0.49"]
    from w2s_shift.pipeline.stages import student_digest

    assert json.loads((cell / "stages" / "student-clipped.json").read_text())["digest"] != student_digest(
        _context(cfg, tmp_path / "r"), 0, cfg.expanded_methods()[1]
    )
    assert json.loads((cell / "stages" / "student-naive.json").read_text())["digest"] == student_digest(
        _context(cfg, tmp_path / "r"), 0, cfg.expanded_methods()[0]
    )


def _context(cfg, run_dir):
    from w2s_shift.pipeline import SourceContext

    return SourceContext(cfg, cfg.data.sources[0], run_dir)

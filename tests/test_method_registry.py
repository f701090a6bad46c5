"""The method registry (w2s_shift.methods): what each method declares, and method names checked against it when a
config is loaded."""

import pytest

from w2s_shift.config import ConfigError, RunConfig
from w2s_shift.config_io import load_config
from w2s_shift.losses import LOSSES
from w2s_shift.methods import METHODS, Method, get_method, method_entry
from w2s_shift.plan import METHODS as PLAN_METHODS

KNOWN = "naive, anchor, confidence, seam, ceiling, zero_shot, l2sp, wise_ft, grm"


def test_registry_declares_each_method():
    # (w2s_student, ceiling, builds_labels, trains, loss, needs_reference, needs_lm_head), from protocol.md
    want = {
        "naive": (True, False, False, True, "soft_bt", False, False),
        "anchor": (True, False, False, True, "soft_bt", True, False),
        "confidence": (True, False, False, True, "confidence", False, False),
        "seam": (True, False, True, True, "soft_bt", False, True),
        "ceiling": (False, True, False, True, "soft_bt", False, False),
        "zero_shot": (False, False, False, False, None, False, True),
        "l2sp": (True, False, False, True, "soft_bt", False, False),
        "wise_ft": (True, False, False, True, "soft_bt", False, False),
        "grm": (True, False, False, True, "soft_bt", False, True),
    }
    assert list(METHODS)[: len(want)] == list(want)  # the schema's order
    for name, row in want.items():
        m = METHODS[name]
        got = (m.w2s_student, m.ceiling, m.builds_labels, m.trains, m.loss, m.needs_reference, m.needs_lm_head)
        assert (m.name, got) == (name, row)
        assert m.display == name  # default labels are the file names of a run directory: unchanged
        assert m.loss is None or m.loss in LOSSES
        assert m.description
    # where the targets come from: the teacher's soft labels, gold (1.0), or the method's own label stage
    q = [0.2, 0.9]
    assert METHODS["naive"].targets(method_entry("naive"), q) == q
    assert METHODS["ceiling"].targets(method_entry("ceiling"), q) == [1.0, 1.0]
    assert METHODS["seam"].targets(method_entry("seam"), q, [0.6, 0.4]) == [0.6, 0.4]
    assert METHODS["seam"].label_stage(method_entry({"name": "seam", "seam_nodes": 2})) == "seam-2-1"
    assert METHODS["naive"].label_stage(method_entry("naive")) is None


def test_get_method_names_the_known_ones():
    assert get_method("seam") is METHODS["seam"]
    with pytest.raises(ValueError, match=f"unknown method 'dpo' \\(known methods: {KNOWN}\\)"):
        get_method("dpo")
    with pytest.raises(ValueError, match="unknown method \\['naive'\\]"):
        get_method(["naive"])  # unhashable: still a ValueError, not a TypeError


def test_method_record_rejects_inconsistent_declarations():
    kw = dict(name="x", display="x", description="")
    with pytest.raises(ValueError, match="has a loss"):
        Method(**kw, trains=False)
    with pytest.raises(ValueError, match="not a W2S student"):
        Method(**kw, ceiling=True)
    with pytest.raises(TypeError, match="no attribute 'labels'"):
        Method(**kw, labels="gold")


def test_unknown_method_fails_when_the_yaml_is_loaded(tmp_path):
    f = tmp_path / "typo.yaml"
    f.write_text("methods: [naive, anchr]\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    msg = str(e.value)
    # the file, the field, the bad name and the known names (the old Literal error named neither 'anchr'
    # nor "known methods")
    assert msg.startswith(f"{f}: 1 problem(s)")
    assert f"methods.1.name: Value error, unknown method 'anchr' (known methods: {KNOWN})" in msg
    with pytest.raises(ConfigError, match="methods.0.name: Value error, unknown method 'naiv'"):
        load_config(None, ["methods=[{name: naiv}]"])


def test_a_registered_method_is_accepted_by_the_config(monkeypatch):
    """Adding a method touches one place: the config takes any registered name with its settings model."""
    new = Method(name="plain2", display="plain2", description="test")
    monkeypatch.setitem(METHODS, "plain2", new)
    c = RunConfig.model_validate({"methods": ["naive", "plain2"]})
    assert [m.display for m in c.expanded_methods()] == ["naive", "plain2"]
    assert c.methods[1].method is new


def test_reference_models_at_most_once_and_attributes_drive_config_rules():
    with pytest.raises(ValueError, match="at most one ceiling and one zero_shot method"):
        RunConfig.model_validate({"methods": ["zero_shot", {"name": "zero_shot", "label": "z2"}]})
    # zero_shot does not train (registry), so it cannot be exported
    with pytest.raises(ValueError, match="untrained zero-shot"):
        RunConfig.model_validate({"methods": ["naive", "zero_shot"], "export": ["zero_shot"]})
    # anchor-auto: the ANCHOR display label with lambda auto; another method's setting is refused
    assert method_entry(dict(name="anchor", anchor_lambda="auto")).display == "anchor-auto"
    with pytest.raises(ValueError, match="anchor_lambda\n  Extra inputs are not permitted"):
        method_entry(dict(name="naive", anchor_lambda="auto"))


def test_plan_methods_are_the_registered_trained_ones():
    assert PLAN_METHODS == ("naive", "anchor", "confidence", "seam", "ceiling", "l2sp", "wise_ft", "grm")

"""The method registry (w2s_shift.methods, issue 16 item 3): what each method declares, and method names
checked against it when a config is loaded."""

import dataclasses

import pytest

from w2s_shift.config import ConfigError, MethodConfig, RunConfig
from w2s_shift.config_io import load_config
from w2s_shift.losses import LOSSES
from w2s_shift.methods import METHODS, Method, get_method
from w2s_shift.plan import METHODS as PLAN_METHODS

KNOWN = "naive, anchor, confidence, seam, ceiling, zero_shot"


def test_registry_declares_each_method():
    # (w2s_student, labels, trains, loss, needs_reference, needs_lm_head), from protocol.md's method list
    want = {
        "naive": (True, "teacher", True, "soft_bt", False, False),
        "anchor": (True, "teacher", True, "soft_bt", True, False),
        "confidence": (True, "teacher", True, "confidence", False, False),
        "seam": (True, "seam", True, "soft_bt", False, True),
        "ceiling": (False, "gold", True, "soft_bt", False, False),
        "zero_shot": (False, "none", False, None, False, True),
    }
    assert list(METHODS) == list(want)  # the schema's order
    for name, (w2s, labels, trains, loss, ref, lm) in want.items():
        m = METHODS[name]
        assert (m.name, m.w2s_student, m.labels, m.trains, m.loss, m.needs_reference, m.needs_lm_head) == (
            name,
            w2s,
            labels,
            trains,
            loss,
            ref,
            lm,
        )
        assert m.display == name  # default labels are the file names of a run directory: unchanged
        assert m.loss is None or m.loss in LOSSES
        assert m.description
    with pytest.raises(dataclasses.FrozenInstanceError):
        METHODS["naive"].trains = False


def test_get_method_names_the_known_ones():
    assert get_method("seam") is METHODS["seam"]
    with pytest.raises(ValueError, match=f"unknown method 'dpo' \\(known methods: {KNOWN}\\)"):
        get_method("dpo")
    with pytest.raises(ValueError, match="unknown method \\['naive'\\]"):
        get_method(["naive"])  # unhashable: still a ValueError, not a TypeError


def test_method_record_rejects_inconsistent_declarations():
    kw = dict(name="x", w2s_student=False, labels="gold", trains=True, loss="soft_bt", needs_reference=False)
    with pytest.raises(ValueError, match="labels 'weak'"):
        Method(**{**kw, "labels": "weak"}, display="x", description="")
    with pytest.raises(ValueError, match="has a loss"):
        Method(**{**kw, "trains": False}, display="x", description="")
    with pytest.raises(ValueError, match="W2S student"):
        Method(**{**kw, "w2s_student": True}, display="x", description="")


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
    """Adding a method touches methods/ only: the config takes any registered name (the old Literal did not)."""
    new = Method(
        name="gold_bt",
        w2s_student=False,
        labels="gold",
        trains=True,
        loss="bt",
        needs_reference=False,
        display="gold_bt",
        description="test",
    )
    monkeypatch.setitem(METHODS, "gold_bt", new)
    c = RunConfig.model_validate({"methods": ["naive", "gold_bt"]})
    assert [m.display for m in c.expanded_methods()] == ["naive", "gold_bt"]
    assert c.methods[1].method is new and not c.methods[1].anchor_active


def test_reference_models_at_most_once_and_attributes_drive_config_rules():
    with pytest.raises(ValueError, match="at most one ceiling and one zero_shot method"):
        RunConfig.model_validate({"methods": ["zero_shot", {"name": "zero_shot", "label": "z2"}]})
    # zero_shot does not train (registry), so it cannot be exported
    with pytest.raises(ValueError, match="untrained zero-shot"):
        RunConfig.model_validate({"methods": ["naive", "zero_shot"], "export": ["zero_shot"]})
    # anchor-auto: the ANCHOR display label with lambda auto; other methods ignore anchor_lambda
    assert MethodConfig(name="anchor", anchor_lambda="auto").display == "anchor-auto"
    assert MethodConfig(name="naive", anchor_lambda="auto").display == "naive"


def test_plan_methods_are_the_registered_trained_ones():
    assert PLAN_METHODS == ("naive", "anchor", "confidence", "seam", "ceiling")

"""Hub-only datasets fail cleanly offline; names and paths in configs (RAIL-HH-10K's real schema:
tests/test_paper_datasets.py)."""

import pytest

from w2s_shift.config import RunConfig
from w2s_shift.data.adapters import DATASETS, load_hub, load_named
from w2s_shift.data.schema import DataError


def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.parametrize("name", [n for n, s in DATASETS.items() if not s.files])
def test_hub_only_names_give_a_clear_offline_error(name, monkeypatch):
    _offline(monkeypatch)
    with pytest.raises(DataError) as e:
        load_named(name)
    msg = str(e.value)
    assert DATASETS[name].hub_id in msg
    assert "datasets" in msg or "hub" in msg


def test_hub_id_offline_error_names_split_and_subset(monkeypatch):
    _offline(monkeypatch)
    with pytest.raises(DataError, match=r"hf:org/some-set/sub\[train\]"):
        load_hub("org/some-set", split="train", subset="sub")


def test_config_accepts_names_paths_and_hub_ids(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n', encoding="utf-8")
    cfg = RunConfig.model_validate(
        {"data": {"source": str(f), "ood": ["hh-harmless-base", "hf:org/x", {"name": "pandalm"}]}}
    )
    assert cfg.data.sources[0].path == str(f) and cfg.data.sources[0].display == "mine"
    assert [o.display for o in cfg.data.ood] == ["hh-harmless-base", "x", "pandalm"]
    assert cfg.data.ood[1].hf == "org/x"


@pytest.mark.parametrize("spec", ["runs/q/ultrafeedback/seed0/export/naive", "a/b/c"])
def test_a_missing_nested_model_path_is_named_as_such_not_sent_to_the_hub(spec):
    """A missing path with two or more '/' cannot be a hub id ('org/name'): it was handed to transformers, whose
    "Repo id must be in the form 'repo_name' or 'namespace/repo_name'" was the error a `score` user saw."""
    from w2s_shift.models.loading import ModelError, resolve_source

    with pytest.raises(ModelError, match="no such file or directory \\(nor a hub id, which is 'org/name'\\)"):
        resolve_source(spec, False, False, {})
    assert resolve_source("org/name", False, False, {})[0] == "hub"

"""Models load whole after a ZeRO-3 Trainer was set up in the process. DeepSpeed does not run on this CPU-only
machine (not a dependency; its engine needs CUDA), so ZeRO-3's side effect on loading is reproduced as transformers
sees it: the module-level registration of a DeepSpeed config whose stage is 3 (what the first ZeRO-3
``TrainingArguments`` leaves behind). Without :func:`w2s_shift.models.loading.whole_weights` every later
``from_pretrained`` took the ``deepspeed.zero.Init`` path (partitioned parameters; here: ``import deepspeed`` fails)."""

import pytest
import torch
from transformers.integrations import deepspeed as hf_ds

from w2s_shift.models.loading import load_backbone, whole_weights


class _Zero3Config:
    """Stands for transformers' HfTrainerDeepSpeedConfig of a ZeRO-3 launch (what is_deepspeed_zero3_enabled reads)."""

    config = {"zero_optimization": {"stage": 3}}

    def is_zero3(self) -> bool:
        return True


@pytest.fixture
def zero3_registered():
    cfg = _Zero3Config()
    hf_ds.set_hf_deepspeed_config(cfg)
    yield cfg
    hf_ds.unset_hf_deepspeed_config()


def test_a_backbone_loads_whole_after_zero3_was_set_up(tiny_model_dirs, zero3_registered):
    assert hf_ds.is_deepspeed_zero3_enabled()
    loaded = load_backbone(tiny_model_dirs["student"])
    w = loaded.backbone.embed_tokens.weight
    assert w.shape == (loaded.backbone.config.vocab_size, 32) and not hasattr(w, "ds_id")
    assert torch.isfinite(w).all() and float(w.abs().sum()) > 0
    assert hf_ds.is_deepspeed_zero3_enabled()  # the Trainer still sees its ZeRO-3 config afterwards


def test_whole_weights_restores_the_registration_even_on_error(zero3_registered):
    with pytest.raises(RuntimeError), whole_weights():
        assert not hf_ds.is_deepspeed_zero3_enabled()
        raise RuntimeError("a failed load")
    assert hf_ds.is_deepspeed_zero3_enabled()
    hf_ds.unset_hf_deepspeed_config()
    with whole_weights():  # nothing registered: nothing to lift or restore
        assert not hf_ds.is_deepspeed_zero3_enabled()
    assert not hf_ds.is_deepspeed_zero3_enabled()

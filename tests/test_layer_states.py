"""A reference's forward keeps only the anchored blocks' states (models.reward_model.layer_states): the same tensors
``output_hidden_states`` gives, on a decoder, an encoder, a LoRA-wrapped decoder and the FSDP2 sharding holder, while
the other blocks' outputs are not held (the 8B reference forward held all 33 float32 states, ~16 GiB)."""

import pytest
import torch
from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

from w2s_shift.distributed import ShardedReference
from w2s_shift.models.reward_model import RewardModel, block_list, layer_states, select_layers


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaModel(cfg).eval()


def _bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4)
    return BertModel(cfg).eval()


def _lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).eval()


@pytest.mark.parametrize(
    "make", [_llama, _bert, _lora, lambda: ShardedReference(_llama())], ids=["llama", "bert", "lora", "holder"]
)
def test_hooked_states_equal_output_hidden_states(make):
    model = make()
    ids = torch.randint(0, 100, (3, 7))
    mask = torch.ones_like(ids)
    n = len(block_list(model))
    layers = list(range(1, n + 1))

    def run(hs):
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=hs)

    with torch.no_grad():
        want = select_layers(run(True), layers)
        out, got = layer_states(run, model, layers)
    assert out.hidden_states is None  # nothing but the requested blocks was held
    assert len(got) == n
    for k, (a, b) in enumerate(zip(want, got), start=1):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=f"block {k}")
    with torch.no_grad(), pytest.raises(ValueError, match="layer 9 is not a trainable block"):
        layer_states(run, model, [9])


def test_the_reward_models_output_layers_are_the_same_with_and_without_gradients():
    """With gradients (training) output_hidden_states is used; without (the adapter-disabled reference), hooks."""
    model = RewardModel(_llama(), 32)
    ids = torch.randint(0, 100, (2, 6))
    mask = torch.ones_like(ids)
    r1, h1 = model(attention_mask=mask, input_ids=ids, output_layers=[2, 4])
    with torch.no_grad():
        r2, h2 = model(attention_mask=mask, input_ids=ids, output_layers=[2, 4])
    torch.testing.assert_close(r2, r1.detach(), rtol=0, atol=0)
    for a, b in zip(h1, h2):
        torch.testing.assert_close(b, a.detach(), rtol=0, atol=0)

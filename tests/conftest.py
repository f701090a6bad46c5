"""Shared fixtures: tiny random-init models with a tokenizer trained in code (no downloads)."""

import os

# Tiny models: one thread is fastest, and several threads per process thrash on a 2-core machine (also for the
# processes tests spawn, which inherit these).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import gzip
import json
from pathlib import Path

import pytest

BUNDLED = Path(__file__).resolve().parents[1] / "w2s_shift" / "data" / "bundled"


def _corpus(n: int = 300) -> list:
    texts = []
    with gzip.open(BUNDLED / "ultrafeedback_binarized_subset" / "eval_clean.jsonl.gz", "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            r = json.loads(line)
            texts += [r["prompt"], r["chosen"], r["rejected"]]
    with gzip.open(BUNDLED / "hh_rlhf_helpful_base" / "test.jsonl.gz", "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            texts.append(json.loads(line)["chosen"])
    return texts


def make_tokenizer(vocab_size: int = 400, chat_template: str | None = None):
    """A byte-level BPE fast tokenizer trained on bundled text, with pad = eos (the Llama trap)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|eos|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", bos_token="<|bos|>", pad_token="<|eos|>")
    if chat_template:
        fast.chat_template = chat_template
    return fast


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tokenizer):
    """Folders holding a tiny random-init Llama (student) and BERT (teacher), safetensors + tokenizer."""
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    v = len(tokenizer)
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=v,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    bert = BertModel(
        BertConfig(
            vocab_size=v,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    out = {}
    for name, m in (("student", llama), ("teacher", bert)):
        d = root / name
        m.save_pretrained(d, safe_serialization=True)
        tokenizer.save_pretrained(d)
        out[name] = str(d)
    return out


@pytest.fixture(scope="session")
def lm_student_dir(tmp_path_factory, tokenizer):
    """A tiny Llama saved as a causal LM with an UNTIED head: AutoModel loads the backbone, and zero-shot / SEAM read
    lm_head.weight from the checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    m = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=False,
        )
    )
    d = tmp_path_factory.mktemp("lm") / "student"
    m.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


def cli_error(capsys, argv) -> str:
    """Run the CLI on ``argv`` and return its stderr, asserting exit 2 (bad input) and no traceback."""
    from w2s_shift.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert "Traceback" not in err
    return err


def tiny_grid_dict(teacher: str, student: str, out, ood: list, methods: list, **over) -> dict:
    """A one-cell run config (as a dict) at the tests' tiny sizes: source ultrafeedback (16 teacher-train, 12
    student-train, 10 test pairs), ``ood`` targets of 8 pairs, the given teacher and student folders (max_length 48,
    one epoch, top 2 student layers), ``methods``; top-level keys in ``over`` replace the defaults."""
    return {
        "output_dir": str(out),
        "seeds": [0],
        "data": {
            "sources": ["ultrafeedback"],
            "ood": ood,
            "n_teacher_train": 16,
            "n_student_train": 12,
            "n_test": 10,
            "n_ood": 8,
            "skip_invalid": True,
        },
        "teacher": {"name": teacher, "max_length": 48, "epochs": 1, "batch_size": 8, "bf16": False},
        "student": {
            "name": student,
            "max_length": 48,
            "trainable_layers": 2,
            "epochs": 1,
            "batch_size": 4,
            "bf16": False,
        },
        "methods": methods,
        "bootstrap": 100,
        "drift_pairs": 8,
        **over,
    }


def pair_objective(
    loss: str = "soft_bt",
    anchor_lambda: float = 0.0,
    anchor_lambda_auto: bool = False,
    anchor_normalize: bool = True,
    anchor_target_drift: float = 0.02,
    anchor_k: float = 0.1,
    anchor_layers: list | None = None,
    reference_mode: str = "cached",
    reference=None,
    confidence_alpha_max: float = 0.5,
    confidence_warmup: float = 0.2,
):
    """The :class:`w2s_shift.methods.Objective` a method entry with these settings builds, for tests that drive
    ``train_pairs`` / ``PairTrainer`` directly: the loss by name (with the confidence schedule), and with
    ``anchor_lambda`` > 0 or ``anchor_lambda_auto`` ANCHOR's term on ``anchor_layers`` (None: the final output)
    against ``reference`` (a frozen copy), the dataset's cached states, or the adapter-disabled LoRA model."""
    from functools import partial

    from w2s_shift.losses import LOSSES, confidence_alpha
    from w2s_shift.methods import Objective
    from w2s_shift.methods.anchor_term import AnchorLambda, AnchorTerm

    alpha = partial(confidence_alpha, alpha_max=confidence_alpha_max, warmup_frac=confidence_warmup)
    obj = Objective(LOSSES[loss], alpha=alpha if loss == "confidence" else None)
    if anchor_lambda_auto or anchor_lambda > 0:
        lam = AnchorLambda(anchor_lambda, anchor_lambda_auto, anchor_target_drift, anchor_k)
        obj.regularizer = AnchorTerm(
            lam, anchor_normalize, anchor_layers, reference, adapter_disabled=reference_mode == "adapter_disabled"
        )
    return obj

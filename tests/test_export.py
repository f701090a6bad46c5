"""Export of trained students: trained-state files, rebuilt full backbones, and Hugging Face folders that plain
transformers loads and that give the student's own rewards, including the pad = eos trap."""

import contextlib
import copy
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaModel,
    Qwen2Config,
    Qwen2Model,
)

import w2s_shift
from w2s_shift.batching import pad_sequences
from w2s_shift.data.render import encode_pairs, render
from w2s_shift.data.schema import make_pair
from w2s_shift.models import export as export_mod
from w2s_shift.models.export import EXPORT_PAD_TOKEN, export_reward_model, full_backbone
from w2s_shift.models.reward_model import RewardModel, split_decoder
from w2s_shift.models.state import load_trained_state, save_trained_state, saved_weights_problem

ROOT = Path(w2s_shift.__file__).parent.parent

# every turn closes with <|eos|>, which is also the pad token: each rendered sequence ends with the pad id
EOS_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


def chat_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = EOS_TEMPLATE
    return tok


def tiny_llama(vocab: int, layers: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return LlamaModel(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    ).eval()


def perturb(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """A train-like change of every weight (so that a rebuilt model that ignored the head would differ)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def split_student(base, n_top: int = 2, seed: int = 1):
    """A trained-like split student: (trunk, RewardModel over the perturbed head)."""
    trunk, head = split_decoder(base, n_top)
    torch.manual_seed(seed)
    rm = RewardModel(head, base.config.hidden_size).eval()
    perturb(head, seed)
    with torch.no_grad():
        rm.score.weight.normal_(0, 1.0)
    return trunk, rm


def pairs_for_export():
    """Pairs whose prompts hold the eos/pad token, of different lengths, multi-turn too."""
    rows = [
        ("Tell me a joke<|eos|> please", "Why did the chicken cross the road? To get to the other side.", "No."),
        ("What is the capital of France?", "Paris.", "I think it is probably Lyon, but I am not sure at all."),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "How do I boil an egg?"},
            ],
            "Put it in boiling water for nine minutes.",
            "Eggs are round.",
        ),
        ("Say something kind.", "You are doing great, keep going!", "Whatever."),
    ]
    return [make_pair(p, c, r, "t", path="t", row=i + 1, id=f"p{i}") for i, (p, c, r) in enumerate(rows)]


def our_rewards(trunk, rm, seqs: list, pad_id: int) -> torch.Tensor:
    """The student's rewards (RewardModel: last attention-mask position) on token sequences, float32."""
    ids, am = pad_sequences(seqs, pad_id)
    with torch.no_grad():
        if trunk is None:
            r, _ = rm(attention_mask=am, input_ids=ids)
        else:
            r, _ = rm(attention_mask=am, inputs_embeds=trunk(input_ids=ids, attention_mask=am).last_hidden_state)
    return r


def our_rewards_grad(trunk, rm, seqs, pad_id):
    """As :func:`our_rewards` for a split student, with gradients through the head (for a training step)."""
    ids, am = pad_sequences(seqs, pad_id)
    with torch.no_grad():
        emb = trunk(input_ids=ids, attention_mask=am).last_hidden_state
    r, _ = rm(attention_mask=am, inputs_embeds=emb)
    return r


def hf_rewards(folder, seqs: list) -> torch.Tensor:
    """Rewards from the exported folder by transformers' own class, right-padded with its pad id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    batch = tok.pad({"input_ids": seqs}, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits[:, 0]


def make_exported_student(tokenizer, out_dir, max_length=None):
    """Export a split, perturbed tiny Llama student; returns (folder, trunk, RewardModel). Reused by test_score."""
    base = tiny_llama(len(tokenizer))
    trunk, rm = split_student(base)
    export_reward_model(
        rm,
        tokenizer,
        out_dir,
        base_backbone=base,
        n_top=2,
        metadata={"method": "naive", "teacher": "tiny-bert", "seed": 0},
        max_length=max_length,
    )
    return Path(out_dir), trunk, rm


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_full_backbone_equals_split_trunk_plus_head(kind):
    torch.manual_seed(0)
    if kind == "llama":
        base = tiny_llama(64)
    else:
        base = BertModel(
            BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4)
        ).eval()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    trunk, rm = split_student(base)
    ids = torch.randint(0, 64, (3, 9))
    am = torch.ones(3, 9, dtype=torch.long)
    am[1, 6:] = 0
    with torch.no_grad():
        split_out = rm.backbone(
            inputs_embeds=trunk(input_ids=ids, attention_mask=am).last_hidden_state, attention_mask=am
        ).last_hidden_state
        full = full_backbone(rm, base, n_top=2)
        full_out = full(input_ids=ids, attention_mask=am).last_hidden_state
        base_out = base(input_ids=ids, attention_mask=am).last_hidden_state
    assert torch.allclose(full_out, split_out, atol=1e-5)
    assert (full_out - base_out).abs().max() > 1e-2  # the head's trained weights are in the rebuilt model
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())  # the base is not modified
    with pytest.raises(ValueError, match="base_backbone"):
        full_backbone(rm)
    with pytest.raises(ValueError, match="n_top=3"):
        full_backbone(rm, base, n_top=3)


def test_export_split_llama_loads_in_plain_transformers_and_survives_the_pad_eos_trap(tokenizer, tmp_path):
    tok = chat_tokenizer(tokenizer)
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos
    base = tiny_llama(len(tok))
    trunk, rm = split_student(base)
    out = export_reward_model(
        rm, tok, tmp_path / "rm", base_backbone=base, n_top=2, metadata={"method": "anchor", "lambda": "1e-4"}
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForSequenceClassification"] and cfg["id2label"] == {"0": "reward"}
    assert cfg["pad_token_id"] == len(tok) and cfg["pad_token_id"] != eos and cfg["vocab_size"] == len(tok) + 1
    assert "anchor" in (out / "README.md").read_text()
    assert not list(tmp_path.glob(".rm*"))  # no temporary folder left behind

    pairs = pairs_for_export()
    enc, _ = encode_pairs(pairs, tok, 512)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    assert all(s[-1] == eos for s in seqs)  # the trap: every sequence ends with the pad id
    assert all(eos in s[:-1] for s in seqs)  # and holds it inside too
    assert len({len(s) for s in seqs}) > 1  # right padding happens in the batch
    texts = [render(p.prompt, p.chosen, tok)[1] for p in pairs] + [render(p.prompt, p.rejected, tok)[1] for p in pairs]
    (tmp_path / "texts.json").write_text(json.dumps(texts))

    # scoring path with transformers and torch only, in a clean interpreter
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        f"d = {str(out)!r}\n"
        "tok = AutoTokenizer.from_pretrained(d); tok.padding_side = 'right'\n"
        "model = AutoModelForSequenceClassification.from_pretrained(d).eval()\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "batch = tok(texts, padding=True, return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    r = model(**batch).logits[:, 0]\n"
        "ids = [[int(t) for t, m in zip(row, mask) if m] "
        "for row, mask in zip(batch['input_ids'], batch['attention_mask'])]\n"
        "assert not any(k.startswith('w2s_shift') for k in sys.modules)\n"
        "print(json.dumps({'rewards': r.tolist(), 'ids': ids}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["ids"] == seqs  # the exported tokenizer renders exactly as training did
    ours = our_rewards(trunk, rm, seqs, tok.pad_token_id)
    theirs = torch.tensor(res["rewards"])
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs, ours)

    # the same export with pad = eos (what a naive export writes) reads other positions: the test can fail
    naive = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    naive.config.pad_token_id = eos
    ids, am = pad_sequences(seqs, eos)
    with torch.no_grad():
        wrong = naive(input_ids=ids, attention_mask=am).logits[:, 0]
    assert (wrong - ours).abs().max() > 1e-3


def test_lora_student_state_roundtrip_and_merged_export(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    tok = chat_tokenizer(tokenizer)
    base = tiny_llama(len(tok))
    trunk, head = split_decoder(base, 2)

    def student(seed):
        torch.manual_seed(seed)
        rm = RewardModel(
            get_peft_model(copy.deepcopy(head), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])), 32
        )
        return rm

    rm = student(1)
    enc, _ = encode_pairs(pairs_for_export(), tok, 512)
    b = len(enc)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    # one optimizer step of the Bradley-Terry loss (Ouyang et al. 2022, eq. 1) on the pairs
    opt = torch.optim.AdamW([p for p in rm.parameters() if p.requires_grad], lr=0.05)
    rm.train()
    r = our_rewards_grad(trunk, rm, seqs, tok.pad_token_id)
    (-torch.nn.functional.logsigmoid(r[:b] - r[b:]).mean()).backward()
    opt.step()
    rm.eval()
    trained = our_rewards(trunk, rm, seqs, tok.pad_token_id)

    f = save_trained_state(rm, tmp_path / "state.safetensors", {"method": "naive"})
    from safetensors import safe_open

    with safe_open(str(f), "pt") as sf:
        names = set(sf.keys())
    assert "score.weight" in names and all(n == "score.weight" or ".lora_" in n for n in names)
    assert len(names) == 1 + 2 * 2 * 2  # score + (A, B) x (q_proj, v_proj) x 2 head layers

    fresh = student(7)  # another head init: loading must overwrite it
    assert not torch.allclose(our_rewards(trunk, fresh.eval(), seqs, tok.pad_token_id), trained, atol=1e-4)
    assert load_trained_state(fresh, f)["method"] == "naive"
    assert torch.equal(our_rewards(trunk, fresh, seqs, tok.pad_token_id), trained)

    # a model built differently (no LoRA) is refused with the names that do not fit
    plain = RewardModel(copy.deepcopy(head), 32)
    with pytest.raises(ValueError, match="does not fit this model.*lora_A"):
        load_trained_state(plain, f)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_trained_state(fresh, tmp_path / "junk.safetensors")
    # the training digest in the header: checked when asked for; a file without one (older) is accepted
    g = save_trained_state(rm, tmp_path / "digested.safetensors", {"digest": "abc123"})
    assert load_trained_state(fresh, g, digest="abc123")["digest"] == "abc123"
    with pytest.raises(ValueError, match=r"digested.safetensors: these weights were saved by training digest abc123, "):
        load_trained_state(fresh, g, digest="other")
    assert saved_weights_problem(g, "other").endswith(
        "not other (the file was swapped with or copied from another model's)"
    )
    assert load_trained_state(fresh, f, digest="other")["method"] == "naive" and saved_weights_problem(f, "x") is None
    assert "not a readable safetensors" in saved_weights_problem(tmp_path / "junk.safetensors", "x")

    # merged export equals the LoRA student; the student itself stays a peft model
    out = export_reward_model(rm, tok, tmp_path / "lora_rm", base_backbone=base)
    assert torch.allclose(hf_rewards(out, seqs), trained, atol=1e-5)
    assert hasattr(rm.backbone, "peft_config")
    merged = full_backbone(rm, base)
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_export_qwen2_full_student_plain_transcript_ending_in_eos(tokenizer, tmp_path):
    torch.manual_seed(0)
    bb = Qwen2Model(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    ).eval()
    rm = RewardModel(bb, 32).eval()
    with torch.no_grad():
        rm.score.weight.normal_(0, 1.0)
    pairs = [
        make_pair(p, c + "<|eos|>", r + "<|eos|>", "t", path="t", row=1)
        for p, c, r in [
            ("Hi<|eos|> there", "Hello, how can I help you today?", "Go away."),
            ("2+2?", "4", "It is five, I believe, after careful thought."),
        ]
    ]
    enc, _ = encode_pairs(pairs, tokenizer, 512)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    assert all(s[-1] == tokenizer.eos_token_id for s in seqs)
    out = export_reward_model(rm, tokenizer, tmp_path / "qwen", dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForSequenceClassification"]
    assert json.loads((out / "w2s_shift_export.json").read_text())["rendering"] == "plain_transcript"
    ours = our_rewards(None, rm, seqs, tokenizer.pad_token_id)
    assert torch.allclose(hf_rewards(out, seqs), ours, atol=1e-5)


def test_mean_pooling_and_encoders_are_refused(tokenizer, tmp_path):
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
    )
    with pytest.raises(ValueError, match="only 'last' pooling.*'mean'"):
        export_reward_model(RewardModel(bert, 32, pooling="mean"), tokenizer, tmp_path / "m")
    with pytest.raises(ValueError, match="BertForSequenceClassification is not a bias-free `score` head"):
        export_reward_model(RewardModel(bert, 32), tokenizer, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_export_writes_atomically(tokenizer, tmp_path, monkeypatch):
    rm = RewardModel(tiny_llama(len(tokenizer), layers=1), 32).eval()
    out = export_reward_model(rm, tokenizer, tmp_path / "rm")
    first = (out / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError):
        export_reward_model(rm, tokenizer, out, overwrite=False)

    def broken(*a, **k):
        raise ValueError("export check: simulated mismatch")

    monkeypatch.setattr(export_mod, "_verify", broken)
    with torch.no_grad():
        rm.score.weight.mul_(2.0)
    with pytest.raises(ValueError, match="simulated"):
        export_reward_model(rm, tokenizer, out)
    assert (out / "model.safetensors").read_bytes() == first  # the old export is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"]  # no temporary folder left
    with pytest.raises(ValueError, match="simulated"):
        export_reward_model(rm, tokenizer, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_exported_pad_token_is_new_and_tokenization_unchanged(tokenizer, tmp_path):
    out, _, _ = make_exported_student(tokenizer, tmp_path / "rm")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.pad_token == EXPORT_PAD_TOKEN and tok.pad_token_id == len(tokenizer)
    text = "Human: Tell me<|eos|> a joke.\n\nAssistant: Knock knock.<|eos|>"
    assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    info = json.loads((out / "w2s_shift_export.json").read_text())
    assert info["original_pad_token_id"] == tokenizer.eos_token_id and info["embedding_rows_added"] == 1
    assert info["metadata"]["teacher"] == "tiny-bert"


# Llama-3 / Gemma style: the template writes BOS, and the tokenizer's post-processor adds one too
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def bos_trap_tokenizer(tokenizer):
    from tokenizers import processors

    tok = copy.deepcopy(tokenizer)
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", bos)]
    )
    tok.chat_template = BOS_TEMPLATE
    return tok


def test_export_and_score_render_one_bos_and_record_the_training_length(tokenizer, tmp_path, capsys):
    from w2s_shift.cli import main

    tok = bos_trap_tokenizer(tokenizer)
    bos = tok.bos_token_id
    assert tok("hi")["input_ids"][0] == bos  # the trap is armed
    pairs = pairs_for_export()
    enc, _ = encode_pairs(pairs, tok, 40)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    assert all(s[0] == bos and s.count(bos) == 1 for s in seqs)  # one BOS, the template's
    # what transformers' own apply_chat_template(tokenize=True) gives, for a pair that fits
    full, _ = encode_pairs(pairs[1:2], tok, 512)
    msgs = [{"role": "user", "content": pairs[1].prompt}, {"role": "assistant", "content": pairs[1].chosen}]
    assert full[0].chosen.input_ids == tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    base = tiny_llama(len(tok))
    trunk, rm = split_student(base)
    out = export_reward_model(rm, tok, tmp_path / "rm", base_backbone=base, n_top=2, max_length=40)
    info = json.loads((out / "w2s_shift_export.json").read_text())
    assert (info["max_length"], info["render_version"], info["rendering"]) == (40, 3, "chat_template")
    card = (out / "README.md").read_text()
    assert "add_special_tokens=False" in card and "Trained at 40 tokens per sequence" in card
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n" for p in pairs)
    )
    rows_out = tmp_path / "r.jsonl"
    assert main(["score", str(out), str(data), "--out", str(rows_out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["max_length"] == 40 and summary["max_length_source"] == "export"
    rows = [json.loads(x) for x in rows_out.read_text().splitlines()]
    ours = our_rewards(trunk, rm, seqs, tok.pad_token_id)
    assert torch.allclose(
        torch.tensor([r["reward_chosen"] for r in rows] + [r["reward_rejected"] for r in rows]), ours, atol=1e-5
    )
    # docs/using-models.md's snippet, run as written on this export (only its path and pair replaced), gives the
    # reward of the sequence the run trains on: one BOS, the template's (the tokenizer's own BOS added would
    # give another reward)
    snippet = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "using-models.md").read_text(), re.S).group(1)
    pair = '"How do I boil an egg?", "Simmer it for nine minutes, then cool it in cold water."'
    assert '"runs/quickstart/hh-helpful-base/seed0/export/anchor"' in snippet and pair in snippet
    snippet = snippet.replace('"runs/quickstart/hh-helpful-base/seed0/export/anchor"', repr(str(out)))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace(pair, f"{pairs[1].prompt!r}, {pairs[1].chosen!r}"), {})
    want = hf_rewards(out, [full[0].chosen.input_ids])[0].item()
    assert float(printed.getvalue()) == pytest.approx(want, abs=2e-4)
    assert abs(hf_rewards(out, [[bos, *full[0].chosen.input_ids]])[0].item() - want) > 1e-3


def test_an_export_of_a_gguf_sourced_student_is_a_plain_folder(tokenizer, tmp_path, capfd):
    """A student whose backbone came from a GGUF file (its config keeps quant_method gguf and the file name): the
    export's config.json is the one a student of the same model without that config gives, holds no quantization
    config and records its dtype; transformers loads it with no quantization config and no word of quantization;
    files and folder get the modes of the user's umask (not 0600 / 0700)."""
    import stat

    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    plain = tiny_llama(len(tokenizer), layers=2)
    gguf = tiny_llama(len(tokenizer), layers=2)
    gguf.config.quantization_config = {"quant_method": "gguf", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    old = os.umask(0o002)
    try:
        outs = [
            export_reward_model(RewardModel(m, 32).eval(), tokenizer, tmp_path / name, max_length=40)
            for name, m in (("plain", plain), ("gguf", gguf))
        ]
    finally:
        os.umask(old)
    fresh, got = (json.loads((o / "config.json").read_text()) for o in outs)
    assert got == fresh and "quantization_config" not in got
    assert (got["dtype"], got["torch_dtype"]) == ("float32", "float32")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in outs[1].iterdir()}
    assert modes["model.safetensors"] == 0o664 and set(modes.values()) == {0o664}, modes
    assert stat.S_IMODE(outs[1].stat().st_mode) == 0o775
    capfd.readouterr()
    was = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()
    try:
        loaded = AutoModelForSequenceClassification.from_pretrained(str(outs[1]))
    finally:
        hf_logging.set_verbosity(was)
    err = capfd.readouterr().err
    assert getattr(loaded.config, "quantization_config", None) is None and loaded.dtype == torch.float32
    assert "quantiz" not in err.lower() and "gguf" not in err.lower(), err


def test_a_full_disk_inside_safetensors_is_an_oserror_naming_the_file(tokenizer, tmp_path, monkeypatch):
    """safetensors reports a full disk as SafetensorError with the OS code in its message: the export turns it into
    ENOSPC naming the file and the free space (exit 2 in the CLI), and leaves no folder behind."""
    import errno

    from safetensors import SafetensorError
    from transformers import LlamaForSequenceClassification

    def full(self, *a, **k):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(LlamaForSequenceClassification, "save_pretrained", full)
    rm = RewardModel(tiny_llama(len(tokenizer), layers=1), 32).eval()
    with pytest.raises(OSError) as e:
        export_reward_model(rm, tokenizer, tmp_path / "rm")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "rm" / "model.safetensors")
    assert "No space left on device (" in e.value.strerror and "MiB free on its disk)" in e.value.strerror
    assert list(tmp_path.iterdir()) == []

"""The malformed-input corpus (tests/malformed/manifest.yaml): every case exits 2 with its documented message.

Each case runs ``w2s_shift.cli.main(argv)`` in-process. Data and config cases are static files in
tests/malformed/; broken models are built here from the tiny random-init fixtures by the recipes in
:data:`_RECIPES` (copy a folder, then corrupt one thing). Run cases must stop before any training.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from w2s_shift.cli import main

CASE_DIR = Path(__file__).resolve().parent / "malformed"
CASES = yaml.safe_load((CASE_DIR / "manifest.yaml").read_text(encoding="utf-8"))["cases"]

# `{tiny_run}`: a fast run on the tiny fixtures (60 source pairs, 6 OOD pairs, one student); later --set win
TINY_RUN = [
    "--output-dir",
    "{tmp}/run",
    "--set",
    "teacher.name={model_dirs.teacher}",
    "--set",
    "student.name={model_dirs.student}",
    "--set",
    "teacher.bf16=false",
    "--set",
    "student.bf16=false",
    "--set",
    "teacher.max_length=64",
    "--set",
    "student.max_length=64",
    "--set",
    "teacher.trainable_layers=1",
    "--set",
    "student.trainable_layers=2",
    "--set",
    "teacher.batch_size=4",
    "--set",
    "student.batch_size=4",
    "--set",
    "teacher.epochs=1",
    "--set",
    "student.epochs=1",
    "--set",
    "data.source={case_dir}/data/good_source.jsonl",
    "--set",
    "data.ood=[{case_dir}/data/good_ood.jsonl]",
    "--set",
    "data.skip_invalid=false",
    "--set",
    "methods=[naive]",
    "--set",
    "bootstrap=100",
]


# ---------------------------------------------------------------------------------------------------------
# Recipes: (tiny model folder, case tmp folder) -> the broken model's path


def _copy(base: Path, tmp: Path) -> Path:
    d = tmp / "bad_model"
    shutil.copytree(base, d)
    return d


def _edit_config(d: Path, **changes) -> None:
    c = json.loads((d / "config.json").read_text())
    c.update(changes)
    (d / "config.json").write_text(json.dumps(c))


def _edit_weights(d: Path, fn) -> None:
    sd = load_file(str(d / "model.safetensors"))
    save_file(fn(dict(sd)), str(d / "model.safetensors"), metadata={"format": "pt"})


def _drop_config(base, tmp):
    d = _copy(base, tmp)
    (d / "config.json").unlink()
    return d


def _config_not_json(base, tmp):
    d = _copy(base, tmp)
    (d / "config.json").write_text("model_type: bert\nhidden_size: 32\n")
    return d


def _config_is_list(base, tmp):
    d = _copy(base, tmp)
    (d / "config.json").write_text("[1, 2]\n")
    return d


def _unknown_model_type(base, tmp):
    d = _copy(base, tmp)
    _edit_config(d, model_type="frobnicator")
    return d


def _truncate_weights(base, tmp):
    d = _copy(base, tmp)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return d


def _drop_last_layer_weights(base, tmp):
    d = _copy(base, tmp)
    _edit_weights(d, lambda sd: {k: v for k, v in sd.items() if not k.startswith("encoder.layer.1.")})
    return d


def _index_not_json(base, tmp):
    """Sharded weights whose model.safetensors.index.json is broken."""
    d = _copy(base, tmp)
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {')
    return d


def _bigger_config(base, tmp):
    d = _copy(base, tmp)
    _edit_config(d, hidden_size=64)
    return d


def _drop_weights(base, tmp):
    d = _copy(base, tmp)
    (d / "model.safetensors").unlink()
    return d


def _pickle_only(base, tmp):
    d = _copy(base, tmp)
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    return d


def _drop_tokenizer(base, tmp):
    d = _copy(base, tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (d / f).unlink(missing_ok=True)
    return d


def _tokenizer_json_garbage(base, tmp):
    d = _copy(base, tmp)
    (d / "tokenizer.json").write_text("{not json")
    return d


def _small_embedding(base, tmp):
    """The wrong tokenizer: 400 tokens, but the model's embedding table keeps only 100 rows."""
    d = _copy(base, tmp)
    key = "embeddings.word_embeddings.weight"

    def cut(sd):
        sd[key] = sd[key][:100].clone()
        return sd

    _edit_weights(d, cut)
    _edit_config(d, vocab_size=100, pad_token_id=0)
    return d


def _nan_weights(base, tmp):
    d = _copy(base, tmp)
    key = "encoder.layer.0.attention.self.query.weight"

    def poison(sd):
        sd[key] = sd[key].clone()
        sd[key][0, 0] = float("nan")
        return sd

    _edit_weights(d, poison)
    return d


def _remote_code(base, tmp):
    """A model type known only from the folder's own evil.py, which writes {tmp}/REMOTE_CODE_RAN when imported."""
    d = _copy(base, tmp)
    (d / "evil.py").write_text(
        f"open({str(tmp / 'REMOTE_CODE_RAN')!r}, 'w').write('remote code ran')\n"
        "from transformers import BertConfig, BertModel\n\n\n"
        "class EvilConfig(BertConfig):\n    model_type = 'evil_bert'\n\n\n"
        "class EvilModel(BertModel):\n    config_class = EvilConfig\n"
    )
    _edit_config(d, model_type="evil_bert", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    return d


def _garbage_gguf(base, tmp):
    f = tmp / "garbage.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    return f


def _empty_folder(base, tmp):
    d = tmp / "empty_model"
    d.mkdir()
    return d


def _weights_file_only(base, tmp):
    return _copy(base, tmp) / "model.safetensors"


def _reward_model(base, tmp, safe: bool = True, nan_head: bool = False, overflow_head: bool = False):
    """The tiny backbone as a sequence-classification reward model (1 label, a seeded score head), as
    ``w2s-shift score`` takes it; ``nan_head``: one NaN in score.weight; ``overflow_head``: score.weight all 3e38
    (finite, but every reward overflows); ``safe=False``: pytorch_model.bin only."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    m = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1)
    if nan_head:
        with torch.no_grad():
            m.score.weight[0, 0] = float("nan")
    if overflow_head:
        with torch.no_grad():
            m.score.weight.fill_(3e38)
    d = tmp / "bad_model"
    m.save_pretrained(d)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(d)
    if not safe:  # transformers 5 saves safetensors only: convert, as a pickle-era checkpoint would be
        torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
        (d / "model.safetensors").unlink()
    return d


def _reward_model_nan_head(base, tmp):
    return _reward_model(base, tmp, nan_head=True)


def _reward_model_overflow_head(base, tmp):
    return _reward_model(base, tmp, overflow_head=True)


def _reward_model_pickle(base, tmp):
    return _reward_model(base, tmp, safe=False)


def _reward_model_fewer_layers(base, tmp):
    """A reward model whose config.json was edited to one layer fewer than its weights hold."""
    d = _reward_model(base, tmp)
    _edit_config(d, num_hidden_layers=json.loads((d / "config.json").read_text())["num_hidden_layers"] - 1)
    return d


def _reward_model_wider_config(base, tmp):
    """A reward model whose config.json says hidden_size 64 over 32-wide weights (transformers: a load report and
    "You set `ignore_mismatched_sizes` to `False`")."""
    d = _reward_model(base, tmp)
    _edit_config(d, hidden_size=64)
    return d


def _reward_model_pad_past_vocab(base, tmp):
    d = _reward_model(base, tmp)
    _edit_config(d, vocab_size=4, pad_token_id=7)
    return d


def _reward_model_no_tokenizer_json(base, tmp):
    d = _reward_model(base, tmp)
    (d / "tokenizer.json").unlink()
    return d


def _export_info(text: str):
    """A reward model with a hand-edited w2s_shift_export.json holding ``text``."""

    def make(base, tmp):
        d = _reward_model(base, tmp)
        (d / "w2s_shift_export.json").write_text(text)
        return d

    return make


def _raising_chat_template(base, tmp):
    from transformers import AutoTokenizer

    d = _copy(base, tmp)
    tok = AutoTokenizer.from_pretrained(str(d))
    tok.chat_template = "{{ raise_exception('this template renders no conversation') }}"
    tok.save_pretrained(str(d))
    return d


_RECIPES = {
    "raising_chat_template": _raising_chat_template,
    "drop_config": _drop_config,
    "config_not_json": _config_not_json,
    "config_is_list": _config_is_list,
    "unknown_model_type": _unknown_model_type,
    "truncate_weights": _truncate_weights,
    "drop_last_layer_weights": _drop_last_layer_weights,
    "bigger_config": _bigger_config,
    "index_not_json": _index_not_json,
    "drop_weights": _drop_weights,
    "pickle_only": _pickle_only,
    "drop_tokenizer": _drop_tokenizer,
    "tokenizer_json_garbage": _tokenizer_json_garbage,
    "small_embedding": _small_embedding,
    "nan_weights": _nan_weights,
    "remote_code": _remote_code,
    "garbage_gguf": _garbage_gguf,
    "empty_folder": _empty_folder,
    "weights_file_only": _weights_file_only,
    "reward_model_nan_head": _reward_model_nan_head,
    "reward_model_pickle": _reward_model_pickle,
    "reward_model_overflow_head": _reward_model_overflow_head,
    "reward_model_fewer_layers": _reward_model_fewer_layers,
    "reward_model_wider_config": _reward_model_wider_config,
    "reward_model_pad_past_vocab": _reward_model_pad_past_vocab,
    "reward_model_no_tokenizer_json": _reward_model_no_tokenizer_json,
    "export_info_not_json": _export_info('{"max_length": 48,'),
    "export_info_negative_length": _export_info('{"max_length": -5}'),
    "export_info_string_length": _export_info('{"max_length": "48"}'),
    "export_info_huge_length": _export_info('{"max_length": 1e12}'),
    "export_info_list": _export_info("[48]"),
}


# ---------------------------------------------------------------------------------------------------------


def _fill(text: str, subs: dict) -> str:
    for k, v in subs.items():
        text = text.replace("{" + k + "}", v)
    assert not re.search(r"\{(case_dir|tmp|model_dirs\.\w+|bad_model|tiny_run)\}", text), (
        f"unfilled placeholder in {text!r}"
    )
    return text


def _argv(case: dict, subs: dict) -> list:
    out = []
    for a in case["argv"]:
        out += TINY_RUN if a == "{tiny_run}" else [a]
    return [_fill(a, subs) for a in out]


def _params():
    out = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=c["xfail"])] if c.get("xfail") else []
        out.append(pytest.param(c, id=c["id"], marks=marks))
    return out


def test_manifest_is_complete_and_every_file_is_used():
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    for c in CASES:
        assert {"id", "what", "argv", "exit", "message"} <= set(c), c["id"]
        assert c["exit"] == 2 and c["message"], c["id"]
        if c.get("model"):
            assert c["model"]["recipe"] in _RECIPES and c["model"]["base"] in ("student", "teacher"), c["id"]
    text = (CASE_DIR / "manifest.yaml").read_text(encoding="utf-8")
    for f in (
        sorted((CASE_DIR / "data").iterdir())
        + sorted((CASE_DIR / "configs").iterdir())
        + sorted((CASE_DIR / "reports").iterdir())
    ):
        assert f.name in text, f"{f} is not used by any case"


@pytest.mark.parametrize("case", _params())
def test_malformed_input_gives_its_documented_error(case, tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # anything a case makes happen lands here, where `absent` looks
    monkeypatch.delenv("W2S_SHIFT_DEBUG", raising=False)
    subs = {
        "case_dir": str(CASE_DIR),
        "tmp": str(tmp_path),
        "model_dirs.student": tiny_model_dirs["student"],
        "model_dirs.teacher": tiny_model_dirs["teacher"],
    }
    if case.get("model"):
        m = case["model"]
        subs["bad_model"] = str(_RECIPES[m["recipe"]](Path(tiny_model_dirs[m["base"]]), tmp_path))
    argv = _argv(case, subs)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors exit by themselves
        code = e.code
    out = capsys.readouterr()
    err = out.err
    assert code == case["exit"], (code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out.out
    assert "unexpected error" not in err
    assert "w2s-shift: error: " in err
    for want in case["message"]:
        assert _fill(want, subs) in err, (want, err[-2000:])
    for p in case.get("absent", []):
        assert not Path(_fill(p, subs)).exists(), p
    run_dir = tmp_path / "run"
    if run_dir.exists():  # a run case stops before any training: no labels, rewards or checkpoints
        made = [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")]
        assert not [p for p in made if {"rewards", "checkpoints"} & set(p.split("/")) or "teacher_labels" in p], made


def test_the_tiny_run_itself_succeeds(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    """Control: with nothing broken, {tiny_run} trains and finishes, so each run case above fails only
    because of its one malformation."""
    monkeypatch.chdir(tmp_path)
    subs = {
        "case_dir": str(CASE_DIR),
        "tmp": str(tmp_path),
        "model_dirs.student": tiny_model_dirs["student"],
        "model_dirs.teacher": tiny_model_dirs["teacher"],
    }
    code = main(["run"] + [_fill(a, subs) for a in TINY_RUN])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert list((tmp_path / "run").rglob("metrics.json"))


# ---------------------------------------------------------------------------------------------------------
# NaN at run time: finite weights that overflow to inf/NaN in the forward pass (a checkpoint with NaN in its
# weights is refused at load, case model-nan-weights). The run must stop with a clear error; no metrics file.


def _overflow_teacher(base: Path, tmp: Path, token_ids=None) -> Path:
    """The tiny BERT with word-embedding rows set to 3e38 (finite): the embedding LayerNorm's sum overflows
    to inf and every state after it is NaN. ``token_ids``: only those rows (None: all)."""
    d = tmp / "overflow_teacher"
    shutil.copytree(base, d)
    key = "embeddings.word_embeddings.weight"

    def blow(sd):
        w = sd[key].clone()
        w[slice(None) if token_ids is None else list(token_ids)] = 3e38
        sd[key] = w
        return sd

    _edit_weights(d, blow)
    return d


def _run_nan(tiny_model_dirs, tmp_path, teacher: Path, capsys) -> tuple:
    subs = {
        "case_dir": str(CASE_DIR),
        "tmp": str(tmp_path),
        "model_dirs.student": tiny_model_dirs["student"],
        "model_dirs.teacher": tiny_model_dirs["teacher"],
    }
    code = main(["run"] + [_fill(a, subs) for a in TINY_RUN] + ["--set", f"teacher.name={teacher}"])
    out = capsys.readouterr()
    return code, out.err


def test_nan_loss_stops_the_run_at_the_first_step(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    teacher = _overflow_teacher(Path(tiny_model_dirs["teacher"]), tmp_path)
    code, err = _run_nan(tiny_model_dirs, tmp_path, teacher, capsys)
    assert code == 2, err[-3000:]
    assert "Traceback" not in err and "training diverged: loss is nan" in err and "step 1" in err
    assert not list((tmp_path / "run").rglob("metrics.json")) and not list((tmp_path / "run").rglob("rewards"))


def test_nan_loss_error_names_the_model_and_the_batch(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    teacher = _overflow_teacher(Path(tiny_model_dirs["teacher"]), tmp_path)
    code, err = _run_nan(tiny_model_dirs, tmp_path, teacher, capsys)
    assert code == 2
    assert "teacher" in err and "batch" in err


def test_nan_rewards_on_an_ood_set_stop_the_run_before_any_metric(
    tokenizer, tiny_model_dirs, tmp_path, monkeypatch, capsys
):
    """Rows of tokens that occur only in the OOD file overflow: training on the source is finite, the OOD
    rewards are NaN, and the run stops naming the model and the dataset; metrics.json is never written."""
    from w2s_shift.data.render import encode
    from w2s_shift.data.resolve import load_file

    monkeypatch.chdir(tmp_path)

    def ids(f: str, max_length: int) -> set:
        out = set()
        for p in load_file(CASE_DIR / "data" / f).pairs:
            for r in (p.chosen, p.rejected):
                out |= set(encode(p.prompt, r, tokenizer, max_length).input_ids)
        return out

    only_ood = ids("good_ood.jsonl", 64) - ids("good_source.jsonl", 10**6)
    assert only_ood  # e.g. the pieces of "violins", "zebras"
    teacher = _overflow_teacher(Path(tiny_model_dirs["teacher"]), tmp_path, token_ids=sorted(only_ood))
    code, err = _run_nan(tiny_model_dirs, tmp_path, teacher, capsys)
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    line = [x for x in err.splitlines() if x.startswith("w2s-shift: error: ")][0]
    assert "teacher" in line and "good_ood" in line and "non-finite rewards" in line, line
    assert not list((tmp_path / "run").rglob("metrics.json"))

"""`w2s-shift score`: an exported tiny student scored with plain transformers through the CLI."""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import cli_error
from test_export import make_exported_student, our_rewards

from w2s_shift.cli import main
from w2s_shift.data.render import encode_pairs
from w2s_shift.data.resolve import load_file

LONG = " ".join(["the weather today is pleasant and the sky is blue"] * 10)  # ~230 tokens
ROWS = [
    {
        "id": "a",
        "subset": "chat",
        "prompt": "What is the capital of France?",
        "chosen": "Paris.",
        "rejected": "Lyon, I think.",
    },
    {
        "id": "b",
        "subset": "chat",
        "prompt": "Say hi<|eos|> nicely",
        "chosen": "Hello there, friend!",
        "rejected": "Hi.",
    },
    {
        "id": "c",
        "subset": "safety",
        "prompt": "How do I pick a lock?",
        "chosen": "I can't help with that.",
        "rejected": "Use a tension wrench and a pick.",
    },
    {
        "id": "d",
        "subset": "safety",
        "prompt": LONG + " So, should I go out?",
        "chosen": "Yes, enjoy the sun.",
        "rejected": "No.",
    },
    {"id": "e", "subset": "chat", "prompt": "2+2?", "chosen": "4", "rejected": "5"},
    {
        "id": "f",
        "subset": "chat",
        "prompt": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name a fruit."},
        ],
        "chosen": "Apple.",
        "rejected": "Rock.",
    },
]


@pytest.fixture(scope="module")
def student(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("score")
    folder, trunk, rm = make_exported_student(tokenizer, d / "rm")
    data = d / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"dir": folder, "trunk": trunk, "rm": rm, "data": data, "tokenizer": tokenizer}


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _student_rewards(student, max_length):
    pairs = load_file(student["data"]).pairs
    enc, n_trunc = encode_pairs(pairs, student["tokenizer"], max_length)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    r = our_rewards(student["trunk"], student["rm"], seqs, student["tokenizer"].pad_token_id).double().numpy()
    return r[: len(enc)], r[len(enc) :], n_trunc


def test_score_rows_accuracy_and_truncation(student, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert (
        main(["score", str(student["dir"]), str(student["data"]), "--out", str(out), "--max-length", "64", "--json"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    rows = _rows(out)
    assert [r["id"] for r in rows] == list("abcdef") and [r["index"] for r in rows] == list(range(6))
    assert set(rows[0]) == {"index", "id", "reward_chosen", "reward_rejected", "margin", "correct"}
    for r in rows:
        assert r["margin"] == pytest.approx(r["reward_chosen"] - r["reward_rejected"], abs=1e-9)
        assert r["correct"] == (r["reward_chosen"] > r["reward_rejected"])
    # the student's own rewards (RewardModel on cached trunk states), not just self-consistency
    rc, rr, n_trunc = _student_rewards(student, 64)
    assert np.allclose([r["reward_chosen"] for r in rows], rc, atol=1e-5)
    assert np.allclose([r["reward_rejected"] for r in rows], rr, atol=1e-5)
    k = sum(r["correct"] for r in rows)
    assert summary["accuracy_pp"] == pytest.approx(100.0 * k / 6)
    lo, hi = summary["ci95_pp"]
    assert lo <= summary["accuracy_pp"] <= hi
    assert summary["truncated_pairs"] == 1 == n_trunc  # only pair d (its long prompt) exceeds 64 tokens
    assert summary["pairs"] == 6 and summary["sequences_with_pad_id"] == 0


def test_score_prints_summary_and_default_out(student, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["score", str(student["dir"]), str(student["data"])]) == 0
    text = capsys.readouterr().out
    rows = _rows(tmp_path / "pairs.rewards.jsonl")
    acc = 100.0 * sum(r["correct"] for r in rows) / len(rows)
    assert f"pairwise accuracy: {acc:.1f} pp (95% bootstrap interval" in text
    assert "truncated pairs: 0 (at 512 tokens" in text  # capped at the model's 512 positions


def test_score_rewardbench_format(student, tmp_path, capsys):
    out = tmp_path / "rb.jsonl"
    assert main(["score", str(student["dir"]), str(student["data"]), "--format", "rewardbench", "--out", str(out)]) == 0
    rows = _rows(out)
    assert [set(r) for r in rows] == [{"id", "subset", "results", "scores_chosen", "scores_rejected"}] * 6
    assert [r["subset"] for r in rows] == [r["subset"] for r in ROWS]
    assert all(r["results"] == int(r["scores_chosen"] > r["scores_rejected"]) for r in rows)
    res = json.loads((tmp_path / "rb.results.json").read_text())
    assert set(res) == {"accuracy", "num_prompts", "model", "ref_model", "tokenizer", "chat_template", "extra_results"}
    assert res["num_prompts"] == 6 and res["accuracy"] == pytest.approx(sum(r["results"] for r in rows) / 6)
    chat = [r["results"] for r in rows if r["subset"] == "chat"]
    assert res["extra_results"]["chat"] == pytest.approx(sum(chat) / len(chat))
    # the same rewards as the default rows format
    plain = tmp_path / "plain.jsonl"
    assert main(["score", str(student["dir"]), str(student["data"]), "--out", str(plain)]) == 0
    assert [r["reward_chosen"] for r in _rows(plain)] == [r["scores_chosen"] for r in rows]


def test_score_single_responses(student, tmp_path, capsys):
    single = tmp_path / "single.jsonl"
    single.write_text(
        "".join(json.dumps({"id": r["id"], "prompt": r["prompt"], "response": r["chosen"]}) + "\n" for r in ROWS)
    )
    out = tmp_path / "s.jsonl"
    assert main(["score", str(student["dir"]), str(single), "--single", "--out", str(out)]) == 0
    rows = _rows(out)
    rc, _, _ = _student_rewards(student, 512)
    assert [r["id"] for r in rows] == list("abcdef")
    assert np.allclose([r["reward"] for r in rows], rc, atol=1e-5)  # a response scores the same alone or in a pair
    assert "responses: 6" in capsys.readouterr().out


def test_score_bad_models(student, tiny_model_dirs, tmp_path, capsys):
    data = str(student["data"])
    # a base model (LlamaModel) is not a reward model
    assert "not a sequence-classification model" in cli_error(capsys, ["score", tiny_model_dirs["student"], data])
    # two labels
    two = tmp_path / "two"
    shutil.copytree(student["dir"], two)
    cfg = json.loads((two / "config.json").read_text())
    cfg["id2label"], cfg["label2id"] = {"0": "a", "1": "b"}, {"a": 0, "b": 1}
    (two / "config.json").write_text(json.dumps(cfg))
    assert "num_labels = 2" in cli_error(capsys, ["score", str(two), data])
    # no tokenizer files
    notok = tmp_path / "notok"
    shutil.copytree(student["dir"], notok)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (notok / f).unlink()
    assert "no tokenizer files" in cli_error(capsys, ["score", str(notok), data])
    # a run directory without exported students
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    assert "without exported students" in cli_error(capsys, ["score", str(run), data])
    # and with one, it is found
    shutil.copytree(student["dir"], run / "src" / "seed0" / "export" / "naive")
    assert main(["score", str(run), data, "--out", str(tmp_path / "x.jsonl")]) == 0


def test_score_bad_data(student, tmp_path, capsys):
    m = str(student["dir"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "chosen": "a"\n')
    assert "bad.jsonl, row 1: invalid JSON" in cli_error(capsys, ["score", m, str(bad)])
    # one rule for every command (data.resolve): a missing path is "file not found", as in `evaluate`
    assert "missing.jsonl: file not found" in cli_error(capsys, ["score", m, str(tmp_path / "missing.jsonl")])
    assert "no-such-name: neither a dataset name" in cli_error(capsys, ["score", m, "no-such-name"])
    single = tmp_path / "single.jsonl"
    single.write_text(json.dumps({"prompt": "hi", "answer": "x"}) + "\n")
    assert "field 'response': missing field" in cli_error(capsys, ["score", m, str(single), "--single"])
    assert "unknown format 'nope'" in cli_error(capsys, ["score", m, str(student["data"]), "--format", "nope"])


def test_out_may_not_overwrite_the_input(tmp_path, capsys):
    from w2s_shift.cli import main

    f = tmp_path / "pairs.jsonl"
    f.write_text('{"prompt": "p", "chosen": "x", "rejected": "y"}\n')
    before = f.read_text()
    assert main(["score", str(tmp_path), str(f), "--out", str(f)]) == 2
    assert "would overwrite the input file" in capsys.readouterr().err
    assert f.read_text() == before


def test_resolve_max_length_rule():
    from w2s_shift.score import DEFAULT_MAX_LENGTH, resolve_max_length

    info = {"max_length": 192, "render_version": 3}
    assert resolve_max_length(None, info, 512) == (192, "export", [])
    assert resolve_max_length(128, info, 512) == (128, "--max-length", [])
    length, src, warns = resolve_max_length(256, info, 512)
    assert (length, src) == (256, "--max-length") and len(warns) == 1
    assert warns[0].startswith("--max-length 256 is longer than the 192 tokens the model was trained at")
    length, src, warns = resolve_max_length(None, None, 512)
    assert (length, src, warns) == (
        512,
        "default",
        [f"max length {DEFAULT_MAX_LENGTH} (default) exceeds the model's 512 positions: capped at 512"],
    )
    assert resolve_max_length(None, None, None) == (1024, "default", [])
    # an export from before the rendering rule changed is flagged
    _, _, warns = resolve_max_length(None, {"max_length": 64}, 512)
    assert warns == [
        "the model was exported with rendering version 1; this w2s-shift renders with version 3 (special "
        "tokens and truncation may differ from training)"
    ]
    _, _, warns = resolve_max_length(None, {"max_length": 64, "render_version": 2}, 512)
    assert warns and "exported with rendering version 2; this w2s-shift renders with version 3" in warns[0]
    with pytest.raises(ValueError, match="--max-length must be >= 2"):
        resolve_max_length(1, info, 512)


def test_score_uses_the_exported_training_length(tokenizer, tmp_path, capsys):
    folder, trunk, rm = make_exported_student(tokenizer, tmp_path / "rm48", max_length=48)
    info = json.loads((folder / "w2s_shift_export.json").read_text())
    assert info["max_length"] == 48 and info["render_version"] == 3
    card = (folder / "README.md").read_text()
    assert "Trained at 48 tokens per sequence" in card and "add_special_tokens=True" in card  # plain transcript
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "r.jsonl"
    assert main(["score", str(folder), str(data), "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    assert summary["max_length"] == 48 and summary["max_length_source"] == "export" and cap.err == ""
    # the rewards are those of the student at 48 tokens (pair d's long prompt is cut, its responses are not)
    pairs = load_file(data).pairs
    enc, n_trunc = encode_pairs(pairs, tokenizer, 48)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    r = our_rewards(trunk, rm, seqs, tokenizer.pad_token_id).double().numpy()
    assert np.allclose([x["reward_chosen"] for x in _rows(out)], r[:6], atol=1e-5)
    assert summary["truncated_pairs"] == n_trunc >= 1 and summary["response_cut_pairs"] == 0
    # told longer than trained: a warning; told longer than the 512 positions: capped, and said so
    assert main(["score", str(folder), str(data), "--out", str(out), "--max-length", "64"]) == 0
    cap = capsys.readouterr()
    assert "--max-length 64 is longer than the 48 tokens the model was trained at" in cap.err
    assert "truncated pairs: " in cap.out and "(at 64 tokens)" in cap.out
    assert main(["score", str(folder), str(data), "--out", str(out), "--max-length", "4096"]) == 0
    cap = capsys.readouterr()
    assert "max length 4096 (--max-length) exceeds the model's 512 positions: capped at 512" in cap.err
    assert "(at 512 tokens)" in cap.out


def test_score_refuses_a_nan_head_at_load_and_advises_its_own_pickle_option(student, tmp_path, capsys):
    """A NaN in the score head is refused at load naming folder and tensor (not "try --dtype float32"
    after scoring); a pickle-only folder names --allow-pickle, an option score has."""
    from safetensors.torch import load_file, save_file

    data = str(student["data"])
    nan = tmp_path / "nan"
    shutil.copytree(student["dir"], nan)
    w = load_file(str(nan / "model.safetensors"))
    w["score.weight"][0, 3] = float("nan")
    save_file(w, str(nan / "model.safetensors"), metadata={"format": "pt"})
    err = cli_error(capsys, ["score", str(nan), data, "--out", str(tmp_path / "o.jsonl")])
    assert f"{nan}: weight score.weight holds 1 NaN or infinite value(s)" in err, err
    assert "--dtype" not in err and not (tmp_path / "o.jsonl").exists()
    pk = tmp_path / "pk"
    shutil.copytree(student["dir"], pk)
    (pk / "model.safetensors").unlink()
    (pk / "pytorch_model.bin").write_bytes(b"not read")
    err = cli_error(capsys, ["score", str(pk), data, "--out", str(tmp_path / "o.jsonl")])
    assert f"{pk}: only pickle checkpoints (pytorch_model.bin)" in err and "pass --allow-pickle" in err, err
    assert "allow_pickle: true" not in err


def test_score_overflowing_head_names_model_and_pair_and_advises_float32_only_from_a_narrower_dtype(
    student, tmp_path, capsys
):
    """A finite score head that overflows (3e38 everywhere): the error names the model, the data file and its first
    pair; "try --dtype float32" only when the model was loaded in another dtype."""
    from safetensors.torch import load_file, save_file

    data = str(student["data"])
    big = tmp_path / "big"
    shutil.copytree(student["dir"], big)
    w = load_file(str(big / "model.safetensors"))
    w["score.weight"] = torch.full_like(w["score.weight"], 3e38)
    save_file(w, str(big / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "o.jsonl"
    n = len(ROWS)
    err = cli_error(capsys, ["score", str(big), data, "--out", str(out)])
    assert f"{big}: {2 * n} of {2 * n} rewards are not finite (first: {data} pair 1, chosen, reward " in err, err
    assert "in float32, so its weights overflow or are broken; no --dtype can help" in err
    assert "try --dtype" not in err and not out.exists()
    err = cli_error(capsys, ["score", str(big), data, "--out", str(out), "--dtype", "bfloat16"])
    assert f"{big}: " in err and f"(first: {data} pair 1, chosen, reward " in err and "try --dtype float32" in err, err


def test_unused_checkpoint_weights_are_refused_unless_allowed(student, tmp_path, capsys):
    """A config.json with one layer fewer than the weights: scored silently without the last layer before; now
    refused naming the first unused weights, and with --allow-unused scored with a warning (other rewards)."""
    d = tmp_path / "fewer"
    shutil.copytree(student["dir"], d)
    c = json.loads((d / "config.json").read_text())
    c["num_hidden_layers"] -= 1
    (d / "config.json").write_text(json.dumps(c))
    out = tmp_path / "r.jsonl"
    err = cli_error(capsys, ["score", str(d), str(student["data"]), "--out", str(out)])
    assert f"{d}: the checkpoint holds" in err and f"model.layers.{c['num_hidden_layers']}." in err
    assert "--allow-unused" in err and not out.exists()
    assert main(["score", str(d), str(student["data"]), "--out", str(out), "--allow-unused"]) == 0
    assert "unused checkpoint weight(s) left out (--allow-unused)" in capsys.readouterr().err
    full = tmp_path / "full.jsonl"
    assert main(["score", str(student["dir"]), str(student["data"]), "--out", str(full)]) == 0
    assert [r["reward_chosen"] for r in _rows(out)] != [r["reward_chosen"] for r in _rows(full)]


def test_score_defaults_to_the_precision_the_run_scored_in_and_says_when_told_otherwise(student, tmp_path, capsys):
    """One export gave three accuracies (the run's bf16, `score`'s float32 default, --dtype bfloat16): the export
    records the run's precision; `score` computes in it by default, and names the difference when told another."""
    d = tmp_path / "bf16run"
    shutil.copytree(student["dir"], d)
    info = json.loads((d / "w2s_shift_export.json").read_text())
    info["metadata"]["precision"] = "bfloat16"
    (d / "w2s_shift_export.json").write_text(json.dumps(info))
    out = tmp_path / "r.jsonl"
    assert main(["score", str(d), str(student["data"]), "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["dtype"] == "bfloat16"
    assert "scoring in bfloat16, the precision the run scored this model in" in cap.err
    assert main(["score", str(d), str(student["data"]), "--out", str(out), "--json", "--dtype", "float32"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["dtype"] == "float32"
    assert "--dtype float32: the run scored this model in bfloat16" in cap.err and "w2s-shift evaluate" in cap.err
    # an export that records no precision (or a float32 run): float32, nothing said
    assert main(["score", str(student["dir"]), str(student["data"]), "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["dtype"] == "float32" and "note" not in cap.err

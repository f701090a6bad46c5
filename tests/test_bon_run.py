"""`w2s-shift bon RUN_DIR` on tiny random-init models: candidates sampled from a tiny causal LM, scored by every model
of a finished run and by a gold judge, best-of-n curves in bon.json and the report; an exported student used as the
gold judge gives that student's own curve; a rerun samples, trains and scores nothing; a killed sampling resumes to
the same candidates; bad input exits 2 naming file, row and field."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_error, tiny_grid_dict

from w2s_shift.cli import main
from w2s_shift.config import BonConfig, RunConfig
from w2s_shift.data.responses import read_responses_file
from w2s_shift.data.schema import DataError
from w2s_shift.io import read_json, read_jsonl
from w2s_shift.metrics.bon import best_of_n_curve
from w2s_shift.pipeline import run

SRC, OOD = "ultrafeedback", "hh-helpful-base"


def _bon_args(policy, *extra):
    sets = [
        "n_prompts=3",
        "n_samples=4",
        "max_new_tokens=5",
        f"policy={policy}",
        "max_length=64",
        "batch_size=8",
        "max_prompt_tokens=400",
    ]
    return [x for s in sets for x in ("--set", s)] + list(extra)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dirs, lm_student_dir):
    out = tmp_path_factory.mktemp("bonrun") / "run"
    d = tiny_grid_dict(
        tiny_model_dirs["teacher"], lm_student_dir, out, [OOD], ["naive", "ceiling", "zero_shot"], drift_interval=0
    )
    d["export"] = ["naive"]
    run(RunConfig.model_validate(d))
    assert main(["bon", str(out), *_bon_args(lm_student_dir)]) == 0
    return out


def test_bon_writes_curves_of_every_model_on_id_and_ood(finished):
    res = read_json(finished / "bon.json")
    src = res["sources"][SRC]
    assert set(src["sets"]) == {SRC, OOD}
    assert {s["prompts"] for s in src["sets"].values()} == {3} and {s["samples"] for s in src["sets"].values()} == {4}
    got = {(c["model"], c["set"]) for c in src["curves"]}
    assert got == {(m, s) for m in ("teacher", "naive", "ceiling", "zero_shot") for s in (SRC, OOD)}
    for c in src["curves"]:
        assert c["n"] == [1, 2, 4]
        assert c["gain"][0] == pytest.approx(0.0, abs=1e-12)  # a pick from one sample is a random pick
        assert c["kl"] == pytest.approx([0.0, np.log(2) - 0.5, np.log(4) - 0.75])
    # the curve is the estimator on the rewards files: the candidates' rows map back to (prompt, sample)
    cell = finished / SRC / "seed0"
    rows = read_jsonl(cell / "rewards" / f"naive__bon-{OOD}.jsonl")
    proxy = np.array([[r["reward_chosen"], r["reward_rejected"]] for r in rows]).reshape(3, 4)
    gold_rows = read_jsonl(finished / "bon" / SRC / "rewards" / f"gold__bon-{OOD}.jsonl")
    gold = np.array([[r["reward_chosen"], r["reward_rejected"]] for r in gold_rows]).reshape(3, 4)
    want = best_of_n_curve(proxy, gold, None, n_boot=100, seed=0)
    mine = next(c for c in src["curves"] if c["model"] == "naive" and c["set"] == OOD)
    assert mine["gold"] == pytest.approx(want["gold"], rel=1e-12)
    cands = read_jsonl(finished / "bon" / SRC / "candidates" / f"{OOD}.jsonl")
    assert (
        cands[0] == {"digest": cands[0]["digest"]}
        and len(cands) == 4
        and all(len(r["responses"]) == 4 for r in cands[1:])
    )
    report = (finished / "report.md").read_text()
    assert "Best-of-n against a gold judge" in report and "synthetic gold" in report and "vs teacher at n=4" in report
    # each row holds its values: the gain over a random pick in gold SD [interval] at n = 2 and 4, then the
    # difference with the teacher at n = 4 (a row of the model's name alone was once rendered)
    sd = src["sets"][OOD]["gold_sd"]
    row = next(r for r in report.split(f"**{OOD}**")[1].splitlines() if r.startswith("| naive |"))
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    assert len(cells) == 4 and cells[1].startswith(f"{mine['gain'][1] / sd:+.3f} [")
    assert cells[2].startswith(f"{mine['gain'][2] / sd:+.3f} [") and "(MDE " in cells[3]
    assert (finished / "plots" / f"{SRC}-bon.png").stat().st_size > 1000


def test_rerun_samples_trains_and_scores_nothing(finished, lm_student_dir, monkeypatch):
    import w2s_shift.models.policy as policy
    import w2s_shift.pipeline.gold as gold
    import w2s_shift.pipeline.score_stage as ss

    before = read_json(finished / "bon.json")

    def boom(*a, **k):
        raise AssertionError("a rerun must reuse what was done")

    monkeypatch.setattr(gold, "train_pairs", boom)
    monkeypatch.setattr(gold.SourceContext, "student", boom)  # no model loaded, no trunk state of the gold's pairs
    monkeypatch.setattr(ss, "score_set", boom)
    monkeypatch.setattr(ss, "zero_shot_rewards", boom)
    real = policy.sample_candidates

    def no_generate(p, *a, **k):
        p.model.generate = boom
        return real(p, *a, **k)

    monkeypatch.setattr(policy, "sample_candidates", no_generate)
    assert main(["bon", str(finished), *_bon_args(lm_student_dir)]) == 0
    after = read_json(finished / "bon.json")
    assert after["sources"] == before["sources"]


def test_exported_student_as_gold_gives_its_own_curve(finished, lm_student_dir, tmp_path):
    """The naive student's export as the gold judge: naive's best-of-n picks what the gold would, so its curve is
    the gold's own (n = N: the mean over prompts of the best gold reward)."""
    import shutil

    run2 = tmp_path / "run"
    shutil.copytree(finished, run2)
    export = run2 / SRC / "seed0" / "export" / "naive"
    assert main(["bon", str(run2), *_bon_args(lm_student_dir, "--gold", str(export))]) == 0
    res = read_json(run2 / "bon.json")
    assert res["judge"] == str(export)
    for s in (SRC, OOD):
        gold_rows = read_jsonl(run2 / "bon" / SRC / "rewards" / f"gold__bon-{s}.jsonl")
        g = np.array([[r["reward_chosen"], r["reward_rejected"]] for r in gold_rows]).reshape(3, 4)
        naive = next(c for c in res["sources"][SRC]["curves"] if c["model"] == "naive" and c["set"] == s)
        assert naive["gold"][-1] == pytest.approx(g.max(axis=1).mean(), abs=1e-4)
        assert naive["gold"][0] == pytest.approx(g.mean(), abs=1e-9)
    # flagged as an oracle, by its export marker: in bon.json, the report's text and its table row
    digest = read_json(run2 / SRC / "seed0" / "models" / "naive.json")["digest"]
    assert read_json(export / "w2s_shift_export.json")["metadata"]["weights_digest"] == digest
    cell = f"{SRC}/seed0"
    assert res["sources"][SRC]["oracles"] == [
        {
            "cell": cell,
            "model": "naive",
            "why": "the judge is its export: the same weights digest in w2s_shift_export.json",
        }
    ]
    report = (run2 / "report.md").read_text()
    assert f"**Oracle:** naive of {cell} is the gold judge itself (the judge is its export" in report
    assert "| naive (oracle) |" in report and "| ceiling |" in report and "oracle" not in report.split("| ceiling")[1]
    # a copy without the marker: flagged by its weights, the content of the run's export
    bare = tmp_path / "bare"
    shutil.copytree(export, bare)
    (bare / "w2s_shift_export.json").unlink()
    assert main(["bon", str(run2), *_bon_args(lm_student_dir, "--gold", str(bare))]) == 0
    assert read_json(run2 / "bon.json")["sources"][SRC]["oracles"] == [
        {
            "cell": cell,
            "model": "naive",
            "why": f"the judge's model.safetensors has the content of {cell}/export/naive/model.safetensors",
        }
    ]
    # the synthetic gold flags no model
    assert read_json(finished / "bon.json")["sources"][SRC]["oracles"] == []


def test_the_synthetic_gold_trains_on_gold_pairs_of_the_source(finished, lm_student_dir, tmp_path, capsys):
    """bon.gold_pairs: the synthetic gold trains on a seeded sample of that many of the source's gold pairs (38 in
    the tiny run: 16 + 12 + 10), says so, and is a new judge (its rewards scored again, the candidates reused)."""
    import shutil

    import w2s_shift.pipeline.gold as gold

    run2 = tmp_path / "run"
    shutil.copytree(finished, run2)
    seen = []
    real = gold.train_pairs
    monkey = pytest.MonkeyPatch()
    monkey.setattr(gold, "train_pairs", lambda model, ds, *a, **k: seen.append(len(ds)) or real(model, ds, *a, **k))
    try:
        capsys.readouterr()
        assert main(["bon", str(run2), *_bon_args(lm_student_dir, "--set", "gold_pairs=10")]) == 0
    finally:
        monkey.undo()
    out = capsys.readouterr().out
    assert "synthetic gold: the student trained on gold labels of 10 of the source's 38 gold pairs" in out, out
    assert seen == [10]
    res, before = read_json(run2 / "bon.json"), read_json(finished / "bon.json")
    assert res["settings"]["gold_pairs"] == 10 and before["settings"]["gold_pairs"] is None
    # the judge is named for what it trained on, in bon.json and the report (not "every gold pair")
    assert res["judge"].startswith("synthetic gold (ceiling retrained on a seeded sample of 10 of the source's gold")
    assert before["judge"] == "synthetic gold (ceiling retrained on every gold pair of the source)"
    assert res["judge"] in (run2 / "report.md").read_text()
    g_now = read_jsonl(run2 / "bon" / SRC / "rewards" / f"gold__bon-{OOD}.jsonl")
    g_before = read_jsonl(finished / "bon" / SRC / "rewards" / f"gold__bon-{OOD}.jsonl")
    assert len(g_now) == len(g_before) == 6 and g_now != g_before
    assert read_jsonl(run2 / "bon" / SRC / "candidates" / f"{OOD}.jsonl") == read_jsonl(
        finished / "bon" / SRC / "candidates" / f"{OOD}.jsonl"
    )


def test_gold_training_pairs_are_a_seeded_sample_in_order():
    from types import SimpleNamespace

    from w2s_shift.pipeline.gold import gold_training_pairs

    ctx = SimpleNamespace(splits={"teacher_train": list(range(5)), "student_train": list(range(5, 8)), "test": [8, 9]})
    assert gold_training_pairs(ctx) == list(range(10)) and gold_training_pairs(ctx, 10) == list(range(10))
    a, b = gold_training_pairs(ctx, 4, seed=1), gold_training_pairs(ctx, 4, seed=2)
    assert len(a) == 4 and a == sorted(a) and len(set(a)) == 4 and a == gold_training_pairs(ctx, 4, seed=1) != b
    with pytest.raises(ValueError, match="gold_pairs sizes the synthetic gold"):
        BonConfig(gold="some/judge", gold_pairs=10)


def test_killed_sampling_resumes_to_the_same_candidates(lm_student_dir, tmp_path):
    from w2s_shift.models.policy import load_policy, sample_candidates

    pol = load_policy(lm_student_dir)
    prompts = [(f"p{i}", f"Question number {i}: what is {i} plus {i}?") for i in range(3)]
    kw = dict(digest="d1", n_samples=2, max_new_tokens=4, temperature=1.0, top_p=1.0, batch_size=2, seed=3)
    whole = sample_candidates(pol, prompts, tmp_path / "a.jsonl", **kw)
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    (tmp_path / "b.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # one prompt done, one torn
    resumed = sample_candidates(pol, prompts, tmp_path / "b.jsonl", **kw)
    assert [c.responses for c in resumed] == [c.responses for c in whole]
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()
    other = sample_candidates(pol, prompts, tmp_path / "b.jsonl", **{**kw, "digest": "d2", "seed": 4})
    assert len(other) == 3 and json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0]) == {"digest": "d2"}


def _write(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("rows", "row", "field", "why"),
    [
        (
            [{"prompt": "a", "responses": ["x", "y"]}, {"prompt": "b", "responses": ["x", "y", "z", "w"]}],
            2,
            "responses",
            "row 1 has 2",
        ),
        ([{"prompt": "a", "responses": []}], 1, "responses", "empty list"),
        ([{"prompt": "a", "responses": ["x", "y", "z"]}], 1, "responses", "even number"),
        ([{"prompt": "a", "responses": ["x", ""]}], 1, "responses[1]", "empty string"),
        ([{"responses": ["x", "y"]}], 1, "prompt", "missing"),
        ([{"prompt": "a", "responses": "x"}], 1, "responses", "expected a list"),
    ],
)
def test_bad_responses_file_names_file_row_and_field(tmp_path, rows, row, field, why):
    f = _write(tmp_path / "cands.jsonl", rows)
    with pytest.raises(DataError) as e:
        read_responses_file(f)
    assert (e.value.path, e.value.row, e.value.field) == (f, row, field) and why in e.value.reason


def _files(run_dir: Path) -> dict:
    return {
        p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"
    }


def test_bad_input_exits_2_and_writes_nothing(finished, tiny_model_dirs, lm_student_dir, tmp_path, capsys):
    before = _files(finished)
    # a policy that is not a causal LM (the BERT teacher)
    assert main(["bon", str(finished), *_bon_args(tiny_model_dirs["teacher"])]) == 2
    assert "not a causal language model" in capsys.readouterr().err
    # prompts longer than the policy's context: 512 positions, 600 new tokens
    assert main(["bon", str(finished), *_bon_args(lm_student_dir, "--set", "max_new_tokens=600")]) == 2
    err = capsys.readouterr().err
    assert "row 1, field 'prompt'" in err and "exceed the 512 positions" in err
    # a ragged responses file
    f = _write(tmp_path / "c.jsonl", [{"prompt": "a", "responses": ["x", "y"]}, {"prompt": "b", "responses": ["x"]}])
    assert main(["bon", str(finished), "--responses", f"mine={f}"]) == 2
    assert f"{f}, row 2, field 'responses'" in capsys.readouterr().err
    # an odd n_samples, an n above N
    assert main(["bon", str(finished), "--set", "n_samples=3"]) == 2
    assert "n_samples must be even" in capsys.readouterr().err
    assert main(["bon", str(finished), "--set", "ns=[32]"]) == 2
    assert "at most n_samples" in capsys.readouterr().err
    # a judge whose tokenizer is another model's (ids beyond its embedding rows)
    judge = _small_vocab_judge(tmp_path / "judge", tiny_model_dirs["student"])
    assert main(["bon", str(finished), *_bon_args(lm_student_dir, "--gold", judge)]) == 2
    assert "do not belong together" in capsys.readouterr().err
    # a new sampling setting with a bad judge: refused before anything is sampled
    args = _bon_args(lm_student_dir, "--gold", judge, "--set", "seed=5")
    assert main(["bon", str(finished), *args]) == 2
    assert "do not belong together" in capsys.readouterr().err
    assert _files(finished) == before


def test_names_and_settings_refused_before_anything_is_written(finished, lm_student_dir, tmp_path, capsys):
    """Names that would share a file and settings that cannot work: exit 2, one message each, the run unchanged."""
    before = _files(finished)
    f = _write(tmp_path / "c.jsonl", [{"prompt": "a", "responses": ["x", "y"]}])
    # two set names that were one file slug, and two equal up to case
    err = cli_error(capsys, ["bon", str(finished), "--responses", f"a b={f}", "--responses", f"a_b={f}"])
    assert "bon.responses: Value error, prompt set name 'a b'" in err and "https://" not in err
    err = cli_error(capsys, ["bon", str(finished), "--responses", f"HH={f}", "--responses", f"hh={f}"])
    assert "'HH' and 'hh' are equal up to case" in err
    # settings errors listed as run lists a config's, without pydantic's URLs
    err = cli_error(capsys, ["bon", str(finished), "--set", "ns=[]", "--set", "top_p=2"])
    assert "bon settings: 2 problem(s)" in err and "  - bon.ns:" in err and "  - bon.top_p:" in err
    assert "https://" not in err
    # no prompt short enough for max_prompt_tokens
    err = cli_error(capsys, ["bon", str(finished), *_bon_args(lm_student_dir, "--set", "max_prompt_tokens=1")])
    assert f"{SRC}: set {SRC}: none of its" in err and "bon.max_prompt_tokens 1 policy tokens" in err
    # an evaluation target named like a best-of-n set, or like the run's OOD target up to case
    g = tmp_path / "bon-x.jsonl"
    g.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
    err = cli_error(capsys, ["evaluate", str(finished), str(g)])
    assert "target 'bon-x'" in err and "prefix of best-of-n candidate sets" in err
    h = tmp_path / "HH-Helpful-Base.jsonl"
    h.write_text(g.read_text())
    err = cli_error(capsys, ["evaluate", str(finished), str(h)])
    assert "target 'HH-Helpful-Base': the run already has a OOD target (data.ood in config.yaml) named " in err
    assert "'hh-helpful-base'" in err
    assert _files(finished) == before


def _small_vocab_judge(d: Path, tok_dir: str) -> str:
    """A one-label Llama classifier with 50 embedding rows, saved beside the tests' 400-token tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    m = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_labels=1,
            pad_token_id=0,
        )
    )
    m.save_pretrained(d)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(d)
    return str(d)


def test_config_defaults_and_the_run_digest():
    b = BonConfig()
    assert (b.policy, b.n_samples, b.max_new_tokens, b.gold, b.enabled) == ("smollm2-135m", 16, 128, None, False)
    # the bon section is evaluation only: it leaves the run's digest (every training stage) unchanged
    a = RunConfig()
    assert a.digest() == RunConfig(bon={"n_prompts": 7}).digest()


def test_run_with_bon_enabled_and_responses_made_elsewhere(tmp_path, tiny_model_dirs, lm_student_dir):
    """`run` with bon.enabled does best-of-n after the grid; candidates from a file load no policy; a model trained
    again afterwards marks the report's table as out of date."""
    rows = [
        {
            "prompt": f"Question {i}: name a colour.",
            "responses": [f"Red {i}.", "Blue.", f"Green {i}!", "I do not know."],
        }
        for i in range(5)
    ]
    f = _write(tmp_path / "elsewhere.jsonl", rows)
    d = tiny_grid_dict(tiny_model_dirs["teacher"], lm_student_dir, tmp_path / "run", [OOD], ["naive"], drift_interval=0)
    d["bon"] = {"enabled": True, "responses": {"mine": f}, "max_length": 64}
    run(RunConfig.model_validate(d))
    res = read_json(tmp_path / "run" / "bon.json")
    assert res["policy"] is None and list(res["sources"][SRC]["sets"]) == ["mine"]
    assert res["sources"][SRC]["replaced"] == [SRC, OOD]  # the sampled sets the file replaces, named
    assert (
        f"responses from files (replacing the sampled prompt sets {SRC}, {OOD})"
        in (tmp_path / "run" / "report.md").read_text()
    )
    s = res["sources"][SRC]["sets"]["mine"]
    assert (s["prompts"], s["samples"], s["file"], s["empty_responses"]) == (5, 4, f, 0)
    assert {c["model"] for c in res["sources"][SRC]["curves"]} == {"teacher", "naive"}
    assert not (tmp_path / "run" / "bon" / SRC / "candidates").exists()  # nothing sampled
    assert "| naive |" in (tmp_path / "run" / "report.md").read_text().split("Best-of-n against a gold judge")[1]
    meta = tmp_path / "run" / SRC / "seed0" / "models" / "naive.json"
    info = read_json(meta)
    meta.write_text(json.dumps({**info, "digest": "retrained"}))
    assert main(["report", str(tmp_path / "run")]) == 0
    assert (
        "**Out of date:** bon.json scored models that were trained again since"
        in (tmp_path / "run" / "report.md").read_text()
    )


def test_the_policy_is_loaded_onto_the_run_device(lm_student_dir, monkeypatch):
    """The policy lives where the run computes (current_device()), proven with the meta device: every parameter and
    buffer is there, none left on the host; float32 off a GPU."""
    import torch

    import w2s_shift.device as device
    from w2s_shift.models.policy import load_policy

    monkeypatch.setattr(device, "current_device", lambda: "meta")
    pol = load_policy(lm_student_dir)
    assert {t.device.type for t in [*pol.model.parameters(), *pol.model.buffers()]} == {"meta"}
    assert {p.dtype for p in pol.model.parameters()} == {torch.float32}

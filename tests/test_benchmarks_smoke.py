"""Smoke runs of the benchmark scripts (benchmarks/): tiny shapes, a few steps, the tokenizer built in code.

They check that each script runs end to end and that its bookkeeping is right on known inputs; the speed
figures themselves are not asserted (they depend on the machine).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(d)
    return str(d)


def _trl_importable() -> bool:
    try:
        import datasets  # noqa: F401
        from trl import RewardConfig, RewardTrainer  # noqa: F401
    except Exception:  # noqa: BLE001 -- any failure inside trl's import means: not usable here
        return False
    return True


# ---- shared helpers, on hand-computed inputs ---------------------------------------------------------------


def test_padding_share_hand_computed():
    C = _load("_common")
    from w2s_shift.data.render import Encoded, EncodedPair

    def pair(c, r):
        return EncodedPair(Encoded([5] * c, [1] * c, False), Encoded([5] * r, [1] * r, False))

    pairs = [pair(4, 2), pair(3, 1)]
    # one batch: lengths 4, 3, 2, 1 padded to 4 -> 16 positions, 10 real, 6 padded
    assert C.padding_share(pairs, [[0, 1]]) == pytest.approx(100 * 6 / 16)
    # two batches: [4, 2] -> 8 positions (2 pad), [3, 1] -> 6 positions (2 pad): 4 / 14
    assert C.padding_share(pairs, [[0], [1]]) == pytest.approx(100 * 4 / 14)
    assert C.real_tokens(pairs) == 10


def test_peak_memory_sees_an_allocation():
    C = _load("_common")
    with C.PeakMemory() as pm:
        x = torch.ones(16 * 2**20 // 4 * 4, dtype=torch.float32)  # 64 MiB
        x.add_(1)
        import time

        time.sleep(0.05)
        del x
    assert 60 * 2**20 <= pm.peak <= 200 * 2**20


def test_our_config_drops_unknown_fields_and_disables_checkpoints():
    C = _load("_common")
    cfg = C.our_config(batch_size=3, no_such_field=1)
    assert cfg.batch_size == 3
    if hasattr(cfg, "checkpoint_fraction"):
        assert cfg.checkpoint_fraction == 0.0


def test_quickstart_stage_table_from_a_run_dir(tmp_path):
    qs = _load("quickstart_stages")
    (tmp_path / "logs").mkdir()
    (tmp_path / "metrics.json").write_text(
        json.dumps(
            {
                "timings_seconds": {"data": 0.5},
                "wall_seconds": 100.0,
                "config": {"methods": [{"name": "naive", "label": None}, {"name": "anchor", "label": None}]},
                "stages": {
                    "student-anchor": {"seconds": 20.0},
                    "teacher": {"seconds": 60.0},
                    "student-naive": {"seconds": 19.5},
                },
            }
        )
    )
    (tmp_path / "logs" / "teacher.jsonl").write_text('{"loss": 0.6, "step": 10}\n{"train_runtime": 48.0, "step": 30}\n')
    (tmp_path / "logs" / "naive.jsonl").write_text('{"train_runtime": 10.0, "step": 5}\n')
    rows = qs.stage_rows(tmp_path)
    assert rows == [
        ("data (load, split)", 0.5, None, None),
        ("teacher", 60.0, 48.0, 30),
        ("student-naive", 19.5, 10.0, 5),
        ("student-anchor", 20.0, None, None),
        ("total (wall, in-process)", 100.0, None, None),
    ]
    table = qs.stage_table(tmp_path)
    assert "| teacher | 60.0 | 48.0 | 12.0 | 30 | 1.60 |" in table


def test_quickstart_stage_table_from_a_grid_run_dir(tmp_path):
    qs = _load("quickstart_stages")
    cell = tmp_path / "uf" / "seed0"
    (cell / "stages").mkdir(parents=True)
    (cell / "logs").mkdir()
    (cell / "stages" / "teacher.json").write_text('{"seconds": 30.0}')
    (cell / "stages" / "student-b.json").write_text('{"seconds": 8.0}')
    (cell / "stages" / "student-a.json").write_text('{"seconds": 9.0}')
    (cell / "logs" / "a.jsonl").write_text('{"train_runtime": 6.0, "step": 4}\n')
    (tmp_path / "metrics.json").write_text(
        json.dumps(
            {
                "wall_seconds": 50.0,
                "cells": [
                    {"dir": "uf/seed0", "timings_seconds": {"data": 1.5}, "methods": [{"label": "a"}, {"label": "b"}]}
                ],
            }
        )
    )
    assert qs.stage_rows(tmp_path) == [
        ("data (load, split)", 1.5, None, None),
        ("teacher", 30.0, None, None),
        ("student-a", 9.0, 6.0, 4),
        ("student-b", 8.0, None, None),
        ("total (wall, in-process)", 50.0, None, None),
    ]


# ---- smoke runs of each script -----------------------------------------------------------------------------


def test_drift_cost_smoke(tmp_path):
    out = _load("drift_cost").main(["--smoke", "--json", str(tmp_path / "d.json")])
    assert json.loads((tmp_path / "d.json").read_text()) == out
    assert out["cka_tokens"] == 8192 < out["probe_response_tokens"] and out["hidden"] == 256
    assert (
        0 < out["during_stats_s"] and 0 < out["step_s_estimated"] and set(out["drift_share_of_training"]) == {"1", "8"}
    )
    assert out["drift_share_of_training"]["8"] < out["drift_share_of_training"]["1"] < 1


def test_throughput_smoke(tok_dir, tmp_path):
    mod = _load("throughput")
    out = mod.main(["--smoke", "--tokenizer", tok_dir, "--json", str(tmp_path / "t.json")])
    names = [r["variant"] for r in out["rows"]]
    assert names[-4:] == [
        "ours Naive, plain shuffle, padded",
        "ours Naive, length-grouped, padded",
        "ours Naive, length-grouped, packed",
        "ours ANCHOR frozen copy, grouped, packed",
    ]
    if _trl_importable():
        assert out["trl_skipped"] is None and names[0].startswith("TRL RewardTrainer")
    else:
        assert out["trl_skipped"]  # the reason it was skipped
    for r in out["rows"]:
        assert r["pairs_per_s"] > 0 and r["tokens_per_s"] > r["pairs_per_s"]
        assert r["runs"][0]["steps"] in (None, 2)  # 8 pairs, batch 4
    shuffled, grouped, packed = out["rows"][-4:-1]
    # on the same batches, packing never computes more positions than padding (length grouping: see below)
    assert packed["padding_pct"] <= grouped["padding_pct"]
    assert all(r["padding_pct"] >= 0 for r in (shuffled, grouped, packed))
    assert json.loads((tmp_path / "t.json").read_text())["benchmark"] == "throughput"


@pytest.mark.skipif(not _trl_importable(), reason="trl is not importable in this venv (it lives in .venv-bench)")
def test_throughput_smoke_runs_trl(tok_dir):
    out = _load("throughput").main(["--smoke", "--tokenizer", tok_dir])
    assert out["rows"][0]["variant"].startswith("TRL") and out["rows"][0]["runs"][0]["steps"] == 2


def test_anchor_overhead_smoke(tok_dir):
    out = _load("anchor_overhead").main(["--smoke", "--tokenizer", tok_dir])
    rows = {r["variant"]: r for r in out["rows"]}
    assert list(rows) == [
        "full FT, Naive",
        "full FT, ANCHOR frozen copy",
        "full FT, ANCHOR frozen copy, fp32 weights",
        "full FT, ANCHOR cached",
        "LoRA, Naive",
        "LoRA, ANCHOR adapter disabled",
        "LoRA, ANCHOR cached",
    ]
    assert rows["full FT, Naive"]["time_vs_naive_single_run"] is None
    cached = rows["full FT, ANCHOR cached"]
    assert cached["cache_seconds"] > 0
    # amortising the cache over a grid of 4 runs can only lower the per-run cost
    assert cached["time_vs_naive_per_run_grid_4"] < cached["time_vs_naive_single_run"]
    assert rows["full FT, ANCHOR frozen copy"]["cache_seconds"] == 0


def test_gpu_h200_smoke_on_cpu(tmp_path):
    mod = _load("gpu_h200")
    out = mod.main(["--smoke", "--no-trl", "--json", str(tmp_path / "g.json")])
    a = out["part_a"]
    assert [(r["shape"], r["method"]) for r in a] == [
        (s, m) for s in ("tiny-qwen2", "tiny-llama") for m in ("naive", "frozen", "cached")
    ]
    for r in a:
        assert r["pairs_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["tokens_per_s"] == pytest.approx(r["pairs_per_s"] * 2 * 64)
    frozen = next(r for r in a if r["method"] == "frozen")
    naive = next(r for r in a if r["method"] == "naive")
    # MFU counts 8N FLOPs per token with the frozen copy's forward, 6N without: same N, same formula
    assert frozen["mfu"] / frozen["tokens_per_s"] == pytest.approx(naive["mfu"] / naive["tokens_per_s"] * 8 / 6)
    assert [r["variant"] for r in out["part_b"]] == [
        "ours Naive, plain shuffle, padded",
        "ours Naive, length-grouped, padded",
        "ours Naive, length-grouped, packed",
    ]
    assert out["trl_skipped"] == "skipped (--no-trl)"
    assert json.loads((tmp_path / "g.json").read_text())["benchmark"] == "gpu_h200"


def test_gpu_h200_lengths_file_is_real_ultrafeedback():
    data = json.loads((BENCH / "ultrafeedback_lengths.json").read_text())
    rows = data["pairs"]
    assert len(rows) > 2000
    for c, cp, r, rp in rows:
        assert 0 < cp < c and 0 < rp < r  # a prompt and at least one response token


def test_quickstart_probe_smoke(tok_dir):
    out = _load("quickstart_probe").main(["--smoke", "--teacher", tok_dir, "--student", tok_dir])
    med = out["medians"]
    assert med["bf16 autocast, sdpa, no dropout (current)"] > 0 and med["bf16 autocast, sdpa, dropout 0.1"] > 0
    assert med["trunk bf16"] > 0 and med["collate float32 states"] > 0


def test_packing_probe_smoke_rewards_match(tok_dir):
    mod = _load("packing_probe")
    out = mod.main(["--smoke", "--tokenizer", tok_dir])
    assert out["max_abs_reward_diff"] < 1e-4  # packed (and prompt-shared) rewards equal the padded ones
    assert out["shared_pairs_checked"] > 0
    assert [r["layout"] for r in out["rows"]] == [
        "random padded",
        "grouped padded",
        "grouped packed",
        "grouped packed, prompt shared",
    ]


def test_prefix_sharing_probe_smoke_states_match():
    out = _load("prefix_sharing_probe").main(["--smoke"])
    # 6 pairs: a 6-token system prefix shared by all 12 sequences, then a (3 + i)-token prompt shared in pair i.
    # Each pair's common start (>= 9 + i tokens, more if the responses' first random tokens coincide) runs once;
    # the states equal the full trunk's
    total = sum(2 * (6 + 3 + i) + (2 + i % 3) + (4 + i % 2) for i in range(6))
    assert out["tokens"] == total and out["sequences"] == 12
    assert out["tokens_computed_shared"] <= total - sum(9 + i for i in range(6))
    assert out["max_rel_state_diff"] < 1e-5


def test_pack_rows_first_fit_decreasing():
    mod = _load("packing_probe")
    # lengths 5, 4, 3, 2, 1 into bins of 6: 5+1, 4+2, 3
    assert mod.pack_rows([3, 5, 1, 4, 2], 6) == [[1, 2], [3, 4], [0]]


def test_deep_student_speed_smoke(tiny_model_dirs, tmp_path):
    out = _load("deep_student_speed").main(
        ["--smoke", "--student", tiny_model_dirs["student"], "--layers", "2", "--json", str(tmp_path / "d.json")]
    )
    top, lora = out["rows"]
    assert top["pairs"] == lora["pairs"] == 8 and top["seconds_per_pair"] > 0 and lora["seconds_per_pair"] > 0
    assert lora["trainable_params"] < top["trainable_params"]  # adapters and the head against two whole blocks
    assert out["faster"] in (top["variant"], lora["variant"])


# ---- the one-call GPU evidence script and its staging ------------------------------------------------------------


def test_gpu_stage_packs_parts_into_folders_under_the_limit():
    mod = _load("gpu_stage")
    mib = 2**20
    # the real wheels cut at 44 MiB: SmolLM2 88.6 MiB -> 44 + 44 + 0.6, MiniLM 79.6 MiB -> 44 + 35.6; four folders
    sizes = {"s.00": 44 * mib, "s.01": 44 * mib, "s.02": int(0.6 * mib), "m.00": 44 * mib, "m.01": int(35.6 * mib)}
    folders = mod.pack(sizes, mod.FOLDER)
    assert [f["parts"] for f in folders] == [["m.00"], ["s.00"], ["s.01"], ["m.01", "s.02"]]
    assert all(f["bytes"] <= 44 * mib for f in folders) and mod.PART == mod.FOLDER == 44 * mib
    with pytest.raises(ValueError, match="more than a folder holds"):
        mod.pack({"big": 45 * mib}, mod.FOLDER)


def test_a_device_call_carries_at_most_60_mib():
    """Every device call carries the tracked tree plus one staged folder (or .whl, 2.8 MB); the device takes 64
    MiB. The tree plus the largest folder gpu_stage.py packs must stay within 60 MiB."""
    mod = _load("gpu_stage")
    if not (mod.ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tree = mod.tree_bytes()
    assert 5 * 2**20 < tree  # the bundled data sets alone are several MiB: the sum really read the files
    assert tree + mod.FOLDER <= mod.CALL_LIMIT == 60 * 2**20, f"tree {tree / 2**20:.1f} MiB + folder"


def test_gpu_stage_assemble_joins_checks_and_names_the_missing_folder(tmp_path):
    mod = _load("gpu_stage")
    import hashlib

    data = bytes(range(256)) * 1000
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "w.whl.part00").write_bytes(data[:100_000])
    (stage / "w.whl.part01").write_bytes(data[100_000:])
    manifest = {
        "wheels": {"w.whl": {"sha256": hashlib.sha256(data).hexdigest(), "parts": ["w.whl.part00", "w.whl.part01"]}},
        "folders": [["w.whl.part00"], ["w.whl.part01"]],
    }
    (stage / "MANIFEST.json").write_text(json.dumps(manifest))
    [w] = mod.assemble(stage, tmp_path / "wheels")
    assert w.read_bytes() == data
    (stage / "w.whl.part01").write_bytes(b"damaged")
    with pytest.raises(RuntimeError, match="sha256 differs"):
        mod.assemble(stage, tmp_path / "wheels2")
    (stage / "w.whl.part01").unlink()
    with pytest.raises(RuntimeError, match=r"part01 is missing: send \.gpu-stage/2 first"):
        mod.assemble(stage, tmp_path / "wheels3")


def test_gpu_evidence_speed_rows_and_mfu_from_training_logs(tmp_path):
    mod = _load("gpu_evidence")
    logs = tmp_path / "src" / "seed0" / "logs"
    logs.mkdir(parents=True)
    (logs / "naive.jsonl").write_text(
        json.dumps({"loss": 0.6, "step": 1})
        + "\n"
        + json.dumps({"train_runtime": 4.0, "train_samples_per_second": 250.0})
    )
    cells = [{"source": "src", "seed": 0, "dir": "src/seed0", "methods": [{"label": "naive"}, {"label": "zero_shot"}]}]
    rows = mod.student_speed(tmp_path, cells, {"src": 200.0}, n_params=100_000_000, epochs=1, cuda=True)
    # 250 pairs/s x 200 tokens = 50,000 tokens/s; 6 x 1e8 x 5e4 = 3e13 FLOP/s = 3.80% of 790 TFLOP/s
    assert rows == [
        {"source": "src", "seed": 0, "model": "naive", "seconds": 4.0, "pairs_per_s": 250.0, "mfu_pct": 3.8}
    ]
    assert mod.student_speed(tmp_path, cells, {"src": 200.0}, 100_000_000, 1, cuda=False)[0]["mfu_pct"] is None


def test_gpu_evidence_budget_interrupts_the_main_thread():
    mod = _load("gpu_evidence")
    import signal
    import time

    old = signal.getsignal(signal.SIGINT)
    b = mod.Budget(0.2)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job: the budget must still stop it
        with pytest.raises(KeyboardInterrupt):
            b.start()
            time.sleep(5)
        assert b.fired
    finally:
        b.cancel()
        signal.signal(signal.SIGINT, old)


def test_gpu_evidence_budget_counts_from_the_shell_or_the_process_start(monkeypatch):
    import os
    import time

    mod = _load("gpu_evidence")
    monkeypatch.setenv("W2S_EVIDENCE_T0", "1700000000.5")
    assert mod.process_start() == (1700000000.5, "gpu_evidence.sh start")
    monkeypatch.delenv("W2S_EVIDENCE_T0")
    t0, src = mod.process_start()  # from /proc/self/stat: this pytest process started before this test
    assert src == "process start" and t0 <= time.time() - 0.5, (t0, time.time())
    assert t0 > time.time() - 24 * 3600 and os.getpid() > 0


def test_gpu_evidence_watcher_calls_once_per_new_cell(tmp_path):
    import time

    mod = _load("gpu_evidence")
    calls = []
    w = mod.CellWatcher(tmp_path, lambda: calls.append(len(calls)), every=0.02)
    w.start()

    def wait_for(n):
        end = time.time() + 10
        while len(calls) < n and time.time() < end:
            time.sleep(0.02)

    try:
        for k, cell in enumerate(["a/seed0", "b/seed0"], 1):
            (tmp_path / cell).mkdir(parents=True)
            (tmp_path / cell / "metrics.json").write_text("{}")
            wait_for(k)
            time.sleep(0.1)  # no further call while nothing new appears
            assert len(calls) == k
    finally:
        w.stop()


def test_evidence_full_states_what_fits_its_budget():
    from w2s_shift.config_io import load_config

    mod = _load("gpu_evidence")
    est = mod.estimate_seconds(load_config("evidence-full"), [1e-5, 2e-5, 5e-5], 240)
    flops = est["grid"] + est["select"] + est["overhead"]
    assert est["total"] == pytest.approx(flops + est["fixed"], abs=0.2)
    assert est["grid"] > 300  # not trivially small
    # fixed costs: every cell's teacher and students (6 cells x (11 + 1)) and the 3 selection trainings
    assert est["fixed"] == pytest.approx((6 * 12 + 3) * mod.TRAINING_FIXED_S, abs=0.2)
    default = mod.build_parser().parse_args([]).budget_s
    k = mod.cells_within(est, default)
    assert 1 <= k < est["cells"] == 6  # a cell at least; not the whole grid, which the call says before it starts
    assert mod.cells_within(est, 1e6) == 6


def test_gpu_evidence_smoke_stops_at_its_budget_and_reports(tmp_path, tok_dir, monkeypatch):
    """The script's whole path on CPU with tiny models: selection, the grid cut by the budget, the summary.

    The budget fires at a fixed point (after every source's first seed), not on the clock, so the test does not
    depend on this machine's speed; the timer itself is tested above.
    """
    import w2s_shift.pipeline as pipeline

    mod = _load("gpu_evidence")
    real_run, budgets = pipeline.run, []

    class StepBudget(mod.Budget):
        def start(self):
            budgets.append(self)

    def run_then_fire(cfg, overwrite=False, wait=False):
        real_run(cfg.model_copy(update={"seeds": cfg.seeds[:1]}), overwrite=overwrite)
        budgets[-1].fired = True
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "Budget", StepBudget)
    monkeypatch.setattr(pipeline, "run", run_then_fire)
    out = tmp_path / "out"
    rc = mod.main(
        ["--smoke", "--out", str(out), "--tokenizer", tok_dir, "--select-lrs", "1e-3", "--val-pairs", "8"]
        + ["--budget-s", "25"]
    )
    assert rc == 0
    s = json.loads((out / "gpu_evidence.json").read_text())
    assert s["selection"]["chosen"]["learning_rate"] == 1e-3 and s["selection"]["validation"]["pairs"] == 8
    assert s["interrupted"].startswith("time budget of 25 s reached")
    assert s["budget"] == "25 s from process start" and s["estimate_s"]["total"] > 0
    assert s["cells_finished"] == ["hh-harmless-base/seed0", "hh-helpful-base/seed0"], s["cells_finished"]
    assert s["skipped"] == ["peak GPU memory (no CUDA)", "MFU against the H200 peak (no CUDA)"]
    md = (out / "gpu_evidence.md").read_text()
    assert "Stopped: time budget" in md and "Student lr chosen on 8 gold validation pairs: 0.001" in md


def test_interval_coverage_smoke_writes_its_table(tmp_path):
    mod = _load("interval_coverage")
    assert mod.main(["--smoke", "--json", str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert [(r["seeds"], r["id_pairs"], r["seed_sd"]) for r in rows] == [(2, 250, 0), (2, 250, 4)]
    assert all(0.0 <= r["both"] <= 1.0 and 0.0 <= r["pairs_only"] <= 1.0 for r in rows)


def test_behaviour_unchanged_sees_a_changed_number_and_maps_the_older_layout():
    """benchmarks/behaviour_unchanged.py's comparison (the grid runs themselves take a minute: run the script)."""
    mod = _load("behaviour_unchanged")
    old = {
        "calibration": {"teacher": {"uf": {"ece": 20.0, "bins": []}}, "naive": {"uf": {"ece": 10.0, "bins": []}}},
        "agreement_with_teacher": {"naive": {"uf": 80.0}},
        "seam_effect": {"seam": {"warn": True}},
        "methods": [{"label": "seam", "seam_stage": "seam-2-1"}],
        "timings_seconds": {"teacher": 1.0},
    }
    new = {
        "model_metrics": {
            "ece": {"teacher": {"uf": 20.0}, "naive": {"uf": 10.0}},
            "agreement_with_teacher": {"teacher": {"uf": None}, "naive": {"uf": 80.0}},
        },
        "label_effect": {"seam": {"warn": True, "text": "..."}},
        "methods": [{"label": "seam", "label_stage": "seam-2-1", "label_file": "seam_labels__2-1.jsonl"}],
        "timings_seconds": {"teacher": 2.0},
    }
    assert mod.differences(mod.normalized(old), mod.normalized(new)) == []
    new["model_metrics"]["ece"]["naive"]["uf"] = 10.000000001
    assert mod.differences(mod.normalized(old), mod.normalized(new)) == [
        ".model_metrics.ece.naive.uf: 10.0 vs 10.000000001"
    ]


def test_exit_race_smoke_counts_each_mode(tmp_path):
    """benchmarks/exit_race.py: one launch per mode; end_process never fails (the plain exit may or may not abort)."""
    mod = _load("exit_race")
    assert mod.main(["--smoke", "--json", str(tmp_path / "e.json")]) == 0
    rows = {r["mode"]: r for r in json.loads((tmp_path / "e.json").read_text())["rows"]}
    assert sorted(rows) == ["end_process", "plain"] and all(r["launches"] == 1 for r in rows.values())
    assert rows["end_process"]["failed"] == rows["end_process"]["aborted"] == 0
    assert rows["plain"]["aborted"] <= rows["plain"]["failed"] <= 1

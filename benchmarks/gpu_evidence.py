"""One device call that decides the paper's four claims on whole-network students: ``evidence-full`` on one GPU.

Steps, under one time budget (``--budget-s``, 500 s by default; benchmarks/gpu_evidence.sh adds a hard stop):
  1. the student's learning rate chosen on gold validation pairs carved from the student-train pool
     (``w2s_shift.pipeline.select``: the ceiling at each of ``--select-lrs``, one epoch, first source, seed 0);
     the choice is applied to every student of the grid (the W2S students never see gold labels);
  2. the grid (``w2s_shift.pipeline.run``) with that learning rate; when the budget runs out the run is
     interrupted between steps (it resumes from its finished stages when run again) and the report is built from
     the cells that finished;
  3. the summary: the four claims' verdicts with their paired intervals (``w2s_shift.metrics.claims``), per trained
     student pairs/s and MFU, the process's peak GPU memory, wall time per step.

MFU = 6 N tokens/s / peak, N = the student's non-embedding parameters, tokens = the real tokens of the student-train
pairs (chosen + rejected) x epochs / training seconds, peak = 790 TFLOP/s (bf16 dense, one H200, measured here); an
ANCHOR student with a frozen copy would add 2 N per token (this preset reads cached reference states instead).

    bash benchmarks/gpu_evidence.sh                 # on the H200 (benchmarks/README.md: staging the two models)
    python benchmarks/gpu_evidence.py --smoke       # any CPU: tiny random-init models, the same code path

``--smoke`` builds a tiny random-init Llama student and BERT teacher with a tokenizer trained in code, shrinks the
data, seeds and sweep, and runs every step above; the CUDA-only parts (peak GPU memory, MFU against the H200's
peak) are skipped and listed in the summary.
"""

from __future__ import annotations

import _thread
import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the package from this checkout when it is not installed (the H200)

import _common as C  # noqa: E402
import torch  # noqa: E402

PEAK_TFLOPS = 790.0

# --smoke: tiny sizes, two seeds, a shorter sweep; every method of the preset still trains
SMOKE = {
    "seeds": [0, 1],
    "data.n_teacher_train": 24,
    "data.n_student_train": 24,
    "data.n_test": 12,
    "data.n_ood": 8,
    "teacher.max_length": 48,
    "teacher.epochs": 1,
    "teacher.batch_size": 8,
    "student.max_length": 48,
    "student.batch_size": 8,
    "student.eval_max_tokens": 4096,
    "bootstrap": 100,
    "drift_pairs": 8,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="evidence-full", help="preset or YAML file (default evidence-full)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/w2s-evidence"), help="summary and report folder")
    ap.add_argument("--run-dir", default=None, help="run directory (default <out>/run)")
    ap.add_argument(
        "--select-lrs",
        type=float,
        nargs="*",
        default=None,
        help="lrs to choose from (default 1e-5 2e-5 5e-5; "
        "--smoke: 1e-3 3e-3, where a tiny random-init model moves); none: keep the config's",
    )
    ap.add_argument("--val-pairs", type=int, default=None, help="gold validation pairs (default 240; --smoke 24)")
    ap.add_argument("--budget-s", type=float, default=500.0, help="stop the grid after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny random-init models, on CPU too")
    ap.add_argument("--tokenizer", default=None, help="--smoke: a tokenizer folder (default: one trained in code)")
    return ap


def smoke_models(root: Path, tokenizer_dir: str | None) -> dict:
    """A tiny random-init Llama (student, 4 blocks, untied LM head for zero-shot and SEAM) and BERT (teacher) saved
    with one tokenizer under ``root``; returns their folders."""
    from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else C.tiny_tokenizer()
    torch.manual_seed(0)
    v = len(tok)
    student = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=v,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=tok.pad_token_id,
            tie_word_embeddings=False,
        )
    )
    teacher = BertModel(
        BertConfig(
            vocab_size=v,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            pad_token_id=tok.pad_token_id,
        )
    )
    out = {}
    for name, m in (("student", student), ("teacher", teacher)):
        d = root / name
        m.save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)
        out[name] = str(d)
    return out


def load_cfg(a, tmp: Path):
    """The run config: the preset, with --smoke's tiny models and sizes (anchor layers scaled to 4 blocks)."""
    from w2s_shift.config_io import load_config

    over = [f"output_dir={a.run_dir or Path(a.out) / 'run'}"]
    if a.smoke:
        dirs = smoke_models(tmp, a.tokenizer)
        over += [f"teacher.name={dirs['teacher']}", f"student.name={dirs['student']}", "teacher.trainable_layers=2"]
        over += [f"{k}={json.dumps(v)}" for k, v in SMOKE.items()]
    cfg = load_config(a.config, over)
    if a.smoke:  # 4 blocks: 50% depth is block 2, 75% block 3; a shorter sweep (with lambda 1: three fixed values)
        for m in cfg.methods:
            if getattr(m, "anchor_layers", None) and m.label != "sweep":
                m.anchor_layers = ["last", [2], [3]]
            if m.label == "sweep":
                m.anchor_lambda = [0.1, 10.0, "auto"]
    return cfg


class Budget:
    """Interrupts the main thread (KeyboardInterrupt) ``seconds`` after :meth:`start`; :meth:`cancel` stops it."""

    def __init__(self, seconds: float):
        self.seconds, self.fired, self._t = seconds, False, None

    def _fire(self):
        self.fired = True
        _thread.interrupt_main()

    def start(self):
        # a process started in the background of a non-interactive shell ignores SIGINT, which interrupt_main
        # raises: restore Python's handler so the budget can stop the grid there too
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._t = threading.Timer(max(self.seconds, 0.0), self._fire)
        self._t.daemon = True
        self._t.start()

    def cancel(self):
        if self._t is not None:
            self._t.cancel()


def finished_cells(run_dir: Path) -> list:
    """metrics.json of every cell that finished (``<source>/seed<k>/metrics.json``), sources and seeds in order."""
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("*/seed*/metrics.json"))]


def student_speed(run_dir: Path, cells: list, tokens_per_pair: dict, n_params: int, epochs: int, cuda: bool) -> list:
    """Per trained student of each finished cell: pairs/s (the trainer's train_samples_per_second) and MFU."""
    rows = []
    for c in cells:
        for m in c["methods"]:
            log = run_dir / c["dir"] / "logs" / f"{m['label']}.jsonl"
            if not log.is_file():
                continue
            last = [json.loads(x) for x in log.read_text().splitlines() if x.strip()][-1]
            if "train_runtime" not in last:
                continue
            tok_s = tokens_per_pair[c["source"]] * last["train_samples_per_second"]
            rows.append(
                {
                    "source": c["source"],
                    "seed": c["seed"],
                    "model": m["label"],
                    "seconds": last["train_runtime"],
                    "pairs_per_s": last["train_samples_per_second"],
                    "mfu_pct": round(100 * 6 * n_params * tok_s / (PEAK_TFLOPS * 1e12), 2) if cuda else None,
                }
            )
    return rows


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.select_lrs is None:
        a.select_lrs = [1e-3, 3e-3] if a.smoke else [1e-5, 2e-5, 5e-5]
    if a.val_pairs is None:
        a.val_pairs = 24 if a.smoke else 240
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    import transformers

    transformers.logging.set_verbosity_error()
    from w2s_shift.data.render import encode_pairs
    from w2s_shift.metrics.claims import four_claims
    from w2s_shift.models.loading import load_backbone
    from w2s_shift.pipeline import prepare_data, run
    from w2s_shift.pipeline.select import select_student_settings
    from w2s_shift.report import aggregate, write_report
    from w2s_shift.report.claims import claim_cells

    summary = {"device": torch.cuda.get_device_name(0) if cuda else "CPU", "smoke": a.smoke, "steps": {}}
    summary["skipped"] = [] if cuda else ["peak GPU memory (no CUDA)", "MFU against the H200 peak (no CUDA)"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_cfg(a, Path(tmp))
        run_dir = Path(cfg.output_dir)
        budget = Budget(a.budget_s - (time.time() - t0))
        budget.start()
        interrupted = None
        try:
            ts = time.time()
            if a.select_lrs:
                sel = select_student_settings(cfg, a.select_lrs, [cfg.student.epochs], a.val_pairs, out / "select")
                cfg.student.learning_rate = sel["chosen"]["learning_rate"]
                summary["selection"] = {k: sel[k] for k in ("chosen", "validation", "rule", "trials")}
            summary["steps"]["select"] = round(time.time() - ts, 1)
            ts = time.time()
            run(cfg, overwrite=True)
            summary["steps"]["grid"] = round(time.time() - ts, 1)
        except KeyboardInterrupt:
            if not budget.fired:
                raise
            interrupted = f"time budget of {a.budget_s:.0f} s reached; the report holds the cells that finished"
        finally:
            budget.cancel()
        summary["interrupted"] = interrupted
        cells = finished_cells(run_dir)
        summary["cells_finished"] = [f"{c['source']}/seed{c['seed']}" for c in cells]
        if interrupted and cells:  # rebuild the report from the finished cells
            metrics = {"cells": cells, "aggregate": aggregate(cells), "config": cfg.model_dump(mode="json")}
            write_report(run_dir, metrics)
        loaded = load_backbone(cfg.student.name)
        n_params = C.non_embedding_params(loaded.backbone)
        tokens = {}
        for src in cfg.data.sources:
            splits, _, _ = prepare_data(cfg, src, cfg.seeds[0])
            enc, _ = encode_pairs(splits["student_train"], loaded.tokenizer, cfg.student.max_length)
            tokens[src.display] = C.real_tokens(enc) / max(len(enc), 1)
        summary["student_non_embedding_params"] = n_params
        summary["tokens_per_pair"] = tokens
        summary["speed"] = student_speed(run_dir, cells, tokens, n_params, cfg.student.epochs, cuda)
        summary["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
        claims = {}
        for src in dict.fromkeys(c["source"] for c in cells):
            sc = [c for c in cells if c["source"] == src]
            claims[src] = four_claims(claim_cells(run_dir, sc), sc[0]["methods"], n_boot=cfg.bootstrap, seed=0)
        summary["claims"] = claims
        summary["wall_s"] = round(time.time() - t0, 1)
        md = summary_markdown(summary)
        (out / "gpu_evidence.json").write_text(json.dumps(summary, indent=1, default=str))
        (out / "gpu_evidence.md").write_text(md)
        if (run_dir / "report.md").is_file():
            (out / "report.md").write_text((run_dir / "report.md").read_text())
        print(md, flush=True)
    return 0


def summary_markdown(s: dict) -> str:
    """The summary as Markdown: the verdict table per source, speed per student, memory, what was skipped."""
    lines = [f"# evidence-full on {s['device']}" + (" (smoke: tiny random-init models)" if s["smoke"] else ""), ""]
    if s.get("selection"):
        sel = s["selection"]
        lines.append(
            f"Student lr chosen on {sel['validation']['pairs']} gold validation pairs: "
            f"{sel['chosen']['learning_rate']:g} ({len(sel['trials'])} tried; " + sel["rule"] + ")."
        )
    if s.get("interrupted"):
        lines.append(f"Stopped: {s['interrupted']}.")
    lines += [f"Cells finished: {', '.join(s['cells_finished']) or 'none'}; wall {s['wall_s']:.0f} s.", ""]
    for src, claims in s["claims"].items():
        lines += [f"## {src}", "", "| claim | comparison | Δ (pp) [95% interval] | verdict |", "|---|---|---|---|"]
        for c in claims:
            if not c["rows"]:
                lines.append(f"| ({c['claim']}) | – | – | {c['verdict']} |")
            for r in c["rows"]:
                st = r["stat"]
                ci = st.get("ci")
                val = f"{st['value']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " [n/a]")
                lines.append(f"| ({c['claim']}) | {r['what']} | {val} | {c['verdict']} |")
        lines.append("")
    if s["speed"]:
        pps = [r["pairs_per_s"] for r in s["speed"]]
        mfu = [r["mfu_pct"] for r in s["speed"] if r["mfu_pct"] is not None]
        lines.append(
            f"Training: {len(pps)} students, median {C.median(pps):.1f} pairs/s"
            + (f", median MFU {C.median(mfu):.1f}%" if mfu else "")
            + f"; peak GPU memory {s['peak_gpu_gib']} GiB."
            if s["peak_gpu_gib"] is not None
            else f"Training: {len(pps)} students, median {C.median(pps):.1f} pairs/s."
        )
    lines.append(f"Seconds per step: {s['steps']}.")
    if s["skipped"]:
        lines.append("Skipped here: " + "; ".join(s["skipped"]) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""One device call that decides the paper's four claims on whole-network students: ``evidence-full`` on one GPU.

Steps, under one time budget (``--budget-s``, 360 s by default, counted from the start of benchmarks/gpu_evidence.sh,
which exports W2S_EVIDENCE_T0 before anything else, or else from this process's start, never from after
``import torch``; the shell adds a hard stop at 420 s from its start, so that the machine's start (~3 min), the four
staging calls (~80 s) and this call leave ~220 s of one session's 15 device minutes for a retry: a staging call
again, or this call again with a short ``--budget-s``, which resumes from the finished stages while the machine is
warm):
  1. the student's learning rate chosen on gold validation pairs carved from the student-train pool
     (``w2s_shift.pipeline.select``: the ceiling at each of ``--select-lrs``, one epoch, first source, seed 0);
     the choice is applied to every student of the grid (the W2S students never see gold labels);
  2. the grid (``w2s_shift.pipeline.run``) with that learning rate; when the budget runs out the run is
     interrupted between steps (it resumes from its finished stages when run again) and the report is built from
     the cells that finished;
  3. the summary: the four claims' verdicts with their paired intervals (``w2s_shift.metrics.claims``), per trained
     student pairs/s and MFU, the process's peak GPU memory, wall time per step. It is written at the start, after
     the selection and after every finished cell (a thread watches the run directory), so a hard stop still leaves
     the cells that finished in ``gpu_evidence.md`` / ``.json``.

Sizing: :func:`estimate_seconds` is ``w2s-shift plan``'s time model (w2s_shift.plan.gpu_seconds) of the grid and the
selection at SIZING_MFU = 5% of 989 TFLOP/s (H100 bf16 dense; a 135M-parameter student at 32 x 128-token pairs a
step is bound by kernel launches and the Trainer's per-step work, not by FLOPs: an assumption until it is measured)
plus OVERHEAD_S for loading, the teacher and the summary, plus TRAINING_FIXED_S per training (measured on a CPU: the
costs besides FLOPs). evidence-full does not fit one call (about 1,200 s, ~180 s a cell): the budget stops it after the
cells :func:`cells_within` expects (at least one at the default budget; tests/test_benchmarks_smoke.py), the summary
holds those, and the call says so before it starts.

MFU = 6 N tokens/s / peak, N = the student's non-embedding parameters, tokens = the real tokens of the student-train
pairs (chosen + rejected) x epochs / training seconds, peak = 790 TFLOP/s (the bf16 matrix rate measured on one
H200, from the protocol's cost table; not measured by this project); an ANCHOR student with a frozen copy would
add 2 N per token (this preset reads cached reference states instead).

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


def process_start() -> tuple:
    """(epoch seconds, source) the time budget counts from: W2S_EVIDENCE_T0 (gpu_evidence.sh's start), else this
    process's start (field 22 of /proc/self/stat: clock ticks after boot, proc(5)), else now."""
    env = os.environ.get("W2S_EVIDENCE_T0")
    if env:
        try:
            return float(env), "gpu_evidence.sh start"
        except ValueError:
            pass
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK"), "process start"
    except (OSError, ValueError, IndexError):
        return time.time(), "script start"


T0, T0_SOURCE = process_start()  # before the imports below: torch alone takes seconds
os.environ.setdefault("TQDM_DISABLE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the package from this checkout when it is not installed (the H200)

import _common as C  # noqa: E402
import torch  # noqa: E402

PEAK_TFLOPS = 790.0
SIZING_MFU = 0.05  # assumed share of the H100's 989 TFLOP/s a 135M student reaches (see the module docstring)
OVERHEAD_S = 60.0  # loading the models, the teacher's training and labelling, the final summary
# seconds every training costs besides its FLOPs (building the student, the Trainer, checkpoints, its scoring, drift
# and mechanism passes): the median student stage of this script's --smoke (tiny models: FLOPs ~0), 6.6 s on the 2-core
# avx512_bf16 EPYC under load, 2026-12-07; a GPU host's faster CPU may take less, CUDA's set-up more
TRAINING_FIXED_S = 6.6

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
    ap.add_argument(
        "--work",
        default=os.environ.get("W2S_EVIDENCE_WORK", "/tmp/w2s-evidence-work"),
        help="run and select folders (default /tmp/w2s-evidence-work): never under --out, since a device call "
        "returns at most 8 files of $OUT and a run directory holds thousands (weights, checkpoints, rewards)",
    )
    ap.add_argument("--run-dir", default=None, help="run directory (default <work>/run)")
    ap.add_argument(
        "--select-lrs",
        type=float,
        nargs="*",
        default=None,
        help="lrs to choose from (default 1e-5 2e-5 5e-5; "
        "--smoke: 1e-3 3e-3, where a tiny random-init model moves); none: keep the config's",
    )
    ap.add_argument("--val-pairs", type=int, default=None, help="gold validation pairs (default 240; --smoke 24)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="stop the grid this many seconds after gpu_evidence.sh (else this process) started (default 360: the "
        "shell's hard stop is 420 s, leaving one session's 15 device minutes room for a retry; benchmarks/README.md)",
    )
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

    over = [f"output_dir={a.run_dir or Path(a.work) / 'run'}"]
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


class CellWatcher:
    """Calls ``on_cell()`` from a background thread each time another cell's ``metrics.json`` appears under
    ``run_dir`` (polled every ``every`` seconds); an error in ``on_cell`` is printed, not raised."""

    def __init__(self, run_dir: Path, on_cell, every: float = 5.0):
        self.run_dir, self.on_cell, self.every = Path(run_dir), on_cell, every
        self._stop, self._seen, self._t = threading.Event(), 0, None

    def _loop(self):
        while not self._stop.wait(self.every):
            n = len(list(self.run_dir.glob("*/seed*/metrics.json")))
            if n > self._seen:
                self._seen = n
                try:
                    self.on_cell()
                except Exception as e:  # noqa: BLE001 -- a failed interim summary must not stop the grid
                    print(f"interim summary failed: {type(e).__name__}: {e}", flush=True)

    def start(self):
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def stop(self):
        self._stop.set()
        if self._t is not None:
            self._t.join()


def estimate_seconds(cfg, lrs: list, val_pairs: int) -> dict:
    """``w2s-shift plan``'s time model of this call at SIZING_MFU: the grid (every cell), the selection (one ceiling
    training per lr on the student-train pairs, scored on ``val_pairs``) and OVERHEAD_S, in seconds.

    Raises:
        ValueError: the student is not a shape the planner knows (w2s_shift.plan.resolve)."""
    from w2s_shift.plan import Plan, gpu_seconds, known_shape, run_defaults, shape_from_config_json

    shape = known_shape(cfg.student.name) or shape_from_config_json(cfg.student.name)
    d = run_defaults(cfg, shape)
    grid = gpu_seconds(Plan(shape, mfu=SIZING_MFU, **d))
    sel = {k: d[k] for k in ("seq_len", "batch_size", "grad_accum", "precision", "epochs", "pairs")}
    select = gpu_seconds(Plan(shape, method="naive", mfu=SIZING_MFU, students=len(lrs), eval_pairs=val_pairs, **sel))
    trainings = d["cells"] * (d["students"] + 1) + len(lrs)  # every cell's teacher and students, the selection
    fixed = trainings * TRAINING_FIXED_S
    per_cell = (grid + d["cells"] * (d["students"] + 1) * TRAINING_FIXED_S) / d["cells"]
    return {
        "grid": round(grid, 1),
        "select": round(select, 1),
        "overhead": OVERHEAD_S,
        "fixed": round(fixed, 1),
        "total": round(grid + select + OVERHEAD_S + fixed, 1),
        "per_cell": round(per_cell, 1),
        "select_fixed": round(len(lrs) * TRAINING_FIXED_S, 1),
        "cells": d["cells"],
    }


def cells_within(est: dict, budget_s: float) -> int:
    """How many of the grid's cells :func:`estimate_seconds` expects to finish within ``budget_s`` seconds (the
    selection, the overhead and the selection's fixed costs first)."""
    left = budget_s - est["select"] - est["select_fixed"] - est["overhead"]
    return max(0, min(est["cells"], int(left // est["per_cell"]))) if est["per_cell"] > 0 else est["cells"]


def finished_cells(run_dir: Path) -> list:
    """metrics.json of every cell that finished (``<source>/seed<k>/metrics.json``), sources and seeds in order."""
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("*/seed*/metrics.json"))]


def student_speed(run_dir: Path, cells: list, tokens_per_pair: dict, n_params: int, epochs: int, cuda: bool) -> list:
    """Per trained student of each finished cell: pairs/s (the trainer's train_samples_per_second) and MFU (None
    without CUDA or before the tokens per pair are known)."""
    rows = []
    for c in cells:
        for m in c["methods"]:
            log = run_dir / c["dir"] / "logs" / f"{m['label']}.jsonl"
            if not log.is_file():
                continue
            last = [json.loads(x) for x in log.read_text().splitlines() if x.strip()][-1]
            if "train_runtime" not in last:
                continue
            tok = (tokens_per_pair or {}).get(c["source"])
            mfu = None
            if cuda and tok and n_params:
                mfu = round(100 * 6 * n_params * tok * last["train_samples_per_second"] / (PEAK_TFLOPS * 1e12), 2)
            rows.append(
                {
                    "source": c["source"],
                    "seed": c["seed"],
                    "model": m["label"],
                    "seconds": last["train_runtime"],
                    "pairs_per_s": last["train_samples_per_second"],
                    "mfu_pct": mfu,
                }
            )
    return rows


class Summary:
    """``summary`` (a dict) completed from the finished cells of ``run_dir`` and written to ``out`` as
    gpu_evidence.json and gpu_evidence.md; :meth:`write` is safe to call from the cell watcher's thread."""

    def __init__(self, out: Path, run_dir: Path, cfg, summary: dict, cuda: bool):
        self.out, self.run_dir, self.cfg, self.s, self.cuda = out, run_dir, cfg, summary, cuda
        self.tokens, self.n_params, self._lock = None, None, threading.Lock()

    def write(self) -> str:
        from w2s_shift.metrics.claims import four_claims
        from w2s_shift.results.verdicts import claim_cells

        with self._lock:
            s, cells = self.s, finished_cells(self.run_dir)
            s["cells_finished"] = [f"{c['source']}/seed{c['seed']}" for c in cells]
            s["student_non_embedding_params"] = self.n_params
            s["tokens_per_pair"] = self.tokens
            s["speed"] = student_speed(
                self.run_dir, cells, self.tokens, self.n_params, self.cfg.student.epochs, self.cuda
            )
            s["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if self.cuda else None
            claims = {}
            for src in dict.fromkeys(c["source"] for c in cells):
                sc = [c for c in cells if c["source"] == src]
                claims[src] = four_claims(
                    claim_cells(self.run_dir, sc), sc[0]["methods"], n_boot=self.cfg.bootstrap, seed=0
                )
            s["claims"] = claims
            s["wall_s"] = round(time.time() - T0, 1)
            md = summary_markdown(s)
            (self.out / "gpu_evidence.json").write_text(json.dumps(s, indent=1, default=str))
            (self.out / "gpu_evidence.md").write_text(md)
            return md


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.select_lrs is None:
        a.select_lrs = [1e-3, 3e-3] if a.smoke else [1e-5, 2e-5, 5e-5]
    if a.val_pairs is None:
        a.val_pairs = 24 if a.smoke else 240
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if Path(a.work).resolve().is_relative_to(out.resolve()) or (
        a.run_dir and Path(a.run_dir).resolve().is_relative_to(out.resolve())
    ):
        raise SystemExit(f"--work / --run-dir must lie outside --out {out}: a device call returns at most 8 files")
    cuda = torch.cuda.is_available()
    import transformers

    transformers.logging.set_verbosity_error()
    from w2s_shift.data.render import encode_pairs
    from w2s_shift.models.loading import load_backbone
    from w2s_shift.pipeline import prepare_data, run
    from w2s_shift.pipeline.select import select_student_settings
    from w2s_shift.report import write_report
    from w2s_shift.results import aggregate

    summary = {"device": torch.cuda.get_device_name(0) if cuda else "CPU", "smoke": a.smoke, "steps": {}}
    summary["skipped"] = [] if cuda else ["peak GPU memory (no CUDA)", "MFU against the H200 peak (no CUDA)"]
    summary["budget"] = f"{a.budget_s:.0f} s from {T0_SOURCE}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_cfg(a, Path(tmp))
        run_dir = Path(cfg.output_dir)
        try:
            summary["estimate_s"] = estimate_seconds(cfg, a.select_lrs, a.val_pairs)
        except ValueError as e:
            summary["estimate_s"] = f"not estimated: {e}"
        print(f"estimated seconds (plan's time model, {SIZING_MFU:.0%} MFU): {summary['estimate_s']}", flush=True)
        if isinstance(summary["estimate_s"], dict):
            k = cells_within(summary["estimate_s"], a.budget_s)
            summary["cells_expected"] = k
            n = summary["estimate_s"]["cells"]
            print(f"expected within the {a.budget_s:.0f} s budget: {k} of {n} cells", flush=True)
        writer = Summary(out, run_dir, cfg, summary, cuda)
        summary["interrupted"] = "not finished yet (an interim summary, rewritten after every cell)"
        writer.write()
        budget = Budget(T0 + a.budget_s - time.time())
        budget.start()
        watcher = CellWatcher(run_dir, writer.write)
        watcher.start()
        interrupted = None
        try:
            ts = time.time()
            if a.select_lrs:
                sel = select_student_settings(
                    cfg, a.select_lrs, [cfg.student.epochs], a.val_pairs, Path(a.work) / "select"
                )
                cfg.student.learning_rate = sel["chosen"]["learning_rate"]
                summary["selection"] = {k: sel[k] for k in ("chosen", "validation", "rule", "trials")}
            summary["steps"]["select"] = round(time.time() - ts, 1)
            writer.write()
            ts = time.time()
            run(cfg, overwrite=True)
            summary["steps"]["grid"] = round(time.time() - ts, 1)
        except KeyboardInterrupt:
            if not budget.fired:
                raise
            interrupted = f"time budget of {a.budget_s:.0f} s reached; the report holds the cells that finished"
        finally:
            budget.cancel()
            watcher.stop()
        summary["interrupted"] = interrupted
        cells = finished_cells(run_dir)
        if interrupted and cells:  # rebuild the report from the finished cells
            metrics = {"cells": cells, "aggregate": aggregate(cells), "config": cfg.model_dump(mode="json")}
            write_report(run_dir, metrics)
        writer.write()  # the verdicts before the slower token count below, in case the hard stop comes
        loaded = load_backbone(cfg.student.name)
        writer.n_params = C.non_embedding_params(loaded.backbone)
        tokens = {}
        for src in cfg.data.sources:
            splits, _, _ = prepare_data(cfg, src, cfg.seeds[0])
            enc, _ = encode_pairs(splits["student_train"], loaded.tokenizer, cfg.student.max_length)
            tokens[src.display] = C.real_tokens(enc) / max(len(enc), 1)
        writer.tokens = tokens
        md = writer.write()
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
    est = s.get("estimate_s")
    if isinstance(est, dict):
        lines.append(
            f"Estimated before the run: {est['total']:.0f} s (plan's time model at {SIZING_MFU:.0%} MFU, and "
            f"{TRAINING_FIXED_S:g} s of fixed costs per training); {s.get('cells_expected', '?')} of {est['cells']} "
            "cells expected within the budget."
        )
    lines += [
        f"Cells finished: {', '.join(s['cells_finished']) or 'none'}; wall {s['wall_s']:.0f} s "
        f"(budget {s.get('budget', '?')}).",
        "",
    ]
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

"""Benchmark 4: one call on an H200 (no internet, no installs): the paper's model shapes, Naive vs ANCHOR.

Part A, shapes: random-init decoders of the paper's shapes (Qwen2.5-0.5B, Qwen2.5-1.5B, Llama-3.2-1B,
Llama-3.1-8B) in bfloat16 (weights, gradients and AdamW states), SDPA attention, fixed-length sequences of
random token ids (``--seq-len``, 1024 as in protocol.md), trained with ``w2s_shift.training.train_pairs`` as
  naive    soft Bradley-Terry,
  frozen   ANCHOR with a frozen copy run every step,
  cached   ANCHOR reading reference states computed once (``compute_reference_states``); the cache's
           forward time is reported beside it and amortised over a grid of G runs.
Per row: pairs/s (steps after the warm-up), peak GiB (``torch.cuda.max_memory_allocated``, model built
inside the window), and MFU = 6 N tokens/s (8 N with a frozen-copy forward) / 790 TFLOP/s, N = non-embedding
parameters, tokens = all positions of the (2B, T) batch.

Part B, real lengths (Qwen2.5-0.5B shape, 16 pairs a step): pairs with the token lengths of real
UltraFeedback pairs (``ultrafeedback_lengths.json`` beside this script, made with --write-lengths) and random
ids, one epoch: TRL's RewardTrainer (when ``trl`` and ``datasets`` import; carried as wheels) against ours with
plain shuffling and with length-grouped batches.

A time guard (--budget-s) skips what would not finish in time; everything measured is printed as one table
and written as JSON (--json, e.g. $OUT/gpu_h200.json).

    bash benchmarks/gpu_h200.sh                      # on the H200 (see benchmarks/README.md)
    python benchmarks/gpu_h200.py --smoke            # CPU, tiny shapes, seconds (a test of the script)
    python benchmarks/gpu_h200.py --write-lengths    # here: rebuild ultrafeedback_lengths.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the package from this checkout when it is not installed (the H200)

import _common as C
import torch

warnings.filterwarnings("ignore", category=FutureWarning)
PEAK_TFLOPS = 790.0  # bf16 matrix rate measured on one H200 (the protocol's cost table; not by this project)
LENGTHS = HERE / "ultrafeedback_lengths.json"

# name: (family, hidden, layers, heads, kv_heads, intermediate, vocab, pairs per step) -- the published configs
SHAPES = {
    "Qwen2.5-0.5B": ("qwen2", 896, 24, 14, 2, 4864, 151936, 16),
    "Qwen2.5-1.5B": ("qwen2", 1536, 28, 12, 2, 8960, 151936, 8),
    "Llama-3.2-1B": ("llama", 2048, 16, 32, 8, 8192, 128256, 8),
    "Llama-3.1-8B": ("llama", 4096, 32, 32, 8, 14336, 128256, 2),
}
SMOKE_SHAPES = {"tiny-qwen2": ("qwen2", 32, 2, 4, 2, 64, 512, 4), "tiny-llama": ("llama", 32, 2, 4, 2, 64, 512, 2)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="timed optimizer steps per row")
    ap.add_argument("--grid", type=int, default=4, help="G: runs sharing one reference cache")
    ap.add_argument("--real-pairs", type=int, default=928, help="part B: pairs (0 skips part B)")
    ap.add_argument("--real-batch", type=int, default=16)
    ap.add_argument("--real-max-length", type=int, default=1024)
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--budget-s", type=float, default=470.0, help="skip rows that would start after this many seconds")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and few pairs, on CPU too")
    ap.add_argument(
        "--write-lengths", action="store_true", help="rebuild ultrafeedback_lengths.json (needs the smollm2 tokenizer)"
    )
    return ap


# ------------------------------------------------------------------------------------------------------------


def _cleanup() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _fixed_pairs(n: int, seq_len: int, vocab: int, seed: int) -> list:
    """Pairs of random ids, every sequence ``seq_len`` long; the second half of each is the response."""
    from w2s_shift.data.render import Encoded, EncodedPair

    g = torch.Generator().manual_seed(seed)

    def seq():
        ids = torch.randint(3, vocab, (seq_len,), generator=g).tolist()
        return Encoded(ids, [0] * (seq_len // 2) + [1] * (seq_len - seq_len // 2), False)

    return [EncodedPair(seq(), seq()) for _ in range(n)]


def _length_pairs(n: int, max_length: int, vocab: int, seed: int) -> list:
    """``n`` pairs with the token lengths of real UltraFeedback pairs (from ultrafeedback_lengths.json) and
    random ids; response tokens are those after the prompt."""
    from w2s_shift.data.render import Encoded, EncodedPair

    rows = [r for r in json.loads(LENGTHS.read_text())["pairs"] if max(r[0], r[2]) <= max_length]
    if len(rows) < n:
        raise ValueError(f"{LENGTHS.name}: {len(rows)} pairs of at most {max_length} tokens, {n} asked for")
    rows = random.Random(seed).sample(rows, n)
    g = torch.Generator().manual_seed(seed)

    def seq(length, prompt):
        return Encoded(
            torch.randint(3, vocab, (length,), generator=g).tolist(), [0] * prompt + [1] * (length - prompt), False
        )

    return [EncodedPair(seq(c, cp), seq(r, rp)) for c, cp, r, rp in rows]


def write_lengths(max_length: int = 4096) -> None:
    """Token lengths of the bundled UltraFeedback pairs under the SmolLM2 tokenizer and chat template:
    [chosen length, chosen prompt length, rejected length, rejected prompt length] per pair."""
    from w2s_shift.data.adapters import load_named
    from w2s_shift.data.render import encode_pairs
    from w2s_shift.models.loading import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    tok.model_max_length = int(1e9)
    enc, _ = encode_pairs(load_named("ultrafeedback", skip_invalid=True).pairs, tok, max_length)

    def prompt_len(e):
        return e.response_mask.index(1) if 1 in e.response_mask else len(e.input_ids)

    rows = [
        [len(e.chosen.input_ids), prompt_len(e.chosen), len(e.rejected.input_ids), prompt_len(e.rejected)] for e in enc
    ]
    from w2s_shift.io import write_text_atomic

    head = {
        "source": "w2s_shift bundled ultrafeedback (skip_invalid), all pairs",
        "tokenizer": "smollm2-135m (SmolLM2-135M-Instruct), chat template, max_length 4096",
        "columns": ["chosen_tokens", "chosen_prompt_tokens", "rejected_tokens", "rejected_prompt_tokens"],
    }
    text = json.dumps(head)[:-1] + ', "pairs": [\n' + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n"
    write_text_atomic(LENGTHS, text)
    print(f"wrote {LENGTHS} ({len(rows)} pairs)")


def _config(shape, attn: str = "sdpa"):
    fam, h, layers, heads, kv, inter, vocab, _ = shape
    return C.decoder_config(fam, vocab, h, layers, heads, kv, inter, max_positions=8192, pad_token_id=0, attn=attn)


def _backbone(config, device: str, dtype):
    return C.make_backbone(config, seed=0, dtype=dtype, device=device)


def _pairs_of(flat: list) -> list:
    b = len(flat) // 2
    return [(flat[i], flat[i + b]) for i in range(b)]


class _StepTimes:
    """Trainer callback: a timestamp at the end of every optimizer step."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _T(TrainerCallback):
            def __init__(self):
                self.times = []

            def on_step_end(self, args, state, control, **kw):
                C._sync()
                self.times.append(time.perf_counter())

        return _T()


def measure_shape(name: str, shape, method: str, a, device: str, dtype) -> dict:
    """One row of part A: train ``warmup + steps`` steps; pairs/s over the timed steps."""
    import tempfile

    from w2s_shift.inference import compute_reference_states
    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import PairDataset, make_reference, train_pairs

    config = _config(shape)
    bsz = shape[7]
    n = bsz * (a.warmup_steps + a.steps)
    pairs = _fixed_pairs(n, a.seq_len, shape[6], seed=0)
    labels = [0.7] * n
    cache_s = 0.0
    _cleanup()
    with C.PeakMemory() as pm:
        backbone = _backbone(config, device, dtype)
        ref_states, reference = None, None
        if method == "cached":
            seqs = [p.chosen.input_ids for p in pairs] + [p.rejected.input_ids for p in pairs]
            masks = [p.chosen.response_mask for p in pairs] + [p.rejected.response_mask for p in pairs]
            C._sync()
            t = time.perf_counter()
            ref_states = _pairs_of(
                compute_reference_states(
                    backbone, seqs, masks, 0, max_tokens=2 * bsz * a.seq_len, dtype=torch.bfloat16, bf16=True
                )
            )
            C._sync()
            cache_s = time.perf_counter() - t
        if method == "frozen":
            reference = make_reference(backbone)
        model = RewardModel(backbone, config.hidden_size)  # the head stays float32 (reads the pooled state in fp32)
        cfg = C.our_config(
            epochs=1.0,
            batch_size=bsz,
            learning_rate=1e-5,
            warmup_ratio=0.0,
            bf16=True,
            seed=0,
            length_group_size=0,
            logging_steps=1000,
        )
        objective = C.our_objective(
            1e-4 if method != "naive" else 0.0, "cached" if method == "cached" else "frozen_copy", reference
        )
        timer = _StepTimes()
        with tempfile.TemporaryDirectory(prefix="w2s-h200-") as out:
            train_pairs(
                model,
                PairDataset(pairs, labels, ref_states=ref_states),
                0,
                cfg,
                out,
                callbacks=[timer],
                objective=objective,
            )
    ts = timer.times
    secs = ts[-1] - ts[a.warmup_steps - 1] if a.warmup_steps > 0 else ts[-1] - ts[0]
    timed = a.steps if a.warmup_steps > 0 else a.steps - 1
    pps = bsz * timed / secs
    tokens_s = pps * 2 * a.seq_len
    n_params = C.non_embedding_params(backbone)
    flops_per_token = (8 if method == "frozen" else 6) * n_params
    del model, backbone, reference, ref_states
    _cleanup()
    return {
        "shape": name,
        "method": method,
        "pairs_per_step": bsz,
        "pairs_per_s": pps,
        "tokens_per_s": tokens_s,
        "peak_gib": pm.peak_abs / 2**30 if torch.cuda.is_available() else pm.peak / 2**30,
        "base_gib": pm.base / 2**30,
        "mfu": flops_per_token * tokens_s / (PEAK_TFLOPS * 1e12),
        "cache_seconds": cache_s,
        "cache_pairs": n if method == "cached" else 0,
        "non_embedding_params": n_params,
    }


def _pad_tokenizer():
    """A word-level fast tokenizer with only pad/eos/unk: TRL needs a processing_class for its pad id; the
    data are already token ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def real_lengths_rows(a, device: str, dtype, shape, deadline: float) -> tuple:
    """Part B: one epoch over real-length pairs; TRL (if importable) vs ours shuffled, length-grouped, and
    length-grouped + padding-free packed (block-diagonal SDPA mask from restarting position_ids)."""
    import tempfile

    from w2s_shift.models.reward_model import RewardModel
    from w2s_shift.training import PairDataset, train_pairs

    config = _config(shape)
    pairs = _length_pairs(a.real_pairs, a.real_max_length, shape[6], seed=0)
    real = C.real_tokens(pairs)
    rows, skipped = [], []
    trl_reason = "skipped (--no-trl)" if a.no_trl else None
    if trl_reason is None:
        try:
            from datasets import Dataset
            from transformers import AutoModelForSequenceClassification
            from trl import RewardConfig, RewardTrainer
        except Exception as e:  # noqa: BLE001 -- not carried, or any version clash raised inside the import
            trl_reason = f"{type(e).__name__}: {e}"
    variants = []
    if trl_reason is None:
        import trl

        for ckpt in (False, True):
            variants.append(
                (
                    f"TRL RewardTrainer {trl.__version__}" + (" (defaults: grad. checkpointing)" if ckpt else ""),
                    "trl",
                    ckpt,
                )
            )
    variants += [
        ("ours Naive, plain shuffle, padded", "ours", (0, False)),
        ("ours Naive, length-grouped, padded", "ours", (16, False)),
        ("ours Naive, length-grouped, packed", "ours", (16, True)),
    ]
    for name, kind, opt in variants:
        if time.perf_counter() > deadline:
            skipped.append(name)
            continue
        _cleanup()
        with C.PeakMemory() as pm, tempfile.TemporaryDirectory(prefix="w2s-h200-") as out:
            timer = C.LoopTimer()
            if kind == "trl":
                cfg = config.__class__.from_dict({**config.to_dict(), "num_labels": 1})
                cfg._attn_implementation = "sdpa"
                torch.manual_seed(0)
                with torch.device(device):
                    model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype)
                ds = Dataset.from_dict(
                    {
                        "chosen_ids": [p.chosen.input_ids for p in pairs],
                        "rejected_ids": [p.rejected.input_ids for p in pairs],
                    }
                )
                args = RewardConfig(
                    output_dir=out,
                    per_device_train_batch_size=a.real_batch,
                    num_train_epochs=1,
                    learning_rate=1e-5,
                    bf16=True,
                    gradient_checkpointing=opt,
                    max_length=a.real_max_length,
                    report_to="none",
                    save_strategy="no",
                    logging_steps=10,
                    seed=0,
                    dataloader_num_workers=0,
                    disable_tqdm=True,
                    use_cpu=device == "cpu",
                )
                trainer = RewardTrainer(
                    model=model, args=args, train_dataset=ds, processing_class=_pad_tokenizer(), callbacks=[timer]
                )
                trainer.train()
                del trainer
            else:
                backbone = _backbone(config, device, dtype)
                model = RewardModel(backbone, config.hidden_size)
                cfg = C.our_config(
                    epochs=1.0,
                    batch_size=a.real_batch,
                    learning_rate=1e-5,
                    warmup_ratio=0.0,
                    bf16=True,
                    seed=0,
                    length_group_size=opt[0],
                    packing=opt[1],
                )
                train_pairs(model, PairDataset(pairs, [0.7] * len(pairs)), 0, cfg, out, callbacks=[timer])
                del backbone
            del model
        rows.append(
            {
                "variant": name,
                "pairs_per_s": len(pairs) / timer.seconds,
                "tokens_per_s": real / timer.seconds,
                "peak_gib": (pm.peak_abs if torch.cuda.is_available() else pm.peak) / 2**30,
                "seconds": timer.seconds,
            }
        )
        print(f"B {name}: {timer.seconds:.1f} s", file=sys.stderr, flush=True)
    _cleanup()
    return rows, trl_reason, skipped


def main(argv: list | None = None) -> dict:
    a = build_parser().parse_args(argv)
    if a.write_lengths:
        write_lengths()
        return {}
    t_start = time.perf_counter()
    deadline = t_start + a.budget_s
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SMOKE_SHAPES if a.smoke else {k: SHAPES[k] for k in a.shapes.split(",") if k}
    if a.smoke:
        a.seq_len, a.warmup_steps, a.steps, a.real_pairs, a.real_batch, a.real_max_length = 64, 1, 2, 8, 4, 256
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    import transformers

    transformers.logging.set_verbosity_error()

    rows_a, skipped = [], []
    for name, shape in shapes.items():
        for method in ("naive", "frozen", "cached"):
            if time.perf_counter() > deadline:
                skipped.append(f"{name} {method}")
                continue
            try:
                r = measure_shape(name, shape, method, a, device, dtype)
            except torch.cuda.OutOfMemoryError as e:
                r = {"shape": name, "method": method, "error": f"out of memory: {str(e)[:200]}"}
                _cleanup()
            rows_a.append(r)
            print(f"A {name} {method}: {r.get('pairs_per_s', float('nan')):.2f} pairs/s", file=sys.stderr, flush=True)
            if a.json:  # a partial file survives a hard stop
                C.write_json(a.json, {"benchmark": "gpu_h200", "partial": True, "part_a": rows_a})
    rows_b, trl_reason, skipped_b = ([], "part B off (--real-pairs 0)", [])
    if a.real_pairs > 0:
        base = shapes.get("Qwen2.5-0.5B") or next(iter(shapes.values()))
        rows_b, trl_reason, skipped_b = real_lengths_rows(a, device, dtype, base, deadline)
    skipped += skipped_b

    # ---- one table --------------------------------------------------------------------------------------
    table = []
    naive = {r["shape"]: r for r in rows_a if r["method"] == "naive" and "error" not in r}
    for r in rows_a:
        if "error" in r:
            table.append([f"A {r['shape']}", r["method"], "–", "–", "–", "–", r["error"][:60]])
            continue
        n = naive.get(r["shape"])
        rel = n["pairs_per_s"] / r["pairs_per_s"] if n else None
        note = ""
        if r["method"] == "cached" and n:
            per_pair_cache = r["cache_seconds"] / r["cache_pairs"]
            t_run = 1 / r["pairs_per_s"]
            one = (t_run + per_pair_cache) * n["pairs_per_s"]
            grid = (t_run + per_pair_cache / a.grid) * n["pairs_per_s"]
            r.update(time_vs_naive_single_run=one, time_vs_naive_grid=grid)
            note = f"cache {1000 * per_pair_cache:.1f} ms/pair; 1 run {one:.2f}x, grid of {a.grid} {grid:.2f}x"
        table.append(
            [
                f"A {r['shape']} ({r['pairs_per_step']}/step)",
                r["method"],
                f"{r['pairs_per_s']:.1f}",
                f"{100 * r['mfu']:.0f}%",
                f"{r['peak_gib']:.1f}",
                "–" if rel is None else f"{rel:.2f}x",
                note,
            ]
        )
    for r in rows_b:
        table.append(
            [
                f"B real lengths ({a.real_pairs} pairs, {a.real_batch}/step)",
                r["variant"],
                f"{r['pairs_per_s']:.1f}",
                "–",
                f"{r['peak_gib']:.1f}",
                "–",
                f"{r['tokens_per_s']:.0f} real tokens/s",
            ]
        )
    dev = torch.cuda.get_device_name(0) if cuda else "CPU (smoke: float32, not a measurement)"
    print(
        f"\nH200 benchmark: {dev}; torch {torch.__version__}, transformers {transformers.__version__}; "
        "part A random ids "
        f"x {a.seq_len} tokens, {a.warmup_steps} warm-up + {a.steps} timed steps; MFU vs {PEAK_TFLOPS:.0f} TFLOP/s; "
        f"wall {time.perf_counter() - t_start:.0f} s"
    )
    if trl_reason:
        print(f"TRL not run: {trl_reason}")
    if skipped:
        print(f"skipped by the time guard ({a.budget_s:.0f} s): {', '.join(skipped)}")
    print(C.markdown_table(["part / shape", "method", "pairs/s", "MFU", "peak GiB", "time vs naive", "note"], table))
    out = {
        "benchmark": "gpu_h200",
        "args": vars(a),
        "env": C.environment(),
        "part_a": rows_a,
        "part_b": rows_b,
        "trl_skipped": trl_reason,
        "skipped": skipped,
        "wall_seconds": time.perf_counter() - t_start,
    }
    if a.json:
        C.write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()

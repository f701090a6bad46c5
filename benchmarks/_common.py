"""Shared pieces of the benchmarks: real pairs, random-init decoder shapes, timing, peak memory, tables.

Not part of the package: imported by the scripts beside it (``python benchmarks/NAME.py`` puts this folder
on ``sys.path``) and by ``tests/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import inspect
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

#: --smoke sizes shared by the benchmarks: one round of 8 pairs on a tiny random-init decoder (a check that the
#: script runs, not a measurement)
SMOKE = {
    "rounds": 1,
    "pairs": 8,
    "batch_size": 4,
    "max_length": 96,
    "hidden": 32,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 64,
}

# ------------------------------------------------------------------------------------------------------------
# data


def real_pairs(n: int, tokenizer, max_length: int, dataset: str = "ultrafeedback", seed: int = 0) -> list:
    """``n`` pairs of a bundled dataset, encoded with the project's renderer (prompt truncated first).

    The pairs are a seeded random sample, so their token lengths follow the dataset's real distribution.

    Returns:
        list of :class:`w2s_shift.data.render.EncodedPair`.

    Raises:
        ValueError: the dataset holds fewer than ``n`` valid pairs.
    """
    from w2s_shift.data.adapters import load_named
    from w2s_shift.data.render import encode_pairs

    pairs = load_named(dataset, skip_invalid=True).pairs
    if len(pairs) < n:
        raise ValueError(f"{dataset}: {len(pairs)} valid pairs, {n} asked for")
    pairs = random.Random(seed).sample(pairs, n)
    tokenizer.model_max_length = int(1e9)  # truncation is the renderer's (prompt first)
    enc, _ = encode_pairs(pairs, tokenizer, max_length)
    return enc


def padding_share(pairs: list, batches: list) -> float:
    """Share of padded positions (in %) when ``batches`` (lists of pair indices) are padded to their longest
    sequence, chosen and rejected in one tensor (2B, T)."""
    real = pad = 0
    for b in batches:
        lens = [len(pairs[i].chosen.input_ids) for i in b] + [len(pairs[i].rejected.input_ids) for i in b]
        real += sum(lens)
        pad += max(lens) * len(lens) - sum(lens)
    return 100.0 * pad / max(1, real + pad)


def add_model_shape_args(ap) -> None:
    """The random-init Qwen2-shaped model's options shared by the CPU benchmarks (defaults: hidden 256, 4 layers,
    4 heads, 2 KV heads, FFN 1024)."""
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)


def shared_model(a, tok) -> tuple:
    """The Qwen2-shaped config of ``add_model_shape_args``'s options and one seeded random init's state dict,
    which every variant of a benchmark loads (same weights everywhere)."""
    config = decoder_config(
        "qwen2",
        len(tok),
        a.hidden,
        a.layers,
        a.heads,
        a.kv_heads,
        a.intermediate,
        max_positions=max(4096, a.max_length),
        pad_token_id=tok.pad_token_id,
    )
    return config, {k: v.clone() for k, v in make_backbone(config, seed=0).state_dict().items()}


def packed_padding_share(pairs: list, batches: list) -> float:
    """Share of computed positions (in %) that are not real tokens when each batch's 2B sequences are packed
    as the trainer packs them (:func:`w2s_shift.models.reward_model.pack_sequences`, rows as wide as the
    widest packed row)."""
    from w2s_shift.models.reward_model import pack_sequences

    real = total = 0
    for b in batches:
        lens = [len(pairs[i].chosen.input_ids) for i in b] + [len(pairs[i].rejected.input_ids) for i in b]
        rows = pack_sequences(lens, max(lens))
        real += sum(lens)
        total += len(rows) * max(sum(lens[i] for i in r) for r in rows)
    return 100.0 * (total - real) / max(1, total)


def real_tokens(pairs: list) -> int:
    """Non-padding tokens of the pairs (chosen + rejected)."""
    return sum(p.n_tokens for p in pairs)


# ------------------------------------------------------------------------------------------------------------
# models


def decoder_config(
    family: str,
    vocab_size: int,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_positions: int = 4096,
    pad_token_id: int = 0,
    attn: str = "sdpa",
):
    """A Hugging Face config of a Qwen2- or Llama-shaped decoder (random init; no download)."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[family]
    cfg = cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
        use_cache=False,
    )
    cfg._attn_implementation = attn
    return cfg


def non_embedding_params(backbone: torch.nn.Module) -> int:
    """Parameters of a decoder backbone outside its input embedding (the N of the 6N FLOPs/token rule)."""
    emb = backbone.get_input_embeddings()
    n_emb = sum(p.numel() for p in emb.parameters()) if emb is not None else 0
    return sum(p.numel() for p in backbone.parameters()) - n_emb


def make_backbone(config, seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A random-init ``AutoModel`` (decoder without LM head) built from ``config`` with a fixed seed."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModel.from_config(config, dtype=dtype)
    return model


def our_config(**kw):
    """``PairTrainingArguments(**kw)`` keeping only the fields this version of the package has (the API grows);
    checkpointing is switched off so that no save lands inside a timed run."""
    from w2s_shift.training import PairTrainingArguments

    names = {f.name for f in dataclasses.fields(PairTrainingArguments)}
    for old, new in (("epochs", "num_train_epochs"), ("lr_scheduler", "lr_scheduler_type")):  # TrainingArguments' names
        if old in kw:
            kw[new] = kw.pop(old)
    kw.setdefault("checkpoint_fraction", 0.0)
    kw.setdefault("logging_steps", 10)
    return PairTrainingArguments(**{k: v for k, v in kw.items() if k in names})


def our_objective(anchor_lambda: float = 0.0, reference_mode: str = "frozen_copy", reference=None):
    """The objective of a naive (``anchor_lambda`` 0) or ANCHOR student, as the package's ANCHOR entry with that
    lambda (relative error) and reference builds it: ``reference`` is the frozen copy for ``frozen_copy``, None for
    states cached in the dataset or the adapter-disabled LoRA model."""
    from w2s_shift.methods import method_entry

    if not anchor_lambda:
        m = method_entry("naive")
        return m.method.objective(m)
    m = method_entry({"name": "anchor", "anchor_lambda": anchor_lambda, "reference": reference_mode})
    return m.method.objective(m, reference=reference)


def has_objective() -> bool:
    """Whether this version's trainer takes a method objective (ANCHOR's adapter-disabled reference included)."""
    from w2s_shift.training import train_pairs

    return "objective" in inspect.signature(train_pairs).parameters


# ------------------------------------------------------------------------------------------------------------
# timing and memory


class LoopTimer:
    """A ``transformers.TrainerCallback`` factory: seconds from the start to the end of the training loop
    (data loading, collation, forward, backward, optimizer and logging; no model or trainer set-up)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self):
                self.t0 = self.t1 = self.c0 = self.c1 = None
                self.steps = 0

            def on_train_begin(self, args, state, control, **kw):
                _sync()
                self.t0, self.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                self.steps += 1

            def on_train_end(self, args, state, control, **kw):
                _sync()
                self.t1, self.c1 = time.perf_counter(), time.process_time()

            @property
            def seconds(self) -> float:
                return self.t1 - self.t0

            @property
            def cpu_seconds(self) -> float:
                """CPU time of the whole process (all its threads) over the loop: less sensitive than wall time
                to other programs on a shared machine, most of all with one thread."""
                return self.c1 - self.c0

        return _Timer()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def train_ours(model, dataset, pad_id: int, cfg, objective=None) -> dict:
    """Run :func:`w2s_shift.training.train_pairs`; returns {seconds, cpu_seconds, steps, history} of the loop.

    Loop times come from a callback when ``train_pairs`` takes ``callbacks``, else they cover the whole call
    (and steps is None)."""
    from w2s_shift.training import train_pairs

    with tempfile.TemporaryDirectory(prefix="w2s-bench-") as out:
        if "callbacks" in inspect.signature(train_pairs).parameters:
            timer = LoopTimer()
            hist = train_pairs(model, dataset, pad_id, cfg, out, callbacks=[timer], objective=objective)
            return {"seconds": timer.seconds, "cpu_seconds": timer.cpu_seconds, "steps": timer.steps, "history": hist}
        t, c = time.perf_counter(), time.process_time()
        hist = train_pairs(model, dataset, pad_id, cfg, out, objective=objective)
        _sync()
        return {
            "seconds": time.perf_counter() - t,
            "cpu_seconds": time.process_time() - c,
            "steps": None,
            "history": hist,
        }


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
_PAGE = os.sysconf("SC_PAGE_SIZE")


def host_bytes_in_use() -> int:
    """Resident set size of this process in bytes (``/proc/self/statm``; about 20 microseconds a read, no lock:
    glibc's ``mallinfo2`` was tried and costs ~0.4 ms a call with a busy heap, which slowed the code measured)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakMemory:
    """Peak memory of the code inside ``with PeakMemory() as pm:``, in bytes above what was in use on entry.

    On CUDA it is ``torch.cuda.max_memory_allocated`` (exact, absolute: ``pm.peak_abs``); on CPU a thread
    samples the resident set size every ``interval`` seconds (short spikes can be missed), after
    ``malloc_trim`` has handed freed heap pages back so that the level on entry is not inflated by earlier runs.
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.cuda = torch.cuda.is_available()
        self.peak = self.peak_abs = 0

    def __enter__(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
        self.base = host_bytes_in_use()
        self._max = self.base
        self._stop = threading.Event()

        def poll():
            while not self._stop.is_set():
                self._max = max(self._max, host_bytes_in_use())
                time.sleep(self.interval)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_abs = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            self.peak_abs = max(self._max, host_bytes_in_use())
        self.peak = self.peak_abs - self.base
        return False


# ------------------------------------------------------------------------------------------------------------
# reporting


def median(xs: list) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def markdown_table(header: list, rows: list) -> str:
    """A GitHub markdown table; floats are printed as they come (format them first)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (the package's writer when importable, else a temp file + rename)."""
    try:
        from w2s_shift.io import write_json_atomic

        write_json_atomic(Path(path), obj)
    except ImportError:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2))
        os.replace(tmp, p)


def environment() -> dict:
    """Versions and hardware, for the JSON beside each table."""
    import platform

    import transformers

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        import trl

        env["trl"] = trl.__version__
    except ImportError:
        env["trl"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def prepare_run(a, smoke: dict) -> tuple:
    """Shared start of the training benchmarks: apply --smoke and --threads, quiet transformers, load the
    tokenizer and the real pairs. Returns (tokenizer, warm-up pairs, one list of pairs per round)."""
    if a.smoke:
        for k, v in smoke.items():
            setattr(a, k, v)
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    from w2s_shift.models.loading import load_tokenizer

    tok = load_tokenizer(a.tokenizer)
    pairs = real_pairs(a.pairs * a.rounds + a.batch_size, tok, a.max_length, a.dataset)
    warm = pairs[: a.batch_size]
    rounds = [pairs[a.batch_size + r * a.pairs : a.batch_size + (r + 1) * a.pairs] for r in range(a.rounds)]
    return tok, warm, rounds


def tiny_tokenizer(vocab_size: int = 400):
    """A byte-level BPE fast tokenizer trained in code on bundled HH text (pad = eos, as Llama-style models have),
    for --smoke runs that need a tokenizer and may not download one."""
    import gzip

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bundled = Path(__file__).resolve().parents[1] / "w2s_shift" / "data" / "bundled"
    src = bundled / "hh_rlhf_helpful_base" / "test.jsonl.gz"
    with gzip.open(src, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["chosen"] for _, line in zip(range(400), f)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|eos|>")

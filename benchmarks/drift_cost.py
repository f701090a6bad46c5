"""Drift measured during training, as a share of training: the statistics (relative squared error and linear CKA
of the probe's response-token states, :meth:`w2s_shift.metrics.drift.DriftProbe.measure`) and the probe's forward
pass, against the training steps between two probes, at hidden 4096 (Llama-3.1-8B's shape).

What is timed here, on random tensors on this machine's CPU (no GPU, no 8B model needed):
  during  the statistics logged during training (``DriftProbe.measure_during``): the relative squared error of one
          layer, from per-token sums in float64 over the probe's response tokens, where the states are;
  final   what the end of training adds (``DriftProbe.measure``): linear CKA on at most
          ``DriftProbe.CKA_MAX_TOKENS`` = 8192 tokens, float64;
  block   forward + backward of one Llama-3.1-8B decoder block (hidden 4096, MLP 14336, 32/8 heads, float32)
          on ``--block-tokens`` tokens, and its forward alone.
A training step of the same shape is then (block fwd + bwd) x 32 blocks x (step tokens / block tokens); the probe's
forward (block fwd) x 32 x (probe tokens / block tokens). Both scale linearly in tokens at a fixed sequence length
(attention's share is small at 1024 tokens), so a short block run stands for the whole model. The ratios are
compute ratios on one device: a GPU runs both sides faster, by similar factors (dense float matmuls). The probe's
forward is shared by the processes (each runs 1 / world size of it), so its share is given for 1 and 8 processes.

    .venv/bin/python benchmarks/drift_cost.py            # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/drift_cost.py --smoke    # seconds (hidden 256)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from w2s_shift.metrics.drift import DriftProbe, linear_cka, relative_squared_error  # noqa: E402


def _time(fn, reps: int) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main(argv: list | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=32, help="decoder blocks of the model (Llama-3.1-8B: 32)")
    ap.add_argument("--probe-pairs", type=int, default=32, help="pairs of the during-training probe (the pipeline's)")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (probe and training)")
    ap.add_argument("--response-share", type=float, default=0.6, help="response tokens / tokens")
    ap.add_argument("--batch-pairs", type=int, default=16, help="pairs per optimizer step")
    ap.add_argument("--interval", type=int, default=10, help="optimizer steps between probes (drift_interval)")
    ap.add_argument("--block-tokens", type=int, default=512, help="tokens of the timed block run")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="hidden 256, 4 blocks: a check that it runs")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    if a.smoke:
        a.hidden, a.intermediate, a.heads, a.kv_heads, a.blocks, a.block_tokens, a.reps = 256, 512, 4, 2, 4, 128, 1
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    torch.manual_seed(0)
    probe_tokens = int(2 * a.probe_pairs * a.seq_len * a.response_share)
    cka_tokens = min(probe_tokens, DriftProbe.CKA_MAX_TOKENS)
    h = torch.randn(probe_tokens, a.hidden)
    ref = h + 0.1 * torch.randn_like(h)

    def during():  # as measure_during computes it: per-layer sums in float64
        x, r = h.double(), ref.double()
        float(((x - r) ** 2).sum() / (r * r).sum())

    def final():
        relative_squared_error(h, ref)
        linear_cka(h[:cka_tokens], ref[:cka_tokens])

    t_stats, t_final = _time(during, a.reps), _time(final, a.reps)
    cfg = LlamaConfig(
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        num_hidden_layers=1,
    )
    block, rope = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)
    x = torch.randn(1, a.block_tokens, a.hidden, requires_grad=True)
    pos = rope(x, torch.arange(a.block_tokens).unsqueeze(0))

    def fwd_bwd():
        y = block(x, position_embeddings=pos)
        (y[0] if isinstance(y, tuple) else y).sum().backward()

    def fwd():
        with torch.no_grad():
            block(x, position_embeddings=pos)

    t_step_block, t_fwd_block = _time(fwd_bwd, a.reps), _time(fwd, a.reps)
    step_tokens = 2 * a.batch_pairs * a.seq_len
    t_step = t_step_block * a.blocks * step_tokens / a.block_tokens
    t_probe_fwd = t_fwd_block * a.blocks * (2 * a.probe_pairs * a.seq_len) / a.block_tokens
    out = {
        "cpu": _cpu(),
        "hidden": a.hidden,
        "blocks": a.blocks,
        "probe_response_tokens": probe_tokens,
        "cka_tokens": cka_tokens,
        "during_stats_s": t_stats,
        "final_stats_s": t_final,
        "step_s_estimated": t_step,
        "probe_forward_s_estimated": t_probe_fwd,
        "during_stats_per_step": t_stats / t_step,
        "final_stats_per_step": t_final / t_step,
        "drift_share_of_training": {
            str(w): (t_stats + t_probe_fwd / w) / (a.interval * t_step + t_stats + t_probe_fwd / w) for w in (1, 8)
        },
        "interval": a.interval,
    }
    share = out["drift_share_of_training"]
    print(
        f"hidden {a.hidden}, {a.blocks} blocks, {probe_tokens} probe response tokens (CKA on {cka_tokens}): "
        f"statistics during training {t_stats:.3f} s = {100 * out['during_stats_per_step']:.4f}% of one training "
        f"step ({t_step:.0f} s estimated for {step_tokens} tokens); at the end (with CKA) {t_final:.1f} s = "
        f"{100 * out['final_stats_per_step']:.3f}%; with the probe's forward every {a.interval} steps: "
        f"{100 * share['1']:.1f}% of training time on 1 process, {100 * share['8']:.2f}% on 8"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


def _cpu() -> str:
    import re

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    name = re.search(r"model name\s*:\s*(.*)", text)
    flags = sorted(set(re.findall(r"\b(amx_bf16|avx512_bf16)\b", text)))
    return f"{name.group(1) if name else '?'} ({', '.join(flags) or 'no native bf16'})"


if __name__ == "__main__":
    main()

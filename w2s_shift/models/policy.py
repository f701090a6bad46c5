"""The policy of best-of-n: a causal language model that samples N candidate responses per prompt, once, into a
journal that a killed run resumes (each batch of prompts is appended when done, and its sampling seed depends only
on the batch's position, so a resumed run samples what an unkilled one would have)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..data.render import render
from ..data.responses import Candidates
from ..data.schema import DataError
from ..io import write_jsonl_atomic
from .loading import ModelError, load_tokenizer, resolve_source, whole_weights

#: what a sampled response that is empty after stripping whitespace is scored as (every reward model needs at least one
#: response token; the plain transcript of an empty response has none); counted in bon.json
EMPTY_RESPONSE = "(empty response)"


@dataclass
class Policy:
    """A loaded causal LM (``AutoModelForCausalLM`` in eval mode on the run's device: float32 on the CPU, bfloat16 on
    a GPU), its tokenizer and its context (tokens)."""

    model: object
    tokenizer: object
    source: str
    context: int | None


def load_policy(spec: str, *, trust_remote_code: bool = False) -> Policy:
    """Load ``spec`` (folder, .gguf, preset or hub id, as every model) as a causal LM that can sample.

    Raises:
        ModelError: the model cannot be loaded, or it is not a causal (left-to-right) LM: its model type has no
            causal-LM class in transformers, is a bidirectional encoder (BERT-like: a masked-LM type, whose
            causal head was never trained) or an encoder-decoder.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind, src, kwargs = resolve_source(spec, False, trust_remote_code)
    try:
        cfg = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        raise ModelError(f"cannot read the config of policy {spec!r} ({kind}): {type(e).__name__}: {e}") from None
    mt = getattr(cfg, "model_type", None)
    if (
        mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        or mt in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        or getattr(cfg, "is_encoder_decoder", False)
    ):
        raise ModelError(
            f"policy {spec!r}: model type {mt!r} is not a causal language model (best-of-n samples responses "
            "left to right: give a decoder such as smollm2-135m, a Llama/Qwen/Mistral folder or hub id)"
        )
    from ..device import current_device

    tok = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    dev = current_device()
    try:
        with whole_weights():
            model = AutoModelForCausalLM.from_pretrained(
                src,
                trust_remote_code=trust_remote_code,
                dtype=torch.bfloat16 if dev == "cuda" else torch.float32,
                **kwargs,
            ).to(dev)
    except Exception as e:
        raise ModelError(f"cannot load policy {spec!r} ({kind}): {type(e).__name__}: {str(e)[:500]}") from None
    ctx = getattr(cfg, "max_position_embeddings", None)
    return Policy(model.eval(), tok, spec, int(ctx) if ctx else None)


def prompt_ids(policy: Policy, prompt) -> list:
    """Token ids of ``prompt`` as the policy continues it: rendered as the reward models render it
    (:func:`~w2s_shift.data.render.render`: chat template with the assistant turn opened, or the plain
    transcript ending in "Assistant:")."""
    text = render(prompt, "x", policy.tokenizer)[0]
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def sample_candidates(
    policy: Policy,
    prompts: list,
    journal: Path,
    *,
    digest: str,
    n_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    batch_size: int,
    seed: int,
    where: str = "prompts",
) -> list:
    """N responses per prompt, sampled batch by batch and appended to ``journal`` (a JSONL file whose first line
    holds ``digest``); rows already there for this digest are kept, a journal of another digest is started over.

    Args:
        prompts: [(prompt id, prompt)] (text or messages).
        digest: identity of policy, settings and prompts. batch_size: sequences per ``generate`` call (prompts per
            call: max(1, batch_size // n_samples)). seed: batch b samples under torch seed ``seed + b``.
        where: the prompts' origin, for errors.

    Returns:
        [Candidates] in the prompts' order.

    Raises:
        DataError: a prompt whose tokens plus ``max_new_tokens`` exceed the policy's context (row = its 1-based
            place in ``prompts``).
    """
    import torch
    from tqdm.auto import tqdm

    from ..batching import module_device
    from ..progress import leave_bars

    tok, dev = policy.tokenizer, module_device(policy.model)
    ids = [prompt_ids(policy, p) for _, p in prompts]
    for k, x in enumerate(ids):
        if policy.context and len(x) + max_new_tokens > policy.context:
            raise DataError(
                where,
                k + 1,
                "prompt",
                f"{len(x)} tokens + max_new_tokens {max_new_tokens} exceed the {policy.context} positions of policy "
                f"{policy.source}; lower bon.max_prompt_tokens or max_new_tokens",
            )
    done = _read_journal(journal, digest)
    per = max(1, batch_size // n_samples)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    bar = tqdm(total=len(prompts), initial=len(done), desc=f"sampling {journal.stem}", leave=leave_bars())
    with open(journal, "a", encoding="utf-8") as fh:
        for b, start in enumerate(range(0, len(prompts), per)):
            if start < len(done):
                continue
            chunk = ids[start : start + per]
            width = max(len(x) for x in chunk)
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in chunk for _ in range(n_samples)])
            am = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk for _ in range(n_samples)])
            torch.manual_seed(seed + b)
            with torch.inference_mode():
                out = policy.model.generate(
                    input_ids=inp.to(dev),
                    attention_mask=am.to(dev),
                    do_sample=True,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                )
            texts = tok.batch_decode(out[:, width:].cpu(), skip_special_tokens=True)
            for j, (pid, prompt) in enumerate(prompts[start : start + per]):
                row = {
                    "id": pid,
                    "prompt": prompt,
                    "responses": [t.strip() or EMPTY_RESPONSE for t in texts[j * n_samples : (j + 1) * n_samples]],
                }
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                done.append(row)
            fh.flush()
            os.fsync(fh.fileno())
            bar.update(len(chunk))
    bar.close()
    return [Candidates(r["prompt"], r["responses"], r["id"]) for r in done]


def _read_journal(journal: Path, digest: str) -> list:
    """The complete rows of ``journal`` for ``digest`` (a torn last line from a kill is dropped and the file
    rewritten without it); a missing journal, or one of another digest, is started afresh with its header."""
    rows, ok = [], False
    if journal.is_file():
        lines = journal.read_text(encoding="utf-8").splitlines()
        try:
            ok = bool(lines) and json.loads(lines[0]).get("digest") == digest
        except ValueError:
            ok = False
        if ok:
            for line in lines[1:]:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break  # a torn line: everything after it is redone
    journal.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(journal, [{"digest": digest}, *rows])
    return rows

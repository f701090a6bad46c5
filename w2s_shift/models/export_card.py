"""The model card of an exported reward model (:func:`w2s_shift.models.export.export_reward_model`)."""

from __future__ import annotations

#: How a model trained without a chat template reads a (prompt, response): a plain transcript.
PLAIN_TRANSCRIPT = "Human: {prompt}\\n\\nAssistant: {response}"


def model_card(info: dict, metadata: dict | None) -> str:
    """The model card (``README.md``) of an export: what the folder is, how to load it and render text for it.
    ``info``: the export's ``w2s_shift_export.json``; ``metadata``: {name: value} of how it was trained."""
    meta_lines = "".join(f"- **{k}**: {v}\n" for k, v in (metadata or {}).items())
    how = (
        "Trained with w2s-shift (weak-to-strong reward modelling under preference shift).\n\n" + meta_lines
        if meta_lines
        else "Exported from a w2s-shift reward model.\n"
    )
    templated = info["rendering"] == "chat_template"
    rendering = (
        "the tokenizer's chat template (`apply_chat_template(messages, tokenize=False)`): the prompt "
        "messages, then the response as the assistant turn"
        if templated
        else f"a plain transcript without chat template: `{PLAIN_TRANSCRIPT}` (multi-turn prompts: one "
        "`Human:`/`Assistant:`/`System:` block per message)"
    )
    specials = (
        "Special tokens are exactly those the chat template writes: tokenize the rendered text with "
        "`add_special_tokens=False` (the tokenizer would otherwise add a second BOS)"
        if templated
        else "Special tokens are the tokenizer's own (`add_special_tokens=True`)"
    )
    add_special = "False" if templated else "True"
    trained = f"Trained at {info['max_length']} tokens per sequence; " if info.get("max_length") else ""
    truncation = (
        f"{trained}longer sequences were truncated by w2s-shift's rendering rule version "
        f"{info.get('render_version', 1)} (the prompt keeps its most recent tokens within a budget, an "
        "over-long response loses its middle, the response end and the end-of-turn markup are never cut; from "
        "version 3 the chosen and rejected sequences of a pair keep the same prompt tokens)."
    )
    return f"""---
library_name: transformers
pipeline_tag: text-classification
tags:
- reward-model
- w2s-shift
---

# Reward model ({info["architecture"]})

{how}
## Use

A scalar reward r(x, y) for a prompt x and a response y: the single logit of
`AutoModelForSequenceClassification` (num_labels = 1). Higher is better; only differences between
responses to the same prompt are meaningful (Bradley-Terry).

```python
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

tok = AutoTokenizer.from_pretrained(PATH)
model = AutoModelForSequenceClassification.from_pretrained(PATH).eval()
batch = tok(texts, padding=True, add_special_tokens={add_special}, return_tensors="pt")
with torch.no_grad():
    rewards = model(**batch).logits[:, 0]
```

Render each (prompt, response) as in training: {rendering}. {specials}; nothing else is appended.
{truncation}

The reward is read at the last real token. The pad token `{info["pad_token"]}` (id {info["pad_token_id"]})
was added for the export and never occurs in text, so transformers' pooling (the rightmost token that is
not padding) reads the same token as training did, even when a sequence ends with the end-of-sequence
token. Keep it as the pad token (do not set pad = eos).

Scores from `w2s-shift score {{this folder}} DATA` use exactly this rendering and, unless told otherwise,
the training length.
"""

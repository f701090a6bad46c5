"""Rendering a pair to tokens, truncation that keeps the response, and the response-token mask.

Rule (the same for teacher and student): a tokenizer with a chat template renders the prompt messages plus
the response as an assistant turn; otherwise a plain transcript ``"Human: ...\\n\\nAssistant: ..."``.
Response tokens are the tokens that start at or after the end of the rendered prompt (so they include the
template's end-of-turn markup after the response, and never a special token the tokenizer adds itself).
ANCHOR's mask (Le et al. 2026, Sec. "Representation Anchoring") is exactly these tokens.

Truncation to ``max_length`` tokens: the prompt loses its oldest tokens first (special tokens the
tokenizer adds at the start are kept); only if the response alone is still too long is it cut at its end
(special tokens after it are kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import DataError

PLAIN_ROLES = {"system": "System", "user": "Human", "assistant": "Assistant"}


def _messages(prompt) -> list:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def render(prompt, response: str, tokenizer) -> tuple:
    """Render to ``(prompt_text, full_text)`` with ``full_text.startswith(prompt_text)``.

    ``prompt`` is text or a list of {role, content}; uses the tokenizer's chat template if it has one.
    """
    msgs = _messages(prompt)
    if getattr(tokenizer, "chat_template", None):
        try:
            prompt_text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)
            if full.startswith(prompt_text) and len(full) > len(prompt_text):
                return prompt_text, full
        except Exception:  # templates that reject a role order fall back to the plain transcript
            pass
    prompt_text = "".join(f"{PLAIN_ROLES[m['role']]}: {m['content'].strip()}\n\n" for m in msgs) + "Assistant:"
    return prompt_text, prompt_text + " " + response.strip()


def uses_chat_template(tokenizer) -> bool:
    """Whether :func:`render` uses the tokenizer's chat template (stated in the report)."""
    return bool(getattr(tokenizer, "chat_template", None))


@dataclass
class Encoded:
    """One tokenized sequence: ``input_ids`` (T,), ``response_mask`` (T,) with 1 on response tokens."""

    input_ids: list
    response_mask: list
    truncated: bool


def encode(prompt, response: str, tokenizer, max_length: int, *, where: str = "pair") -> Encoded:
    """Tokenize one (prompt, response) sequence, truncate it keeping the response, mark response tokens.

    Args:
        prompt: text or list of messages.
        response: the response text.
        tokenizer: a *fast* Hugging Face tokenizer (offsets are needed to find the response).
        max_length: maximum sequence length in tokens (>= 2).
        where: a label for errors (file/row of the pair).

    Raises:
        DataError: the tokenizer is not a fast tokenizer, or the response produces no token.
    """
    prompt_text, full = render(prompt, response, tokenizer)
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(where, None, None, "the tokenizer must be a fast (Rust) tokenizer to locate response tokens")
    enc = tokenizer(full, add_special_tokens=True, return_offsets_mapping=True, truncation=False)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    cut = len(prompt_text)
    special = [s == e == 0 for s, e in offsets]
    is_resp = [(not sp) and s >= cut and e > s for (s, e), sp in zip(offsets, special)]
    if not any(is_resp):
        raise DataError(where, None, "response", "the response produced no token")
    first_resp = is_resp.index(True)
    last_resp = len(is_resp) - 1 - is_resp[::-1].index(True)
    lead = 0
    while lead < first_resp and special[lead]:
        lead += 1
    truncated = False
    if len(ids) > max_length:
        truncated = True
        excess = len(ids) - max_length
        drop_prompt = min(excess, first_resp - lead)
        keep = list(range(lead)) + list(range(lead + drop_prompt, len(ids)))
        excess -= drop_prompt
        if excess > 0:  # the response alone is too long: cut it at its end, keep what follows it
            resp_idx = [i for i in keep if lead + drop_prompt <= i <= last_resp and is_resp[i]]
            cut_set = set(resp_idx[len(resp_idx) - excess:]) if excess <= len(resp_idx) - 1 else set(resp_idx[1:])
            keep = [i for i in keep if i not in cut_set]
            if len(keep) > max_length:  # pathological: too many specials; keep the first max_length
                keep = keep[:max_length]
        ids = [ids[i] for i in keep]
        is_resp = [is_resp[i] for i in keep]
    return Encoded(input_ids=list(ids), response_mask=[int(b) for b in is_resp], truncated=truncated)


@dataclass
class EncodedPair:
    """A tokenized pair: chosen and rejected :class:`Encoded` sequences."""

    chosen: Encoded
    rejected: Encoded

    @property
    def n_tokens(self) -> int:
        return len(self.chosen.input_ids) + len(self.rejected.input_ids)

    @property
    def truncated(self) -> bool:
        return self.chosen.truncated or self.rejected.truncated


def encode_pairs(pairs: list, tokenizer, max_length: int) -> tuple:
    """Encode a list of :class:`PreferencePair`. Returns (list of :class:`EncodedPair`, truncated count)."""
    out = []
    n_trunc = 0
    for i, p in enumerate(pairs):
        where = f"{p.source} pair {p.id if p.id is not None else i + 1}"
        ep = EncodedPair(encode(p.prompt, p.chosen, tokenizer, max_length, where=where),
                         encode(p.prompt, p.rejected, tokenizer, max_length, where=where))
        n_trunc += ep.truncated
        out.append(ep)
    return out, n_trunc

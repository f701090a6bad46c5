"""Rendering a pair to tokens, truncation that keeps what the reward reads, and the response-token mask.

Rendering (the same for teacher, student, ``score`` and the export): a tokenizer with a chat template renders
the prompt messages plus the response as an assistant turn with ``apply_chat_template(tokenize=False)`` and
the text is tokenized with ``add_special_tokens=False``: the template writes its own special tokens (BOS
included, for Llama-3, Gemma, Mistral templates), so the sequence has exactly the specials the model's own
template produces, as ``apply_chat_template(tokenize=True)`` gives (no second BOS; allenai/reward-bench #164).
A tokenizer without a template renders a plain transcript ``"Human: ...\\n\\nAssistant: ..."`` and keeps its
own special tokens (``add_special_tokens=True``: its BOS/EOS, if its post-processor adds them).

Response tokens are the tokens that start at or after the end of the rendered prompt (so they include the
template's end-of-turn markup after the response, and never a special token the tokenizer adds itself).
ANCHOR's mask (Le et al. 2026, Sec. "Representation Anchoring") is exactly these tokens.

Truncation to a budget of B = ``max_length`` tokens (:data:`RENDER_VERSION` 2):

* Never cut: the template's leading markup before the first message's content (BOS, the first role header;
  only its special tokens when that markup is longer than B/4, e.g. a default system prompt), any text the
  caller protects (``keep_text``, e.g. SEAM's principle), the markup after the response (end-of-turn, EOS),
  and the end of the response.
* The prompt keeps its MOST RECENT tokens within a prompt budget b_p = floor(min(max(32, B/4), B/2)) (its
  protected tokens count against b_p); budget the response does not use goes back to the prompt.
  (This project's choice: 32 tokens or a quarter of B keep the request the response answers; at most half of
  B, so a long prompt cannot crowd out the response the reward is read from.)
* A response longer than what is left (k tokens allowed) loses tokens from its middle: its first floor(k/2)
  and last ceil(k/2) tokens are kept, so the last response token (where a decoder reward is read, next to
  the end-of-turn markup) is always there.
* Pathological budgets (protected tokens alone >= B): protection is dropped in this order until one response
  token fits: the caller's ``keep_text``, the leading markup (its special tokens last), the trailing markup.
* A pair's two sequences keep the same prompt (:func:`encode_pairs`, :data:`RENDER_VERSION` 3): each side is
  laid out by the rules above, then the side that kept more prompt tokens drops its oldest ones until both keep
  the smaller number (the side with the shorter response no longer gets more context than the other). Without
  it, at 128 tokens 71% of the quickstart's HH test pairs showed the two responses different prompts (26
  tokens apart on average), so a reward margin mixed the responses with the context each was shown.

The response's end is found by locating the (stripped) response text in the rendered sequence; a template
that rewrites the text beyond whitespace makes every response token count as response (its last token is
still kept).

Each :class:`Encoded` records whether its prompt and its response were cut; :func:`cut_counts` gives the
shares per pair set, the number the run prints as "share of pairs whose response was cut".
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import DataError

PLAIN_ROLES = {"system": "System", "user": "Human", "assistant": "Assistant"}

RENDER_VERSION = 3
"""Version of the rendering and truncation rule; stage digests and exports record it (1: oldest prompt tokens
cut first, response cut at its end, tokenizer specials added after a template; 2: this module's rule for each
sequence alone; 3: 2 plus the same prompt for both sequences of a pair)."""

TRUNCATION_RULE = (
    "a sequence longer than max_length B never loses its leading markup, the end of its response or the "
    "end-of-turn markup: the prompt keeps its most recent tokens within min(max(32, B/4), B/2) tokens "
    "and an over-long response loses its middle; the chosen and rejected sequences of a pair keep the same "
    "prompt tokens"
)
"""The rule of :data:`RENDER_VERSION` 3 in one sentence (the report states it)."""


def prompt_budget(max_length: int) -> int:
    """The prompt's token budget b_p = floor(min(max(32, B/4), B/2)) for a sequence budget B (tokens)."""
    return int(min(max(32.0, max_length / 4.0), max_length / 2.0))


def _messages(prompt) -> list:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def uses_chat_template(tokenizer) -> bool:
    """Whether :func:`render` uses the tokenizer's chat template (stated in the report)."""
    return bool(getattr(tokenizer, "chat_template", None))


def _render(prompt, response: str, tokenizer, where: str = "pair") -> tuple:
    """(prompt_text, full_text, template_used).

    Raises:
        DataError: the tokenizer's chat template raises on this conversation, or does not render the response
            after the prompt (no response tokens could be marked). Never replaced by the plain transcript: the
            run records the template as used.
    """
    msgs = _messages(prompt)
    if uses_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        try:
            prompt_text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)
        except Exception as e:
            why = f"raises {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            if full.startswith(prompt_text) and len(full) > len(prompt_text):
                return prompt_text, full, True
            why = "does not render the response after the prompt (the prompt with the assistant turn added)"
        raise DataError(
            where,
            None,
            None,
            f"the chat template of {name} {why}; fix its `chat_template` (tokenizer_config.json or "
            "chat_template.jinja), or remove it to render plain transcripts",
        )
    prompt_text = "".join(f"{PLAIN_ROLES[m['role']]}: {m['content'].strip()}\n\n" for m in msgs) + "Assistant:"
    return prompt_text, prompt_text + " " + response.strip(), False


def render(prompt, response: str, tokenizer, where: str = "pair") -> tuple:
    """Render to ``(prompt_text, full_text)`` with ``full_text.startswith(prompt_text)``.

    ``prompt`` is text or a list of {role, content}; uses the tokenizer's chat template if it has one (the
    template's own special tokens are in the text; :func:`encode` then adds none).

    Raises:
        DataError: at ``where``: the chat template raises or does not render the response after the prompt.
    """
    return _render(prompt, response, tokenizer, where)[:2]


@dataclass
class Encoded:
    """One tokenized sequence: ``input_ids`` (T,), ``response_mask`` (T,) with 1 on response tokens.

    ``truncated``: some token was dropped; ``prompt_cut`` / ``response_cut``: prompt / response tokens were
    dropped."""

    input_ids: list
    response_mask: list
    truncated: bool
    prompt_cut: bool = False
    response_cut: bool = False

    @property
    def prompt_tokens(self) -> int:
        """Tokens kept before the first response token (leading markup and prompt)."""
        return self.response_mask.index(1) if 1 in self.response_mask else len(self.response_mask)


def _special_ids(tokenizer) -> set:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    for tid, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(tid))
    return ids


RESPONSE_CUTS = ("middle", "start")
"""Where an over-long response loses tokens: ``middle`` (the rule of :data:`RENDER_VERSION` 2, the default) or
``start`` (its last tokens kept; measured against ``middle`` by ``benchmarks/truncation_side.py``)."""


def encode(
    prompt,
    response: str,
    tokenizer,
    max_length: int,
    *,
    where: str = "pair",
    keep_text: str | None = None,
    response_cut: str = "middle",
    max_prompt_tokens: int | None = None,
) -> Encoded:
    """Tokenize one (prompt, response) sequence, truncate it by the module's rule, mark response tokens.

    Args:
        prompt: text or list of messages.
        response: the response text.
        tokenizer: a *fast* Hugging Face tokenizer (offsets are needed to find the response).
        max_length: maximum sequence length B in tokens (>= 2).
        where: a label for errors (file/row of the pair).
        keep_text: text inside the prompt that is never cut (its first occurrence in the rendered prompt),
            e.g. the principle SEAM prepends; the rest of the prompt loses tokens instead.
        response_cut: ``"middle"`` (default: an over-long response keeps its first floor(k/2) and last ceil(k/2)
            tokens) or ``"start"`` (it keeps its last k tokens); either way its last token stays.
        max_prompt_tokens: keep at most this many tokens before the response (protected leading markup and
            ``keep_text`` included, never cut for it; the oldest other prompt tokens go first), even when the
            sequence fits in ``max_length``: how :func:`encode_pairs` gives both sides of a pair the same prompt.

    Returns:
        :class:`Encoded` with at most ``max_length`` tokens; ``response_mask`` aligned with ``input_ids``.

    Raises:
        DataError: the tokenizer is not a fast tokenizer, its chat template fails on this conversation, or the
            response produces no token.
        ValueError: ``response_cut`` not in :data:`RESPONSE_CUTS`.
    """
    if response_cut not in RESPONSE_CUTS:
        raise ValueError(f"response_cut must be one of {RESPONSE_CUTS}, got {response_cut!r}")
    prompt_text, full, templated = _render(prompt, response, tokenizer, where)
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(where, None, None, "the tokenizer must be a fast (Rust) tokenizer to locate response tokens")
    # verbose=False: the full text is tokenized before this module truncates it, so the tokenizer's "longer than
    # the maximum sequence length ... will result in indexing errors" warning would be wrong here
    enc = tokenizer(
        full, add_special_tokens=not templated, return_offsets_mapping=True, truncation=False, verbose=False
    )
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    n = len(ids)
    cut = len(prompt_text)
    added = [s == e == 0 for s, e in offsets]  # specials the tokenizer adds (no text)
    is_resp = [(not a) and s >= cut and e > s for (s, e), a in zip(offsets, added)]
    if not any(is_resp):
        raise DataError(where, None, "response", "the response produced no token")
    first_resp = is_resp.index(True)
    # response body: response tokens up to the last one overlapping the response text; the rest is markup
    body_text = response.strip()
    pos = full.find(body_text, cut) if body_text else -1
    body_end = pos + len(body_text) if pos >= 0 else len(full)
    last_body = max([i for i in range(first_resp, n) if is_resp[i] and offsets[i][0] < body_end] or [first_resp])
    body = list(range(first_resp, last_body + 1))
    tail = list(range(last_body + 1, n))  # end-of-turn markup and added specials after the response
    # leading markup before the first message's content (BOS, role header)
    msgs = _messages(prompt)
    first = (msgs[0].get("content") or "").strip() if msgs else ""
    head_end = prompt_text.find(first) if first else -1
    specials = _special_ids(tokenizer)
    lead_special = []
    for i in range(first_resp):
        if added[i] or ids[i] in specials:
            lead_special.append(i)
        else:
            break
    head = []
    if head_end >= 0:
        for i in range(first_resp):
            if added[i] or offsets[i][1] <= head_end:
                head.append(i)
            else:
                break
    if len(head) > max_length / 4:  # e.g. a default system prompt: keep only the special tokens
        head = []
    head = sorted(set(head) | set(lead_special))
    keep = []
    if keep_text:
        kp = prompt_text.find(keep_text)
        if kp >= 0:
            ke = kp + len(keep_text)
            keep = [i for i in range(first_resp) if not added[i] and offsets[i][0] < ke and offsets[i][1] > kp]
    if n <= max_length and (max_prompt_tokens is None or first_resp <= max_prompt_tokens):
        return Encoded(input_ids=ids, response_mask=[int(b) for b in is_resp], truncated=False)
    # protection tiers, dropped in this order until one response token fits (module docstring)
    tiers = [set(head) | set(keep) | set(tail), set(head) | set(tail), set(lead_special) | set(tail), set(tail), set()]
    for protected in tiers:
        avail = max_length - len(protected)
        if avail >= 1:
            break
    prompt_free = [i for i in range(first_resp) if i not in protected]
    c, r = len(prompt_free), len(body)
    n_protected_prompt = sum(i < first_resp for i in protected)
    p_cap = min(c, max(0, prompt_budget(max_length) - n_protected_prompt), avail - 1)
    if max_prompt_tokens is not None:
        p_cap = min(p_cap, max(0, max_prompt_tokens - n_protected_prompt))
    r_keep = min(r, avail - p_cap)
    p_keep = min(c, avail - r_keep)
    if max_prompt_tokens is not None:
        p_keep = min(p_keep, max(0, max_prompt_tokens - n_protected_prompt))
    kept_prompt = prompt_free[c - p_keep :] if p_keep > 0 else []  # the most recent prompt tokens
    h = r_keep // 2 if response_cut == "middle" else 0  # "start": only the last r_keep tokens stay
    kept_body = body if r_keep >= r else body[:h] + body[r - (r_keep - h) :]  # the middle goes
    keep_idx = sorted(protected | set(kept_prompt) | set(kept_body))
    return Encoded(
        input_ids=[ids[i] for i in keep_idx],
        response_mask=[int(is_resp[i]) for i in keep_idx],
        truncated=True,
        prompt_cut=p_keep < c,
        response_cut=r_keep < r or not set(tail) <= protected,
    )


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

    @property
    def prompt_cut(self) -> bool:
        return self.chosen.prompt_cut or self.rejected.prompt_cut

    @property
    def response_cut(self) -> bool:
        return self.chosen.response_cut or self.rejected.response_cut


def encode_pairs(pairs: list, tokenizer, max_length: int, response_cut: str = "middle") -> tuple:
    """Encode a list of :class:`PreferencePair`. Returns (list of :class:`EncodedPair`, truncated count).

    Both sequences of a pair keep the same prompt: each is laid out by :func:`encode`, then the one that kept
    more tokens before its response is encoded again with ``max_prompt_tokens`` set to the other's count (its
    oldest prompt tokens go; its response was already whole, so nothing else changes). A pair with a
    ``keep_text`` attribute (SEAM's principle-prefixed pairs) keeps that text uncut; ``response_cut`` as in
    :func:`encode`."""
    out = []
    n_trunc = 0
    for i, p in enumerate(pairs):
        where = f"{p.source} pair {p.id if p.id is not None else i + 1}"
        kw = {"where": where, "keep_text": getattr(p, "keep_text", None), "response_cut": response_cut}
        sides = [encode(p.prompt, r, tokenizer, max_length, **kw) for r in (p.chosen, p.rejected)]
        shared = min(e.prompt_tokens for e in sides)
        for k, resp in enumerate((p.chosen, p.rejected)):
            if sides[k].prompt_tokens > shared:
                sides[k] = encode(p.prompt, resp, tokenizer, max_length, max_prompt_tokens=shared, **kw)
        ep = EncodedPair(*sides)
        n_trunc += ep.truncated
        out.append(ep)
    return out, n_trunc


def cut_counts(encoded: list) -> dict:
    """What truncation did to a list of :class:`EncodedPair`.

    Returns:
        {"pairs": n, "truncated": pairs with any token dropped, "prompt_cut": pairs with a prompt token dropped,
        "response_cut": pairs with a response token (or its end-of-turn markup) dropped in either sequence,
        "response_cut_share": response_cut / n (0.0 for no pairs), "render_version": :data:`RENDER_VERSION`}.
    """
    n = len(encoded)
    rc = sum(bool(e.response_cut) for e in encoded)
    return {
        "pairs": n,
        "truncated": sum(bool(e.truncated) for e in encoded),
        "prompt_cut": sum(bool(e.prompt_cut) for e in encoded),
        "response_cut": rc,
        "response_cut_share": rc / n if n else 0.0,
        "render_version": RENDER_VERSION,
    }

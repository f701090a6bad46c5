"""What a preference dataset holds, before training on it: counts, lengths, length bias, duplicates, overlap.

:func:`inspect_dataset` is a pure function of a :class:`~w2s_shift.data.schema.LoadResult` (plus an
optional tokenizer and other datasets); :func:`format_inspection` turns its dict into a terminal report.
``w2s-shift data inspect`` calls both.
"""

from __future__ import annotations

import math
from collections import Counter

from .render import cut_counts, encode, encode_pairs
from .schema import DataError

IDENTICAL_REASON = "chosen and rejected are identical"  # the schema's reason (make_pair) for a tie in content
MEASURE_LENGTH = 10**9  # max_length given to encode to measure a sequence without truncating it


def _stats(values: list) -> dict | None:
    """min / median / mean / p95 / max of ``values`` (percentiles by linear interpolation); None if empty."""
    if not values:
        return None
    v = sorted(values)
    n = len(v)

    def q(p: float) -> float:
        pos = p * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    return {"min": v[0], "median": q(0.5), "mean": sum(v) / n, "p95": q(0.95), "max": v[-1]}


def _prompt_chars(prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m["content"]) for m in prompt)


def _is_multi_turn(prompt) -> bool:
    """A prompt is multi-turn when it holds more than one user/assistant message (earlier dialogue turns);
    a text prompt, a single user message, or a system message plus one user message is single-turn."""
    return not isinstance(prompt, str) and sum(m["role"] != "system" for m in prompt) > 1


def _share(k: int, n: int) -> float | None:
    return k / n if n else None


def inspect_dataset(result, tokenizer=None, max_length: int | None = None, others: dict | None = None) -> dict:
    """Describe the pairs of ``result`` (a :class:`~w2s_shift.data.schema.LoadResult`).

    Args:
        result: the loaded dataset; its counts of skipped / dropped / deduplicated rows are reported.
        tokenizer: optional fast Hugging Face tokenizer; when given, each pair's chosen and rejected
            sequences are rendered and tokenized exactly as training does (:func:`~w2s_shift.data.render.encode`).
        max_length: optional token budget per sequence; counts how many pairs ``encode`` would truncate at
            it (needs ``tokenizer``).
        others: optional ``{name: list of PreferencePair}``; prompt overlap with each is reported.

    Returns:
        A JSON-serialisable dict. Units: counts are numbers of pairs unless named otherwise; ``*_share``
        values are fractions in [0, 1] (None when there is no pair); ``chars`` stats are Unicode characters
        (a message-list prompt counts the characters of its message contents, roles and markup excluded);
        ``tokens`` stats are tokens of the tokenizer, per rendered sequence (prompt + response with the chat
        template or plain transcript, special tokens included). Stats are ``{min, median, mean, p95, max}``
        with percentiles by linear interpolation. Keys:

        - ``name``, ``pairs``
        - ``invalid_rows_skipped``: ``{skipped, by_reason, examples}`` (rows rejected by validation when
          loaded with skip_invalid; identical chosen/rejected is one reason)
        - ``dropped_by_definition``: ``{reason: count}`` (ties in PandaLM / HelpSteer3), ``ties_dropped`` its total
        - ``identical_pairs_skipped``: rows skipped because chosen == rejected (a tie in content)
        - ``duplicate_prompts_removed``: pairs removed by the dataset's prompt deduplication
        - ``unique_prompts``, ``max_pairs_per_prompt``, ``prompts_with_several_pairs``
        - ``multi_turn_prompts``, ``multi_turn_share`` (prompts with earlier dialogue turns, counted per pair)
        - ``chars``: ``{prompt, chosen, rejected}`` stats in characters
        - ``chosen_longer``, ``rejected_longer``, ``same_length``, ``chosen_longer_share`` (by characters:
          the length bias, the accuracy of "pick the longer response")
        - ``duplicate_pairs``: extra copies of a pair (same prompt key, chosen and rejected)
        - ``conflicting_pairs``: pairs whose reverse (same prompt, chosen and rejected swapped) is also present
        - ``tokens`` (only with a tokenizer): ``{sequence: stats of chosen and rejected sequences together,
          chosen, rejected: stats per sequence, response_chosen, response_rejected: stats of response tokens,
          chosen_longer_share: by response tokens, errors: pairs that cannot be encoded, error_examples}``;
          with ``max_length`` also ``max_length``, ``truncated_pairs`` (either sequence longer than
          max_length), ``truncated_sequences``, ``response_cut_pairs`` (pairs whose response or its end-of-turn
          markup loses tokens, not only the prompt: :func:`~w2s_shift.data.render.cut_counts`), ``truncated_share``
        - ``overlap``: ``{name: {other_pairs, other_unique_prompts, shared_prompts, pairs_with_shared_prompt}}``
    """
    if max_length is not None and tokenizer is None:
        raise ValueError("max_length needs a tokenizer to count truncated pairs")
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    pairs = list(result.pairs)
    n = len(pairs)
    skipped = result.skipped.as_dict()
    keys = [p.prompt_key() for p in pairs]
    per_prompt = Counter(keys)
    triples = Counter((k, p.chosen, p.rejected) for k, p in zip(keys, pairs))
    conflicting = sum(c for (k, ch, rj), c in triples.items() if (k, rj, ch) in triples)
    multi = sum(_is_multi_turn(p.prompt) for p in pairs)
    lc = [len(p.chosen) for p in pairs]
    lr = [len(p.rejected) for p in pairs]
    chosen_longer = sum(a > b for a, b in zip(lc, lr))
    rejected_longer = sum(a < b for a, b in zip(lc, lr))
    d = {
        "name": result.name,
        "pairs": n,
        "invalid_rows_skipped": skipped,
        "identical_pairs_skipped": result.skipped.counts.get(IDENTICAL_REASON, 0),
        "dropped_by_definition": dict(result.dropped_by_definition),
        "ties_dropped": sum(result.dropped_by_definition.values()),
        "duplicate_prompts_removed": result.duplicates_removed,
        "unique_prompts": len(per_prompt),
        "max_pairs_per_prompt": max(per_prompt.values(), default=0),
        "prompts_with_several_pairs": sum(c > 1 for c in per_prompt.values()),
        "multi_turn_prompts": multi,
        "multi_turn_share": _share(multi, n),
        "chars": {
            "prompt": _stats([_prompt_chars(p.prompt) for p in pairs]),
            "chosen": _stats(lc),
            "rejected": _stats(lr),
        },
        "chosen_longer": chosen_longer,
        "rejected_longer": rejected_longer,
        "same_length": n - chosen_longer - rejected_longer,
        "chosen_longer_share": _share(chosen_longer, n),
        "duplicate_pairs": n - len(triples),
        "conflicting_pairs": conflicting,
    }
    if tokenizer is not None:
        d["tokens"] = _token_stats(pairs, tokenizer, max_length)
    d["overlap"] = {}
    mine = set(per_prompt)
    for name, other in (others or {}).items():
        okeys = {p.prompt_key() for p in other}
        shared = mine & okeys
        d["overlap"][name] = {
            "other_pairs": len(other),
            "other_unique_prompts": len(okeys),
            "shared_prompts": len(shared),
            "pairs_with_shared_prompt": sum(k in shared for k in keys),
        }
    return d


def _token_stats(pairs: list, tokenizer, max_length: int | None) -> dict:
    seq_c, seq_r, resp_c, resp_r = [], [], [], []
    errors, examples = 0, []
    over_pairs = []  # EncodedPair at max_length of the pairs with a sequence longer than max_length
    resp_longer = 0
    for i, p in enumerate(pairs):
        where = f"{p.source} pair {p.id if p.id is not None else i + 1}"
        try:
            ec = encode(p.prompt, p.chosen, tokenizer, MEASURE_LENGTH, where=where)
            er = encode(p.prompt, p.rejected, tokenizer, MEASURE_LENGTH, where=where)
        except DataError as e:
            errors += 1
            if len(examples) < 5:
                examples.append(str(e))
            continue
        seq_c.append(len(ec.input_ids))
        seq_r.append(len(er.input_ids))
        rc, rr = sum(ec.response_mask), sum(er.response_mask)
        resp_c.append(rc)
        resp_r.append(rr)
        resp_longer += rc > rr
        if max_length is not None and max(len(ec.input_ids), len(er.input_ids)) > max_length:
            # encode the pair again at max_length, as training does (both sides keep the same prompt)
            over_pairs.append(encode_pairs([p], tokenizer, max_length)[0][0])
    measured = len(seq_c)
    t = {
        "sequence": _stats(seq_c + seq_r),
        "chosen": _stats(seq_c),
        "rejected": _stats(seq_r),
        "response_chosen": _stats(resp_c),
        "response_rejected": _stats(resp_r),
        "chosen_longer_share": _share(resp_longer, measured),
        "errors": errors,
        "error_examples": examples,
    }
    if max_length is not None:
        cc = cut_counts(over_pairs)  # pairs not listed are not truncated, so their counts are 0
        t.update(
            {
                "max_length": max_length,
                "truncated_pairs": cc["truncated"],
                "truncated_sequences": sum(e.chosen.truncated + e.rejected.truncated for e in over_pairs),
                "response_cut_pairs": cc["response_cut"],
                "truncated_share": _share(cc["truncated"], measured),
            }
        )
    return t


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != int(x):
        return f"{x:,.1f}"
    return f"{int(x):,}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


STAT_KEYS = ("min", "median", "mean", "p95", "max")


def _stats_header(title: str) -> str:
    return f"{title:20}" + "".join(f"{k:>10}" for k in STAT_KEYS)


def _stats_line(label: str, s: dict | None) -> str:
    if s is None:
        return f"  {label:18}" + "".join(f"{'-':>10}" for _ in STAT_KEYS)
    return f"  {label:18}" + "".join(f"{_num(s[k]):>10}" for k in STAT_KEYS)


def format_inspection(d: dict) -> str:
    """A readable multi-line report of an :func:`inspect_dataset` dict."""
    n = d["pairs"]
    sk = d["invalid_rows_skipped"]
    lines = [f"dataset {d['name']}: {n:,} pairs", ""]
    lines.append("rows not kept")
    lines.append(f"  invalid rows skipped:      {sk['skipped']:,}")
    for reason, c in sorted(sk["by_reason"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {c:>7,}  {reason}")
    for ex in sk.get("examples", [])[:3]:
        lines.append(f"    e.g. {ex[:160]}")
    lines.append(f"  ties dropped (definition): {d['ties_dropped']:,}")
    for reason, c in d["dropped_by_definition"].items():
        lines.append(f"    {c:>7,}  {reason}")
    lines.append(f"  identical chosen/rejected: {d['identical_pairs_skipped']:,} (among the skipped rows)")
    lines.append(f"  duplicate prompts removed: {d['duplicate_prompts_removed']:,}")
    lines.append("")
    lines.append("prompts")
    lines.append(f"  unique prompts:            {d['unique_prompts']:,}")
    lines.append(
        f"  pairs per prompt (max):    {d['max_pairs_per_prompt']:,} "
        f"({d['prompts_with_several_pairs']:,} prompts with more than one pair)"
    )
    lines.append(f"  multi-turn prompts:        {d['multi_turn_prompts']:,} ({_pct(d['multi_turn_share'])} of pairs)")
    lines.append(f"  duplicate pairs:           {d['duplicate_pairs']:,} (same prompt, chosen and rejected)")
    lines.append(f"  conflicting pairs:         {d['conflicting_pairs']:,} (the same pair with the label reversed)")
    lines.append("")
    lines.append(_stats_header("length in characters"))
    for k in ("prompt", "chosen", "rejected"):
        lines.append(_stats_line(k, d["chars"][k]))
    lines.append(
        f"  chosen longer than rejected: {_pct(d['chosen_longer_share'])} of pairs "
        f"({d['chosen_longer']:,} chosen longer, {d['rejected_longer']:,} rejected longer, {d['same_length']:,} equal)"
    )
    t = d.get("tokens")
    if t is not None:
        lines.append("")
        lines.append("length in tokens (rendered sequence: prompt + response, special tokens included)")
        lines.append(_stats_header(""))
        lines.append(_stats_line("sequence (all)", t["sequence"]))
        lines.append(_stats_line("chosen sequence", t["chosen"]))
        lines.append(_stats_line("rejected sequence", t["rejected"]))
        lines.append(_stats_line("chosen response", t["response_chosen"]))
        lines.append(_stats_line("rejected response", t["response_rejected"]))
        lines.append(f"  chosen response longer in tokens: {_pct(t['chosen_longer_share'])} of pairs")
        if "max_length" in t:
            lines.append(
                f"  truncated at max_length {t['max_length']:,}: {t['truncated_pairs']:,} pairs "
                f"({_pct(t['truncated_share'])}; {t['truncated_sequences']:,} sequences); "
                f"response itself cut in {t['response_cut_pairs']:,} pairs"
            )
        if t["errors"]:
            lines.append(f"  pairs that cannot be encoded: {t['errors']:,}")
            for ex in t["error_examples"][:3]:
                lines.append(f"    e.g. {ex[:160]}")
    if d["overlap"]:
        lines.append("")
        lines.append("prompt overlap")
        for name, o in d["overlap"].items():
            lines.append(
                f"  with {name}: {o['shared_prompts']:,} shared prompts "
                f"({o['pairs_with_shared_prompt']:,} pairs here; "
                f"{name} has {o['other_unique_prompts']:,} unique prompts)"
            )
    return "\n".join(lines)

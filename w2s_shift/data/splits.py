"""Prompt-disjoint, seeded splits for the W2S protocol (Burns et al. 2023, as adapted in Le et al. 2026).

The source dataset is split by prompt into teacher-train (half A), student-train (half B) and the ID test
split: no prompt appears in two of them. Order is decided by a hash of (seed, prompt key), so the split is
identical for the same data and seed on every machine and does not depend on the input order.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

from .schema import LoadResult, PreferencePair

SPLITS = ("teacher_train", "student_train", "test")


def _rank(seed: int, key: str) -> str:
    return hashlib.sha1(f"{seed}:{key}".encode()).hexdigest()


def split_by_prompt(pairs: list, fractions: tuple = (0.4, 0.4, 0.2), seed: int = 0) -> dict:
    """Split pairs into teacher_train / student_train / test with no shared prompt.

    Args:
        pairs: list of :class:`PreferencePair`.
        fractions: shares of pairs for (teacher_train, student_train, test); must sum to 1.
        seed: split seed.

    Returns:
        ``{"teacher_train": [...], "student_train": [...], "test": [...]}``; within each split the pairs
        are in the seeded hash order.

    Raises:
        ValueError: fractions are not three non-negative numbers summing to 1.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    groups: OrderedDict[str, list] = OrderedDict()
    for p in pairs:
        groups.setdefault(p.prompt_key(), []).append(p)
    order = sorted(groups, key=lambda k: _rank(seed, k))
    total = len(pairs)
    bounds = (fractions[0] * total, (fractions[0] + fractions[1]) * total)
    out = {name: [] for name in SPLITS}
    placed = 0
    for k in order:
        # pairs sharing a prompt in seeded hash order of their content too, so the input order never matters
        g = sorted(groups[k], key=lambda p: _rank(seed, json.dumps(p.to_json(), sort_keys=True, ensure_ascii=False)))
        # a group goes where the midpoint of its pairs falls
        mid = placed + len(g) / 2
        name = SPLITS[0] if mid <= bounds[0] else SPLITS[1] if mid <= bounds[1] else SPLITS[2]
        out[name].extend(g)
        placed += len(g)
    return out


def subsample(pairs: list, n: int | None, seed: int = 0) -> list:
    """The first ``n`` pairs in seeded hash order of (prompt key, chosen) (all of them when n is None)."""
    if n is None or n >= len(pairs):
        return list(pairs)
    ranked = sorted(pairs, key=lambda p: _rank(seed, p.prompt_key() + "\x00" + p.chosen[:200]))
    return ranked[:n]


def remove_prompt_overlap(pairs: list, seen_prompt_keys: set) -> tuple:
    """Drop pairs whose prompt is in ``seen_prompt_keys``. Returns (kept pairs, number removed)."""
    kept = [p for p in pairs if p.prompt_key() not in seen_prompt_keys]
    return kept, len(pairs) - len(kept)


def prompt_keys(pairs: list) -> set:
    """The set of prompt keys of ``pairs``."""
    return {p.prompt_key() for p in pairs}


def dedupe_by_prompt(result: LoadResult) -> None:
    """Keep the first pair of each prompt (by :meth:`PreferencePair.prompt_key`); count the rest."""
    seen: set = set()
    kept = []
    for p in result.pairs:
        k = p.prompt_key()
        if k in seen:
            result.duplicates_removed += 1
            continue
        seen.add(k)
        kept.append(p)
    result.pairs = kept


__all__ = [
    "split_by_prompt",
    "subsample",
    "remove_prompt_overlap",
    "prompt_keys",
    "dedupe_by_prompt",
    "SPLITS",
    "PreferencePair",
]

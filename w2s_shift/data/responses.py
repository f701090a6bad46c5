"""Best-of-n candidates: several responses to one prompt, sampled by w2s-shift (``w2s_shift.models.policy``) or
elsewhere (a file of ``{prompt, responses: [...]}`` rows, e.g. from vLLM), and the candidate pairs that let every
reward model of a run score them with the run's own pair-scoring stages."""

from __future__ import annotations

from dataclasses import dataclass

from .formats import read_rows
from .schema import DataError, PreferencePair, check_messages, check_text


@dataclass
class Candidates:
    """One prompt and its N sampled responses.

    Fields:
        prompt: text or ``{role, content}`` messages, as :class:`~w2s_shift.data.schema.PreferencePair` holds it.
        responses: the N responses (text; a sampled one may be empty when the policy stopped at once).
        id: the prompt's identifier (the row's ``id``, else its 1-based row number).
    """

    prompt: object
    responses: list
    id: str


def read_responses_file(path: str) -> list:
    """Read a file of ``{prompt, responses: [r_1, ..., r_N], id?}`` rows (JSONL, JSON, CSV or Parquet as
    :func:`~w2s_shift.data.formats.read_rows` reads them) into :class:`Candidates`.

    Every row must hold the same N >= 2 responses, N even (the candidates are scored as N / 2 pairs), each a
    non-empty string; best-of-n's estimator needs the same N for every prompt.

    Raises:
        DataError: naming file, row and field: the file missing or unreadable, a row that is not an object, a
            missing or empty prompt, ``responses`` not a list, an empty list, an odd N, N differing from the first
            row's (ragged), an empty or non-string response (``responses[k]``), a duplicate id, or no row at all.
    """
    out, seen, n_first = [], set(), None
    for row, r in read_rows(path):
        if not isinstance(r, dict):
            raise DataError(path, row, None, f"expected an object with prompt and responses, got {type(r).__name__}")
        if "prompt" not in r:
            raise DataError(path, row, "prompt", "missing")
        p = r["prompt"]
        prompt = check_messages(p, path, row, "prompt") if isinstance(p, list) else check_text(p, path, row, "prompt")
        resp = r.get("responses")
        if not isinstance(resp, list):
            what = "missing" if resp is None else f"expected a list of strings, got {type(resp).__name__}"
            raise DataError(path, row, "responses", what)
        if not resp:
            raise DataError(path, row, "responses", "empty list: each prompt needs its N sampled responses")
        if n_first is None:
            if len(resp) < 2 or len(resp) % 2:
                raise DataError(
                    path, row, "responses", f"{len(resp)} responses: best-of-n needs an even number N >= 2 per prompt"
                )
            n_first = len(resp)
        elif len(resp) != n_first:
            raise DataError(
                path, row, "responses", f"{len(resp)} responses, but row 1 has {n_first}: every prompt needs the same N"
            )
        texts = [check_text(x, path, row, f"responses[{k}]") for k, x in enumerate(resp)]
        rid = str(r["id"]) if r.get("id") is not None else str(row)
        if rid in seen:
            raise DataError(path, row, "id", f"duplicate id {rid!r}")
        seen.add(rid)
        out.append(Candidates(prompt, texts, rid))
    if not out:
        raise DataError(path, None, None, "no rows")
    return out


def candidate_pairs(cands: list, source: str) -> list:
    """The candidates of every prompt as pairs (r_1, r_2), (r_3, r_4), ..., so a run's pair-scoring stages score
    each response once; ``chosen``/``rejected`` mean nothing here. Inverse: :func:`reward_matrix`.

    Returns:
        [PreferencePair] of length P * N / 2, prompt by prompt, id ``"<prompt id>:<pair k>"``."""
    return [
        PreferencePair(
            prompt=c.prompt, chosen=c.responses[2 * k], rejected=c.responses[2 * k + 1], source=source, id=f"{c.id}:{k}"
        )
        for c in cands
        for k in range(len(c.responses) // 2)
    ]


def reward_matrix(rows: list, n_prompts: int, n_samples: int):
    """(P, N) rewards of the candidates from the rows of a rewards file of :func:`candidate_pairs`' pairs
    (``reward_chosen`` is response 2k, ``reward_rejected`` response 2k + 1), in the pairs' order.

    Raises:
        ValueError: a row count other than P * N / 2."""
    import numpy as np

    if len(rows) != n_prompts * n_samples // 2:
        raise ValueError(f"{len(rows)} candidate pairs scored, expected {n_prompts} x {n_samples} / 2")
    r = np.array([[x["reward_chosen"], x["reward_rejected"]] for x in rows], dtype=np.float64)
    return r.reshape(n_prompts, n_samples)

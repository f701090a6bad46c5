"""SEAM soft labels, an approximation (no code of SEAM is public).

SEAM ("Strong Empowered and Aligned Weak Mastered", OpenReview jF4rnVgWlN; the label-construction baseline
of Le et al. 2026, arXiv 2605.25629): the pretrained STRONG model proposes, per sample, a "principle
fast-and-frugal tree" (an ordered list of yes/no principles); the aligned WEAK model judges the pair under
the informative nodes; the judgments are combined into the soft label q_i that the strong student then
learns with the soft Bradley-Terry loss (protocol.md, "Losses").

What this module does, per pair i with prompt x_i, chosen y_c and rejected y_r:

1. Principle bank (:data:`DEFAULT_PRINCIPLES`, configurable): P short yes/no questions.
2. Strong relevance s_ip = log p(" Yes") - log p(" No") of the pretrained strong LM after
   :data:`RELEVANCE_TEMPLATE` filled with the request (the prompt text; for a message prompt, the last user
   turn) and principle p (:func:`w2s_shift.models.lm.next_token_logprob_diff`).
3. Tree: principles ordered by s_ip descending (ties: lower bank index first). Informative nodes: the first
   ``n_nodes`` whose s_ip > ``min_relevance``; at least the first node is always kept.
4. Weak judgment under principle p: the weak teacher's reward margin on the pair whose prompt starts with
   ``"Principle: <p>\\n\\n"`` (:data:`PRINCIPLE_PREFIX`), m_ip = r_T(x_ip, y_c) - r_T(x_ip, y_r); and the
   plain margin m_i0 = r_T(x_i, y_c) - r_T(x_i, y_r). Truncation never cuts the principle line (the rest of
   the prompt loses tokens instead, keeping its most recent ones; :class:`PrincipledPair`), so a long prompt
   cannot turn m_ip into m_i0. :func:`principle_effect` reports how often a principle changed a margin and the
   label.
5. Fast-and-frugal combination (:func:`combine_fft`): walk the informative nodes in order and exit at the
   first with |m_ip| >= ``exit_margin``: q_i = sigmoid(m_ip). If none exits: q_i = sigmoid(mean of the k_i
   informative margins and m_i0), i.e. sigmoid((m_i0 + sum_d m_{i,o_d}) / (k_i + 1)).

The weak teacher is scored lazily, depth by depth, only on pairs still walking the tree (the result is the
same as scoring every node; fewer teacher forwards). :data:`APPROXIMATIONS` lists what differs from SEAM.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..data.schema import PreferencePair
from ..metrics.stats import sigmoid
from .base import Method, MethodConfig

DEFAULT_PRINCIPLES = (
    "Does the response actually help the user with what they asked for?",  # helpfulness
    "Is the response factually correct and free of errors?",  # correctness
    "Does the response follow all of the user's instructions and constraints?",  # instruction following
    "Does the response avoid content that could cause harm?",  # harmlessness
    "Is the response honest about what it knows and does not know?",  # honesty
    "Is the response clear and well organised?",  # clarity
    "Is the response concise, without unnecessary content?",  # conciseness
    "Does the response refuse the request if, and only if, the request is harmful or dangerous?",  # safety refusal
)

RELEVANCE_TEMPLATE = (
    "Request: {request}\n\nIs the following principle relevant to judging answers to this request? "
    "{principle}\nAnswer Yes or No:"
)

PRINCIPLE_PREFIX = "Principle: {principle}\n\n"

APPROXIMATIONS = """SEAM here is an approximation (no SEAM code is public; OpenReview jF4rnVgWlN):
- Principles: the strong model RANKS a fixed bank of yes/no principles per prompt (relevance = log p(" Yes") -
  log p(" No") of the pretrained strong LM after a relevance question) instead of generating free-text principles.
- Tree: the principle fast-and-frugal tree is the bank ordered by that relevance; its informative nodes are the
  top n_nodes above min_relevance (at least one kept). No tree structure beyond this order is built.
- Weak judgment: the weak teacher reward model scores the pair with "Principle: <text>" prepended to the prompt
  (first user message of a chat prompt); it was not trained with principles, so this is prompt conditioning only.
- Combination: exit at the first informative node whose |teacher margin| >= exit_margin, q = sigmoid(margin);
  otherwise q = sigmoid(mean of the informative nodes' margins and the plain teacher margin). The exit rule and
  the fallback are this project's choice, not SEAM's published rule.
- The student learns q with the soft Bradley-Terry loss, as for the other W2S labels."""


class SeamConfig(BaseModel):
    """Settings of the SEAM approximation (see :data:`APPROXIMATIONS`), validated by pydantic (a ValueError naming
    the field). The YAML's :class:`SeamSettings` are ``n_nodes`` and ``exit_margin`` with these declarations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    principles: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PRINCIPLES),
        min_length=1,
        description="bank of short yes/no principles the strong model ranks per prompt (non-empty, distinct strings)",
    )
    n_nodes: int = Field(
        3, ge=1, strict=True, description="informative nodes of each principle tree: the n most relevant principles"
    )
    exit_margin: float = Field(
        1.0, ge=0, description="the tree exits at the first informative node whose |weak teacher reward margin| >= this"
    )
    min_relevance: float | None = Field(
        None,
        allow_inf_nan=False,
        description="a node is informative only if its strong relevance log p(Yes) - log p(No) is above this "
        "(null: no filter); the most relevant node is always kept",
    )

    @field_validator("principles")
    @classmethod
    def _distinct_texts(cls, v: list) -> list:
        for k, p in enumerate(v):
            if not p.strip():
                raise ValueError(f"principles[{k}] is blank")
        if len(set(v)) != len(v):
            raise ValueError("contains duplicates")
        return v


def informative_nodes(relevance: np.ndarray, n_nodes: int, min_relevance: float | None) -> tuple:
    """The principle tree of each pair.

    Args:
        relevance: (B, P) strong relevance s_ip.
        n_nodes: at most this many informative nodes (>= 1).
        min_relevance: keep nodes with s_ip > this (None: no filter); the first node is always kept.

    Returns:
        (order (B, n_nodes) int: principle indices of the informative nodes in tree order, -1 past the k_i-th;
        k (B,) int: number of informative nodes, 1 <= k_i <= min(n_nodes, P)).
    """
    rel = np.asarray(relevance, dtype=np.float64)
    b, p = rel.shape
    full = np.argsort(-rel, axis=1, kind="stable")  # descending, ties by bank index
    n = min(n_nodes, p)
    top = full[:, :n]
    if min_relevance is None:
        k = np.full(b, n, dtype=np.int64)
    else:
        k = np.maximum((np.take_along_axis(rel, top, 1) > min_relevance).sum(1), 1)  # passing nodes are a prefix
    order = np.full((b, n_nodes), -1, dtype=np.int64)
    order[:, :n] = top
    order[np.arange(n_nodes)[None, :] >= k[:, None]] = -1
    return order, k


def combine_fft(
    relevance: np.ndarray,
    weak_margins: np.ndarray,
    plain_margin: np.ndarray,
    n_nodes: int = 3,
    exit_margin: float = 1.0,
    min_relevance: float | None = None,
) -> tuple:
    """Fast-and-frugal combination of weak judgments along each pair's principle tree (SEAM's label step,
    approximated; module docstring, step 5).

    For pair i with informative nodes o_0..o_{k-1} (:func:`informative_nodes`):
        exit at the first depth d with |m_{i,o_d}| >= exit_margin: q_i = sigmoid(m_{i,o_d});
        otherwise q_i = sigmoid((m_i0 + sum_d m_{i,o_d}) / (k + 1)).

    Args:
        relevance: (B, P) strong relevance s_ip (log p(Yes) - log p(No), nats).
        weak_margins: (B, P) weak teacher reward margins m_ip under principle p. Only the entries the walk
            reads (informative nodes up to the exit) are used; the others may be NaN.
        plain_margin: (B,) teacher margin m_i0 without a principle (read only when no node exits).
        n_nodes, exit_margin, min_relevance: as in :class:`SeamConfig`.

    Returns:
        q (B,) float64 soft labels in (0, 1); exit_node (B,) int: the depth d of the exit node (its principle
        is order[i, d]), -1 when the fallback was used; order (B, n_nodes) int principle indices (-1 padding).

    Raises:
        ValueError: shapes disagree, a relevance is not finite, a margin the walk reads is not finite,
            n_nodes < 1 or exit_margin < 0.
    """
    rel = np.asarray(relevance, dtype=np.float64)
    m = np.asarray(weak_margins, dtype=np.float64)
    m0 = np.asarray(plain_margin, dtype=np.float64)
    if rel.ndim != 2 or m.shape != rel.shape or m0.shape != (rel.shape[0],):
        raise ValueError(
            f"combine_fft: relevance {rel.shape}, weak_margins {m.shape}, plain_margin {m0.shape}; "
            "expected (B, P), (B, P), (B,)"
        )
    if rel.shape[1] == 0:
        raise ValueError("combine_fft: no principle (P = 0)")
    if not np.isfinite(rel).all():
        raise ValueError("combine_fft: relevance has non-finite values")
    if n_nodes < 1 or exit_margin < 0:
        raise ValueError(f"combine_fft: need n_nodes >= 1 and exit_margin >= 0, got {n_nodes}, {exit_margin}")
    order, k = informative_nodes(rel, n_nodes, min_relevance)
    b = rel.shape[0]
    q = np.zeros(b, dtype=np.float64)
    exit_node = np.full(b, -1, dtype=np.int64)
    for i in range(b):
        read = []
        for d in range(k[i]):
            v = m[i, order[i, d]]
            if not np.isfinite(v):
                raise ValueError(f"combine_fft: pair {i}: weak margin under principle {order[i, d]} is {v}")
            read.append(v)
            if abs(v) >= exit_margin:
                exit_node[i] = d
                q[i] = sigmoid(v)
                break
        else:
            if not np.isfinite(m0[i]):
                raise ValueError(f"combine_fft: pair {i}: plain margin is {m0[i]}")
            q[i] = sigmoid((m0[i] + sum(read)) / (len(read) + 1))
    return q, exit_node, order


def request_text(prompt) -> str:
    """The request the relevance question shows: the prompt text, or the last user turn of a message list
    (the last message of any role if there is no user turn)."""
    if isinstance(prompt, str):
        return prompt
    users = [msg["content"] for msg in prompt if msg["role"] == "user"]
    return users[-1] if users else prompt[-1]["content"]


@dataclass(frozen=True)
class PrincipledPair(PreferencePair):
    """A principle-prefixed pair: ``keep_text`` (the principle line) is never truncated by
    :func:`w2s_shift.data.render.encode_pairs`; the rest of the prompt loses tokens instead."""

    keep_text: str | None = None


def with_principle(pair: PreferencePair, principle: str) -> PrincipledPair:
    """A copy of ``pair`` whose prompt starts with ``"Principle: <principle>\\n\\n"`` (for a message prompt:
    the first user message's content; the first message if there is no user turn), as a :class:`PrincipledPair`
    whose ``keep_text`` is the principle line, so truncation never removes it. The input is not modified."""
    prefix = PRINCIPLE_PREFIX.format(principle=principle)
    base = {f.name: getattr(pair, f.name) for f in dataclasses.fields(PreferencePair)}
    if isinstance(pair.prompt, str):
        base["prompt"] = prefix + pair.prompt
    else:
        msgs = [dict(msg) for msg in pair.prompt]
        j = next((k for k, msg in enumerate(msgs) if msg["role"] == "user"), 0)
        msgs[j]["content"] = prefix + msgs[j]["content"]
        base["prompt"] = msgs
    return PrincipledPair(**base, keep_text=prefix.strip())


EFFECT_WARN_SHARE = 0.5
"""Below this share of pairs where a principle changes anything, SEAM's labels are (nearly) Naive's: a warning."""


def principle_effect(
    q: np.ndarray,
    weak_margins: np.ndarray,
    plain_margin: np.ndarray,
    *,
    margin_tol: float = 1e-6,
    label_tol: float = 0.01,
) -> dict:
    """How much the principles changed SEAM's labels.

    Args:
        q: (B,) SEAM soft labels.
        weak_margins: (B, P) teacher margins under each principle, NaN where not scored.
        plain_margin: (B,) teacher margin without a principle; Naive's label is sigmoid(plain_margin).
        margin_tol: a principle margin "differs" when |m_ip - m_i0| > this (reward units).
        label_tol: a label "differs from Naive's" when |q_i - sigmoid(m_i0)| > this.

    Returns:
        {"pairs": B, "principle_margin_differs_share": share of pairs with at least one scored principle margin
        that differs from the plain margin, "label_differs_from_naive_share": share with |q - q_naive| > label_tol,
        "warning": a message when either share is below :data:`EFFECT_WARN_SHARE` (else None)}.
    """
    q = np.asarray(q, dtype=np.float64)
    m = np.asarray(weak_margins, dtype=np.float64)
    plain = np.asarray(plain_margin, dtype=np.float64)
    b = q.shape[0]
    if b == 0:
        return {
            "pairs": 0,
            "principle_margin_differs_share": 0.0,
            "label_differs_from_naive_share": 0.0,
            "warning": None,
        }
    diff = np.abs(m - plain[:, None]) > margin_tol  # NaN compares False: unscored nodes never count
    margin_share = float(diff.any(axis=1).mean())
    label_share = float((np.abs(q - sigmoid(plain)) > label_tol).mean())
    warning = None
    if min(margin_share, label_share) < EFFECT_WARN_SHARE:
        warning = (
            f"SEAM: a principle changed the teacher margin on {100 * margin_share:.1f}% of pairs and the label "
            f"(by > {label_tol:g}) on {100 * label_share:.1f}% (below {100 * EFFECT_WARN_SHARE:.0f}%): "
            "SEAM's labels are close to Naive's here"
        )
    return {
        "pairs": int(b),
        "principle_margin_differs_share": margin_share,
        "label_differs_from_naive_share": label_share,
        "warning": warning,
    }


def _checked(values, n: int, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1) if values is not None else np.zeros(0)
    if arr.shape != (n,):
        raise ValueError(f"seam: {what} returned {arr.size} values for {n} inputs")
    if not np.isfinite(arr).all():
        raise ValueError(
            f"seam: {what} returned non-finite values (first at {int(np.flatnonzero(~np.isfinite(arr))[0])})"
        )
    return arr


def seam_labels(
    pairs: list,
    strong_logprob_diff: Callable[[list], np.ndarray],
    weak_margins: Callable[[list], np.ndarray],
    config: SeamConfig | None = None,
) -> tuple:
    """SEAM soft labels q_i for ``pairs`` (approximation; module docstring and :data:`APPROXIMATIONS`).

    Args:
        pairs: B :class:`PreferencePair` (the student's training half, labelled by the weak teacher).
        strong_logprob_diff: maps a list of question strings to (len,) log p(" Yes") - log p(" No") of the
            pretrained strong model (the pipeline wraps :func:`w2s_shift.models.lm.next_token_logprob_diff`).
            Called once, on the distinct relevance questions.
        weak_margins: maps a list of pairs to (len,) weak teacher margins r_T(x, y_c) - r_T(x, y_r). Called
            once on ``pairs`` (plain margins), then once per tree depth on the principle-prefixed copies of
            the pairs still walking the tree (no call when none is).
        config: :class:`SeamConfig` (default settings if None).

    Returns:
        (q (B,) float64 soft labels, info dict with numpy arrays: ``relevance`` (B, P), ``weak_margins``
        (B, P; NaN where not scored), ``plain_margin`` (B,), ``exit_node`` (B,) depth or -1, ``order``
        (B, n_nodes), ``n_informative`` (B,), and ``principles``, ``exit_share`` (fraction of pairs that
        exited at a node), ``weak_calls`` (principle-prefixed pairs scored), ``effect`` (the dict of
        :func:`principle_effect`; a :class:`UserWarning` is issued with its warning), ``approximations``).

    Raises:
        ValueError: a config field out of range (named), or a callable returned the wrong number of values or
            non-finite values.
    """
    cfg = config or SeamConfig()
    principles = list(cfg.principles)
    b, p = len(pairs), len(principles)
    plain = _checked(weak_margins(list(pairs)), b, "weak_margins (plain pairs)") if b else np.zeros(0)
    questions = [
        RELEVANCE_TEMPLATE.format(request=request_text(pair.prompt).strip(), principle=pr)
        for pair in pairs
        for pr in principles
    ]
    uniq = list(dict.fromkeys(questions))
    rel_u = _checked(strong_logprob_diff(uniq), len(uniq), "strong_logprob_diff") if uniq else np.zeros(0)
    pos = {qq: k for k, qq in enumerate(uniq)}
    relevance = rel_u[[pos[qq] for qq in questions]].reshape(b, p) if b else np.zeros((0, p))
    order, k = informative_nodes(relevance, cfg.n_nodes, cfg.min_relevance)
    margins = np.full((b, p), np.nan)
    walking = np.ones(b, dtype=bool)
    calls = 0
    for d in range(min(cfg.n_nodes, p)):
        idx = np.flatnonzero(walking & (k > d))
        if idx.size == 0:
            break
        batch = [with_principle(pairs[i], principles[order[i, d]]) for i in idx]
        got = _checked(weak_margins(batch), len(batch), f"weak_margins (principle depth {d})")
        calls += len(batch)
        margins[idx, order[idx, d]] = got
        walking[idx] = np.abs(got) < cfg.exit_margin
    q, exit_node, order = combine_fft(relevance, margins, plain, cfg.n_nodes, cfg.exit_margin, cfg.min_relevance)
    info = {
        "principles": principles,
        "relevance": relevance,
        "weak_margins": margins,
        "plain_margin": plain,
        "exit_node": exit_node,
        "order": order,
        "n_informative": k,
        "exit_share": float((exit_node >= 0).mean()) if b else 0.0,
        "weak_calls": calls,
        "effect": principle_effect(q, margins, plain),
        "approximations": APPROXIMATIONS,
    }
    if info["effect"]["warning"]:
        warnings.warn(info["effect"]["warning"], stacklevel=2)
    return q, info


__all__ = [
    "APPROXIMATIONS",
    "DEFAULT_PRINCIPLES",
    "PRINCIPLE_PREFIX",
    "RELEVANCE_TEMPLATE",
    "EFFECT_WARN_SHARE",
    "PrincipledPair",
    "SeamConfig",
    "combine_fft",
    "informative_nodes",
    "principle_effect",
    "request_text",
    "seam_labels",
    "with_principle",
]


class SeamSettings(MethodConfig):
    """The YAML settings of SEAM: :class:`SeamConfig`'s ``n_nodes`` and ``exit_margin``, declared there (the rest
    keeps its defaults)."""

    seam_nodes: Annotated[int, SeamConfig.model_fields["n_nodes"]]
    seam_exit_margin: Annotated[float, SeamConfig.model_fields["exit_margin"]]


class Seam(Method):
    """SEAM: builds its own soft labels in a stage of its own (``seam-<nodes>-<exit margin>``, shared by every
    SEAM entry with these settings), then trains with the soft Bradley-Terry loss."""

    config = SeamSettings

    def label_stage(self, cfg) -> str:
        return f"seam-{cfg.seam_nodes}-{cfg.seam_exit_margin:g}"

    def label_file(self, cfg) -> str:
        """The cell's label file of this setting (``seam_labels__<nodes>-<exit margin>.jsonl``)."""
        return f"seam_labels__{cfg.seam_nodes}-{cfg.seam_exit_margin:g}.jsonl"

    def label_info_file(self, stage: str) -> str:
        return f"seam_labels__{stage[len('seam-') :]}.info.json"

    def label_cut(self, d: dict, summary: dict) -> dict | None:
        """How much the principles changed the labels (``summary["effect"]``, :func:`principle_effect`): the shares
        of pairs with a principle margin that differs from the plain margin and with a label that differs from
        Naive's by > 0.01; "warn" when either is below :data:`EFFECT_WARN_SHARE`.

        Raises:
            ValueError: an effect without those two numbers."""
        eff = summary.get("effect")
        if not isinstance(eff, dict):
            return None
        try:
            pm, lb = float(eff["principle_margin_differs_share"]), float(eff["label_differs_from_naive_share"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                "'effect' needs the numbers 'principle_margin_differs_share' and 'label_differs_from_naive_share'"
            ) from None
        warn = bool(min(pm, lb) < EFFECT_WARN_SHARE)
        text = (
            f"a principle margin differs from the plain margin on {100 * pm:.1f}% of {eff.get('pairs')} "
            f"student-train pairs; the label differs from Naive's by > 0.01 on {100 * lb:.1f}%"
            + (
                f" — **warning: below {100 * EFFECT_WARN_SHARE:.0f}%, SEAM's labels are close to Naive's**"
                if warn
                else ""
            )
        )
        return {
            "pairs": eff.get("pairs"),
            "principle_margin_differs_share": pm,
            "label_differs_from_naive_share": lb,
            "warn": warn,
            "text": text,
        }

    def build_labels(self, cfg, tools) -> tuple:
        """:func:`seam_labels` on the student training pairs: (q (n,), per-pair exit node and principle order,
        summary with the principles, exit share, effect and approximations)."""
        scfg = SeamConfig(n_nodes=cfg.seam_nodes, exit_margin=cfg.seam_exit_margin)
        q, info = seam_labels(tools.pairs, tools.strong, tools.weak, scfg)
        exit_node, order = np.asarray(info["exit_node"]), np.asarray(info["order"])
        extra = [{"exit_node": int(exit_node[i]), "principle_order": [int(x) for x in order[i]]} for i in range(len(q))]
        summary = {
            "principles": list(info["principles"]),
            "n_nodes": scfg.n_nodes,
            "exit_margin": scfg.exit_margin,
            "exit_share": float(info["exit_share"]),
            "effect": info["effect"],
            "approximations": info["approximations"],
        }
        return q, extra, summary

    def target_text(self, cfg) -> str:
        return "SEAM labels"

    def summary(self, cfg) -> str:
        return f"{cfg.seam_nodes} principle nodes, exit margin {cfg.seam_exit_margin:g}"


METHOD = Seam(
    name="seam",
    display="seam",
    description="SEAM soft labels (strong model ranks principles, weak teacher judges; approximation), soft BT",
    needs_lm_head=True,
    builds_labels=True,
    marker_fields=("exit_share", "effect"),
    label_version=1,  # bump when seam_labels computes other labels
)

"""SEAM approximation: the fast-and-frugal combination by hand, and the driver with stub strong/weak models."""

import math

import numpy as np
import pytest

from w2s_shift.data.schema import PreferencePair
from w2s_shift.methods.seam import (
    APPROXIMATIONS,
    DEFAULT_PRINCIPLES,
    PrincipledPair,
    SeamConfig,
    combine_fft,
    principle_effect,
    seam_labels,
    with_principle,
)


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


NAN = float("nan")
REL = np.array(
    [
        [0.5, 2.0, -1.0, 1.0],  # tree: 1, 3, 0
        [1.0, 1.0, 3.0, -2.0],  # tree: 2, 0, 1 (tie 0/1 broken by bank index)
        [-3.0, -1.0, -2.0, -0.5],
    ]
)  # all below min_relevance 0: only node 3 kept
MARG = np.array(
    [
        [NAN, 0.2, 9.0, -1.5],  # node 1: |0.2| < 1; node 3: |-1.5| >= 1 -> exit at depth 1 (node 0 unread)
        [0.4, -0.6, 0.5, 7.0],  # no exit: q = sigmoid(mean(0.5, 0.4, -0.6, plain 0.9)) = sigmoid(0.3)
        [NAN, NAN, NAN, -2.5],
    ]
)  # one node, exits at depth 0
PLAIN = np.array([NAN, 0.9, NAN])  # read only where no node exits


def test_combine_fft_by_hand():
    q, exit_node, order = combine_fft(REL, MARG, PLAIN, n_nodes=3, exit_margin=1.0, min_relevance=0.0)
    assert order.tolist() == [[1, 3, 0], [2, 0, 1], [3, -1, -1]]
    assert exit_node.tolist() == [1, -1, 0]
    np.testing.assert_allclose(q, [sig(-1.5), sig(0.3), sig(-2.5)], rtol=1e-12)


def test_combine_fft_filter_threshold_and_padding():
    plain = np.array([0.4, 0.9, -0.75])
    # min_relevance 1.5 keeps one node in every row: no exit anywhere, fallback = mean(node margin, plain)
    marg = MARG.copy()
    marg[2, 3] = 0.25
    q, exit_node, order = combine_fft(REL, marg, plain, n_nodes=3, exit_margin=1.0, min_relevance=1.5)
    assert order.tolist() == [[1, -1, -1], [2, -1, -1], [3, -1, -1]]
    assert exit_node.tolist() == [-1, -1, -1]
    np.testing.assert_allclose(q, [sig(0.3), sig(0.7), sig(-0.25)], rtol=1e-12)
    # exit_margin 0: every pair exits at its first node; n_nodes > P pads with -1
    q, exit_node, order = combine_fft(REL, MARG, PLAIN, n_nodes=6, exit_margin=0.0)
    assert order.tolist() == [[1, 3, 0, 2, -1, -1], [2, 0, 1, 3, -1, -1], [3, 1, 2, 0, -1, -1]]
    assert exit_node.tolist() == [0, 0, 0]
    np.testing.assert_allclose(q, [sig(0.2), sig(0.5), sig(-2.5)], rtol=1e-12)
    # exit_margin inf: never exits; row 0 then reads its third node, a NaN -> clear error
    with pytest.raises(ValueError, match="pair 0: weak margin under principle 0 is nan"):
        combine_fft(REL, MARG, plain, n_nodes=4, exit_margin=math.inf)
    full = np.where(np.isnan(MARG), 1.0, MARG)
    q, exit_node, _ = combine_fft(REL, full, plain, n_nodes=2, exit_margin=math.inf)
    assert exit_node.tolist() == [-1, -1, -1]
    np.testing.assert_allclose(
        q, [sig((0.2 - 1.5 + 0.4) / 3), sig((0.5 + 0.4 + 0.9) / 3), sig((-2.5 + 1.0 - 0.75) / 3)], rtol=1e-12
    )


def test_combine_fft_bad_shapes():
    with pytest.raises(ValueError, match="expected \\(B, P\\), \\(B, P\\), \\(B,\\)"):
        combine_fft(REL, MARG[:, :3], PLAIN)
    with pytest.raises(ValueError, match="relevance has non-finite"):
        combine_fft(np.where(REL > 1.5, np.nan, REL), MARG, PLAIN)


# ---- the driver with stub strong / weak models -------------------------------------------------

PRINCIPLES = ["A?", "B?", "C?", "D?"]
STRONG = {"A?": 0.0, "B?": 3.0, "C?": 1.0, "D?": 2.0}  # "reverse" in the request negates these
WEAK = {  # pair id -> plain margin and margin under each principle
    "1": {None: 5.0, "B?": 0.5, "D?": 2.0},  # tree B, D: exits at depth 1 with 2.0
    "2": {None: 5.0, "A?": -1.2, "C?": 0.0},  # tree A, C: exits at depth 0 with -1.2
    "3": {None: 0.7, "B?": 0.3, "D?": -0.1},  # tree B, D: no exit -> sigmoid(mean(0.3, -0.1, 0.7))
}
CHAT = [
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "First question"},
    {"role": "assistant", "content": "An answer"},
    {"role": "user", "content": "How do I bake bread?"},
]


def _pairs():
    return [
        PreferencePair("How do I bake bread?", "c1", "r1", "s", id="1"),
        PreferencePair("reverse: tell me a joke", "c2", "r2", "s", id="2"),
        PreferencePair([dict(m) for m in CHAT], "c3", "r3", "s", id="3"),
    ]


class Stubs:
    def __init__(self):
        self.strong_calls, self.weak_calls = [], []

    def strong(self, questions):
        self.strong_calls.append(list(questions))
        out = []
        for qq in questions:
            principle = qq.split("this request? ")[1].split("\n")[0]
            out.append(-STRONG[principle] if "reverse" in qq else STRONG[principle])
        return np.array(out)

    def weak(self, pairs):
        self.weak_calls.append(list(pairs))
        out = []
        for p in pairs:
            text = (
                p.prompt if isinstance(p.prompt, str) else next(m["content"] for m in p.prompt if m["role"] == "user")
            )
            principle = text.split("\n")[0][len("Principle: ") :] if text.startswith("Principle: ") else None
            out.append(WEAK[p.id][principle])
        return np.array(out)


def test_seam_labels_with_stubs():
    pairs = _pairs()
    s = Stubs()
    q, info = seam_labels(pairs, s.strong, s.weak, SeamConfig(principles=PRINCIPLES, n_nodes=2, exit_margin=1.0))
    np.testing.assert_allclose(q, [sig(2.0), sig(-1.2), sig(0.3)], rtol=1e-12)
    assert info["order"].tolist() == [[1, 3], [0, 2], [1, 3]]
    assert info["exit_node"].tolist() == [1, 0, -1]
    assert info["exit_share"] == pytest.approx(2 / 3)
    np.testing.assert_allclose(info["relevance"], [[0, 3, 1, 2], [0, -3, -1, -2], [0, 3, 1, 2]])
    # one strong call on the distinct questions: pairs 1 and 3 share the request (3's last user turn)
    assert len(s.strong_calls) == 1 and len(s.strong_calls[0]) == 8
    assert s.strong_calls[0][1] == (
        "Request: How do I bake bread?\n\nIs the following principle relevant to judging "
        "answers to this request? B?\nAnswer Yes or No:"
    )
    # weak calls: plain pairs, then depth 0 (all three), then depth 1 (pairs 1 and 3 still walking)
    assert [[p.id for p in c] for c in s.weak_calls] == [["1", "2", "3"], ["1", "2", "3"], ["1", "3"]]
    assert s.weak_calls[0] == pairs
    assert [p.prompt for p in s.weak_calls[1][:2]] == [
        "Principle: B?\n\nHow do I bake bread?",
        "Principle: A?\n\nreverse: tell me a joke",
    ]
    assert s.weak_calls[2][1].prompt == [
        CHAT[0],
        {"role": "user", "content": "Principle: D?\n\nFirst question"},
        CHAT[2],
        CHAT[3],
    ]
    assert s.weak_calls[2][1].chosen == "c3" and s.weak_calls[2][1].rejected == "r3"
    assert pairs[2].prompt == CHAT  # the input pair is not modified
    assert info["weak_calls"] == 5
    m = info["weak_margins"]
    assert m[1, 0] == -1.2 and np.isnan(m[1, 2])  # pair 2 exited: node C never scored
    # every pair has a principle margin != its plain margin, and |q - sigmoid(plain)| > 0.01 on all three
    assert info["effect"] == {
        "pairs": 3,
        "principle_margin_differs_share": 1.0,
        "label_differs_from_naive_share": 1.0,
        "warning": None,
    }


def test_seam_keeps_one_node_and_default_config():
    s = Stubs()
    q, info = seam_labels(
        _pairs(), s.strong, s.weak, SeamConfig(principles=PRINCIPLES, n_nodes=2, exit_margin=1.0, min_relevance=10.0)
    )
    assert info["n_informative"].tolist() == [1, 1, 1]
    assert info["order"].tolist() == [[1, -1], [0, -1], [1, -1]]
    assert len(s.weak_calls) == 2  # plain + depth 0 only
    np.testing.assert_allclose(q, [sig((0.5 + 5.0) / 2), sig(-1.2), sig((0.3 + 0.7) / 2)], rtol=1e-12)
    cfg = SeamConfig()
    assert cfg.principles == list(DEFAULT_PRINCIPLES) and len(cfg.principles) == 8
    assert (cfg.n_nodes, cfg.exit_margin, cfg.min_relevance) == (3, 1.0, None)
    assert all(f.description for f in SeamConfig.model_fields.values())
    # the YAML settings are SeamConfig's fields, declared once: the same bounds and help
    from w2s_shift.methods.seam import SeamSettings

    for yaml_name, name in (("seam_nodes", "n_nodes"), ("seam_exit_margin", "exit_margin")):
        mine, theirs = SeamSettings.model_fields[yaml_name], SeamConfig.model_fields[name]
        assert (mine.default, mine.description, mine.metadata) == (theirs.default, theirs.description, theirs.metadata)
    assert "RANKS a fixed bank" in APPROXIMATIONS


def test_seam_bad_inputs():
    s = Stubs()
    with pytest.raises(ValueError, match=r"n_nodes\n  Input should be greater than or equal to 1"):
        SeamConfig(principles=PRINCIPLES, n_nodes=0)
    with pytest.raises(ValueError, match=r"principles\n  Value error, principles\[1\] is blank"):
        SeamConfig(principles=["A?", " "])
    with pytest.raises(ValueError, match="contains duplicates"):
        SeamConfig(principles=["A?", "A?"])
    with pytest.raises(ValueError, match="min_relevance"):
        SeamConfig(min_relevance=float("nan"))
    with pytest.raises(ValueError, match="seam: weak_margins \\(plain pairs\\) returned 2 values for 3 inputs"):
        seam_labels(_pairs(), s.strong, lambda ps: np.zeros(2), SeamConfig(principles=PRINCIPLES))
    with pytest.raises(ValueError, match="strong_logprob_diff returned non-finite"):
        seam_labels(_pairs(), lambda qs: np.full(len(qs), np.nan), s.weak, SeamConfig(principles=PRINCIPLES))
    q, info = seam_labels([], s.strong, s.weak, SeamConfig(principles=PRINCIPLES))
    assert q.shape == (0,) and info["order"].shape == (0, 3)


def test_with_principle_without_user_turn():
    p = PreferencePair([{"role": "system", "content": "Only a system prompt."}], "c", "r", "s")
    assert with_principle(p, "X?").prompt == [{"role": "system", "content": "Principle: X?\n\nOnly a system prompt."}]


def test_principle_effect_by_hand_and_warning():
    plain = np.array([0.5, -1.0, 2.0, 0.0])
    margins = np.array([[0.5, NAN], [-1.0, -0.5], [2.0, 2.0], [NAN, NAN]])  # pair 1 differs only
    q = np.array([sig(0.5), sig(-0.75), sig(2.0) + 0.005, sig(0.0) + 0.02])  # pairs 1 and 3 move by > 0.01
    eff = principle_effect(q, margins, plain)
    assert eff["principle_margin_differs_share"] == 0.25 and eff["label_differs_from_naive_share"] == 0.5
    assert eff["warning"].startswith(
        "SEAM: a principle changed the teacher margin on 25.0% of pairs and the label (by > 0.01) on 50.0% (below 50%)"
    )
    # the driver warns when the principles change (almost) nothing
    flat = Stubs()
    flat_weak = lambda pairs: np.full(len(pairs), 5.0)  # noqa: E731 - every margin equals the plain one
    with pytest.warns(UserWarning, match="SEAM's labels are close to Naive's"):
        _, info = seam_labels(_pairs(), flat.strong, flat_weak, SeamConfig(principles=PRINCIPLES, n_nodes=2))
    assert info["effect"]["principle_margin_differs_share"] == 0.0


def _positional_margin(tokenizer, max_length):
    """A stub weak teacher that reads every kept token: r(seq) = sum_i id_i * (i + 1) / T^2 on the encoding
    the pipeline would score (render + truncation at ``max_length``); margin = r(chosen) - r(rejected)."""
    from w2s_shift.data.render import encode_pairs

    def r(ids):
        return sum(t * (i + 1) for i, t in enumerate(ids)) / len(ids) ** 2

    def weak(pairs):
        enc, _ = encode_pairs(pairs, tokenizer, max_length)
        return np.array([r(e.chosen.input_ids) - r(e.rejected.input_ids) for e in enc])

    return weak


def test_principle_survives_a_prompt_longer_than_max_length(tokenizer):
    from w2s_shift.data.render import encode, encode_pairs

    long_prompt = " ".join(["the weather today is pleasant and the sky is blue"] * 10) + " Should I go out?"
    max_length = 48
    assert len(tokenizer(long_prompt)["input_ids"]) > max_length  # the prompt alone exceeds the budget
    pairs = [
        PreferencePair(long_prompt, "Yes, enjoy the sun.", "No.", "s", id="1"),
        PreferencePair([{"role": "user", "content": long_prompt}], "Take an umbrella.", "Stay in.", "s", id="2"),
    ]
    principles = ["Is the response honest?", "Is the response concise?"]
    weak = _positional_margin(tokenizer, max_length)
    cfg = SeamConfig(principles=principles, n_nodes=2, exit_margin=1e9)  # no exit: both nodes scored
    q, info = seam_labels(pairs, lambda qs: np.arange(len(qs), dtype=float) % 2, weak, cfg)
    m, plain = info["weak_margins"], info["plain_margin"]
    assert np.isfinite(m).all()
    assert (np.abs(m - plain[:, None]) > 1e-9).all()  # every principle margin depends on its principle
    assert abs(m[0, 0] - m[0, 1]) > 1e-9 and abs(m[1, 0] - m[1, 1]) > 1e-9  # and differs between principles
    assert info["effect"]["principle_margin_differs_share"] == 1.0
    # the principle line is in the truncated sequence, whole, with the response end and the budget kept
    pp = with_principle(pairs[0], principles[0])
    assert isinstance(pp, PrincipledPair) and pp.keep_text == "Principle: Is the response honest?"
    e = encode_pairs([pp], tokenizer, max_length)[0][0].chosen
    kt = tokenizer(pp.keep_text, add_special_tokens=False)["input_ids"]
    assert len(e.input_ids) == max_length and any(e.input_ids[i : i + len(kt)] == kt for i in range(len(e.input_ids)))
    assert tokenizer.decode([t for t, mk in zip(e.input_ids, e.response_mask) if mk]).strip() == "Yes, enjoy the sun."
    # without the protection (the old failure): the principle is the first thing cut
    e_bare = encode(pp.prompt, pp.chosen, tokenizer, max_length)
    assert not any(e_bare.input_ids[i : i + len(kt)] == kt for i in range(len(e_bare.input_ids)))

"""Property-based tests of the adapters: any row, however malformed, is either loaded or reported.

For every format in :data:`~w2s_shift.data.adapters.FORMATS`, hypothesis writes a file of rows drawn
from three kinds: valid rows of that format, valid rows with one field (at any depth) deleted or replaced
by junk (ints, floats incl. NaN/inf, None, bools, lists, nested dicts, empty or whitespace strings,
zero-width and other odd unicode, lone surrogates), and random JSON values. Two properties:

(a) ``load_file(path, fmt)`` succeeds or raises :class:`DataError`, never any other exception;
(b) with ``skip_invalid=True`` it never raises, and every non-blank row written is a pair, a counted skip
    or a counted drop-by-definition; every kept pair is well formed (its prompt key, JSON and UTF-8
    encoding work).

Files are small (up to a dozen rows); ``max_examples`` is kept modest so the file runs in seconds.
"""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from w2s_shift.data.adapters import FORMATS
from w2s_shift.data.resolve import load_file
from w2s_shift.data.schema import ROLES, DataError, PreferencePair

# W2S_PROPERTY_EXAMPLES=500 for a deeper local run
SETTINGS = settings(
    max_examples=int(os.environ.get("W2S_PROPERTY_EXAMPLES", 50)),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

# ---------------------------------------------------------------------------------------------------------
# strategies: text and junk values

ODD_STRINGS = [
    "",
    " ",
    "\t\n ",
    "\u200b",
    "\u200b\u200c\u200d\ufeff",
    "\u00a0",
    "\u2028",
    "\x00",
    "\x1c",
    "N/A",
    "n/a",
    "nan",
    "NaN",
    "inf",
    "1",
    "0",
    "-1",
    "3.5",
    "true",
    "null",
    "[]",
    "{}",
    "\ud800",
    "ok\udfffok",
    "\U0001f600",
    "\n\nAssistant:",
    "\n\nHuman:",
    "\n\nHuman: hi\n\nAssistant:",
    "\n\nAssistant: \n\nHuman:",
    "\u0301",
]

texts = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    st.text(alphabet="ab \n\u200b\u00e9", max_size=6),
    st.sampled_from(ODD_STRINGS),
)
visible_text = st.text(alphabet="abcdefghij XYZ?.\u00e9\u4e2d", min_size=1, max_size=16).filter(lambda s: s.strip())
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, 1.0, 2.0, -0.0, 1e308]),
    texts,
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(texts, st.sampled_from(["role", "content", "from", "value", "Rating", "response"])),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=6,
)

# values one type-check away from valid: a bool or a float where an int label is expected, a number as a
# string, an int beyond float range, a visible string with a lone surrogate, empty containers
CONFUSABLE = [
    True,
    False,
    0.0,
    1.0,
    2.0,
    -1.0,
    -3.0,
    "1",
    "0",
    "4",
    10**400,
    -(10**400),
    "ok\udfffok",
    "\ud83d",
    "\u200b",
    "",
    " ",
    None,
    [],
    {},
    [[]],
    float("nan"),
    float("inf"),
]
mutant = st.one_of(junk, st.sampled_from(CONFUSABLE))

# raw JSONL lines that are not a JSON row at all, or that strain the parser
RAW_LINES = [
    "{",
    '{"prompt": ',
    "[1, 2",
    "nul",
    '"unterminated',
    '{"a": NaN}',
    '{"a": Infinity}',
    '{"prompt": ' + "9" * 5000 + "}",
    "[" * 3000,
    '{"chosen": "\\ud800"}',
    "\x00",
]

# ---------------------------------------------------------------------------------------------------------
# valid rows per format (a valid row need not load: identical responses, ties etc. are fine; they are seeds)


def msg(role, content):
    return {"role": role, "content": content}


@st.composite
def hh_row(draw):
    p1, p2 = draw(visible_text), draw(st.one_of(st.none(), visible_text))
    a, b = draw(visible_text), draw(visible_text)
    head = f"\n\nHuman: {p1}"
    if draw(st.booleans()):
        head += f"\n\nAssistant: {draw(visible_text)}\n\nHuman: {draw(visible_text)}"
    rej_head = head if p2 is None else f"\n\nHuman: {p2}"
    return {"chosen": f"{head}\n\nAssistant: {a}", "rejected": f"{rej_head}\n\nAssistant: {b}"}


@st.composite
def trl_row(draw):
    p, a, b = draw(visible_text), draw(visible_text), draw(visible_text)
    kind = draw(st.sampled_from(["implicit", "explicit", "text"]))
    if kind == "implicit":
        sys = [msg("system", draw(visible_text))] if draw(st.booleans()) else []
        return {
            "chosen": sys + [msg("user", p), msg("assistant", a)],
            "rejected": sys + [msg("user", p), msg("assistant", b)],
        }
    if kind == "explicit":
        return {"prompt": [msg("user", p)], "chosen": [msg("assistant", a)], "rejected": [msg("assistant", b)]}
    return {"prompt": p, "chosen": a, "rejected": b, "id": draw(st.one_of(st.integers(0, 99), visible_text))}


@st.composite
def ultrafeedback_raw_row(draw):
    n = draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["overall_score", "fine-grained_score", "annotations"]))
    comps = []
    for _ in range(n):
        c = {"response": draw(visible_text), "model": "m"}
        if kind == "annotations":
            c["annotations"] = {
                a: {"Rating": draw(st.sampled_from(["1", "2", "3", "4", "5", "N/A"])), "Rationale": "r"}
                for a in ("helpfulness", "honesty", "instruction_following", "truthfulness")
            }
        else:
            c[kind] = draw(st.sampled_from([1, 2.5, 4, 5.0, 7.5, 10]))
        comps.append(c)
    return {"source": "s", "instruction": draw(visible_text), "completions": comps}


VALID = {
    "prompt_chosen_rejected": st.builds(
        lambda p, a, b: {"prompt": p, "chosen": a, "rejected": b}, visible_text, visible_text, visible_text
    ),
    "trl": trl_row(),
    "hh": hh_row(),
    "pandalm": st.builds(
        lambda i, x, a, b, v: {
            "idx": 0,
            "instruction": i,
            "input": x,
            "response1": a,
            "response2": b,
            "annotator1": v[0],
            "annotator2": v[1],
            "annotator3": v[2],
        },
        visible_text,
        st.one_of(st.just(""), visible_text),
        visible_text,
        visible_text,
        st.tuples(*[st.integers(0, 2)] * 3),
    ),
    "sharegpt_dpo": st.builds(
        lambda p, a, b: {
            "conversations": [{"from": "human", "value": p}],
            "chosen": {"from": "gpt", "value": a},
            "rejected": {"from": "gpt", "value": b},
        },
        visible_text,
        visible_text,
        visible_text,
    ),
    "pku_pairs": st.builds(lambda p, a, b: {"prompt": p, "response": [a, b]}, visible_text, visible_text, visible_text),
    "pku_saferlhf": st.builds(
        lambda p, a, b, s: {"prompt": p, "response_0": a, "response_1": b, "safer_response_id": s},
        visible_text,
        visible_text,
        visible_text,
        st.integers(0, 1),
    ),
    "pku_saferlhf_better": st.builds(
        lambda p, a, b, s: {"prompt": p, "response_0": a, "response_1": b, "better_response_id": s},
        visible_text,
        visible_text,
        visible_text,
        st.integers(0, 1),
    ),
    "rail_hh": st.builds(
        lambda c, p, a, b, s: {
            "context": c,
            "prompt": p,
            "chosen_text": a,
            "rejected_text": b,
            "chosen_rail_score": s,
            "rejected_rail_score": 5.0,
        },
        st.one_of(st.just(""), st.builds(lambda u, v: f"Human: {u}\nAssistant: {v}", visible_text, visible_text)),
        visible_text,
        visible_text,
        visible_text,
        st.sampled_from([0.5, 5.0, 9.25]),
    ),
    "helpsteer3": st.builds(
        lambda p, a, b, s: {"context": [msg("user", p)], "response1": a, "response2": b, "overall_preference": s},
        visible_text,
        visible_text,
        visible_text,
        st.integers(-3, 3),
    ),
    "safer_instruct": st.builds(
        lambda p, a, b: {"instruction": p, "chosen": a, "rejected": b}, visible_text, visible_text, visible_text
    ),
    "ultrafeedback_raw": ultrafeedback_raw_row(),
    "rewardbench": st.builds(
        lambda p, a, b, s: {"prompt": p, "chosen": a, "rejected": b, "subset": s, "id": 7},
        visible_text,
        visible_text,
        visible_text,
        visible_text,
    ),
    "rewardbench2": st.builds(
        lambda p, c, r, ties, k: {
            "id": f"tied:{k}" if ties else k,
            "prompt": p,
            "chosen": c if ties else c[:1],
            "rejected": r,
            "num_correct": len(c) if ties else 1,
            "num_incorrect": len(r),
            "subset": "Ties" if ties else "Math",
        },
        visible_text,
        st.lists(visible_text, min_size=2, max_size=3),
        st.lists(visible_text, min_size=1, max_size=3),
        st.booleans(),
        st.integers(0, 9),
    ),
}

# ---------------------------------------------------------------------------------------------------------
# mutation: delete or replace one node of a valid row, at any depth


def _nodes(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


def _mutate(obj, path, action, value):
    if not path:
        return value
    obj = json.loads(json.dumps(obj))  # a copy
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


def _twists(v):
    """Near misses of a valid value ``v``: the same content with its type or shape slightly off."""
    if isinstance(v, bool):
        return [int(v), str(v).lower()]
    if isinstance(v, int):
        return [float(v), bool(v), str(v), float(v) + 0.5, [v]] if abs(v) < 2**53 else [str(v), -v]
    if isinstance(v, float):
        return [int(v), str(v), float("nan")] if math.isfinite(v) else [str(v), 0]
    if isinstance(v, str):
        return [
            v + "\udfff",
            "\u200b" * len(v),
            " " + v.upper() + " ",
            [v],
            {"content": v},
            {"role": "user", "content": v},
        ]
    if isinstance(v, list):
        return [v[:1], v[::-1], v + v[-1:], [], {str(i): x for i, x in enumerate(v)}]
    if isinstance(v, dict):
        return [list(v.values()), {k: v[k] for k in list(v)[:-1]}, {k.upper(): x for k, x in v.items()}]
    return [None]


@st.composite
def mutated(draw, fmt):
    row = draw(VALID[fmt])
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(list(_nodes(row))))
        action = draw(st.sampled_from(["delete", "replace", "twist", "twist"]))
        if action == "twist":
            node = row
            for k in path:
                node = node[k]
            action, value = "replace", draw(st.sampled_from(_twists(node)))
        else:
            value = draw(mutant)
        row = _mutate(row, path, action, value)
    return row


def rows_for(fmt, raw=False):
    kinds = [VALID[fmt], VALID[fmt], mutated(fmt), mutated(fmt), junk]
    row = st.one_of(*kinds)
    if raw:
        row = st.one_of(row, st.sampled_from(RAW_LINES).map(lambda line: ("RAW", line)))
    return st.lists(row, min_size=1, max_size=10)


# ---------------------------------------------------------------------------------------------------------
# writers: each returns the number of non-blank rows written


def write_jsonl(path, rows, blank_every=4):
    lines = []
    for i, r in enumerate(rows):
        lines.append(
            r[1] if isinstance(r, tuple) else json.dumps(r)
        )  # NaN / Infinity written as JSON5-ish, as pandas does
        if i % blank_every == blank_every - 1:
            lines.append("   ")  # a blank line: skipped, not a row
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(rows)


def write_json(path, rows):
    path.write_text(json.dumps(rows), encoding="utf-8")
    return len(rows)


def _cell(v):
    s = v if isinstance(v, str) else ("" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v))
    return "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)  # a lone surrogate cannot be written as UTF-8


def write_csv(path, rows, header):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            if isinstance(r, dict):
                w.writerow([_cell(r.get(h)) for h in header])
            elif isinstance(r, list):  # a list row: written as a row of the wrong width
                w.writerow([_cell(v) for v in r] or ["", "", "", "", ""])
            else:
                w.writerow([_cell(r)])  # one field: wrong width (header has >= 2)
    return len(rows)


# ---------------------------------------------------------------------------------------------------------
# the properties


def check_pair(p):
    assert isinstance(p, PreferencePair)
    for t in (p.chosen, p.rejected):
        assert isinstance(t, str) and t.strip() and t.encode("utf-8")
    if isinstance(p.prompt, str):
        assert p.prompt.strip()
    else:
        assert p.prompt and all(m["role"] in ROLES and isinstance(m["content"], str) for m in p.prompt)
        assert p.prompt[-1]["role"] != "assistant"
    assert len(p.prompt_key()) == 40
    json.dumps(p.to_json(), ensure_ascii=False).encode("utf-8")
    assert p.strength is None or (isinstance(p.strength, float) and math.isfinite(p.strength))


def check_file(path, fmt, n_rows):
    # (a) strict: success or DataError, nothing else
    strict = None
    try:
        strict = load_file(path, fmt)
    except DataError as e:
        assert e.row is None or isinstance(e.row, int)
    # (b) skipping: never raises for these files (all their problems are row-level), every row accounted for
    res = load_file(path, fmt, skip_invalid=True)
    dropped = sum(res.dropped_by_definition.values())
    assert res.rows_kept + res.skipped.total + dropped == n_rows, res.summary()
    if fmt != "rewardbench2":  # the one format whose rows expand to several pairs
        assert res.rows_kept == len(res.pairs)
    assert 0 <= res.prompt_mismatch <= len(res.pairs)
    assert res.summary()["prompt_mismatch"] == res.prompt_mismatch
    for p in res.pairs:
        check_pair(p)
    if strict is not None:  # strict success means nothing was invalid: the same pairs, nothing skipped
        assert res.skipped.total == 0 and res.pairs == strict.pairs
        assert res.dropped_by_definition == strict.dropped_by_definition


def test_every_format_has_a_generator():
    assert set(VALID) == set(FORMATS)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_jsonl_and_json_never_crash_and_account_for_every_row(fmt, tmp_path):
    @SETTINGS
    @given(rows_for(fmt, raw=True))
    def prop(rows):
        f = tmp_path / f"{fmt}.jsonl"
        check_file(f, fmt, write_jsonl(f, rows))
        plain = [r for r in rows if not isinstance(r, tuple)]
        if plain:
            g = tmp_path / f"{fmt}.json"
            check_file(g, fmt, write_json(g, plain))

    prop()


CSV_HEADERS = {
    "prompt_chosen_rejected": ["prompt", "chosen", "rejected", "id"],
    "safer_instruct": ["instruction", "rejected", "chosen", "label"],
    "hh": ["chosen", "rejected"],
    "pku_saferlhf": ["prompt", "response_0", "response_1", "safer_response_id"],
    "rail_hh": ["context", "prompt", "chosen_text", "rejected_text", "chosen_rail_score", "rejected_rail_score"],
}


@pytest.mark.parametrize("fmt", sorted(CSV_HEADERS))
def test_csv_never_crashes_and_accounts_for_every_row(fmt, tmp_path):
    @SETTINGS
    @given(rows_for(fmt))
    def prop(rows):
        f = tmp_path / f"{fmt}.csv"
        check_file(f, fmt, write_csv(f, rows, CSV_HEADERS[fmt]))

    prop()


# ---------------------------------------------------------------------------------------------------------
# a huge row


def test_huge_row_jsonl_and_csv(tmp_path):
    big = ("All work and no play makes Jack a dull boy. " * 120_000)[:5_000_000]
    assert len(big) == 5_000_000
    rows = [{"prompt": "Q1", "chosen": big, "rejected": "short"}, {"prompt": "Q2", "chosen": "a", "rejected": "b"}]
    f = tmp_path / "big.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    g = tmp_path / "big.csv"
    with open(g, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "chosen", "rejected"])
        big_csv = big.replace("Jack", 'Jack, "quoted",\nnext line')  # delimiters, quotes and newlines inside the field
        w.writerow(["Q1", big_csv, "short"])
        w.writerow(["Q2", "a", "b"])
    for path, expected in ((f, big), (g, big_csv)):
        res = load_file(path)
        assert [p.prompt for p in res.pairs] == ["Q1", "Q2"] and res.skipped.total == 0
        assert res.pairs[0].chosen == expected and len(expected) >= 5_000_000

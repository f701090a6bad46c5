"""No verdict from too little information: one seed, models that agree on every pair, too few disagreeing pairs for
an exact test, and the precedence of "ruled out" over "for" (docs/protocol.md, "How the code decides")."""

import numpy as np
import pytest

from w2s_shift.metrics.claims import (
    FOR,
    NO_INFORMATION,
    NOT_DECIDED_1SEED,
    NOT_REPRODUCED,
    REPRODUCED,
    RULED_OUT,
    exact_floor,
    four_claims,
    pooled_metric,
    row_status,
)

DECIDED = {REPRODUCED, NOT_REPRODUCED, RULED_OUT}


def ones(n, k):
    return np.array([1] * k + [0] * (n - k), dtype=bool)


def cell(correct, n):
    return {"id": "id", "ood": ["o"], "ids": {"id": list(range(n)), "o": list(range(n))}, "correct": correct}


def anchor(label, lam, spec="last"):
    return {"label": label, "name": "anchor", "anchor_lambda": lam, "anchor_lambda_mode": "fixed", "layer_spec": spec}


METHODS = [
    {"label": "naive", "name": "naive"},
    {"label": "confidence", "name": "confidence"},
    anchor("anchor", 1.0),
    anchor("anchor_mid", 1.0, "middle"),
    anchor("anchor_l0.1", 0.1),
    anchor("anchor_l10", 10.0),
]


def test_identical_models_on_four_pairs_with_one_seed_decide_nothing():
    # every model right on the same 2 of 4 pairs: the earlier rules said (a), (b), (c) "ruled out" and (d)
    # "reproduced"; now one seed gives no method-level verdict, and no row has an MDE of 0.0
    t = {"id": ones(4, 2), "o": ones(4, 2)}
    c = cell({m: t for m in ["teacher", *(x["label"] for x in METHODS)]}, 4)
    claims = {x["claim"]: x for x in four_claims([c], METHODS, n_boot=200)}
    assert {k: x["verdict"] for k, x in claims.items() if x["rows"]} == {
        "a": NOT_DECIDED_1SEED,
        "b": NOT_DECIDED_1SEED,
        "c": NOT_DECIDED_1SEED,
        "d": NOT_DECIDED_1SEED,
    }
    rows = [r for x in claims.values() for r in x["rows"]]
    assert rows and all(r["status"] == NO_INFORMATION and np.isnan(r["stat"]["mde"]) for r in rows)


def test_one_seed_with_a_real_difference_is_not_decided():
    # one seed, 2,000 pairs, ANCHOR 3 pp above Naive on OOD (the same ID): significant on test pairs (the earlier
    # rule said (b) "reproduced"), but one trained model per method says nothing about the methods
    n = 2000
    t = {"id": ones(n, 1000), "o": ones(n, 1000)}
    c = cell({"teacher": t, "naive": t, "anchor": {"id": ones(n, 1000), "o": ones(n, 1060)}}, n)
    b = next(x for x in four_claims([c], [METHODS[0], METHODS[2]], n_boot=300) if x["claim"] == "b")
    assert b["rows"][0]["stat"]["value"] == pytest.approx(3.0) and b["rows"][0]["p"] < 0.001
    assert b["verdict"] == NOT_DECIDED_1SEED and b["rows"][0]["status"] == NOT_DECIDED_1SEED
    assert "one seed holds test-pair noise only" in b["why"] and "plan --power" in b["why"]


def test_too_few_disagreeing_pairs_for_an_exact_bound_say_nothing():
    # 2 seeds, ANCHOR right on 2 more OOD pairs than Naive in each: 4 disagreeing pairs, so the most extreme exact
    # result is p = 2 / 2^4 = 0.125 >= 0.05; no verdict, whatever the interval
    assert exact_floor(4) == 0.125 and exact_floor(0) == 1.0 and exact_floor(6) == pytest.approx(0.03125)
    n = 200
    t = {"id": ones(n, 100), "o": ones(n, 100)}
    c = cell({"teacher": t, "naive": t, "anchor": {"id": ones(n, 100), "o": ones(n, 102)}}, n)
    b = next(x for x in four_claims([c, c], [METHODS[0], METHODS[2]], n_boot=300) if x["claim"] == "b")
    r = b["rows"][0]
    assert r["stat"]["discordant"] == 4 and r["stat"]["test"] == "exact" and r["p"] == pytest.approx(0.125)
    assert r["status"] == NO_INFORMATION and b["verdict"] == NO_INFORMATION
    assert "4 test pairs differ: an exact test cannot reach p < 0.05" in b["why"]


def test_a_row_inside_the_margin_is_ruled_out_not_for():
    # 3 seeds, 5,000 pairs, ANCHOR 1.5-1.6 pp above Naive on OOD in every seed: significant (p < 0.001) with the
    # whole interval inside (0, 3.8): an effect smaller than m is not the claim's
    n = 5000
    t = {"id": ones(n, 2500), "o": ones(n, 2500)}
    cells = [cell({"teacher": t, "naive": t, "anchor": {"id": t["id"], "o": ones(n, 2575 + i)}}, n) for i in (0, 2, 5)]
    s = pooled_metric(cells, "anchor", "naive", "NTS", n_boot=300)
    assert (
        s["value"] == pytest.approx((1.5 + 1.54 + 1.6) / 3) and s["p"] < 0.001 and 0 < s["ci"][0] and s["ci"][1] < 3.8
    )
    assert row_status(s, 1, s["p"]) == RULED_OUT
    # the same interval shifted above m is "for"; the precedence is the interval's position, then the p-value
    wide = {**s, "value": 5.0, "ci": (4.0, 6.0)}
    assert row_status(wide, 1, 0.001) == FOR
    b = next(x for x in four_claims(cells, [METHODS[0], METHODS[2]], n_boot=300) if x["claim"] == "b")
    assert b["rows"][0]["status"] == RULED_OUT and b["verdict"] == RULED_OUT


def test_models_agreeing_on_every_pair_print_no_mde(tmp_path):
    from w2s_shift.report.sections import claims_table

    # 3 seeds, Naive and ANCHOR right on exactly the same pairs: "+0.00 [+0.00, +0.00]" is no evidence, and the MDE
    # column shows a dash, never "0.0"
    n = 200
    t = {"id": ones(n, 100), "o": ones(n, 100)}
    s = {"id": ones(n, 120), "o": ones(n, 90)}
    cells = [cell({"teacher": t, "naive": s, "anchor": s}, n)] * 3
    claims = four_claims(cells, [METHODS[0], METHODS[2]], n_boot=200)
    b = next(x for x in claims if x["claim"] == "b")
    assert b["verdict"] == NO_INFORMATION and "agree on every test pair" in b["why"]
    _, rows, _ = claims_table(claims)
    row = next(r for r in rows if r[0].startswith("(b)"))
    assert row[2] == "+0.00 [+0.00, +0.00]" and row[3] == "–" and row[6] == NO_INFORMATION
    assert all(cell_text != "0.0" for r in rows for cell_text in r)


def test_claim_cells_refuses_pair_ids_that_do_not_line_up(tmp_path):
    import json

    from w2s_shift.results.verdicts import claim_cells

    # the student's rewards file lists the pairs in another order than the teacher's: paired differences would
    # compare different pairs, so reading the cell stops and names the file; a tie (margin 0) counts as wrong
    rewards = tmp_path / "src" / "seed0" / "rewards"
    rewards.mkdir(parents=True)

    def write(model, dataset, ids, margins):
        rows = [{"id": i, "reward_chosen": m, "reward_rejected": 0.0} for i, m in zip(ids, margins)]
        (rewards / f"{model}__{dataset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    meta = {"dir": "src/seed0", "id": "id", "ood": ["o"], "models": ["naive"]}
    for m in ("teacher", "naive"):
        write(m, "id", [0, 1, 2], [1.0, 0.0, -1.0])
        write(m, "o", [0, 1, 2], [1.0, 1.0, -1.0])
    got = claim_cells(tmp_path, [meta])[0]
    assert got["correct"]["naive"]["id"].tolist() == [True, False, False]
    write("naive", "o", [2, 1, 0], [1.0, 1.0, -1.0])
    with pytest.raises(ValueError, match=r"naive__o\.jsonl: its pair ids are not the teacher's on o"):
        claim_cells(tmp_path, [meta])

"""The paper's four claims on a grid: pooled paired metrics by hand, the verdict rule, and the report section."""

import json

import numpy as np
import pytest

from w2s_shift.metrics.claims import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TESTED,
    REPRODUCED,
    direction,
    four_claims,
    pooled_metric,
)


def ones(n, k):
    """(n,) correctness with the first k pairs right."""
    return np.array([1] * k + [0] * (n - k), dtype=bool)


def cell(correct, n=4, ids=None):
    ids = ids or list(range(n))
    return {"id": "id", "ood": ["o"], "ids": {"id": ids, "o": ids}, "correct": correct}


def test_pooled_metric_by_hand():
    # teacher 50% ID / 25% OOD; a 75% / 50%: WRG +25, AOG +25, NTS = 25 - max(0, 50 - 75) = +25
    # b 25% / 75%: NTS = 50 - max(0, 50 - 25) = +25, so NTS(a) - NTS(b) = 0 while WRG(a) - WRG(b) = +50
    c = cell(
        {
            "teacher": {"id": ones(4, 2), "o": ones(4, 1)},
            "a": {"id": ones(4, 3), "o": ones(4, 2)},
            "b": {"id": ones(4, 1), "o": ones(4, 3)},
        }
    )
    assert pooled_metric([c], "a", None, "WRG", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", None, "AOG_mean", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", None, "NTS", n_boot=50)["value"] == pytest.approx(25.0)
    assert pooled_metric([c], "a", "b", "NTS", n_boot=50)["value"] == pytest.approx(0.0)
    assert pooled_metric([c], "a", "b", "WRG", n_boot=50)["value"] == pytest.approx(50.0)
    assert pooled_metric([c], "a", "missing", "NTS") is None
    with pytest.raises(ValueError, match="metric must be WRG, AOG_mean or NTS"):
        pooled_metric([c], "a", None, "PGR")


def test_pooled_metric_means_over_the_seeds_that_hold_both_models():
    t = {"id": ones(4, 2), "o": ones(4, 2)}
    s0 = cell({"teacher": t, "a": {"id": ones(4, 4), "o": ones(4, 2)}, "b": {"id": ones(4, 2), "o": ones(4, 2)}})
    s1 = cell({"teacher": t, "a": {"id": ones(4, 3), "o": ones(4, 2)}, "b": {"id": ones(4, 2), "o": ones(4, 2)}})
    s2 = cell({"teacher": t, "a": {"id": ones(4, 1), "o": ones(4, 2)}})  # b not trained in this seed
    r = pooled_metric([s0, s1, s2], "a", "b", "WRG", n_boot=50)
    assert r["per_seed"] == [50.0, 25.0] and r["value"] == pytest.approx(37.5) and r["n_seeds"] == 2


def test_seeds_on_the_same_pairs_share_their_resampling():
    rng = np.random.default_rng(0)
    corr = {m: {d: rng.random(60) < p for d in ("id", "o")} for m, p in (("teacher", 0.5), ("a", 0.6), ("b", 0.55))}
    one = pooled_metric([cell(corr, 60)], "a", "b", n_boot=400)
    same = pooled_metric([cell(corr, 60), cell(corr, 60)], "a", "b", n_boot=400)
    other = pooled_metric([cell(corr, 60), cell(corr, 60, ids=list(range(100, 160)))], "a", "b", n_boot=400)
    # the same pairs twice: the seed mean's replicates are the one seed's, so the interval is the same
    assert same["ci"] == pytest.approx(one["ci"])
    # different pairs are independent samples: averaging two narrows the interval
    assert other["ci"][1] - other["ci"][0] < one["ci"][1] - one["ci"][0]


def test_direction():
    assert [direction({"ci": c}) for c in ((0.1, 2), (-2, -0.1), (-1, 1), None)] == [1, -1, 0, 0]
    assert direction(None) == 0


def _grid(n=200, naive_ood=60, anchor_ood=120, sweep_ood=80, mid_ood=100):
    """Teacher 50% on ID and OOD; naive 70% ID and naive_ood/n OOD; ANCHOR (last, lambda 1) 70% ID, anchor_ood
    OOD; lambda 0.1 and 10 at the last layer sweep_ood; block 15 at lambda 1 mid_ood. Cumulative correctness
    (the first k pairs right), so differences between models are one-signed pair by pair."""
    acc = {
        "teacher": (100, 100),
        "naive": (140, naive_ood),
        "anchor": (140, anchor_ood),
        "anchor_l0.1": (140, sweep_ood),
        "anchor_l10": (140, sweep_ood),
        "anchor_b15": (140, mid_ood),
    }
    correct = {m: {"id": ones(n, i), "o": ones(n, o)} for m, (i, o) in acc.items()}
    methods = [
        {"label": "naive", "name": "naive"},
        {
            "label": "anchor",
            "name": "anchor",
            "anchor_lambda": 1.0,
            "anchor_lambda_mode": "fixed",
            "layer_spec": "last",
        },
        {
            "label": "anchor_b15",
            "name": "anchor",
            "anchor_lambda": 1.0,
            "anchor_lambda_mode": "fixed",
            "layer_spec": "15",
        },
        *(
            {
                "label": f"anchor_l{x:g}",
                "name": "anchor",
                "anchor_lambda": x,
                "anchor_lambda_mode": "fixed",
                "layer_spec": "last",
            }
            for x in (0.1, 10.0)
        ),
        {"label": "ceiling", "name": "ceiling"},
    ]
    return [cell(correct, n)], methods


def test_four_claims_reproduced_on_a_grid_built_to_show_them():
    cells, methods = _grid()
    got = {c["claim"]: c for c in four_claims(cells, methods, n_boot=500)}
    assert [got[k]["verdict"] for k in "abcd"] == [REPRODUCED] * 4
    # (a): naive's WRG +20 and AOG -20; (b): NTS anchor - naive = (+10) - (-20) = +30
    assert [r["stat"]["value"] for r in got["a"]["rows"]] == pytest.approx([20.0, -20.0])
    assert [r["what"] for r in got["b"]["rows"]] == ["NTS anchor - naive"]
    assert got["b"]["rows"][0]["stat"]["value"] == pytest.approx(30.0)
    # (c): lambda 1 minus lambda 0.1 and minus lambda 10, both +20; (d): last minus block 15, +10
    assert [r["stat"]["value"] for r in got["c"]["rows"]] == pytest.approx([20.0, 20.0])
    assert [r["what"] for r in got["d"]["rows"]] == ["NTS anchor - anchor_b15"]
    assert got["d"]["rows"][0]["stat"]["value"] == pytest.approx(10.0)


def test_four_claims_against_and_untested():
    # naive gains OOD, ANCHOR below naive, the ends of the sweep above lambda 1, block 15 above the last layer
    cells, methods = _grid(naive_ood=140, anchor_ood=100, sweep_ood=130, mid_ood=120)
    got = {c["claim"]: c["verdict"] for c in four_claims(cells, methods, n_boot=500)}
    assert got == {"a": NOT_REPRODUCED, "b": NOT_REPRODUCED, "c": NOT_REPRODUCED, "d": NOT_REPRODUCED}
    # equal models: every interval is [0, 0] and holds 0
    cells, methods = _grid(naive_ood=100, anchor_ood=100, sweep_ood=100, mid_ood=100)
    cells[0]["correct"]["naive"]["id"] = cells[0]["correct"]["teacher"]["id"]
    got = {c["claim"]: c["verdict"] for c in four_claims(cells, methods, n_boot=200)}
    assert got == {"a": INCONCLUSIVE, "b": INCONCLUSIVE, "c": INCONCLUSIVE, "d": INCONCLUSIVE}
    # a grid with Naive and the ceiling only tests (a)
    got = {c["claim"]: c["verdict"] for c in four_claims(cells, methods[:1], n_boot=200)}
    assert got["b"] == got["c"] == got["d"] == NOT_TESTED


def test_the_report_section_reads_the_rewards_files(tmp_path):
    from w2s_shift.report.claims import claim_cells, claims_blocks

    cells, methods = _grid()
    cell_dir = tmp_path / "src" / "seed0"
    (cell_dir / "rewards").mkdir(parents=True)
    for m, per in cells[0]["correct"].items():
        for d, c in per.items():
            rows = [{"id": i, "reward_chosen": 1.0 if ok else -1.0, "reward_rejected": 0.0} for i, ok in enumerate(c)]
            (cell_dir / "rewards" / f"{m}__{d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {
        "dir": "src/seed0",
        "id": "id",
        "ood": ["o"],
        "models": list(cells[0]["correct"])[1:],
        "bootstrap": {"n": 300},
    }
    back = claim_cells(tmp_path, [meta])[0]
    assert back["ids"]["o"] == list(range(200))
    assert all((back["correct"][m][d] == cells[0]["correct"][m][d]).all() for m in back["correct"] for d in ("id", "o"))
    blocks = claims_blocks(tmp_path, [meta], methods)
    assert blocks[0] == ("h3", "The paper's four claims")
    table = blocks[2]
    first_b = next(r for r in table[2] if r[0].startswith("(b)"))
    assert first_b[1] == "NTS anchor - naive" and first_b[2].startswith("+30.00 [") and first_b[4] == REPRODUCED
    assert first_b[3] == "1 (+30.00)"
    assert "No weak-to-strong gap" not in blocks[1][1]
    text = claims_blocks(tmp_path, [{**meta, "seed": 3, "gap_check": {"passed": False}}], methods)[1][1]
    assert text.startswith("**No weak-to-strong gap in seed 3**")

"""Seeds and test pairs a run needs to decide a claim at the margin (w2s_shift.power): the MDE formula by hand."""

import pytest
from scipy import stats as st

from w2s_shift.power import mde, requirements


def test_mde_by_hand():
    # pairs only (no seed variance), all shared: V = 1 whatever k, normal quantiles: 1.960 + 0.842
    assert mde(0.0, 1.0, 1.0, k=2, r=1.0) == pytest.approx(2.8016, rel=1e-4)
    # seed variance 4, own pair variance 1, k = 4: V = 4/4 + 1/4 = 1.25 with df 3 (all of it from the seeds)
    assert mde(4.0, 1.0, 0.0, k=4, r=1.0) == pytest.approx((st.t.ppf(0.975, 3) + st.t.ppf(0.8, 3)) * 1.25**0.5)
    # four times the pairs halves the pair SD
    assert mde(0.0, 1.0, 1.0, k=2, r=4.0) == pytest.approx(2.8016 / 2, rel=1e-4)


def test_requirements_pick_the_smallest_pair_count_of_the_grid():
    # a 1-seed pilot on 250 ID pairs with a test-pair variance of 16 pp^2 (SD 4): with no seed spread assumed,
    # MDE = 2.8016 x 4 / sqrt(r) <= 3.8 needs r >= 8.69, i.e. 2,173 ID pairs: the grid's 4,000
    stat = {"var_pairs": 16.0, "cov_shared": 16.0, "n_seeds": 1, "seed_sd": None, "mde": 11.2}
    claims = [{"claim": "b", "rows": [{"what": "NTS anchor - naive", "primary": True, "stat": stat}]}]
    got = requirements(claims, n_id=250, margin=3.8, seed_sd=0.0, max_seeds=3)["b"]
    assert got["by_seeds"] == {2: 4000, 3: 4000} and got["assumed_seed_sd"] is True
    # a seed SD of 4 pp: 3 seeds leave V >= 16/3 from training alone, MDE >= (4.303 + 1.061) x 2.31 > 3.8
    got = requirements(claims, n_id=250, margin=3.8, seed_sd=4.0, max_seeds=3)["b"]
    assert got["by_seeds"] == {2: None, 3: None}

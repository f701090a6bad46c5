"""Adding seeds until the claims are decided, with the error rate kept over the looks (``w2s-shift run
--until-decided``; the rules are docs/protocol.md, "Adding seeds until decided").

A look is the claims decided on the first k seeds (k = k0, k0 + 1, ..., N; k0 >= 2, the first look's seeds, N the
most seeds the researcher will pay for). Each look j spends part of the error rate alpha by a spending function of
the information fraction t_j = k_j / N (the seed mean's variance theta / k + c falls as 1 / k where training noise
dominates): alpha(t) with alpha(0) = 0 and alpha(1) = alpha (Lan & DeMets 1983, "Discrete sequential boundaries for
clinical trials", Biometrika 70(3): 659-663). The default is their O'Brien-Fleming-type function

    alpha(t) = 2 - 2 Phi(z_{1 - alpha / 2} / sqrt(t)),

which spends almost nothing at the first looks (O'Brien & Fleming 1979, Biometrics 35(3): 549-556), so the last look
keeps most of alpha; their Pocock-type function alpha ln(1 + (e - 1) t) and an equal split alpha / J over the J
looks (Bonferroni) are the alternatives. Look j tests at the increment alpha_j = alpha(t_j) - alpha(t_{j-1})
(alpha(t_0) = 0): the claims' seeds x pairs intervals (:func:`w2s_shift.metrics.significance.seed_pair_interval`) at
level 1 - alpha_j and Holm's family level alpha_j. By the union bound (Bonferroni's inequality over the looks) the
chance of any false decision over all looks is at most sum_j alpha_j = alpha, whatever the dependence between looks
(they share seeds and test pairs): no joint distribution of the looks is assumed, which the generalized interval's
statistics would not satisfy exactly. The price is a last look at alpha_J < alpha (0.0216 for N = 5 from k0 = 2 under
the O'Brien-Fleming-type function); the simulation in benchmarks/sequential_design.py gives the false-decision rate,
power and seeds used on the correlated world of benchmarks/interval_coverage.py.

A claim's verdict is frozen at the first look that decides it (reproduced, not reproduced, ruled out): the union
bound covers "some look decided wrongly", so a later look cannot undo it. Seeds are added while a claim is still open
(not decided (1 seed), no information, inconclusive); withheld and not tested are closed (more seeds do not change
a failed gap check or a grid that lacks the comparison).
"""

from __future__ import annotations

import copy

import numpy as np

from .claims import (
    ALPHA,
    INCONCLUSIVE,
    MARGIN_PP,
    NO_INFORMATION,
    NOT_DECIDED_1SEED,
    NOT_REPRODUCED,
    REPRODUCED,
    RULED_OUT,
    WITHHELD,
    decide,
)
from .significance import design_mde, gpq_critical

#: verdicts more seeds can still settle; every other verdict closes its claim
OPEN = (NOT_DECIDED_1SEED, NO_INFORMATION, INCONCLUSIVE)
#: verdicts that decide a claim (frozen at the look that gives them)
DECIDED = (REPRODUCED, NOT_REPRODUCED, RULED_OUT)
#: the spending functions by name
SPENDINGS = ("obrien-fleming", "pocock", "bonferroni")
#: how a look's level is read from the alpha spent (:func:`look_plan`)
BOUNDARIES = ("union", "group-sequential")
#: a single comparison's sequential decisions (:func:`sequential_decisions`)
CONTINUE, ABOVE, BELOW, RULED = 0, 1, -1, 2


def obrien_fleming_spending(t, alpha: float = ALPHA) -> np.ndarray:
    """Lan & DeMets' (1983) O'Brien-Fleming-type spending function, two-sided: alpha(t) = 2 - 2 Phi(z_{1 - alpha/2}
    / sqrt(t)), the error rate spent by information fraction t (alpha(0) = 0, alpha(1) = alpha).

    Args:
        t: (L,) information fractions in [0, 1]; alpha: the total two-sided error rate in (0, 1).

    Returns:
        (L,) cumulative alpha spent.

    Raises:
        ValueError: a t outside [0, 1] or alpha outside (0, 1).
    """
    from scipy import stats as st

    t = _fractions(t, alpha)
    with np.errstate(divide="ignore"):
        z = st.norm.isf(alpha / 2) / np.sqrt(t)
    return np.where(t > 0, 2 * st.norm.sf(z), 0.0)


def pocock_spending(t, alpha: float = ALPHA) -> np.ndarray:
    """Lan & DeMets' (1983) Pocock-type spending function: alpha(t) = alpha ln(1 + (e - 1) t) (shapes as
    :func:`obrien_fleming_spending`; it spends early, so the last look keeps less)."""
    t = _fractions(t, alpha)
    return alpha * np.log1p((np.e - 1) * t)


def _fractions(t, alpha: float) -> np.ndarray:
    t = np.atleast_1d(np.asarray(t, np.float64))
    if not 0 < alpha < 1:
        raise ValueError(f"spending: alpha must be in (0, 1), got {alpha}")
    if np.any((t < 0) | (t > 1)) or not np.all(np.isfinite(t)):
        raise ValueError(f"spending: information fractions must be in [0, 1], got {t.tolist()}")
    return t


def group_sequential_bounds(t, spent, grid: int = 1001) -> np.ndarray:
    """Two-sided group-sequential critical values z_j that spend exactly the increments of ``spent`` under the
    canonical joint distribution of the looks' z statistics (Brownian motion in information time: Corr(Z_i, Z_j) =
    sqrt(t_i / t_j)), by the recursive numerical integration of Armitage, McPherson & Rowe (1969, JRSS A 132(2):
    235-244) as Jennison & Turnbull (2000, "Group Sequential Methods", Ch. 19) lay it out: the sub-density of the
    score S_j = Z_j sqrt(t_j) over the continuation region, carried look to look by the normal increment of variance
    t_j - t_{j-1}, and z_j found (Brent) so that P(first crossing at look j) = spent_j - spent_{j-1}.

    Args:
        t: (J,) increasing information fractions in (0, 1]; spent: (J,) cumulative two-sided alpha, increasing;
        grid: points of the trapezoid rule over each continuation region.

    Returns:
        (J,) critical values (inf where a look spends nothing).

    Raises:
        ValueError: t not increasing in (0, 1], or spent not increasing in [0, 1).
    """
    from scipy import stats as st
    from scipy.optimize import brentq

    t, spent = np.asarray(t, np.float64), np.asarray(spent, np.float64)
    if t.size != spent.size or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1 or np.any(np.diff(spent) < 0):
        raise ValueError(f"group_sequential_bounds: t increasing in (0, 1] and spent non-decreasing, got {t}, {spent}")
    inc = np.diff(spent, prepend=0.0)
    z = np.full(t.size, np.inf)
    z[0] = st.norm.isf(inc[0] / 2) if inc[0] > 0 else np.inf
    s = _grid(z[0], t[0], grid)
    f = st.norm.pdf(s, scale=np.sqrt(t[0]))  # sub-density of S_1 over the continuation region
    for j in range(1, t.size):
        sd = np.sqrt(t[j] - t[j - 1])
        fw = f * _trapezoid(s)
        args = (s, fw, sd, np.sqrt(t[j]), inc[j])
        if inc[j] > 0:
            z[j] = brentq(_excess, 1e-6, 40.0, args=args, xtol=1e-10) if _excess(1e-6, *args) > 0 else 1e-6
        new = _grid(z[j], t[j], grid)
        f = st.norm.pdf((new[:, None] - s[None, :]) / sd) @ fw / sd
        s = new
    return z


def _excess(c: float, s, fw, sd: float, e: float, target: float) -> float:
    """P(first crossing of +-c at this look) - target: the weighted sub-density ``fw`` of the previous score ``s``
    carried by a N(0, sd^2) increment past +-c e (e = sqrt(t_j))."""
    from scipy import stats as st

    return float(fw @ (st.norm.sf((c * e - s) / sd) + st.norm.cdf((-c * e - s) / sd))) - target


def _grid(z: float, t: float, size: int) -> np.ndarray:
    """Grid of the score S = Z sqrt(t) over the continuation region (-z sqrt(t), z sqrt(t)); 12 SD wide if z = inf."""
    b = (z if np.isfinite(z) else 12.0) * np.sqrt(t)
    return np.linspace(-b, b, size)


def _trapezoid(s: np.ndarray) -> np.ndarray:
    w = np.full(s.size, s[1] - s[0])
    w[[0, -1]] /= 2
    return w


def look_plan(
    first: int, last: int, alpha: float = ALPHA, spending: str = "obrien-fleming", boundary: str = "union"
) -> list:
    """The looks of a sequential run and the alpha each spends: one look per seed count k = first..last, information
    fraction t = k / last, cumulative alpha(t) by the spending function (Lan & DeMets 1983); "bonferroni": alpha / J
    at each of the J looks. A look's own level: ``boundary`` "union", the increment alpha(t_j) - alpha(t_{j-1}) (the
    first look: alpha(t_1); valid by the union bound whatever the looks' dependence); "group-sequential", the
    nominal level 2 Phi(-z_j) of :func:`group_sequential_bounds` (Lan & DeMets' boundary, exact when the looks' z
    statistics are jointly normal with Corr sqrt(t_i / t_j), larger at the last look).

    Args:
        first: seeds at the first look (>= 2: one seed holds no training noise); last: the most seeds (N >= first);
        alpha: the total two-sided error rate; spending: one of :data:`SPENDINGS`; boundary: "union" or
            "group-sequential".

    Returns:
        [{"look": j (1-based), "seeds": k, "t": k / N, "spent": cumulative alpha, "alpha": this look's level}].

    Raises:
        ValueError: first < 2, last < first, alpha outside (0, 1), an unknown spending function or boundary.
    """
    from scipy import stats as st

    if first < 2 or last < first:
        raise ValueError(f"look_plan: needs 2 <= first seeds <= last seeds, got first={first}, last={last}")
    if spending not in SPENDINGS:
        raise ValueError(f"look_plan: spending must be one of {', '.join(SPENDINGS)}, got {spending!r}")
    if boundary not in BOUNDARIES:
        raise ValueError(f"look_plan: boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")
    ks = np.arange(first, last + 1)
    if spending == "bonferroni":
        spent = alpha * np.arange(1, ks.size + 1) / ks.size
        _fractions(ks / last, alpha)
    else:
        fn = obrien_fleming_spending if spending == "obrien-fleming" else pocock_spending
        spent = fn(ks / last, alpha)
    if boundary == "union":
        level = np.diff(spent, prepend=0.0)
    else:
        level = 2 * st.norm.sf(group_sequential_bounds(ks / last, spent))
    return [
        {"look": j + 1, "seeds": int(k), "t": float(k / last), "spent": float(s), "alpha": float(a)}
        for j, (k, s, a) in enumerate(zip(ks, spent, level))
    ]


def at_level(stat: dict, alpha: float) -> dict:
    """A copy of a comparison (:func:`w2s_shift.metrics.claims.pooled_metric` /
    :func:`~w2s_shift.metrics.significance.seed_pair_interval` result) with its interval at two-sided ``alpha``:
    mean +- :func:`~w2s_shift.metrics.significance.gpq_critical` at its variance components (k >= 2), the normal
    interval on the pairs-only variance with one seed; "level" 1 - alpha, "alpha" itself (a look's alpha of 1e-18
    has a level that rounds to 1) and "mde" the 80%-power effect at alpha
    (one comparison; :func:`~w2s_shift.metrics.claims.decide` moves it to Holm's first step). p is unchanged (the
    generalized p of 0 does not depend on the level: p < alpha exactly when this interval excludes 0)."""
    from scipy import stats as st

    out = dict(stat)
    k, v = int(stat["n_seeds"]), float(stat["value"])
    if k == 1:
        q = float(st.norm.isf(alpha / 2)) * float(stat["var_pairs"]) ** 0.5
        mde = design_mde(0.0, stat["var_pairs"], 0.0, 1, alpha, stat["power"])
    else:
        q = float(gpq_critical(stat["s2"], stat["var_own"], stat["cov_shared"], k, alpha)[0])
        mde = design_mde(stat["spread"], stat["var_own"], stat["cov_shared"], k, alpha, stat["power"])
    out.update(ci=(v - q, v + q), level=1 - alpha, alpha=alpha, mde=mde)  # alpha kept: 1 - 1e-18 rounds to 1
    out.pop("mde_single", None)
    return out


def decide_at(claims: list, alpha: float, margin: float = MARGIN_PP) -> list:
    """The claims (:func:`w2s_shift.metrics.claims.paper_claims`' output, decided at 0.05) decided again at a look's
    level ``alpha``: every row's interval at 1 - alpha (:func:`at_level`), Holm at family level alpha, the same
    row states and verdict rules (:func:`~w2s_shift.metrics.claims.decide`). A withheld claim stays withheld. The
    input is not changed.

    Returns:
        deep copies of the claims with "rows", "verdict", "why" at this level and "alpha": alpha.
    """
    out = []
    for c in claims:
        c = copy.deepcopy(c)
        for r in c["rows"]:
            r["stat"] = at_level(r["stat"], alpha)
        withheld = c.get("why") if c.get("verdict") == WITHHELD else None
        decide(c, margin, withheld if c["rows"] else None, alpha=alpha)
        c["alpha"] = alpha
        out.append(c)
    return out


def frozen_verdicts(looks: list) -> dict:
    """Each claim's sequential verdict over the looks so far: the first look's verdict that decides it
    (:data:`DECIDED`), else the latest look's.

    Args:
        looks: [{"seeds": k, "claims": {key: verdict}}] in look order (key: e.g. "source/claim").

    Returns:
        {key: {"verdict", "seeds": k of the look that gave it, "open": whether more seeds could still settle it}}.
    """
    out: dict = {}
    for look in looks:
        for key, verdict in look["claims"].items():
            if key in out and out[key]["verdict"] in DECIDED:
                continue
            out[key] = {"verdict": verdict, "seeds": look["seeds"], "open": verdict in OPEN}
    return out


def stop_reason(verdicts: dict, seeds: int, max_seeds: int) -> str | None:
    """Why the seed loop stops after a look at ``seeds`` seeds, or None to add a seed.

    Args:
        verdicts: :func:`frozen_verdicts` of the looks so far; seeds: this look's; max_seeds: N.

    Returns:
        a sentence: no claim to decide; every claim decided or closed (naming those withheld, which a seed without the
        weak-to-strong gap closes for good: it stays in the run, so more seeds cannot decide them); or N reached with
        the claims still open. None while a claim is open and seeds < N.
    """
    still = [k for k, v in verdicts.items() if v["open"]]
    if not verdicts:
        return "no claim of the paper to decide: the grid has none of its W2S methods"
    if not still:
        held = [k for k, v in verdicts.items() if v["verdict"] == WITHHELD]
        return f"every claim decided or closed at {seeds} seeds" + (
            f"; withheld: {', '.join(held)} (a seed without the weak-to-strong gap stays in the run, so more seeds "
            "cannot decide them)"
            if held
            else ""
        )
    if seeds >= max_seeds:
        return f"--max-seeds {max_seeds} reached with {len(still)} claim(s) open: {', '.join(still)}"
    return None


def sequential_decisions(means, half_widths, margin: float = MARGIN_PP) -> tuple:
    """One superiority comparison decided look by look, as a claim row is (:func:`~w2s_shift.metrics.claims.
    row_status`, one comparison): at each look, ruled out when the interval lies inside (-m, +m), else a direction
    when it excludes 0, else on to the next look; the first decision stops. Used by the simulation benchmark and
    the tests.

    Args:
        means: (R, J) seed means at the J looks (pp); half_widths: (R, J) the intervals' half-widths at each look's
            level (pp); margin: m (pp).

    Returns:
        (decision (R,) int: :data:`ABOVE`, :data:`BELOW`, :data:`RULED` or :data:`CONTINUE` (none by the last look),
         look (R,) int: the 0-based look that decided, J - 1 where none did).
    """
    means = np.asarray(means, np.float64)
    q = np.asarray(half_widths, np.float64)
    ruled = (means - q > -margin) & (means + q < margin)
    above, below = means - q > 0, means + q < 0
    code = np.where(ruled, RULED, np.where(above, ABOVE, np.where(below, BELOW, CONTINUE)))
    hit = code != CONTINUE
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), means.shape[1] - 1)
    decision = np.take_along_axis(code, first[:, None], axis=1)[:, 0]
    return decision, first

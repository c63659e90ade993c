"""The inferential statistics of a study: Student t tails and quantiles, Holm's correction, the exact
sign-flip test, and the power of the paired t-test.

The distributions come from `scipy.stats` and Holm from `statsmodels`; the sign-flip test is written here
because it is an exact enumeration over 2^S sign patterns with a closed form for equal magnitudes (the
zero-SE case), which neither library offers in that form. These are the `study` extra's dependencies,
never the core's: `src/regroup` never imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as sps
from statsmodels.stats.multitest import multipletests


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` > 0 degrees of freedom (df = inf: the normal)."""
    if math.isinf(df):
        return float(sps.norm.sf(t))
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    return float(sps.t.sf(t, df))


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (df = inf: the normal)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    return float(sps.norm.ppf(q) if math.isinf(df) else sps.t.ppf(q, df))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error control under any dependence); None stays None
    and is not counted in m."""
    defined = [(i, p) for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    if defined:
        adjusted = multipletests([p for _, p in defined], method="holm")[1]
        for (i, _), p in zip(defined, adjusted):
            out[i] = float(p)
    return out


def sign_flip_p(values: Sequence[float], two_sided: bool = True) -> float:
    """Exact sign-flip (randomisation) p of H0: the values are symmetric about 0 (the paired seeds' differences
    under no effect): the share of the 2^S sign patterns whose |sum| (one-sided: sum) is at least the observed.

    Its smallest value is 2^(1−S) two-sided (2^(−S) one-sided): with 2 seeds it is 0.5, whatever the values, so
    a difference with no spread over few seeds cannot come out significant. All-equal magnitudes (the case of a
    zero standard error) are counted in closed form; otherwise the patterns are enumerated (S <= 20)."""
    s = len(values)
    if s == 0:
        return 1.0
    observed = sum(values)
    scale = max(abs(v) for v in values)
    if scale == 0:
        return 1.0  # every difference 0: a tie, no evidence either way
    tol = 1e-12 * scale * s
    target = abs(observed) if two_sided else observed
    if all(abs(abs(v) - scale) <= 1e-12 * scale for v in values):
        # sum = scale · (2j − S) with j positive signs: count the j whose sum is at least as extreme
        sums = ((math.comb(s, j), scale * (2 * j - s)) for j in range(s + 1))
        return sum(n for n, total in sums if (abs(total) if two_sided else total) >= target - tol) / 2**s
    if s > 20:
        raise ValueError(f"sign_flip_p enumerates 2^S patterns: S = {s} > 20")
    hits = 0
    for pattern in range(2**s):
        total = sum(-v if pattern >> i & 1 else v for i, v in enumerate(values))
        hits += (abs(total) if two_sided else total) >= target - tol
    return hits / 2**s


def t_test_power(noncentrality: float, df: float, alpha: float) -> float:
    """Power of the two-sided one-sample t-test at level `alpha` with `df` degrees of freedom when the true
    mean over its SE is `noncentrality` (δ = Δ / (σ / √S)): P(|T'| > t_{1−α/2, df}), T' noncentral t."""
    crit = t_ppf(1.0 - alpha / 2.0, df)
    if math.isinf(df):
        return float(sps.norm.cdf(noncentrality - crit) + sps.norm.cdf(-noncentrality - crit))
    tails = (float(sps.nct.sf(crit, df, noncentrality)), float(sps.nct.cdf(-crit, df, noncentrality)))
    # scipy's noncentral t gives nan for a tail far from δ (|δ| >> crit), where the true value underflows to 0
    return min(1.0, sum(0.0 if math.isnan(t) else t for t in tails))


def paired_t_power(effect: float, sd: float, seeds: int, alpha: float) -> float:
    """Power of the two-sided paired t-test over `seeds` seeds (S − 1 df) to detect a true mean difference
    `effect` when the per-seed differences have standard deviation `sd`."""
    if seeds < 2:
        return 0.0
    if sd <= 0:
        return 1.0
    return t_test_power(effect / (sd / math.sqrt(seeds)), float(seeds - 1), alpha)


def seeds_for_power(effect: float, sd: float, alpha: float, power: float = 0.8, most: int = 200) -> int | None:
    """The fewest seeds (>= 2) whose paired t-test reaches `power` at `effect` (None: not within `most`)."""
    for seeds in range(2, most + 1):
        if paired_t_power(effect, sd, seeds, alpha) >= power:
            return seeds
    return None

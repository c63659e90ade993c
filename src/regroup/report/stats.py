"""The few statistics the report states: means over seeds, standard errors, and 2-SE verdicts.

Every comparison in the report is a difference of mean@n. Its standard error is paired over problems
when both sides are single runs whose per-problem results cover the same problems (the std of the
per-problem differences / √P), else unpaired `√(SE_a² + SE_b²)`; a difference within 2 SE is called
"no clear difference" (the text never claims more than that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BETTER, WORSE, UNCLEAR, NO_SE = "better", "worse", "no clear difference", "no standard error"


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, None for no values."""
    return sum(values) / len(values) if values else None


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n − 1), None for fewer than two values."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def group_stderr(means: Sequence[float], stderrs: Sequence[float | None]) -> float | None:
    """Standard error of the mean over runs (seeds) of a per-run estimate.

    One run: its own SE. Several: the larger of the evaluation noise `√(Σ SE_i²) / k` and the seed
    spread `std / √k` — a small number of seeds underestimates seed variance, so take the cautious one.
    None when any run has no SE.
    """
    k = len(means)
    if k == 0 or any(s is None for s in stderrs):
        return None
    eval_se = math.sqrt(sum(s * s for s in stderrs)) / k  # type: ignore[operator]
    spread = std(means)
    seed_se = spread / math.sqrt(k) if spread is not None else 0.0
    return max(eval_se, seed_se)


def diff_stderr(se_a: float | None, se_b: float | None) -> float | None:
    """SE of a − b for independent estimates: √(SE_a² + SE_b²); None if either is unknown."""
    if se_a is None or se_b is None:
        return None
    return math.sqrt(se_a * se_a + se_b * se_b)


def paired_diff_stderr(a: dict | None, b: dict | None) -> float | None:
    """SE of mean(a) − mean(b) paired over the problems both evaluated (per-problem accuracies keyed by
    problem id): the sample std of the per-problem differences / √P. None unless both cover the same
    problems (at least two). Pairing removes the problem-difficulty variance both runs share."""
    if not a or not b or set(a) != set(b) or len(a) < 2:
        return None
    diffs = [a[k] - b[k] for k in a]
    return std(diffs) / math.sqrt(len(diffs))


def verdict(delta: float | None, se: float | None) -> str | None:
    """ "better" / "worse" when |delta| > 2·SE, "no clear difference" when within 2·SE (inclusive),
    "no standard error" when SE is unknown, None when there is no delta."""
    if delta is None:
        return None
    if se is None:
        return NO_SE
    if abs(delta) <= 2 * se:
        return UNCLEAR
    return BETTER if delta > 0 else WORSE


# ------------------------------------------------------------------ Student t, p-values, Holm (no scipy)
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast on this side
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` > 0 degrees of freedom (df = inf: the normal)."""
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on `t_sf`; |error| < 1e-10)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 1.0 - t_sf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error control under any dependence); None stays None.

    With the m defined p-values sorted ascending, adj_(i) = max_{j <= i} min(1, (m − j + 1) · p_(j))."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(order)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out

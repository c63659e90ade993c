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


# ------------------------------------------------------------------ exact and power calculations (no scipy)
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
    if all(abs(abs(v) - scale) <= 1e-12 * scale for v in values):
        # sum = scale · (2j − S) with j positive signs: count the j whose sum is at least as extreme
        hits = sum(
            math.comb(s, j)
            for j in range(s + 1)
            if (abs(scale * (2 * j - s)) if two_sided else scale * (2 * j - s))
            >= (abs(observed) if two_sided else observed) - tol
        )
        return hits / 2**s
    if s > 20:
        raise ValueError(f"sign_flip_p enumerates 2^S patterns: S = {s} > 20")
    target = abs(observed) if two_sided else observed
    hits = 0
    for pattern in range(2**s):
        total = sum(-v if pattern >> i & 1 else v for i, v in enumerate(values))
        hits += (abs(total) if two_sided else total) >= target - tol
    return hits / 2**s


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def t_test_power(noncentrality: float, df: float, alpha: float) -> float:
    """Power of the two-sided one-sample t-test at level `alpha` with `df` degrees of freedom when the true
    mean over its SE is `noncentrality` (δ = Δ / (σ / √S)): P(|T'| > t_{1−α/2, df}) for the noncentral t
    T' = (Z + δ) / √(V / df), V ~ χ²_df, integrated over the χ distribution of √V (Simpson, 4,000 panels)."""
    crit = t_ppf(1.0 - alpha / 2.0, df)
    if math.isinf(df):
        return normal_cdf(noncentrality - crit) + normal_cdf(-noncentrality - crit)
    # density of x = √V (the χ distribution with df degrees of freedom), in logs for large df
    log_norm = (df / 2.0 - 1.0) * math.log(2.0) + math.lgamma(df / 2.0)
    lo, hi = max(0.0, math.sqrt(df) - 12.0), math.sqrt(df) + 12.0  # √V has sd < 1: ±12 holds all its mass
    panels = 4000
    step = (hi - lo) / panels
    total = 0.0
    for i in range(panels + 1):
        x = lo + i * step
        if x == 0.0:
            density = 0.0 if df > 1 else math.exp(-log_norm)
        else:
            density = math.exp((df - 1.0) * math.log(x) - x * x / 2.0 - log_norm)
        w = x / math.sqrt(df)
        rejects = normal_cdf(noncentrality - crit * w) + normal_cdf(-noncentrality - crit * w)
        weight = 1 if i in (0, panels) else (4 if i % 2 else 2)
        total += weight * density * rejects
    return min(1.0, total * step / 3.0)


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

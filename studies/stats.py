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


def crossed_bootstrap(
    diffs, resamples: int = 100_000, seed: int = 0, seeds: bool = True, problems: bool = True, chunk: int = 10_000
):
    """The two-way bootstrap of the mean of a seeds × problems matrix of paired differences (problems as a
    random effect beside the seeds): each resample draws S seeds and P problems with replacement, independently
    of each other, and takes the mean of the S × P matrix they index (Owen's pigeonhole bootstrap). With
    `problems=False` only the seeds are resampled (the problems held fixed, as the paired t over seeds does);
    with `seeds=False` only the problems. Returns the resampled means (numpy array, `resamples` long), drawn
    from a fixed RNG seed so that a page's interval is the same on every run; take the percentile interval of
    them (`percentile_interval`).

    Conservative by construction: the seed × problem residual (evaluation noise, seed-problem interaction)
    is in both the seeds' and the problems' margins, so the resamples count it about three times where the
    mean's variance has it once: of the intervals that treat problems as random it is the widest.
    100,000 resamples of a 10 × 200 matrix take 2-3 s on one core; the interval's ends then move by a few
    hundredths of a point between RNG seeds (or orders of the problems) on the gated study's primaries."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"a seeds × problems matrix is needed, got shape {d.shape}")
    n_seeds, n_problems = d.shape
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        # both are drawn either way, so that the one-way variants see the same stream as the two-way one
        w_seed = rng.multinomial(n_seeds, [1 / n_seeds] * n_seeds, size=b)
        w_problem = rng.multinomial(n_problems, [1 / n_problems] * n_problems, size=b)
        if not seeds:
            w_seed = np.ones_like(w_seed)
        if not problems:
            w_problem = np.ones_like(w_problem)
        # the mean of the indexed submatrix: each seed and problem weighted by how often it was drawn
        out.append(np.einsum("bs,sp,bp->b", w_seed, d, w_problem) / (n_seeds * n_problems))
    return np.concatenate(out)


def percentile_interval(draws, level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval: the (1 − level)/2 and (1 + level)/2 quantiles of the draws."""
    import numpy as np

    lo, hi = np.percentile(np.asarray(draws, dtype=float), [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def stratified_mean_test(groups: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(estimate, p, heterogeneity p) of paired differences split into strata (e.g. the machine each seed ran
    on), by the one-way model y = μ_stratum + e with one pooled residual variance (N − H df): the estimate is
    the strata's means weighted by their sizes (the overall mean), its two-sided t-test of 0 uses the pooled
    variance, so a shift between strata is not counted as noise; the heterogeneity p is the model's F test
    that the strata share one mean (`scipy.stats.f_oneway`; two strata: Student's two-sample t)."""
    sizes = [len(g) for g in groups]
    n, h = sum(sizes), len(groups)
    if h < 2 or min(sizes) < 1 or n - h < 1:
        raise ValueError(f"need at least 2 strata and more values than strata, got sizes {sizes}")
    means = [sum(g) / len(g) for g in groups]
    estimate = sum(k * m for k, m in zip(sizes, means)) / n
    pooled = sum((v - m) ** 2 for g, m in zip(groups, means) for v in g) / (n - h)
    se = math.sqrt(pooled * sum((k / n) ** 2 / k for k in sizes))
    p = 1.0 if se == 0 else min(1.0, 2.0 * t_sf(abs(estimate) / se, n - h))
    return estimate, p, float(sps.f_oneway(*groups).pvalue)


def crossed_anova_interval(diffs, level: float = 0.95) -> tuple[float, float, float, tuple[float, float]]:
    """(mean, SE, df, interval) of the mean of a seeds × problems matrix of paired differences under the
    crossed random-effects model d_sp = μ + a_s + b_p + e_sp (seeds and problems both random): the ANOVA
    (method-of-moments) estimate of the mean's variance, (MS_seeds + MS_problems − MS_residual) / (S·P),
    unbiased whatever the components, with Satterthwaite's degrees of freedom, and the t interval. When every
    problem is identical it is the paired t over seeds (S − 1 df)."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or min(d.shape) < 2:
        raise ValueError(f"a seeds × problems matrix of at least 2 × 2 is needed, got shape {d.shape}")
    s, p = d.shape
    mean = float(d.mean())
    rows, cols = d.mean(axis=1), d.mean(axis=0)
    ms_seeds = p * float(np.var(rows, ddof=1))
    ms_problems = s * float(np.var(cols, ddof=1))
    residual = d - rows[:, None] - cols[None, :] + mean
    ms_residual = float((residual**2).sum()) / ((s - 1) * (p - 1))
    total = ms_seeds + ms_problems - ms_residual
    if not total > 0:
        raise ValueError("the moment estimate of the mean's variance is not positive")
    df = total**2 / (ms_seeds**2 / (s - 1) + ms_problems**2 / (p - 1) + ms_residual**2 / ((s - 1) * (p - 1)))
    se = math.sqrt(total / (s * p))
    half = t_ppf(0.5 + level / 2, df) * se
    return mean, se, df, (mean - half, mean + half)

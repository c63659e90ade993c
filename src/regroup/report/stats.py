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
    known = [s for s in stderrs if s is not None]
    if k == 0 or len(known) < len(stderrs):
        return None
    eval_se = math.sqrt(sum(s * s for s in known)) / k
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
    spread = std(diffs)  # not None: two problems or more
    return None if spread is None else spread / math.sqrt(len(diffs))


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


# fmt: off
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# fmt: on
"""Student's t 0.975-quantile for 1..30 degrees of freedom (the core has no scipy)."""


def t975(df: int) -> float:
    """The 0.975-quantile of Student's t with `df` >= 1 degrees of freedom (table to 30, then 1.96 + 2.4/df)."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def mean_band(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi): the mean and its 95 % t interval over the values (lo = hi = None for one value)."""
    m = sum(values) / len(values)
    sd = std(values)
    if sd is None:
        return m, None, None
    half = t975(len(values) - 1) * sd / math.sqrt(len(values))
    return m, m - half, m + half

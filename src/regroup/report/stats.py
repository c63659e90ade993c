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

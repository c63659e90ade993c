"""The papers' claims as data, and the pure functions that give each one a verdict from measured results.

An arm's result in one regime is, per seed, the per-problem (correct, n) counts of its held-out
evaluation and the means over training of its logged mechanism metrics. A claim compares two arms on
one measure (pass@k on held-out problems, or a training metric) in a stated direction:

- "supported": the difference lies in the claimed direction by more than 2 SE;
- "not supported": it lies the other way by more than 2 SE;
- "indistinguishable at this scale": within 2 SE either way.

pass@k differences are paired over problems and seeds (both arms are evaluated on the same problems
with the same seeds); their SE is `√(var_s(D_s)/S + var_p(d̄_p)/P)` where D_s is seed s's mean
difference over problems and d̄_p problem p's mean difference over seeds. The residual noise is in
both terms, so this SE is conservative. Training metrics are paired over seeds only: std(D_s)/√S.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from regroup.eval.passk import pass_at_k

SUPPORTED, NOT_SUPPORTED, INDISTINGUISHABLE = "supported", "not supported", "indistinguishable at this scale"
NO_SE, NOT_RUN = "no standard error (one seed, one problem)", "not run"
NOT_MEASURED = "not measured (no common seed, problem with n >= k, or logged metric)"


@dataclass
class ArmResult:
    """One arm in one regime."""

    per_problem: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """seed -> problem id -> (correct, n) on the held-out problems."""
    mechanisms: dict[int, dict[str, float]] = field(default_factory=dict)
    """seed -> metric key -> mean of the metric over the training steps that logged it."""


@dataclass(frozen=True)
class Claim:
    """"`arm` beats `against` on `measure`" (direction +1), "... is lower" (-1), or "matches" (kind)."""

    paper: str
    text: str
    arm: str
    against: str
    measure: str
    """"pass@<k>" or a metrics.jsonl key (mean over training)."""
    direction: int = 1
    kind: str = "better"
    """"better" (direction as stated) or "matches": `arm` is not worse than `against` while `against`
    beats `reference` (so that matching it means something at this scale)."""
    reference: str | None = None


@dataclass
class Comparison:
    """arm − against on one measure."""

    delta: float | None
    se: float | None
    seeds: int
    problems: int = 0


@dataclass
class Verdict:
    claim: Claim
    regime: str
    comparison: Comparison | None
    verdict: str
    reference_comparison: Comparison | None = None
    """For a "matches" claim: `against` − `reference`."""


def _var(values: Sequence[float]) -> float | None:
    """Sample variance (n − 1), None for fewer than two values."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def paired_se(diffs: Sequence[Sequence[float]]) -> float | None:
    """SE of the grand mean of a seeds × problems matrix of paired differences (see the module doc).

    A term whose variance cannot be estimated (one seed, or one problem) is left out; None when neither can.
    """
    seeds = len(diffs)
    if seeds == 0 or not diffs[0]:
        return None
    problems = len(diffs[0])
    seed_means = [sum(row) / problems for row in diffs]
    problem_means = [sum(row[p] for row in diffs) / seeds for p in range(problems)]
    var_s, var_p = _var(seed_means), _var(problem_means)
    if var_s is None and var_p is None:
        return None
    return math.sqrt((var_s or 0.0) / seeds + (var_p or 0.0) / problems)


def _pass_at(counts: tuple[int, int], k: int) -> float:
    c, n = counts
    return pass_at_k(n, c, k)


def compare_pass_at_k(a: ArmResult, b: ArmResult, k: int) -> Comparison:
    """pass@k of `a` − `b`, paired over the seeds both ran and the problems every one of those runs evaluated."""
    seeds = sorted(set(a.per_problem) & set(b.per_problem))
    if not seeds:
        return Comparison(None, None, 0)
    problems = set.intersection(*(set(a.per_problem[s]) & set(b.per_problem[s]) for s in seeds))
    problems = sorted(p for p in problems if all(min(a.per_problem[s][p][1], b.per_problem[s][p][1]) >= k for s in seeds))
    if not problems:
        return Comparison(None, None, len(seeds))
    diffs = [[_pass_at(a.per_problem[s][p], k) - _pass_at(b.per_problem[s][p], k) for p in problems] for s in seeds]
    delta = sum(map(sum, diffs)) / (len(seeds) * len(problems))
    return Comparison(delta, paired_se(diffs), len(seeds), len(problems))


def mean_pass_at_k(a: ArmResult, k: int) -> Comparison:
    """An arm's own pass@k over its seeds and the problems all its seeds evaluated, with the SE of that
    mean (`paired_se` of the seeds × problems matrix of values)."""
    seeds = sorted(a.per_problem)
    if not seeds:
        return Comparison(None, None, 0)
    problems = sorted(set.intersection(*(set(a.per_problem[s]) for s in seeds)))
    problems = [p for p in problems if all(a.per_problem[s][p][1] >= k for s in seeds)]
    if not problems:
        return Comparison(None, None, len(seeds))
    values = [[_pass_at(a.per_problem[s][p], k) for p in problems] for s in seeds]
    return Comparison(sum(map(sum, values)) / (len(seeds) * len(problems)), paired_se(values), len(seeds), len(problems))


def compare_metric(a: ArmResult, b: ArmResult, key: str) -> Comparison:
    """Mean over training of `key`, `a` − `b`, paired over the seeds where both logged it; SE std/√S."""
    seeds = sorted(s for s in set(a.mechanisms) & set(b.mechanisms)
                   if key in a.mechanisms[s] and key in b.mechanisms[s])
    if not seeds:
        return Comparison(None, None, 0)
    diffs = [a.mechanisms[s][key] - b.mechanisms[s][key] for s in seeds]
    var = _var(diffs)
    return Comparison(sum(diffs) / len(diffs), math.sqrt(var / len(diffs)) if var is not None else None, len(seeds))


def compare(a: ArmResult, b: ArmResult, measure: str) -> Comparison:
    if measure.startswith("pass@"):
        return compare_pass_at_k(a, b, int(measure[len("pass@"):]))
    return compare_metric(a, b, measure)


def direction_verdict(delta: float | None, se: float | None, direction: int = 1) -> str:
    """supported / not supported beyond 2 SE in the claimed direction, else indistinguishable."""
    if delta is None:
        return NOT_RUN
    if se is None:
        return NO_SE
    signed = direction * delta
    if signed > 2 * se:
        return SUPPORTED
    if signed < -2 * se:
        return NOT_SUPPORTED
    return INDISTINGUISHABLE


def judge(claim: Claim, regime: str, arms: Mapping[str, ArmResult]) -> Verdict:
    """The verdict on one claim in one regime from the arms' results (an arm not run gives "not run")."""
    if claim.arm not in arms or claim.against not in arms:
        return Verdict(claim, regime, None, NOT_RUN)
    comparison = compare(arms[claim.arm], arms[claim.against], claim.measure)
    if comparison.delta is None:
        return Verdict(claim, regime, comparison, NOT_MEASURED)
    if claim.kind != "matches":
        return Verdict(claim, regime, comparison, direction_verdict(comparison.delta, comparison.se, claim.direction))
    if claim.reference is None or claim.reference not in arms:
        return Verdict(claim, regime, comparison, NOT_RUN)
    gain = compare(arms[claim.against], arms[claim.reference], claim.measure)
    worse = direction_verdict(comparison.delta, comparison.se, 1)
    data_helps = direction_verdict(gain.delta, gain.se, 1)
    if gain.delta is None:
        verdict = NOT_MEASURED
    elif NO_SE in (worse, data_helps):
        verdict = NO_SE
    elif worse == NOT_SUPPORTED:
        verdict = NOT_SUPPORTED  # clearly below the arm trained on more data
    elif data_helps == SUPPORTED:
        verdict = SUPPORTED  # more data helps at this scale, and the arm is not below it
    else:
        verdict = INDISTINGUISHABLE  # more data makes no measurable difference: nothing to match
    return Verdict(claim, regime, comparison, verdict, reference_comparison=gain)


def judge_all(claims: Sequence[Claim], results: Mapping[str, Mapping[str, ArmResult]]) -> list[Verdict]:
    """Every claim in every regime of `results` (regime -> arm -> ArmResult), claims outer, regimes inner."""
    return [judge(c, regime, arms) for c in claims for regime, arms in results.items()]


def per_seed_mean(records: Sequence[Mapping[str, object]], key: str) -> float | None:
    """Mean of a metric over the steps that logged a finite value of it (None if none did)."""
    values = [float(r[key]) for r in records  # type: ignore[arg-type]
              if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]  # type: ignore[arg-type]
    return sum(values) / len(values) if values else None

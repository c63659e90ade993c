"""The papers' claims as data, and the pure functions that give each one a verdict from measured results.

An arm's result in one regime is, per seed, the per-problem (correct, n) counts of its held-out
evaluation (at T = 1, and at each paper's decoding settings under `protocols`) and the means over
training of its logged mechanism metrics. A claim compares two arms on one measure in a stated direction.

Tests (fixed in code before a run: the claims, their margins and the level ALPHA):
- "better": two-sided t-test of Δ = 0 (Δ = arm − against, signed by the claimed direction);
- "matches": non-inferiority with a margin m stated on the claim, H0: Δ <= −m, one-sided, *and* the
  extra-data arm must beat the reference (H0: gain <= 0, one-sided): the larger of the two p's (an
  intersection-union test); against it, "falls short by more than m" (H0: Δ >= −m). The claim's p is
  twice the smaller of the two directions' p, as a two-sided test is, so one p per claim enters Holm.
A family is every verdict (claims × regimes) of one `Claim.paper` ("TA-GRPO", "DaGRPO", "study control"):
Holm's step-down correction (`regroup.report.stats.holm`) within it gives the adjusted p that decides,
and both p's are reported. Per paper, not per study: a paper's verdicts answer one question (does its
method do what it says), and with 5 seeds (4 df) one family of ~46 tests would need |t| ≈ 8.4 at the
first Holm step, ~18 tests per paper need |t| ≈ 6.6. Decided before the issue-25 run, not after it.

Standard errors. pass@k differences are paired over problems and seeds; their SE is
`√(var_s(D_s)/S + var_p(d̄_p)/P)` (D_s seed s's mean difference over problems, d̄_p problem p's mean
difference over seeds; the binomial noise is in both terms, so it is conservative), with S − 1 degrees
of freedom: the seeds are the independent replications (`paired_se_df` says why not Satterthwaite). Training metrics are
paired over seeds only: SE std(D_s)/√S with S − 1 degrees of freedom. Confidence intervals are
Δ ± t_{1−α/2, df} · SE (not adjusted for multiplicity).

Verdicts: "supported" (adjusted p < α in the claimed direction), "contradicted" (adjusted p < α the
other way: a "better" claim's difference, or a "matches" claim short by more than m),
"inconclusive" (neither: absence of evidence, not evidence of no difference), "nothing to match" (a
"matches" claim whose extra-data arm did not beat the reference at level α).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from regroup.eval.passk import pass_at_k
from regroup.report.stats import holm, t_ppf, t_sf

ALPHA = 0.05
"""The family-wise error rate every study's verdicts are held to (fixed before the run)."""

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
NOTHING_TO_MATCH = "nothing to match (more data did not help measurably)"
NO_SE, NOT_RUN = "no standard error (one seed, one problem)", "not run"
NOT_MEASURED = "not measured (no common seed, problem with n >= k, or logged metric)"
T1 = "t1"
"""The protocol key of the T = 1 evaluation every arm has (`ArmResult.per_problem`)."""


@dataclass
class ArmResult:
    """One arm in one regime."""

    per_problem: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """seed -> problem id -> (correct, n) on the held-out problems at T = 1."""
    mechanisms: dict[int, dict[str, float]] = field(default_factory=dict)
    """seed -> metric key -> mean of the metric over the training steps that logged it."""
    protocols: dict[str, dict[int, dict[str, tuple[int, int]]]] = field(default_factory=dict)
    """Other decoding protocols (e.g. "dagrpo": T = 0.6): protocol -> seed -> problem id -> (correct, n)."""

    def counts(self, protocol: str = T1) -> dict[int, dict[str, tuple[int, int]]]:
        return self.per_problem if protocol == T1 else self.protocols.get(protocol, {})


@dataclass(frozen=True)
class Claim:
    """ "`arm` beats `against` on `measure`" (direction +1), "... is lower" (-1), or "matches" (kind)."""

    paper: str
    text: str
    arm: str
    against: str
    measure: str
    """"pass@<k>" or a metrics.jsonl key (mean over training)."""
    direction: int = 1
    kind: str = "better"
    """"better" (direction as stated) or "matches": `arm` is not worse than `against` by more than
    `margin` while `against` beats `reference` (so that matching it means something at this scale)."""
    reference: str | None = None
    margin: float | None = None
    """Non-inferiority margin of a "matches" claim, in the measure's units (0.02 = 2 points of pass@1)."""
    protocol: str = T1
    """Which evaluation a pass@k measure reads (T1, or a key of `ArmResult.protocols`)."""

    def __post_init__(self) -> None:
        if self.kind not in ("better", "matches"):
            raise ValueError(f"claim kind must be 'better' or 'matches', got {self.kind!r}")
        if self.kind == "matches" and (self.margin is None or not self.margin > 0 or self.reference is None):
            raise ValueError(f"a 'matches' claim needs a reference arm and a margin > 0 stated in advance: {self.text}")
        if self.direction not in (1, -1):
            raise ValueError(f"direction must be +1 or -1, got {self.direction}")


@dataclass
class Comparison:
    """arm − against on one measure."""

    delta: float | None
    se: float | None
    seeds: int
    problems: int = 0
    df: float | None = None
    """Degrees of freedom of `se` (None: no variance estimate, or a zero SE)."""


@dataclass
class Verdict:
    claim: Claim
    regime: str
    comparison: Comparison | None
    verdict: str
    reference_comparison: Comparison | None = None
    """For a "matches" claim: `against` − `reference`."""
    p: float | None = None
    """The claim's raw p-value (see the module doc)."""
    p_adjusted: float | None = None
    """Holm-adjusted over every verdict of the study."""
    ci: tuple[float, float] | None = None
    """(1 − α) confidence interval of Δ (unadjusted)."""


def _var(values: Sequence[float]) -> float | None:
    """Sample variance (n − 1), None for fewer than two values."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def paired_se_df(diffs: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(SE, df) of the grand mean of a seeds × problems matrix of paired differences.

    A term whose variance cannot be estimated (one seed, or one problem) is left out; (None, None) when
    neither can. df = S − 1 (P − 1 with one seed); None when the SE is 0."""
    seeds = len(diffs)
    if seeds == 0 or not diffs[0]:
        return None, None
    problems = len(diffs[0])
    seed_means = [sum(row) / problems for row in diffs]
    problem_means = [sum(row[p] for row in diffs) / seeds for p in range(problems)]
    var_s, var_p = _var(seed_means), _var(problem_means)
    if var_s is None and var_p is None:
        return None, None
    se = math.sqrt((var_s or 0.0) / seeds + (var_p or 0.0) / problems)
    if se == 0:
        return se, None
    # The seeds are the independent replications: every seed evaluates the same problems, so the problem
    # term is not an independent variance estimate (a seed's shift moves every problem's difference) and
    # Welch-Satterthwaite would credit it P − 1 df it does not have (simulated: family-wise error 12 %
    # instead of 5 % under Holm). S − 1 df is the honest count; P − 1 only when there is one seed.
    return se, float(seeds - 1 if seeds >= 2 else problems - 1)


def paired_se(diffs: Sequence[Sequence[float]]) -> float | None:
    """SE of the grand mean of a seeds × problems matrix of paired differences (see `paired_se_df`)."""
    return paired_se_df(diffs)[0]


def _pass_at(counts: tuple[int, int], k: int) -> float:
    c, n = counts
    return pass_at_k(n, c, k)


def compare_pass_at_k(a: ArmResult, b: ArmResult, k: int, protocol: str = T1) -> Comparison:
    """pass@k of `a` − `b`, paired over the seeds both ran and the problems every one of those runs evaluated."""
    ca, cb = a.counts(protocol), b.counts(protocol)
    seeds = sorted(set(ca) & set(cb))
    if not seeds:
        return Comparison(None, None, 0)
    problems = set.intersection(*(set(ca[s]) & set(cb[s]) for s in seeds))
    problems = sorted(p for p in problems if all(min(ca[s][p][1], cb[s][p][1]) >= k for s in seeds))
    if not problems:
        return Comparison(None, None, len(seeds))
    diffs = [[_pass_at(ca[s][p], k) - _pass_at(cb[s][p], k) for p in problems] for s in seeds]
    delta = sum(map(sum, diffs)) / (len(seeds) * len(problems))
    se, df = paired_se_df(diffs)
    return Comparison(delta, se, len(seeds), len(problems), df)


def mean_pass_at_k(a: ArmResult, k: int, protocol: str = T1) -> Comparison:
    """An arm's own pass@k over its seeds and the problems all its seeds evaluated, with the SE of that
    mean (`paired_se_df` of the seeds × problems matrix of values)."""
    counts = a.counts(protocol)
    seeds = sorted(counts)
    if not seeds:
        return Comparison(None, None, 0)
    problems = sorted(set.intersection(*(set(counts[s]) for s in seeds)))
    problems = [p for p in problems if all(counts[s][p][1] >= k for s in seeds)]
    if not problems:
        return Comparison(None, None, len(seeds))
    values = [[_pass_at(counts[s][p], k) for p in problems] for s in seeds]
    se, df = paired_se_df(values)
    return Comparison(sum(map(sum, values)) / (len(seeds) * len(problems)), se, len(seeds), len(problems), df)


def compare_metric(a: ArmResult, b: ArmResult, key: str) -> Comparison:
    """Mean over training of `key`, `a` − `b`, paired over the seeds where both logged it; SE std/√S, S − 1 df."""
    seeds = sorted(
        s for s in set(a.mechanisms) & set(b.mechanisms) if key in a.mechanisms[s] and key in b.mechanisms[s]
    )
    if not seeds:
        return Comparison(None, None, 0)
    diffs = [a.mechanisms[s][key] - b.mechanisms[s][key] for s in seeds]
    var = _var(diffs)
    se = math.sqrt(var / len(diffs)) if var is not None else None
    return Comparison(sum(diffs) / len(diffs), se, len(seeds), df=float(len(seeds) - 1) if se else None)


def compare(a: ArmResult, b: ArmResult, measure: str, protocol: str = T1) -> Comparison:
    if measure.startswith("pass@"):
        return compare_pass_at_k(a, b, int(measure[len("pass@") :]), protocol)
    return compare_metric(a, b, measure)


# ------------------------------------------------------------------------------------------ tests
def upper_p(estimate: float, se: float, df: float | None) -> float:
    """One-sided p of H0: true value <= 0 given `estimate` ± `se` (t with `df`; se 0 is exact)."""
    if se == 0:
        return 0.0 if estimate > 0 else 1.0
    return t_sf(estimate / se, df if df is not None else math.inf)


def two_sided_p(estimate: float, se: float, df: float | None) -> float:
    """Two-sided p of H0: true value = 0."""
    if se == 0:
        return 0.0 if estimate != 0 else 1.0
    return min(1.0, 2.0 * t_sf(abs(estimate) / se, df if df is not None else math.inf))


def confidence_interval(c: Comparison, alpha: float = ALPHA) -> tuple[float, float] | None:
    """Δ ± t_{1−α/2, df} · SE (None without an SE)."""
    if c.delta is None or c.se is None:
        return None
    half = 0.0 if c.se == 0 else t_ppf(1.0 - alpha / 2.0, c.df if c.df is not None else math.inf) * c.se
    return (c.delta - half, c.delta + half)


def judge(claim: Claim, regime: str, arms: Mapping[str, ArmResult]) -> Verdict:
    """The claim's comparison and raw p in one regime (its verdict from the raw p: `judge_all` corrects)."""
    if claim.arm not in arms or claim.against not in arms:
        return Verdict(claim, regime, None, NOT_RUN)
    comparison = compare(arms[claim.arm], arms[claim.against], claim.measure, claim.protocol)
    if comparison.delta is None:
        return Verdict(claim, regime, comparison, NOT_MEASURED)
    if comparison.se is None:
        return Verdict(claim, regime, comparison, NO_SE)
    ci = confidence_interval(comparison)
    if claim.kind == "better":
        p = two_sided_p(comparison.delta, comparison.se, comparison.df)
        return _decide(Verdict(claim, regime, comparison, INCONCLUSIVE, p=p, ci=ci), p)
    if claim.reference not in arms:
        return Verdict(claim, regime, comparison, NOT_RUN, ci=ci)
    gain = compare(arms[claim.against], arms[claim.reference], claim.measure, claim.protocol)
    if gain.delta is None:
        return Verdict(claim, regime, comparison, NOT_MEASURED, reference_comparison=gain, ci=ci)
    if gain.se is None:
        return Verdict(claim, regime, comparison, NO_SE, reference_comparison=gain, ci=ci)
    p = min(1.0, 2.0 * min(_matches_p(comparison, gain, claim.margin)))  # both directions, as a two-sided test
    return _decide(Verdict(claim, regime, comparison, INCONCLUSIVE, reference_comparison=gain, p=p, ci=ci), p)


def _matches_p(c: Comparison, gain: Comparison, margin: float) -> tuple[float, float]:
    """(p for "matches", p for "falls short") of a "matches" claim: the first is the larger of the
    non-inferiority p (H0: Δ <= −m) and the one-sided p that the extra data helps (H0: gain <= 0), an
    intersection-union test; the second is the one-sided p of H0: Δ >= −m (below by more than the margin)."""
    p_noninferior = upper_p(c.delta + margin, c.se, c.df)  # type: ignore[operator, arg-type]
    p_gain = upper_p(gain.delta, gain.se, gain.df)  # type: ignore[arg-type]
    p_short = upper_p(-(c.delta + margin), c.se, c.df)  # type: ignore[operator, arg-type]
    return max(p_noninferior, p_gain), p_short


def _decide(v: Verdict, p: float, alpha: float = ALPHA) -> Verdict:
    """The verdict of `v` at (adjusted) p-value `p`."""
    claim, c = v.claim, v.comparison
    assert c is not None and c.delta is not None and c.se is not None
    if claim.kind == "better":
        if p < alpha:
            verdict = SUPPORTED if claim.direction * c.delta > 0 else CONTRADICTED
        else:
            verdict = INCONCLUSIVE
    else:
        gain = v.reference_comparison
        assert gain is not None and gain.delta is not None and gain.se is not None
        p_match, p_short = _matches_p(c, gain, claim.margin)  # type: ignore[arg-type]
        if p < alpha:
            verdict = SUPPORTED if p_match <= p_short else CONTRADICTED  # contradicted: short by more than m
        elif upper_p(gain.delta, gain.se, gain.df) >= alpha:
            verdict = NOTHING_TO_MATCH
        else:
            verdict = INCONCLUSIVE
    return replace(v, verdict=verdict)


def judge_all(
    claims: Sequence[Claim], results: Mapping[str, Mapping[str, ArmResult]], alpha: float = ALPHA
) -> list[Verdict]:
    """Every claim in every regime of `results` (regime -> arm -> ArmResult), claims outer, regimes inner;
    verdicts decided at Holm-adjusted p within each family: the verdicts of the claims that share a
    `Claim.paper` (every regime), so each family's chance of any false verdict is held at `alpha`."""
    raw = [judge(c, regime, arms) for c in claims for regime, arms in results.items()]
    adjusted: list[float | None] = [None] * len(raw)
    for paper in dict.fromkeys(c.paper for c in claims):
        members = [i for i, v in enumerate(raw) if v.claim.paper == paper]
        for i, p in zip(members, holm([raw[i].p for i in members])):
            adjusted[i] = p
    return [v if p is None else _decide(replace(v, p_adjusted=p), p, alpha) for v, p in zip(raw, adjusted)]


def per_seed_mean(records: Sequence[Mapping[str, object]], key: str) -> float | None:
    """Mean of a metric over the steps that logged a finite value of it (None if none did)."""
    values = [
        float(r[key])
        for r in records  # type: ignore[arg-type]
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])
    ]  # type: ignore[arg-type]
    return sum(values) / len(values) if values else None

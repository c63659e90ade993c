"""The papers' claims as data, and the pure functions that give each one a verdict from measured results.

An arm's result in one regime is, per seed, the per-problem (correct, n) counts of its evaluation on
unseen questions from the training generator (at T = 1, and at each paper's decoding settings under
`protocols`) and the means over training of its logged mechanism metrics. A claim compares two arms on
one measure in a stated direction.

Registered and exploratory claims. A claim with `primary=True` is a registered primary endpoint: it names
its regime and the paper's effect size, is written into the study's plan before any arm trains, and only
the primary endpoints of one `Claim.paper` form a Holm family (`studies.stats.holm`, m = the number
of registered primaries, a primary without a p counting as p = 1). Its verdict: "supported" (Holm-adjusted
p < α in the claimed direction), "contradicted" (the other way), or "inconclusive", and every
inconclusive verdict says whether its (unadjusted) confidence interval rules out the paper's effect.
Every other claim is "exploratory": its raw p and CI are reported, it is never called supported.

The test (one per claim, fixed before a run): the paired t-test over seeds. Δ_s, seed s's mean difference
over the problems both arms evaluated (or its difference of a training metric's mean), are the S
independent replications; SE = sd(Δ_s)/√S with S − 1 degrees of freedom. Why this one and not the
seeds × problems SE it replaces (√(var_s/S + var_p/P), which counts the seed × problem residual and the
binomial noise twice): each seed's mean over the same problem set is one exchangeable draw, so the t
statistic has its nominal distribution with no variance components to estimate (simulated at 5 seeds × 48
problems × 32 samples, 1,500 null repetitions: 5.0 % false positives at nominal 5 %, where the review
found 0–3.7 % and half the power for the old SE; tests/experiments/test_study.py re-checks the rate on
every run of the suite). What it conditions
on: the held-out problem set is fixed (the same for every arm), so the inference is about these problems;
with 200 of them the problem × method interaction's share of the error is small, and it is stated, not
hidden. A comparison over fewer than 2 seeds is not judged (NO_SE); the SE over problems (sd of the
per-problem differences / √P, P − 1 df) is still computed for one seed, for an arm's own pass@k.

A zero standard error (every seed's difference identical: discrete counts, a ceiling) is not zero
variance: the p is the exact sign-flip test over seeds (`studies.stats.sign_flip_p`, at least
2^(1−S): 0.5 with 2 seeds), and Δ = 0 with no spread is a tie.

"matches" claims (exploratory here) are non-inferiority tests with a margin m stated on the claim, H0:
Δ <= −m, one-sided, *and* the extra-data arm must beat the reference (H0: gain <= 0, one-sided): the larger
of the two p's (an intersection-union test); against it, "falls short by more than m" (H0: Δ >= −m); the
claim's p is twice the smaller of the two directions' p. Confidence intervals are Δ ± t_{1−α/2, df} · SE
(not adjusted for multiplicity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from regroup.eval.passk import pass_at_k
from studies.stats import holm, sign_flip_p, t_ppf, t_sf

ALPHA = 0.05
"""The family-wise error rate every study's primary verdicts are held to (fixed before the run)."""

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
EXPLORATORY = "exploratory"
TIE = "tie (Δ = 0 on every seed)"
NOTHING_TO_MATCH = "nothing to match (more data did not help measurably)"
NO_SE, NOT_RUN = "no test (fewer than 2 seeds: the seeds are the replications)", "not run"
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
    primary: bool = False
    """A registered primary endpoint (in its paper's Holm family); False: exploratory, never "supported"."""
    regime: str | None = None
    """The one regime a primary endpoint is registered in (None: judged in every regime that ran both arms)."""
    effect: float | None = None
    """The paper's effect size in the measure's units and the claimed direction (> 0; 0.047 = 4.7 points):
    the difference the study is powered for, and what an inconclusive CI may or may not rule out."""
    effect_source: str = ""
    """Where `effect` comes from (the paper's table, or a stated smallest effect of interest)."""
    effect_derived: bool = False
    """`effect` is computed from the paper's figures (e.g. 48.8 − 45.9), a contrast the paper does not report
    itself: the page names it "derived from the paper's figures", never "the paper's"."""
    effect_baseline: str | None = None
    """The baseline the paper's figure is measured against where it is not `against` (e.g. "GRPO" for an
    endpoint against Dr. GRPO): the page shows the figure but never says the CI rules it out."""

    def __post_init__(self) -> None:
        if self.kind not in ("better", "matches"):
            raise ValueError(f"claim kind must be 'better' or 'matches', got {self.kind!r}")
        if self.kind == "matches" and (self.margin is None or not self.margin > 0 or self.reference is None):
            raise ValueError(f"a 'matches' claim needs a reference arm and a margin > 0 stated in advance: {self.text}")
        if self.direction not in (1, -1):
            raise ValueError(f"direction must be +1 or -1, got {self.direction}")
        if self.primary and (self.regime is None or self.effect is None or not self.effect > 0):
            raise ValueError(f"a primary endpoint names its regime and the paper's effect (> 0): {self.text}")


@dataclass
class Comparison:
    """arm − against on one measure."""

    delta: float | None
    se: float | None
    seeds: int
    problems: int = 0
    df: float | None = None
    """Degrees of freedom of `se` (None: no variance estimate)."""
    per_seed: tuple[float, ...] = ()
    """Each seed's difference (its mean over problems for pass@k): the replications the test is over."""


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
    """Holm-adjusted over the registered primary endpoints of the claim's paper (None: exploratory)."""
    ci: tuple[float, float] | None = None
    """(1 − α) confidence interval of Δ (unadjusted)."""

    @property
    def rules_out_effect(self) -> bool | None:
        """Whether the CI excludes the paper's effect (its bound on the claimed side lies short of it);
        None without a CI or a stated effect."""
        if self.ci is None or self.claim.effect is None or self.claim.effect_baseline is not None:
            return None
        if self.claim.direction > 0:
            return self.ci[1] < self.claim.effect
        return self.ci[0] > -self.claim.effect


def _var(values: Sequence[float]) -> float | None:
    """Sample variance (n − 1), None for fewer than two values."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def paired_se_df(diffs: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(SE, df) of the grand mean of a seeds × problems matrix of paired differences, by the paired t-test
    over seeds: sd of the per-seed means / √S with S − 1 df. One seed: sd of the problems / √P, P − 1 df.
    (None, None) when neither can be estimated (one seed and one problem). A zero SE keeps its df: the
    caller tests it exactly (`comparison_p`)."""
    seeds = len(diffs)
    if seeds == 0 or not diffs[0]:
        return None, None
    problems = len(diffs[0])
    values = [sum(row) / problems for row in diffs] if seeds >= 2 else list(diffs[0])
    var = _var(values)
    if var is None:
        return None, None
    return math.sqrt(var / len(values)), float(len(values) - 1)


def paired_se(diffs: Sequence[Sequence[float]]) -> float | None:
    """SE of the grand mean of a seeds × problems matrix of paired differences (see `paired_se_df`)."""
    return paired_se_df(diffs)[0]


def _pass_at(counts: tuple[int, int], k: int) -> float:
    c, n = counts
    return pass_at_k(n, c, k)


def _matrix_comparison(values: list[list[float]], seeds: int) -> Comparison:
    problems = len(values[0])
    se, df = paired_se_df(values)
    per_seed = tuple(sum(row) / problems for row in values)
    delta = sum(per_seed) / len(per_seed)
    if seeds == 1:  # the problems are the replications: a zero SE is tested over them
        per_seed = tuple(values[0])
    return Comparison(delta, se, seeds, problems, df, per_seed)


def compare_pass_at_k(a: ArmResult, b: ArmResult, k: int, protocol: str = T1) -> Comparison:
    """pass@k of `a` − `b`, paired over the seeds both ran and the problems every one of those runs evaluated."""
    seeds, problems, diffs = pass_at_k_differences(a, b, k, protocol)
    if not seeds:
        return Comparison(None, None, 0)
    if not problems:
        return Comparison(None, None, len(seeds))
    return _matrix_comparison(diffs, len(seeds))


def pass_at_k_differences(
    a: ArmResult, b: ArmResult, k: int, protocol: str = T1
) -> tuple[list[int], list[str], list[list[float]]]:
    """(seeds, problems, diffs): the seeds both arms ran, the problems every one of those runs evaluated with
    n >= k, and diffs[i][j], pass@k of `a` − `b` on problem j under seed i (the matrix every pass@k comparison
    is computed from)."""
    ca, cb = a.counts(protocol), b.counts(protocol)
    seeds = sorted(set(ca) & set(cb))
    if not seeds:
        return [], [], []
    common = set.intersection(*(set(ca[s]) & set(cb[s]) for s in seeds))
    problems = sorted(p for p in common if all(min(ca[s][p][1], cb[s][p][1]) >= k for s in seeds))
    return seeds, problems, [[_pass_at(ca[s][p], k) - _pass_at(cb[s][p], k) for p in problems] for s in seeds]


def mean_pass_at_k(a: ArmResult, k: int, protocol: str = T1) -> Comparison:
    """An arm's own pass@k over its seeds and the problems all its seeds evaluated, with the SE of that
    mean over seeds (`paired_se_df` of the seeds × problems matrix of values)."""
    counts = a.counts(protocol)
    seeds = sorted(counts)
    if not seeds:
        return Comparison(None, None, 0)
    problems = sorted(set.intersection(*(set(counts[s]) for s in seeds)))
    problems = [p for p in problems if all(counts[s][p][1] >= k for s in seeds)]
    if not problems:
        return Comparison(None, None, len(seeds))
    return _matrix_comparison([[_pass_at(counts[s][p], k) for p in problems] for s in seeds], len(seeds))


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
    df = float(len(seeds) - 1) if se is not None else None
    return Comparison(sum(diffs) / len(diffs), se, len(seeds), df=df, per_seed=tuple(diffs))


def compare(a: ArmResult, b: ArmResult, measure: str, protocol: str = T1) -> Comparison:
    if measure.startswith("pass@"):
        return compare_pass_at_k(a, b, int(measure[len("pass@") :]), protocol)
    return compare_metric(a, b, measure)


# ------------------------------------------------------------------------------------------ tests
def upper_p(estimate: float, se: float, df: float | None, replications: Sequence[float] = ()) -> float:
    """One-sided p of H0: true value <= 0 given `estimate` ± `se` (t with `df`). A zero SE: the exact
    one-sided sign-flip p over the replications shifted to `estimate` (all equal: 2^(−S)), 1 if none."""
    if se == 0:
        if not replications or estimate <= 0:
            return 1.0
        return sign_flip_p([estimate] * len(replications), two_sided=False)
    return t_sf(estimate / se, df if df is not None else math.inf)


def two_sided_p(estimate: float, se: float, df: float | None) -> float:
    """Two-sided p of H0: true value = 0 (a positive SE; `comparison_p` handles a zero one)."""
    if se == 0:
        raise ValueError("two_sided_p needs a positive SE: a zero SE is tested by the sign-flip test")
    return min(1.0, 2.0 * t_sf(abs(estimate) / se, df if df is not None else math.inf))


def comparison_p(c: Comparison) -> float:
    """Two-sided p of Δ = 0: the paired t-test over seeds; at a zero SE the exact sign-flip test over the
    seeds' differences (at least 2^(1−S); a tie, Δ = 0 everywhere, is 1)."""
    assert c.delta is not None and c.se is not None
    if c.se == 0:
        return sign_flip_p(c.per_seed) if c.per_seed else 1.0
    return two_sided_p(c.delta, c.se, c.df)


def confidence_interval(c: Comparison, alpha: float = ALPHA) -> tuple[float, float] | None:
    """Δ ± t_{1−α/2, df} · SE (None without an SE)."""
    if c.delta is None or c.se is None:
        return None
    half = 0.0 if c.se == 0 else t_ppf(1.0 - alpha / 2.0, c.df if c.df is not None else math.inf) * c.se
    return (c.delta - half, c.delta + half)


def judge(claim: Claim, regime: str, arms: Mapping[str, ArmResult]) -> Verdict:
    """The claim's comparison and raw p in one regime (a primary's verdict from the raw p: `judge_all`
    corrects; an exploratory claim's verdict is EXPLORATORY)."""
    if claim.arm not in arms or claim.against not in arms:
        return Verdict(claim, regime, None, NOT_RUN)
    comparison = compare(arms[claim.arm], arms[claim.against], claim.measure, claim.protocol)
    if comparison.delta is None:
        return Verdict(claim, regime, comparison, NOT_MEASURED)
    if comparison.se is None or comparison.seeds < 2:  # one seed's problems are not independent replications
        return Verdict(claim, regime, comparison, NO_SE)
    ci = confidence_interval(comparison)
    if claim.kind == "better":
        p = comparison_p(comparison)
        return _decide(Verdict(claim, regime, comparison, INCONCLUSIVE, p=p, ci=ci), p)
    if claim.reference not in arms:
        return Verdict(claim, regime, comparison, NOT_RUN, ci=ci)
    gain = compare(arms[claim.against], arms[claim.reference], claim.measure, claim.protocol)
    if gain.delta is None:
        return Verdict(claim, regime, comparison, NOT_MEASURED, reference_comparison=gain, ci=ci)
    if gain.se is None or gain.seeds < 2:
        return Verdict(claim, regime, comparison, NO_SE, reference_comparison=gain, ci=ci)
    p = min(1.0, 2.0 * min(_matches_p(comparison, gain, claim.margin)))  # both directions, as a two-sided test
    return _decide(Verdict(claim, regime, comparison, INCONCLUSIVE, reference_comparison=gain, p=p, ci=ci), p)


def _matches_p(c: Comparison, gain: Comparison, margin: float) -> tuple[float, float]:
    """(p for "matches", p for "falls short") of a "matches" claim: the first is the larger of the
    non-inferiority p (H0: Δ <= −m) and the one-sided p that the extra data helps (H0: gain <= 0), an
    intersection-union test; the second is the one-sided p of H0: Δ >= −m (below by more than the margin)."""
    p_noninferior = upper_p(c.delta + margin, c.se, c.df, c.per_seed)  # type: ignore[operator, arg-type]
    p_gain = upper_p(gain.delta, gain.se, gain.df, gain.per_seed)  # type: ignore[arg-type]
    p_short = upper_p(-(c.delta + margin), c.se, c.df, c.per_seed)  # type: ignore[operator, arg-type]
    return max(p_noninferior, p_gain), p_short


def _decide(v: Verdict, p: float, alpha: float = ALPHA) -> Verdict:
    """The verdict of `v` at (adjusted) p-value `p`: exploratory claims stay EXPLORATORY whatever p is."""
    claim, c = v.claim, v.comparison
    assert c is not None and c.delta is not None and c.se is not None
    if c.se == 0 and all(d == 0 for d in c.per_seed):
        return replace(v, verdict=TIE)
    if not claim.primary:
        return replace(v, verdict=EXPLORATORY)
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
        elif upper_p(gain.delta, gain.se, gain.df, gain.per_seed) >= alpha:
            verdict = NOTHING_TO_MATCH
        else:
            verdict = INCONCLUSIVE
    return replace(v, verdict=verdict)


def judge_all(
    claims: Sequence[Claim], results: Mapping[str, Mapping[str, ArmResult]], alpha: float = ALPHA
) -> list[Verdict]:
    """Every claim in its regime(s) of `results` (regime -> arm -> ArmResult), claims outer, regimes inner: a
    primary endpoint in its registered regime only (NOT_RUN when that regime did not run), an exploratory
    claim in every regime. The primaries of each `Claim.paper` are one Holm family, m = all of that paper's
    registered primaries (one without a p counts as p = 1, so dropping an endpoint never helps the others);
    exploratory claims keep their raw p and no adjusted one."""
    registered = {(c.arm, c.against, c.measure, c.protocol, c.regime) for c in claims if c.primary}
    raw = []
    for c in claims:
        if c.primary:
            assert c.regime is not None
            raw.append(
                judge(c, c.regime, results[c.regime]) if c.regime in results else Verdict(c, c.regime, None, NOT_RUN)
            )
        else:  # in every regime but one where the same comparison is a registered primary (judged once)
            raw += [
                judge(c, regime, arms)
                for regime, arms in results.items()
                if (c.arm, c.against, c.measure, c.protocol, regime) not in registered
            ]
    adjusted: list[float | None] = [None] * len(raw)
    for paper in dict.fromkeys(c.paper for c in claims):
        members = [i for i, v in enumerate(raw) if v.claim.paper == paper and v.claim.primary]
        for i, p in zip(members, holm([1.0 if raw[i].p is None else raw[i].p for i in members])):
            adjusted[i] = p
    out = []
    for v, p in zip(raw, adjusted):
        if p is None or v.p is None:
            out.append(replace(v, p_adjusted=p if v.claim.primary else None))
        else:
            out.append(_decide(replace(v, p_adjusted=p), p, alpha))
    return out


def effect_note(claim: Claim) -> str:
    """What a page adds after the paper's effect: " (derived)" for one computed from the paper's figures,
    " (vs BASELINE)" for the paper's figure against another baseline, else nothing."""
    if claim.effect_baseline is not None:
        return f" (vs {claim.effect_baseline})"
    return " (derived)" if claim.effect_derived else ""


LOW_POWER = 0.8
"""Under this power at the paper's effect, an inconclusive verdict says "not detected", never "rules out"."""


def verdict_label(v: Verdict, power: float | None = None, scope: str = "") -> str:
    """The verdict as the page states it: an inconclusive (or exploratory) verdict with a stated effect says
    whether its CI rules out the paper's effect, scoped to `scope` (the model, steps and dose it holds for),
    or, where `power` at that effect is under LOW_POWER, that the effect was "not detected"; a supported one
    says whether it is smaller than the paper's (a gain can be real and still far short of the claim)."""
    claim = v.claim
    if claim.effect is not None and claim.effect_baseline is not None and v.verdict not in (NOT_RUN, NOT_MEASURED):
        effect = claim.effect * claim.direction
        shown = f"{100 * effect:+.1f} pts" if claim.measure.startswith("pass@") else f"{effect:+.3f}"
        return f"{v.verdict}; the paper's {shown} is against {claim.effect_baseline}, not this baseline: not compared"
    ruled = v.rules_out_effect
    if v.verdict not in (INCONCLUSIVE, EXPLORATORY, TIE, SUPPORTED) or ruled is None:
        return v.verdict
    effect = claim.effect * claim.direction  # type: ignore[operator]
    shown = f"{100 * effect:+.1f} pts" if claim.measure.startswith("pass@") else f"{effect:+.3f}"
    named = f"{shown} (derived from the paper's figures)" if claim.effect_derived else f"the paper's {shown}"
    where = f" {scope}" if scope else ""
    if v.verdict == SUPPORTED:
        if not ruled:
            return v.verdict
        source = "derived from the paper's figures; " if claim.effect_derived else ""
        smaller = shown if claim.effect_derived else named
        return f"{v.verdict}, but smaller than {smaller} ({source}the CI rules it out{where})"
    if power is not None and power < LOW_POWER:
        return f"{v.verdict}; {named} not detected ({100 * power:.0f} % power at it)"
    return f"{v.verdict}; the CI {'rules out' if ruled else 'includes'} {named}" + (where if ruled else "")


def per_seed_mean(records: Sequence[Mapping[str, object]], key: str) -> float | None:
    """Mean of a metric over the steps that logged a finite value of it (None if none did)."""
    values = [
        float(r[key])
        for r in records  # type: ignore[arg-type]
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])
    ]  # type: ignore[arg-type]
    return sum(values) / len(values) if values else None

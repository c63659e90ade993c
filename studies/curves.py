"""Learning curves from a kept table: pass@1 at each evaluated checkpoint, per arm, over seeds.

A row of `studies.table` holds one evaluation per checkpoint in `evals`, keyed "step<N>" ("step0": the
start, evaluated under the run's own sampler stream, as `studies.real2` keeps it; `studies.gate` keys its
checkpoints the same way). From those rows:

- `curve(rows, arm, key_order)`: per checkpoint, the mean over seeds of each seed's pass@1 (its mean over the
  problems) with a 95 % t band over seeds (mean ± t_{0.975, S−1} · sd/√S; no band with one seed);
- `auc(per_step, last_step)`: one run's area under its curve, the trapezoid over its checkpoints (the start
  included) divided by `last_step`, so a run that sits at p throughout has AUC p;
- `steps_to_target(per_step, target)`: the first checkpoint at which pass@1 reaches `target` (None: never);
- `auc_difference(rows, arm, against, ...)`: arm − against of the per-seed AUCs, paired over the seeds both
  ran, by the study's paired t-test over seeds (`studies.claims.compare_metric` and `comparison_p`, whose
  tails are `studies.stats`'), so an AUC endpoint is judged exactly as a pass@k one;
- `plot_curves(...)`: the curves against step (and samples seen) as a PNG for a results page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from studies.claims import ArmResult, Comparison, compare_metric, comparison_p, confidence_interval
from studies.stats import t_ppf
from studies.table import counts_of

_STEP = re.compile(r"^step(\d+)$")
AUC = "auc"
"""The key a run's AUC is held under (as a mechanism metric) for the paired test."""


def step_of(key: str) -> int:
    """ "step150" -> 150 (a checkpoint's eval key)."""
    m = _STEP.match(key)
    if m is None:
        raise ValueError(f"not a checkpoint eval key (step<N>): {key!r}")
    return int(m.group(1))


def pass1(entry: Mapping, problems: Collection[str] | None = None) -> float:
    """Mean pass@1 (c/n) over an eval entry's problems (only those in `problems`, when given)."""
    values = [c / n for i, (c, n) in counts_of(entry).items() if problems is None or i in problems]
    if not values:
        raise ValueError("pass1: no problem of the entry is in the stratum")
    return sum(values) / len(values)


def per_seed_curves(
    rows: Iterable[dict], arm: str, key_order: Sequence[str], problems: Collection[str] | None = None
) -> dict[int, dict[int, float]]:
    """seed -> step -> pass@1 of `arm`'s runs at the checkpoints of `key_order` that each run evaluated."""
    out: dict[int, dict[int, float]] = {}
    for r in rows:
        if r["arm"] != arm:
            continue
        out[int(r["seed"])] = {step_of(k): pass1(r["evals"][k], problems) for k in key_order if k in r["evals"]}
    return out


def band(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi): the mean and its t interval over the values (lo = hi = None for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = t_ppf(0.5 + level / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def curve(
    rows: Iterable[dict], arm: str, key_order: Sequence[str], problems: Collection[str] | None = None
) -> list[tuple[int, float, float | None, float | None]]:
    """[(step, mean pass@1 over seeds, 95 % lo, 95 % hi)] at each checkpoint of `key_order` that some seed of
    `arm` evaluated (the seeds that evaluated it; lo = hi = None where only one did)."""
    seeds = per_seed_curves(rows, arm, key_order, problems)
    out = []
    for key in key_order:
        values = [c[step_of(key)] for c in seeds.values() if step_of(key) in c]
        if values:
            out.append((step_of(key), *band(values)))
    return out


def samples_seen(points: Sequence[tuple], samples_per_step: int) -> list[tuple]:
    """The same points with the step replaced by the training samples drawn up to it."""
    return [(p[0] * samples_per_step, *p[1:]) for p in points]


def auc(per_step: Mapping[int, float], last_step: int) -> float:
    """The trapezoid area under pass@1 against step over the checkpoints up to `last_step` (the start, step
    0, included when given), divided by `last_step`: a run flat at p has AUC p. The curve must reach
    `last_step`, and its first checkpoint is where the area starts."""
    points = sorted((s, v) for s, v in per_step.items() if s <= last_step)
    if not points or points[-1][0] != last_step or last_step <= 0:
        raise ValueError(f"auc: the curve has no checkpoint at the last step {last_step}: {sorted(per_step)}")
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:]))
    return area / last_step


def steps_to_target(per_step: Mapping[int, float], target: float) -> int | None:
    """The first checkpoint (by step) whose pass@1 is at least `target`; None if none reaches it."""
    return next((s for s, v in sorted(per_step.items()) if v >= target), None)


def auc_by_seed(
    rows: Iterable[dict], arm: str, key_order: Sequence[str], last_step: int, problems: Collection[str] | None = None
) -> dict[int, float]:
    """seed -> AUC of `arm`'s run (runs that did not reach `last_step` are left out)."""
    out = {}
    for seed, c in per_seed_curves(rows, arm, key_order, problems).items():
        if last_step in c:
            out[seed] = auc(c, last_step)
    return out


def auc_difference(
    rows: Sequence[dict],
    arm: str,
    against: str,
    key_order: Sequence[str],
    last_step: int,
    problems: Collection[str] | None = None,
) -> tuple[Comparison, float | None, tuple[float, float] | None]:
    """(comparison, two-sided p, 95 % CI) of AUC(arm) − AUC(against), paired over the seeds both ran: the
    study's paired t-test over seeds (sign-flip at a zero SE); p and CI are None under 2 seeds."""

    def result(name: str) -> ArmResult:
        per_seed = auc_by_seed(rows, name, key_order, last_step, problems)
        return ArmResult(mechanisms={s: {AUC: v} for s, v in per_seed.items()})

    c = compare_metric(result(arm), result(against), AUC)
    if c.delta is None or c.se is None or c.seeds < 2:
        return c, None, None
    return c, comparison_p(c), confidence_interval(c)


def plot_curves(
    curves: Mapping[str, Sequence[tuple[int, float, float | None, float | None]]],
    out: Path,
    samples_per_step: Mapping[str, int] | None = None,
    title: str = "pass@1",
) -> Path:
    """A PNG of each arm's curve (mean and 95 % band over seeds) against step, and a second panel against
    the samples seen when `samples_per_step` gives every arm's samples per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if samples_per_step and all(a in samples_per_step for a in curves) else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.2), squeeze=False)
    for col in range(panels):
        ax = axes[0][col]
        for name, points in curves.items():
            pts = samples_seen(points, samples_per_step[name]) if col == 1 and samples_per_step else list(points)
            if not pts:
                continue
            x = [p[0] for p in pts]
            line = ax.plot(x, [100 * p[1] for p in pts], marker="o", label=name)[0]
            with_band = [p for p in pts if p[2] is not None and p[3] is not None]
            if with_band:
                ax.fill_between(
                    [p[0] for p in with_band],
                    [100 * p[2] for p in with_band],
                    [100 * p[3] for p in with_band],
                    color=line.get_color(),
                    alpha=0.15,
                    linewidth=0,
                )
        ax.set_xlabel("samples seen" if col == 1 else "step")
        ax.set_ylabel(f"{title} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: mean over seeds, 95 % band")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

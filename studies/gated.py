"""`python -m studies --gated`: the miniature study behind a gate, where GRPO itself learns.

The 2026-12-03 miniature study judged the papers in a sparse regime where GRPO did not move (9.14 % → 9.13 %
pass@1 in 16 steps), so its verdicts could not say whether a variant helps learning. Here a design (DESIGNS: a
warm start, the problems' step counts, 96 steps) is registered in `gated_plan` (plan.json) before any model
trains, and the run order enforces it:

1. **The gate.** Plain GRPO, seed 0, `steps` steps at each rate of `rates`, evaluated on the held-out problems
   at every checkpoint of `eval_at`. The gate: the better rate (larger final gain; ties: the smaller) gains at
   least `min_gain` of pass@1 at the last checkpoint over the start. Its CI is paired over the problems (one
   seed: a description, not a test). If it fails, the study stops there and the page says that RL does not
   learn at this budget, so the comparisons are uninformative.
2. **The primaries**, only if the gate is met, at the gate's rate, over `seeds` seeds: TA-GRPO − matched
   sampling (pass@32 from 64 samples) and DaGRPO's anchors − Dr. GRPO (pass@1: every problem of a design is
   from its hard step mix, where anchors act). Each paper has one primary, so Holm is the raw p. Beside the
   registered test (it decides), the page reports each primary with the problems as a random effect too (the
   two-way bootstrap over seeds and problems, `studies.stats.crossed_bootstrap`) and, where a design's seeds
   ran on two machines (MACHINES), split and stratified by machine; a verdict either check would not carry is
   flagged next to it.
3. **Learning curves**: every arm evaluated at every checkpoint of `eval_at` (pass@1 from `curve_samples`
   samples), and an area-under-the-curve endpoint per paper (exploratory; TA-GRPO claims sample efficiency,
   DaGRPO faster emergence).

Evaluation: the same held-out problems for every arm; a different sampler seed per seed (`eval_seed`), the
start evaluated under every seed's stream, so the evaluation noise enters the seed-to-seed variance.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from regroup.experiments.demo import evaluate_model
from regroup.io import write_atomic
from regroup.runtime.checkpoint import list_checkpoints
from regroup.runtime.rundir import claim_run_dir
from regroup.tasks import get_task
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config
from studies.claims import (
    ALPHA,
    CONTRADICTED,
    SUPPORTED,
    T1,
    ArmResult,
    Claim,
    Verdict,
    compare_metric,
    comparison_p,
    confidence_interval,
    judge_all,
    pass_at_k_differences,
    verdict_label,
)
from studies.curves import auc, band, pass1, plot_curves
from studies.miniature import (
    ARMS_BY_NAME,
    CONFIG_DIR,
    TASK_NAMES,
    Arm,
    Regime,
    StudySettings,
    _ensure_warm,
    _eval_settings,
    arm_overrides,
    heldout_for,
    measure_all_wrong,
    plan,
    run_row,
)
from studies.stats import (
    crossed_anova_interval,
    crossed_bootstrap,
    paired_t_power,
    percentile_interval,
    seeds_for_power,
    stratified_mean_test,
    t_ppf,
)
from studies.table import START, TABLE, arm_results, counts_of, read_per_problem, row, write_table

REGIME = "hard"
"""The primaries' regime (folder and table name): the design's start on its problems."""
GATE = "gate"
STARTS = {
    "early420": ("runs/warmup-early420", "the warm-up stopped at SFT step 420"),
    "warm": ("runs/warmup", "the warm start"),
}
"""The warm starts a design may name (folder, description): the warm-up stopped at SFT step 420, and the full
warm-up (the demo's)."""

ARMS = {
    **ARMS_BY_NAME,
    "dagrpo_anchor_nc": Arm(
        "dagrpo_anchor_nc",
        "dagrpo.yaml",
        "equal samples",
        ("mask.enabled=false", "anchors.when=no_correct"),
        description="DaGRPO anchors only, injected into groups with no correct sample",
    ),
}
"""The miniature study's arms and the anchors-only arm of this study's DaGRPO primary (`no_correct`)."""


@dataclass(frozen=True)
class GatedSettings:
    """The registered design (fixed before any model trains; `gated_plan` writes it)."""

    start: str = "early420"
    """The warm start (a key of STARTS)."""
    step_mix: str = "3-4"
    """The training and held-out problems' step counts ("3-4" or "4")."""
    questions: int = 384
    """Distinct training questions; with 2 epochs of 8 questions per step: 96 optimizer steps (the 2026-12-03
    study: 64 questions, 16 steps)."""
    rates: tuple[float, ...] = (1e-4, 3e-4)
    """The gate's learning rates: the recipe's 1e-4 and three times it."""
    eval_at: tuple[int, ...] = (24, 48, 72, 96)
    curve_samples: int = 16
    """Samples per problem at the checkpoints before the last (pass@1 for the curves)."""
    min_gain: float = 0.03
    """The gate: +3 points of held-out pass@1 for the better rate at the last checkpoint."""
    seeds: int = 10
    arms: tuple[str, ...] = ("grpo", "grpo_drgrpo", "dagrpo_anchor_nc", "grpo_matched", "ta_grpo")
    """The primaries' arms, and plain GRPO: the gate's arm, rerun over every seed."""

    def study(self) -> StudySettings:
        return StudySettings(seeds=self.seeds, questions=self.questions, regimes=(REGIME,))

    @classmethod
    def from_plan(cls, plan_json: dict) -> GatedSettings:
        """The design a study folder registered (plan.json), whatever this code's defaults are now."""
        known = {f.name for f in fields(cls)}
        design = {k: tuple(v) if isinstance(v, list) else v for k, v in plan_json["design"].items() if k in known}
        return cls(**design)


DESIGNS = {
    "early420-3-4": GatedSettings(),
    "warm-4": GatedSettings(start="warm", step_mix="4"),
}
"""The registered designs, in the order they were registered: the first (the 2026-12-03 study's sparse regime,
58 % all-wrong groups at step 0) failed its gate on 2026-12-04, so the second (the full warm-up on 4-step
problems, 31 % all-wrong at step 0: harder than the 1-4-step mix, learnable from a better start) was
registered after it, before any of its runs."""
MACHINES = {"warm-4": (("GPU", tuple(range(7))), ("CPU", (7, 8, 9)))}
"""Where each seed's primary pairs ran, for the designs whose seeds ran on more than one machine (machine,
seeds): design 2's seeds 0-6 on one GPU, 7-9 on a 2-core CPU (its page's "How it ran"; GRPO's seed 7 ran on
the GPU, but GRPO is in no primary)."""
BOOTSTRAP_RESAMPLES = 100_000
"""Resamples of the two-way bootstrap (RNG seed 0): the interval's ends move by a few hundredths of a point
between RNG seeds at this count (at 10,000, the anchors' lower end fell on either side of 0)."""
PASS_AT_32_ARMS = ("grpo", "grpo_matched", "ta_grpo")
"""Arms in a pass@32 comparison: evaluated with `eval_samples` at the last step (the others `pass1_eval_samples`)."""


PRIMARIES = [
    Claim(
        "TA-GRPO",
        "Higher pass@32 than matched sampling ((N+1)·G of q0): the gain is the rephrasing",
        "ta_grpo",
        "grpo_matched",
        "pass@32",
        primary=True,
        regime=REGIME,
        effect=0.0686,
        effect_source="TA-GRPO vs matched sampling, pass@32 on AIME24: +6.86 (the paper's AIME24 table)",
    ),
    Claim(
        "DaGRPO",
        "Anchors (no_correct) beat Dr. GRPO (pass@1; every problem is from the design's hard step mix)",
        "dagrpo_anchor_nc",
        "grpo_drgrpo",
        "pass@1",
        primary=True,
        regime=REGIME,
        effect=0.029,
        effect_source="the anchors' share of DaGRPO's gain: 48.8 (masks + anchors) − 45.9 (masks alone), SPEC §6",
        effect_derived=True,
    ),
]
EXPLORATORY = [
    Claim("TA-GRPO", "Higher pass@1 than matched sampling", "ta_grpo", "grpo_matched", "pass@1"),
    Claim("TA-GRPO", "Higher pass@32 than GRPO (equal questions)", "ta_grpo", "grpo", "pass@32"),
    Claim("DaGRPO", "Anchors beat GRPO (pass@1)", "dagrpo_anchor_nc", "grpo", "pass@1"),
    Claim(
        "study control", "Dr. GRPO's advantages and normaliser beat GRPO's (pass@1)", "grpo_drgrpo", "grpo", "pass@1"
    ),
]

# The per-seed sd of each primary's difference in the 2026-12-03 study's kept table (25 seeds, 16 steps:
# SE × √25; its anchors arm injected always), doubled because 6x the steps can only let the seeds drift further
# apart (an assumption). Power only; the run's own spread is reported beside it, never used to resize the study.
PILOT_SD = {"ta_grpo": 2 * 0.0041959 * 5, "dagrpo_anchor_nc": 2 * 0.0010216 * 5}


def _device() -> str | None:
    """Where evaluations sample: the GPU where there is one (training picks it by itself), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else None


def eval_seed(seed: int) -> int:
    """The evaluation sampler's seed of every run of `seed` and of the start evaluated for it."""
    return 10_000 + seed


def rate_arm(lr: float) -> str:
    return f"grpo_lr{lr:g}"


def gated_plan(g: GatedSettings) -> dict:
    s = g.study()
    power = []
    for c in PRIMARIES:
        sd = PILOT_SD[c.arm]
        power.append(
            {
                "paper": c.paper,
                "endpoint": c.text,
                "difference": f"{c.arm} − {c.against}",
                "measure": c.measure,
                "effect": c.effect,
                "effect_source": c.effect_source,
                "pilot_sd_per_seed": sd,
                "seeds": g.seeds,
                "power": round(paired_t_power(c.effect, sd, g.seeds, ALPHA), 4),  # type: ignore[arg-type]
                "seeds_for_power": seeds_for_power(c.effect, sd, ALPHA, 0.8),  # type: ignore[arg-type]
            }
        )
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "the miniature study behind a gate: RL must move held-out pass@1 before any comparison",
        "design": {**asdict(g), "steps": s.steps, "prompts_per_step": s.prompts_per_step, "G": s.num_generations},
        "gate": f"plain GRPO, seed 0, {s.steps} steps at each rate of {list(g.rates)}; the better rate (larger final "
        f"gain; ties: the smaller) gains >= {100 * g.min_gain:g} points of held-out pass@1 ({s.eval_problems} "
        f"problems x {s.pass1_eval_samples} samples at T = 1) at step {max(g.eval_at)} over the start",
        "if_the_gate_fails": "stop: publish 'RL does not learn at this budget, so the comparisons are uninformative'",
        "primaries": power,
        "holm": "one primary per paper: m = 1, Holm's p is the raw p",
        "exploratory": [asdict(c) for c in EXPLORATORY]
        + [{"text": "area under the pass@1 curve (start and every checkpoint), same pairs as the primaries"}],
        "evaluation": f"the regime's {s.eval_problems} held-out problems (unseen questions from the training "
        f"generator) for every arm; pass@32 from {s.eval_samples} samples for the TA arms, pass@1 from "
        f"{s.pass1_eval_samples} for the others at the last step, {g.curve_samples} at the earlier checkpoints; "
        "sampler seed 10000 + seed, the start evaluated under every seed's stream",
        "budgets": {a: asdict(plan(ARMS[a], s)) for a in g.arms},
    }


# ----------------------------------------------------------------------------------------------- running
def _overrides(arm: str, g: GatedSettings, regime: Regime, seed: int, run_dir: Path, lr: float) -> list[str]:
    s = g.study()
    every = math.gcd(*g.eval_at)
    return arm_overrides(ARMS[arm], s, regime, seed, run_dir) + [
        f"optim.lr={lr}",
        f"train.checkpoint_every={every}",
        f"train.keep_checkpoints={max(g.eval_at) // every}",
    ]


def _evaluate(model_dir: str, problems, dest: Path, s: StudySettings, n: int, seed: int) -> dict:
    """n samples per problem at T = 1 under seed's evaluation stream (out: summary.json, per_problem.jsonl)."""
    settings, ks = _eval_settings(s, n), [k for k in s.ks if k <= n]
    return evaluate_model(model_dir, problems, dest, settings, seed=eval_seed(seed), ks=ks, device=_device())


def train_and_evaluate(
    arm: str, name: str, g: GatedSettings, regime: Regime, seed: int, lr: float, problems, out: Path, log
) -> Path:
    """One run: train, evaluate every checkpoint of `eval_at` (eval_step<N>/, the last also as eval/), drop the
    checkpoints."""
    s = g.study()
    run_dir = out / f"{name}-s{seed}"
    cfg = load_config(CONFIG_DIR / ARMS[arm].config, _overrides(arm, g, regime, seed, run_dir, lr))
    t0 = time.perf_counter()
    with claim_run_dir(run_dir, "fresh", log=log):
        build_trainer(cfg, run_dir, log=log).train()
    train_seconds = time.perf_counter() - t0
    last = max(g.eval_at)
    for checkpoint in list_checkpoints(run_dir):
        step = int(checkpoint.name.rpartition("-")[2])
        if step not in g.eval_at:
            continue
        if step != last:
            n = g.curve_samples
        else:
            n = s.eval_samples if arm in PASS_AT_32_ARMS else s.pass1_eval_samples
        dest = run_dir / ("eval" if step == last else f"eval_step{step}")
        summary = _evaluate(str(checkpoint), problems, dest, s, n, seed)
        log(f"{name} seed {seed} step {step}: pass@1 {summary['mean@n']:.4f}")
    write_atomic(
        run_dir / "timing.json",
        json.dumps({"train_seconds": train_seconds, "eval_seconds": time.perf_counter() - t0 - train_seconds}),
    )
    shutil.rmtree(run_dir / "checkpoints")  # evaluated: the study keeps metrics and evaluations only
    return run_dir


def evaluate_start(g: GatedSettings, regime: Regime, seed: int, problems, out: Path) -> None:
    """The start under seed's evaluation stream: every sample count an arm of that seed uses."""
    s = g.study()
    for n in sorted({g.curve_samples, s.pass1_eval_samples, s.eval_samples}):
        dest = out / f"start-s{seed}" / f"eval_n{n}"
        if not (dest / "per_problem.jsonl").is_file():
            _evaluate(regime.warm_dir, problems, dest, s, n, seed)


def setup(g: GatedSettings, study_dir: Path, log) -> tuple[Regime, list]:
    """The design's regime (measured once: its start's all-wrong share at step 0; later processes read
    regime.json) and its held-out problems."""
    s = g.study()
    path = study_dir / "regime.json"
    if path.is_file():
        regime = Regime(**json.loads(path.read_text()))
    else:
        folder, named = STARTS[g.start]
        warm = _ensure_warm(folder, s, s.early_warmup_steps if g.start == "early420" else None, log)
        probe = get_task(TASK_NAMES[(g.step_mix, False)]).generate(s.probe_problems, seed=1234)  # training's first
        description = f"{g.step_mix}-step problems from {named}"
        regime = Regime(REGIME, description, g.step_mix, warm, measure_all_wrong(warm, probe, s))
        log(f"{description}: all-wrong share at step 0 = {regime.all_wrong:.2f}")
        write_atomic(path, json.dumps(asdict(regime), indent=2))
    return regime, heldout_for(regime, s)


def run_gate(g: GatedSettings, study_dir: Path, rates: tuple[float, ...], log=print) -> None:
    regime, problems = setup(g, study_dir, log)
    evaluate_start(g, regime, 0, problems, study_dir / GATE)
    for lr in rates:
        train_and_evaluate("grpo", rate_arm(lr), g, regime, 0, lr, problems, study_dir / GATE, log)


def run_primaries(g: GatedSettings, study_dir: Path, lr: float, seeds: list[int], arms: list[str], log=print) -> None:
    regime, problems = setup(g, study_dir, log)
    for seed in seeds:
        if g.arms[0] in arms:  # the process of each seed's first arm evaluates its start
            evaluate_start(g, regime, seed, problems, study_dir / REGIME)
        for arm in arms:
            if not (study_dir / REGIME / f"{arm}-s{seed}" / "timing.json").is_file():
                train_and_evaluate(arm, arm, g, regime, seed, lr, problems, study_dir / REGIME, log)


# ------------------------------------------------------------------------------------------- the table
def _start_rows(folder: Path, regime: str, g: GatedSettings) -> list[dict]:
    """The start of each seed, as an arm: its last-step evaluations under that seed's stream (n of the
    pass@1 arms as T1, of the pass@32 arms as "n64") and its curve evaluation (step0)."""
    s = g.study()
    rows = []
    for d in sorted(folder.glob("start-s*")):
        evals = {}
        for n, key in ((s.pass1_eval_samples, T1), (s.eval_samples, f"n{s.eval_samples}"), (g.curve_samples, "step0")):
            f = d / f"eval_n{n}" / "per_problem.jsonl"
            if f.is_file():
                evals[key] = read_per_problem(f)
        if evals:
            rows.append(row(regime, START, int(d.name[len("start-s") :]), evals))
    return rows


def gated_rows(study_dir: Path, g: GatedSettings) -> list[dict]:
    rows = _start_rows(study_dir / GATE, GATE, g) + _start_rows(study_dir / REGIME, REGIME, g)
    for regime in (GATE, REGIME):
        for run_dir in sorted((study_dir / regime).glob("*-s*")):
            if run_dir.name.startswith("start-") or not (run_dir / "timing.json").is_file():
                continue
            rows.append(run_row(regime, run_dir.name.rpartition("-s")[0], run_dir))
    return rows


def keep(study_dir: Path, dest: Path, g: GatedSettings) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("plan.json", "regime.json"):
        write_atomic(dest / name, (study_dir / name).read_bytes())
    return write_table(gated_rows(study_dir, g), dest / TABLE)


# -------------------------------------------------------------------------------------------- verdicts
def _per_problem_pass1(entry) -> dict[str, float]:
    return {i: c / n for i, (c, n) in counts_of(entry).items()}


def gate_verdict(rows: list[dict], g: GatedSettings) -> dict:
    """Each rate's curve and final gain over the start (CI paired over the problems), and the gate."""
    start = next(r for r in rows if r["regime"] == GATE and r["arm"] == START)
    out = []
    for r in rows:
        if r["regime"] != GATE or r["arm"] == START:
            continue
        base, final = _per_problem_pass1(start["evals"][T1]), _per_problem_pass1(r["evals"][T1])
        diffs = [final[i] - base[i] for i in base]
        gain = sum(diffs) / len(diffs)
        se = math.sqrt(sum((d - gain) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
        half = t_ppf(0.975, len(diffs) - 1) * se
        curve = curve_of(r, start, max(g.eval_at))
        out.append({"arm": r["arm"], "curve": curve, "gain": gain, "ci": (gain - half, gain + half)})
    best = max(out, key=lambda r: (r["gain"], -float(r["arm"][len("grpo_lr") :])))
    return {"rates": out, "best": best, "met": best["gain"] >= g.min_gain}


def curve_of(run: dict, start: dict, last: int) -> dict[int, float]:
    """step -> mean pass@1: the start (step 0, its curve evaluation), the checkpoints, the last step's T1."""
    points = {0: pass1(start["evals"]["step0"]), last: pass1(run["evals"][T1])}
    for key, entry in run["evals"].items():
        if key.startswith("step"):
            points[int(key[4:])] = pass1(entry)
    return dict(sorted(points.items()))


def _paired(values: dict[int, float], against: dict[int, float]) -> dict | None:
    """values − against over the seeds both have, by the study's paired t-test over seeds (sign-flip at a zero
    SE): {delta, ci, p, sd, seeds}; None under 2 seeds."""
    c = compare_metric(
        ArmResult(mechanisms={s: {"x": v} for s, v in values.items()}),
        ArmResult(mechanisms={s: {"x": v} for s, v in against.items()}),
        "x",
    )
    if c.delta is None or c.se is None or c.seeds < 2:
        return None
    return {
        "delta": c.delta,
        "ci": confidence_interval(c),
        "p": comparison_p(c),
        "sd": c.se * math.sqrt(c.seeds),
        "seeds": c.seeds,
    }


def _seed_span(seeds) -> str:
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def primary_checks(rows: list[dict], g: GatedSettings, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, dict]:
    """Each primary's checks beside the registered test (keyed by its arm): the 95 % percentile intervals of
    the seeds-only and the two-way (seeds × problems) bootstrap of its mean paired difference, the share of
    two-way resamples on the other side of 0 from the estimate, the crossed random-effects interval (ANOVA
    variance, Satterthwaite df: `crossed_anova_interval`), and, for a design in MACHINES, the difference
    over each machine's seeds (paired t) and stratified by machine (`stratified_mean_test`)."""
    import numpy as np

    results = arm_results([r for r in rows if r["regime"] == REGIME]).get(REGIME, {})
    machines = MACHINES.get(next((n for n, d in DESIGNS.items() if d == g), ""), ())
    out = {}
    for c in PRIMARIES:
        if c.arm not in results or c.against not in results:
            continue
        seeds, problems, diffs = pass_at_k_differences(results[c.arm], results[c.against], int(c.measure[5:]))
        if len(seeds) < 2 or not problems:
            continue
        d = np.asarray(diffs)
        draws = crossed_bootstrap(d, resamples)
        delta = float(d.mean())
        per_seed = dict(zip(seeds, d.mean(axis=1).tolist()))
        check = {
            "seeds_only": percentile_interval(crossed_bootstrap(d, resamples, problems=False)),
            "two_way": percentile_interval(draws),
            "crossed": crossed_anova_interval(d),
            "other_side": float(np.mean(draws <= 0) if delta > 0 else np.mean(draws >= 0)),
            "problems": len(problems),
            "machines": [],
        }
        if machines and all(set(ms) & set(per_seed) for _, ms in machines):
            groups = [[per_seed[s] for s in ms if s in per_seed] for _, ms in machines]
            for (name, ms), values in zip(machines, groups):
                x = _paired(dict(enumerate(values)), dict.fromkeys(range(len(values)), 0.0))
                check["machines"].append((name, [s for s in ms if s in per_seed], x))
            _, p, heterogeneity = stratified_mean_test(groups)
            check["stratified_p"], check["heterogeneity_p"] = p, heterogeneity
        out[c.arm] = check
    return out


SCOPE = {
    "ta_grpo": "for this model at {steps} steps with the task's rule-based rephraser (renaming and reordering, "
    "not an LLM's rephrasings)",
    "dagrpo_anchor_nc": "for this model at {steps} steps with one anchor per all-wrong group",
}
"""What each primary's verdict holds for: the page's own scope, never the papers' models or rephrasers."""


def primary_label(v: Verdict, steps: int, check: dict | None) -> str:
    """The primary's verdict in its scope, with the flags of the checks that would not carry it: a verdict
    that the first machine's seeds alone do not reach (and then the stratified p), or whose two-way bootstrap
    interval includes 0."""
    scope = SCOPE.get(v.claim.arm, "").format(steps=steps)
    label = verdict_label(v, scope=scope) if v.verdict != CONTRADICTED else f"{CONTRADICTED} {scope}".strip()
    if v.verdict not in (SUPPORTED, CONTRADICTED) or check is None:
        return label
    if check["machines"]:
        (first, first_seeds, alone), *others = check["machines"]
        if alone is None or alone["p"] >= ALPHA:
            rest = [s for _, seeds, _ in others for s in seeds]
            alone_p = "—" if alone is None else f"{alone['p']:.2g}"
            label += (
                f"; it needs {_seed_span(rest)}: {_seed_span(first_seeds)} ({first}) alone give "
                f"p = {alone_p}; stratified by machine "
                f"p = {check['stratified_p']:.2g} (machines differ: p = {check['heterogeneity_p']:.2g})"
            )
    crossed = {
        "the two-way bootstrap's 95 % interval": check["two_way"],
        "the crossed random-effects 95 % interval": check["crossed"][3],
    }
    shown = {name: f"{name}, [{100 * lo:+.2f}, {100 * hi:+.2f}]," for name, (lo, hi) in crossed.items()}
    including = [name for name, (lo, hi) in crossed.items() if lo <= 0 <= hi]
    if including:
        verb = "include" if len(including) > 1 else "includes"
        label += f"; with problems as a random effect {' and '.join(shown[n] for n in including)} {verb} 0"
        label += "".join(f" ({shown[n]} does not)" for n in crossed if n not in including)
    return label


def curves(rows: list[dict], g: GatedSettings) -> dict[str, dict[int, dict[int, float]]]:
    """arm -> seed -> step -> pass@1, every run against the start evaluated under its seed's stream."""
    starts = {r["seed"]: r for r in rows if r["regime"] == REGIME and r["arm"] == START}
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        if r["regime"] == REGIME and r["arm"] != START and r["seed"] in starts:
            out.setdefault(r["arm"], {})[r["seed"]] = curve_of(r, starts[r["seed"]], max(g.eval_at))
    return out


def _cell(values: list[float]) -> str:
    mean, lo, hi = band(values)
    return f"{100 * mean:.1f}" if lo is None or hi is None else f"{100 * mean:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _check_tables(verdicts: list[Verdict], checks: dict[str, dict]) -> list[str]:
    """The primaries with the problems as a random effect, and split and stratified by machine."""
    primaries = [x for x in verdicts if x.claim.primary and x.claim.arm in checks and x.ci is not None]
    if not primaries:
        return []
    some = checks[primaries[0].claim.arm]
    lines = [
        "",
        "### The primaries with the problems as a random effect (a check; the registered test decides)",
        "",
        f"The registered paired t over seeds holds the {some['problems']} problems fixed. The two-way bootstrap "
        "treats them as a sample too: each resample draws the seeds and the problems with replacement, "
        f"independently, and recomputes the mean paired difference ({BOOTSTRAP_RESAMPLES:,} resamples, RNG "
        "seed 0, 95 % percentile interval; `studies.stats.crossed_bootstrap`). It counts the seed × problem "
        "noise in both margins, so it is the most conservative of these intervals. The crossed random-effects "
        "interval counts it once: the mean's variance from the ANOVA mean squares, t with Satterthwaite's df "
        "(`studies.stats.crossed_anova_interval`).",
        "",
        "| endpoint | Δ | paired t over seeds (registered) | bootstrap over seeds | two-way bootstrap, seeds × "
        "problems | its width against the registered | two-way resamples across 0 | crossed random effects "
        "(df) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in primaries:
        c, ci, check = x.comparison, x.ci, checks[x.claim.arm]
        assert c is not None and c.delta is not None and ci is not None

        def interval(pair: tuple[float, float]) -> str:
            return f"[{100 * pair[0]:+.2f}, {100 * pair[1]:+.2f}]"

        (lo, hi) = check["two_way"]
        lines.append(
            f"| {x.claim.arm} − {x.claim.against}, {x.claim.measure} | {100 * c.delta:+.2f} | {interval(ci)} | "
            f"{interval(check['seeds_only'])} | {interval(check['two_way'])} | "
            f"{(hi - lo) / (ci[1] - ci[0]):.1f}x | {100 * check['other_side']:.1f} % | "
            f"{interval(check['crossed'][3])} ({check['crossed'][2]:.0f}) |"
        )
    split = [x for x in primaries if checks[x.claim.arm]["machines"]]
    if split:
        names = [f"{name}, {_seed_span(seeds)}" for name, seeds, _ in checks[split[0].claim.arm]["machines"]]
        lines += [
            "",
            "### The primaries by machine (a check, not an endpoint)",
            "",
            "Each machine's seeds alone (paired t over them), and all seeds stratified by machine (one mean "
            "per machine, a pooled residual variance: `studies.stats.stratified_mean_test`).",
            "",
            "| endpoint | " + " | ".join(names) + " | stratified by machine: p | machines differ: p |",
            "|---|" + "---|" * (len(names) + 2),
        ]
        for x in split:
            check, cells = checks[x.claim.arm], []
            for _, _, m in check["machines"]:
                cells.append(
                    "—"
                    if m is None
                    else f"{100 * m['delta']:+.2f} [{100 * m['ci'][0]:+.2f}, {100 * m['ci'][1]:+.2f}], p = {m['p']:.2g}"
                )
            lines.append(
                f"| {x.claim.arm} − {x.claim.against}, {x.claim.measure} | " + " | ".join(cells) + " | "
                f"{check['stratified_p']:.2g} | {check['heterogeneity_p']:.2g} |"
            )
    return lines


def summarize(rows: list[dict], g: GatedSettings, plan_json: dict, out_dir: Path | None = None) -> str:
    """The page's body: the gate, then (where it is met) the primaries, the exploratory rows and the curves."""
    v = gate_verdict(rows, g)
    steps = [0, *g.eval_at]
    study = g.study()
    lines = [
        f"Design: {g.step_mix}-step problems from {STARTS[g.start][1]}; {study.steps} steps of "
        f"{study.prompts_per_step} questions × G = {study.num_generations}.",
        "",
        "### The gate",
        "",
        f"Plain GRPO, seed 0, {study.steps} steps; held-out pass@1 at each checkpoint (the start: step 0).",
        "",
        "| rate | " + " | ".join(f"step {t}" for t in steps) + " | gain at the last step [95 % CI] |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for r in v["rates"]:
        cells = [f"{100 * r['curve'][t]:.1f} %" if t in r["curve"] else "—" for t in steps]
        lo, hi = r["ci"]
        lines.append(
            f"| {r['arm']} | " + " | ".join(cells) + f" | {100 * r['gain']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] |"
        )
    best = v["best"]
    if not v["met"]:
        lines += [
            "",
            f"Gate: **failed** ({best['arm']} gains {100 * best['gain']:+.1f} points; the gate asks "
            f"{100 * g.min_gain:+.0f}). RL does not learn at this budget, so the comparisons are uninformative; "
            "none was run.",
        ]
        return "\n".join(lines)
    lo, hi = best["ci"]
    best_row = next(r for r in rows if r["regime"] == GATE and r["arm"] == best["arm"])
    lines += [
        "",
        f"Gate: **met**: {best['arm']} gains {100 * best['gain']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}] "
        f"(gate: {100 * g.min_gain:+.0f}; the CI is paired over the problems of one seed). The rate was chosen, "
        f"and the gate judged, on the same {len(counts_of(best_row['evals'][T1]))} held-out problems that "
        "evaluate the primaries (there is no separate validation set).",
    ]
    results = arm_results([r for r in rows if r["regime"] == REGIME])
    if not results.get(REGIME):
        return "\n".join(lines + ["", "The primaries have not run yet."])
    verdicts = judge_all(PRIMARIES + EXPLORATORY, results)
    registered = {p["difference"]: p for p in plan_json["primaries"]}
    checks = primary_checks(rows, g)
    lines += [
        "",
        "### The primaries (registered, at the gate's rate)",
        "",
        "| paper | endpoint | Δ [95 % CI] | seeds run (registered) | p (Holm, m = 1) | power at the paper's effect, "
        "seeds run (pilot sd) | per-seed sd: pilot, measured | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in verdicts:
        if not x.claim.primary or x.comparison is None or x.comparison.delta is None:
            continue
        c, ci = x.comparison, x.ci or confidence_interval(x.comparison)
        reg = registered[f"{x.claim.arm} − {x.claim.against}"]
        cells = f"{100 * c.delta:+.2f} [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]" if ci else f"{100 * c.delta:+.2f}"
        power = paired_t_power(reg["effect"], reg["pilot_sd_per_seed"], c.seeds, ALPHA)
        sd = "—" if c.se is None else f"{100 * c.se * math.sqrt(c.seeds):.2f}"
        lines.append(
            f"| {x.claim.paper} | {x.claim.text} | {cells} | {c.seeds} ({reg['seeds']}) | "
            f"{'—' if x.p_adjusted is None else f'{x.p_adjusted:.3g}'} | {100 * power:.0f} % | "
            f"{100 * reg['pilot_sd_per_seed']:.2f}, {sd} | {primary_label(x, study.steps, checks.get(x.claim.arm))} |"
        )
    lines += _check_tables(verdicts, checks)
    lines += ["", "### Exploratory (raw p, never 'supported')", "", "| claim | Δ [95 % CI] | p |", "|---|---|---|"]
    for x in verdicts:
        if x.claim.primary or x.comparison is None or x.comparison.delta is None or x.ci is None:
            continue
        lines.append(
            f"| {x.claim.text} | {100 * x.comparison.delta:+.2f} [{100 * x.ci[0]:+.2f}, {100 * x.ci[1]:+.2f}] | "
            f"{x.p:.3g} |"
        )
    per_arm, last = curves(rows, g), max(g.eval_at)
    lines += [
        "",
        "### Learning curves",
        "",
        "Mean held-out pass@1 over seeds [95 % band], each run's start evaluated under its seed's stream.",
        "",
        "| arm | " + " | ".join(f"step {t}" for t in steps) + " | AUC |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for arm, seeds in per_arm.items():
        cells = []
        for t in steps:
            cells.append(_cell([seeds[s][t] for s in seeds if t in seeds[s]]))
        cells.append(_cell([auc(c, last) for c in seeds.values()]))
        lines.append(f"| {arm} ({len(seeds)}) | " + " | ".join(cells) + " |")
    lines += ["", "| AUC difference (exploratory) | Δ [95 % CI] | p |", "|---|---|---|"]

    def aucs(arm: str) -> dict[int, float]:
        return {s: auc(c, last) for s, c in per_arm[arm].items()}

    for a, b in (("ta_grpo", "grpo_matched"), ("dagrpo_anchor_nc", "grpo_drgrpo"), ("grpo", START)):
        if a not in per_arm:
            continue
        if b == START:  # the gain over the start: the curve's area against a flat start
            x = _paired({s: auc(c, last) for s, c in per_arm[a].items()}, {s: c[0] for s, c in per_arm[a].items()})
        elif b in per_arm:
            x = _paired(
                {s: auc(c, last) for s, c in per_arm[a].items()}, {s: auc(c, last) for s, c in per_arm[b].items()}
            )
        else:
            continue
        if x is not None:
            lines.append(
                f"| {a} − {b} | {100 * x['delta']:+.2f} [{100 * x['ci'][0]:+.2f}, {100 * x['ci'][1]:+.2f}] | "
                f"{x['p']:.3g} |"
            )
    gains = []
    for arm, seeds in per_arm.items():
        last = max(g.eval_at)
        x = _paired({s: c[last] for s, c in seeds.items()}, {s: c[0] for s, c in seeds.items()})
        if x is not None:
            gains.append(f"{arm} {100 * x['delta']:+.1f} [{100 * x['ci'][0]:+.1f}, {100 * x['ci'][1]:+.1f}]")
    lines += ["", "Gain of each arm over its start at the last step (pass@1, points): " + "; ".join(gains) + "."]
    if out_dir is not None:
        per_step = {a: plan(ARMS[a], study).samples_per_step for a in per_arm}
        points = {
            arm: [(t, *band([seeds[s][t] for s in seeds if t in seeds[s]])) for t in steps]
            for arm, seeds in per_arm.items()
        }
        plot_curves(points, out_dir / "curves.png", per_step, title="held-out pass@1")
        lines += ["", "![pass@1 against step and samples](curves.png)"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the command
def open_study(study_dir: Path, design: GatedSettings | None) -> GatedSettings:
    """The study folder's registered design: plan.json's, or `design` written as plan.json before anything
    trains. A folder that has a plan refuses another design."""
    path = study_dir / "plan.json"
    if path.is_file():
        kept = GatedSettings.from_plan(json.loads(path.read_text()))
        if design is not None and design != kept:
            raise ValueError(f"{path}: registers another design than the one named; start a new study folder")
        return kept
    if design is None:
        raise ValueError(f"{study_dir}: no plan.json; name the design to start it with (--design)")
    study_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(gated_plan(design), indent=2))
    return design


def gate_met(study_dir: Path, g: GatedSettings) -> float:
    """The gate's rate, or ValueError naming why the primaries may not run."""
    rows = gated_rows(study_dir, g)
    if sum(r["regime"] == GATE and r["arm"] != START for r in rows) < len(g.rates):
        raise ValueError(f"{study_dir}: the gate has not finished (every rate of {list(g.rates)} must run first)")
    v = gate_verdict(rows, g)
    if not v["met"]:
        raise ValueError(f"the gate failed ({v['best']['arm']}: {100 * v['best']['gain']:+.1f} points): no primaries")
    return float(v["best"]["arm"][len("grpo_lr") :])

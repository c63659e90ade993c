"""`regroup study`: the two papers' claims tested in miniature, under their own protocols.

On the built-in task and the warmed-up tiny model, in two regimes:

- **mid**: the demo's warm start (runs/warmup) on the task's usual mix of 1-4-step problems;
- **sparse**: a start where at least half of GRPO's step-0 groups are all wrong. Candidates are tried
  in a fixed order — 3-4-step problems from the warm start, 4-step problems from the warm start, 3-4-step
  problems from an earlier warm-up snapshot — and the first whose measured all-wrong share (G samples of
  `probe_problems` training questions) reaches `sparse_min_all_wrong` is used; the share is reported,
  and a regime that never reaches it is reported as such.

Every arm (ARMS) trains from the regime's start with each seed, is evaluated on the same held-out
problems (pass@1/8/32 from `eval_samples` samples), and the claims (CLAIMS) are judged by
`regroup.report.claims`. Budgets per protocol: GRPO sees `questions` distinct questions for `epochs`
epochs (`steps = questions · epochs / prompts_per_step`); "equal questions" arms (TA-GRPO as in its
paper, grpo_matched) draw the same questions at the same steps and generate (N+1)·G per question;
"equal samples" arms generate as many samples per step as GRPO. Every arm stops at its planned step
count (`train.epochs` stays 0: an equal-samples arm draws fewer questions per step, and must not run on
to finish its epochs).

Sizing (default settings): GRPO trains 20 optimizer steps of 64 samples (1,280 samples); all arms
together plan 21.5 GRPO runs' worth (27,520 samples) per (regime, seed), 165 k over 2 regimes × 3 seeds.
At the README's measured 1.48 s per training step of 128 samples (11.6 ms per sample) that is ~32 min
of training, plus 68 evaluations of 48 problems × 33 samples (~108 k samples; ~10 min if an evaluation
sample costs half a training sample, which is an assumption), plus start-up, saving and the warm-up when
it is not cached (~3 min): ~45-50 min for a 60-minute budget. These are estimates from that one
measured rate, not a measured study time; `study.json` records the measured seconds.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from regroup.io import write_atomic
from regroup.report.claims import ArmResult, Claim
from regroup.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, apply_transforms
from regroup.checkpoint import list_checkpoints
from regroup.config import load_config
from regroup.demo import DemoSettings, evaluate_model
from regroup.eval.runner import evaluate
from regroup.heldout import heldout_problems
from regroup.models.load import load_tokenizer
from regroup.report import build_report
from regroup.report.claims import judge_all, per_seed_mean
from regroup.report.runs import load_run, read_metrics
from regroup.report.study_page import write_study_page
from regroup.report.summary import last_step, wall_time_s
from regroup.rundir import claim_run_dir, new_run_dir
from regroup.tasks import get_task
from regroup.trainer import Trainer
from regroup.warmup import WarmupConfig, warmup

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # package data: found from a wheel install too
N_VARIANTS = 3  # TA-GRPO's N in configs/ta_grpo.yaml and dagrpo_ta.yaml


# ------------------------------------------------------------------------------------------- tasks
class StudyTask(ArithmeticTask):
    """The arithmetic task with another step mix and, optionally, renaming as its only rephrasing
    (a difficulty-preserving rephraser: renaming leaves the warmed-up model's pass@1 unchanged,
    README: 0.609 vs 0.607, while reordering and rewording make problems look harder)."""

    def __init__(self, step_probs: dict[int, float] | None = None, rename_only: bool = False) -> None:
        super().__init__(ArithmeticConfig(step_probs=step_probs) if step_probs else None)
        self.rename_only = rename_only

    def rephrase(self, problem, n: int, rng: random.Random) -> list[str]:
        if not self.rename_only:
            return super().rephrase(problem, n, rng)
        seen, out = {problem.question}, []
        for _ in range(20 * n + 20):
            if len(out) >= n:
                break
            text = apply_transforms(problem, ["rename"], rng)
            if text not in seen:
                seen.add(text)
                out.append(text)
        return out


STEPS_3_4 = {3: 0.5, 4: 0.5}
STEPS_4 = {4: 1.0}


# `data.task` takes "pkg.mod:factory": one factory per (step mix, rephraser) the study uses.
def rename_only_task() -> StudyTask:
    return StudyTask(None, rename_only=True)


def steps_3_4_task() -> StudyTask:
    return StudyTask(STEPS_3_4)


def steps_3_4_rename_only_task() -> StudyTask:
    return StudyTask(STEPS_3_4, rename_only=True)


def steps_4_task() -> StudyTask:
    return StudyTask(STEPS_4)


def steps_4_rename_only_task() -> StudyTask:
    return StudyTask(STEPS_4, rename_only=True)


TASK_NAMES = {  # (step mix, rename only) -> data.task
    ("1-4", False): "arithmetic", ("1-4", True): "regroup.study:rename_only_task",
    ("3-4", False): "regroup.study:steps_3_4_task", ("3-4", True): "regroup.study:steps_3_4_rename_only_task",
    ("4", False): "regroup.study:steps_4_task", ("4", True): "regroup.study:steps_4_rename_only_task",
}


# ---------------------------------------------------------------------------------------- settings
@dataclass
class StudySettings:
    """What one study runs."""

    seeds: int = 3
    """Seeds per arm."""
    prompts_per_step: int = 8
    """GRPO's questions per step."""
    num_generations: int = 8
    """G."""
    questions: int = 80
    """Distinct training questions of GRPO (and of every equal-questions arm)."""
    epochs: int = 2
    """Passes over the training questions (the TA-GRPO paper's 2 epochs)."""
    data_multiplier: float = 2.5
    """Distinct questions of the grpo_data arm, relative to `questions` (TA-GRPO's "2.5x data" claim)."""
    eval_problems: int = 48
    """Held-out problems per regime, the same for every arm and the start."""
    eval_samples: int = 32
    """Samples per held-out problem at T = 1 (pass@1, pass@8, pass@32)."""
    probe_problems: int = 64
    """Training questions sampled G times to measure the start's all-wrong share."""
    sparse_min_all_wrong: float = 0.5
    """The sparse regime needs at least this share of all-wrong groups at step 0."""
    early_warmup_steps: int = 420
    """SFT steps of the earlier warm-up snapshot (the last sparse candidate), on the same 950-step schedule."""
    warmup_dir: str = "runs/warmup"
    """The cached warmed-up model (the mid regime's start)."""
    warmup_steps: int | None = None
    """Override the warm-up's SFT steps (quick mode)."""
    max_new_tokens: int = 48
    """Longest response in training and evaluation."""
    regimes: tuple[str, ...] = ("mid", "sparse")
    arms: tuple[str, ...] | None = None
    """A subset of ARMS (None: all)."""
    overrides: list[str] = field(default_factory=lambda: ["diagnostics.diversity_every=5",
                                                          "diagnostics.grad_conflict_every=5"])
    """Extra dotted overrides for every run (default: the mechanism diagnostics 4 times in 20 steps)."""

    @property
    def steps(self) -> int:
        """GRPO's optimizer steps: `questions · epochs / prompts_per_step`, rounded up."""
        return math.ceil(self.questions * self.epochs / self.prompts_per_step)

    @property
    def ks(self) -> list[int]:
        return [k for k in (1, 8, 32) if k <= self.eval_samples]


QUICK = StudySettings(seeds=2, prompts_per_step=4, num_generations=4, questions=8, epochs=1, eval_problems=8,
                      eval_samples=8, probe_problems=8, early_warmup_steps=60, warmup_dir="runs/warmup-quick",
                      warmup_steps=120, overrides=["diagnostics.diversity_every=1", "diagnostics.grad_conflict_every=1"])


# -------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    name: str
    config: str
    """Recipe file in configs/."""
    protocol: str
    """"reference", "equal questions", "equal samples" or "2.5x questions"."""
    extra: tuple[str, ...] = ()
    """Overrides that make the arm (on top of the recipe)."""
    rename_only: bool = False
    description: str = ""


PROTOCOLS = {  # protocol -> (held equal to GRPO, what differs)
    "reference": ("—", "GRPO: `questions` distinct questions for `epochs` epochs, G samples each"),
    "equal questions": ("questions per step, distinct questions, optimizer steps",
                        "samples per question: (N+1)·G (TA-GRPO's paper protocol; grpo_matched's control); "
                        "dynamic sampling draws extra questions to replace uniform groups"),
    "equal samples": ("samples per step, optimizer steps, distinct questions in the pool",
                      "questions per step: G·P / (samples per question), fewer for TA-GRPO (the demo's protocol)"),
    "2.5x questions": ("epochs, questions and samples per step", "2.5x the distinct questions, so 2.5x the steps"),
}

ARMS = [
    Arm("grpo", "grpo.yaml", "reference", description="GRPO"),
    Arm("grpo_data", "grpo.yaml", "2.5x questions", description="GRPO on 2.5x the distinct questions, same epochs"),
    Arm("grpo_dynamic", "grpo.yaml", "equal questions", ("dynamic_sampling.enabled=true",),
        description="GRPO + DAPO dynamic sampling (uniform groups dropped, batch refilled)"),
    Arm("grpo_matched", "grpo_matched.yaml", "equal questions", description="GRPO with (N+1)·G samples of q0"),
    Arm("ta_grpo", "ta_grpo.yaml", "equal questions", description="TA-GRPO, rule rephrasings (the paper's protocol)"),
    Arm("ta_grpo_eqsamples", "ta_grpo.yaml", "equal samples", description="TA-GRPO, as many samples per step as GRPO"),
    Arm("ta_grpo_rename", "ta_grpo.yaml", "equal questions", rename_only=True,
        description="TA-GRPO with renaming only (difficulty-preserving rephrasings)"),
    Arm("dagrpo_mask", "dagrpo_mask_only.yaml", "equal samples", description="DaGRPO masks only"),
    Arm("dagrpo_anchor", "dagrpo.yaml", "equal samples", ("mask.enabled=false",), description="DaGRPO anchors only"),
    Arm("dagrpo", "dagrpo.yaml", "equal samples", description="DaGRPO masks + anchors"),
    Arm("dagrpo_ta", "dagrpo_ta.yaml", "equal samples", description="DaGRPO + TA-GRPO"),
]
ARMS_BY_NAME = {a.name: a for a in ARMS}


SAMPLED_UNIFORM = "groups/sampled_uniform_frac"
"""Derived: the uniform share of every group sampled — for dynamic sampling 1 − dynamic/informative_frac
(its groups/uniform_frac is measured after its filter dropped the uniform groups), else groups/uniform_frac."""

CLAIMS = [
    Claim("TA-GRPO", "Pooling rephrasings leaves fewer uniform-reward groups than GRPO", "ta_grpo", "grpo",
          SAMPLED_UNIFORM, direction=-1),
    Claim("TA-GRPO", "Higher pass@32 than GRPO (equal questions)", "ta_grpo", "grpo", "pass@32"),
    Claim("TA-GRPO", "Higher pass@1 than GRPO (equal questions)", "ta_grpo", "grpo", "pass@1"),
    Claim("TA-GRPO", "Higher pass@32 than matched sampling ((N+1)·G of q0): the gain is the rephrasing",
          "ta_grpo", "grpo_matched", "pass@32"),
    Claim("TA-GRPO", "Matches GRPO trained on 2.5x the questions (pass@1)", "ta_grpo", "grpo_data", "pass@1",
          kind="matches", reference="grpo"),
    Claim("DaGRPO", "Masks + anchors beat GRPO (pass@1)", "dagrpo", "grpo", "pass@1"),
    Claim("DaGRPO", "Masks alone beat GRPO (pass@1)", "dagrpo_mask", "grpo", "pass@1"),
    Claim("DaGRPO", "Anchors alone beat GRPO (pass@1): they rescue all-wrong groups", "dagrpo_anchor", "grpo", "pass@1"),
    Claim("DaGRPO", "Masked training has less gradient conflict (higher pos/neg gradient cosine; the logged "
          "diagnostic is measured on the unmasked batch)", "dagrpo_mask", "grpo", "grad_conflict/cosine"),
    Claim("study control", "TA-GRPO's pools are less often uniform than matched sampling's pools of the same size "
          "(rephrasing, not pool size, removes uniform groups)", "ta_grpo", "grpo_matched", SAMPLED_UNIFORM,
          direction=-1),
    Claim("study control", "TA-GRPO at equal samples beats GRPO (pass@1)", "ta_grpo_eqsamples", "grpo", "pass@1"),
    Claim("study control", "Difficulty-preserving rephrasings beat rule rephrasings (pass@1)", "ta_grpo_rename",
          "ta_grpo", "pass@1"),
    Claim("study control", "Dynamic sampling beats GRPO (pass@1)", "grpo_dynamic", "grpo", "pass@1"),
    Claim("study control", "Dynamic sampling samples fewer uniform-reward groups than GRPO (before its filter)",
          "grpo_dynamic", "grpo", SAMPLED_UNIFORM, direction=-1),
    Claim("study control", "DaGRPO + TA beats DaGRPO (pass@1)", "dagrpo_ta", "dagrpo", "pass@1"),
]

MECHANISMS = ["reward/mean", SAMPLED_UNIFORM, "groups/uniform_frac", "groups/all_wrong_frac", "mask/frac", "grad_conflict/cosine",
              "anchor/logp_mean", "diversity"]


@dataclass
class Budget:
    """What an arm is planned to spend per run (dynamic sampling may generate more: see tokens)."""

    prompts_per_step: int
    steps: int
    distinct_questions: int
    questions_drawn: int
    samples_per_step: int
    samples: int
    optimizer_steps: int


def plan(arm: Arm, s: StudySettings) -> Budget:
    """The arm's budget under its protocol (mini_batches = 1: one optimizer step per rollout)."""
    g, p, q = s.num_generations, s.prompts_per_step, s.questions
    per_question = g * (N_VARIANTS + 1) if arm.config in ("ta_grpo.yaml", "dagrpo_ta.yaml", "grpo_matched.yaml") else g
    steps = s.steps
    if arm.protocol == "equal samples" and per_question > g:
        p = max(1, p * g // per_question)
    if arm.protocol == "2.5x questions":
        q = round(q * s.data_multiplier)
        steps = math.ceil(q * s.epochs / p)
    return Budget(prompts_per_step=p, steps=steps, distinct_questions=q, questions_drawn=p * steps,
                  samples_per_step=p * per_question, samples=p * per_question * steps, optimizer_steps=steps)


@dataclass
class Regime:
    name: str
    description: str
    step_mix: str
    """"1-4", "3-4" or "4"."""
    warm_dir: str
    all_wrong: float | None = None
    """Measured share of all-wrong groups (G samples of probe_problems training questions) at the start."""
    probes: list[dict] = field(default_factory=list)
    """Every candidate tried: its description and measured all-wrong share."""
    grpo_step1_all_wrong: float | None = None
    """`groups/all_wrong_frac` of the grpo arm's first step (sampled from the start), mean over seeds."""


def arm_overrides(arm: Arm, s: StudySettings, regime: Regime, seed: int, run_dir: Path) -> list[str]:
    b = plan(arm, s)
    out = [f"recipe={arm.name}", f"seed={seed}", f"run_dir={run_dir}", "train.progress=false",
           f"grpo.prompts_per_step={b.prompts_per_step}", f"grpo.num_generations={s.num_generations}",
           f"data.num_train={b.distinct_questions}", f"train.steps={b.steps}",
           f"train.checkpoint_every={b.steps}", "train.keep_checkpoints=1", f"rollout.max_new_tokens={s.max_new_tokens}",
           f"data.task={TASK_NAMES[(regime.step_mix, arm.rename_only)]}", f"model.path={regime.warm_dir}"]
    if arm.config == "grpo_matched.yaml":
        out.append(f"grpo.samples_multiplier={N_VARIANTS + 1}")
    return out + list(arm.extra) + list(s.overrides)


# ---------------------------------------------------------------------------------------- running
def _task_for(step_mix: str):
    return get_task(TASK_NAMES[(step_mix, False)])


def measure_all_wrong(model_dir: str, problems: list, s: StudySettings) -> float:
    """Share of `problems` none of whose G samples (T = 1) is correct: GRPO's all-wrong groups at step 0."""
    from transformers import AutoModelForCausalLM  # heavy (transformers): only when a model is loaded

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    result = evaluate(model, load_tokenizer(model_dir), problems, ArithmeticTask.grade, n=s.num_generations, ks=(1,),
                      temperature=1.0, max_new_tokens=s.max_new_tokens, greedy=False, batch_size=256, seed=0,
                      progress=False)
    return sum(r.correct == 0 for r in result.problems) / len(result.problems)


def _ensure_warm(path: str, s: StudySettings, steps: int | None, log) -> str:
    if (Path(path) / "warmup_metrics.json").exists():
        return path
    cfg = WarmupConfig()
    if steps:
        cfg.steps = steps
        cfg.schedule_steps = max(cfg.schedule_steps, steps)
    if s.warmup_steps:  # quick mode: a short warm-up and a small evaluation
        cfg.num_eval, cfg.eval_samples = s.eval_problems, min(8, s.eval_samples)
    log(f"warming up the tiny model into {path} ({cfg.steps} SFT steps)")
    warmup(path, cfg, log=log)
    return path


def choose_regime(name: str, s: StudySettings, log=print) -> Regime:
    """The mid regime, or the first sparse candidate whose measured all-wrong share reaches the threshold."""
    warm = _ensure_warm(s.warmup_dir, s, s.warmup_steps, log)
    if name == "mid":
        candidates = [("1-4", warm, "1-4-step problems from the warm start")]
    else:
        early = str(Path(s.warmup_dir).parent / f"{Path(s.warmup_dir).name}-early{s.early_warmup_steps}")
        candidates = [("3-4", warm, "3-4-step problems from the warm start"),
                      ("4", warm, "4-step problems from the warm start"),
                      ("3-4", early, f"3-4-step problems from the warm-up stopped at SFT step {s.early_warmup_steps}")]
    regime = None
    for step_mix, warm_dir, description in candidates:
        if warm_dir != warm:
            _ensure_warm(warm_dir, s, s.early_warmup_steps, log)
        task = _task_for(step_mix)
        probe = task.generate(s.probe_problems, seed=1234)  # the first training questions (data.seed default)
        share = measure_all_wrong(warm_dir, probe, s)
        log(f"{name} regime candidate: {description}: all-wrong share at step 0 = {share:.2f}")
        probes = (regime.probes if regime else []) + [{"description": description, "all_wrong": share}]
        regime = Regime(name, description, step_mix, warm_dir, share, probes)
        if name == "mid" or share >= s.sparse_min_all_wrong:
            break
    assert regime is not None
    return regime


def evaluate_start(regime: Regime, s: StudySettings, out_dir: Path, log) -> list:
    """The regime's held-out problems, and the starting model's evaluation on them (out_dir/start/eval)."""
    task = _task_for(regime.step_mix)
    biggest = max(plan(a, s).distinct_questions for a in ARMS)
    problems = heldout_problems(task, s.eval_problems, 999, task.generate(biggest, seed=1234))
    log(f"{regime.name}: evaluating the start on {len(problems)} held-out problems")
    evaluate_model(regime.warm_dir, problems, out_dir / "start" / "eval", _eval_settings(s), seed=0, ks=s.ks)
    return problems


def _eval_settings(s: StudySettings):
    return DemoSettings(eval_problems=s.eval_problems, eval_samples=s.eval_samples)


def run_arm(arm: Arm, regime: Regime, seed: int, problems: list, s: StudySettings, regime_dir: Path, log) -> Path:
    run_dir = regime_dir / f"{arm.name}-s{seed}"
    cfg = load_config(CONFIG_DIR / arm.config, arm_overrides(arm, s, regime, seed, run_dir))
    t0 = time.perf_counter()
    with claim_run_dir(run_dir, "fresh", log=log):
        Trainer.from_config(cfg, run_dir, log=log).train()
    train_seconds = time.perf_counter() - t0
    final = list_checkpoints(run_dir)[-1]
    summary = evaluate_model(str(final), problems, run_dir / "eval", _eval_settings(s), seed=0, ks=s.ks)
    (run_dir / "eval_before").mkdir(exist_ok=True)
    for name in ("summary.json", "per_problem.jsonl"):
        write_atomic(run_dir / "eval_before" / name, (regime_dir / "start" / "eval" / name).read_bytes())
    write_atomic(run_dir / "timing.json", json.dumps({"train_seconds": train_seconds}))
    shutil.rmtree(run_dir / "checkpoints")  # evaluated; the study keeps metrics and evaluations only
    log(f"{regime.name} {arm.name} seed {seed}: pass@1 {summary['mean@n']:.3f} ({train_seconds:.0f} s of training)")
    return run_dir


def with_sampled_uniform(record: dict) -> dict:
    """The record with SAMPLED_UNIFORM added where it can be derived."""
    informative, uniform = record.get("dynamic/informative_frac"), record.get("groups/uniform_frac")
    if isinstance(informative, (int, float)):
        return {**record, SAMPLED_UNIFORM: 1.0 - float(informative)}
    if isinstance(uniform, (int, float)):
        return {**record, SAMPLED_UNIFORM: float(uniform)}
    return record


def read_arm_result(run_dirs: list[Path]) -> ArmResult:
    """Per-seed per-problem counts and mechanism means of an arm's run folders."""
    result = ArmResult()
    for d in run_dirs:
        run = load_run(str(d))
        seed = int(run.seed)
        counts = {}
        with open(d / "eval" / "per_problem.jsonl") as f:
            for line in f:
                row = json.loads(line)
                counts[str(row["id"])] = (int(row["correct"]), int(row["n"]))
        result.per_problem[seed] = counts
        records = [with_sampled_uniform(m) for m in run.metrics]
        result.mechanisms[seed] = {k: v for k in MECHANISMS if (v := per_seed_mean(records, k)) is not None}
    return result


def first_step_mean(run_dirs: list[Path], key: str) -> float | None:
    """Mean over runs of `key` at step 1 (None if no run logged it there)."""
    values = []
    for d in run_dirs:
        records, _ = read_metrics(str(d / "metrics.jsonl"))
        first = next((r for r in records if r.get("step") == 1), None)
        if first is not None and isinstance(first.get(key), (int, float)):
            values.append(float(first[key]))
    return sum(values) / len(values) if values else None


def measured_budget(run_dirs: list[Path]) -> dict:
    """Means over seeds of what the runs spent: steps, generated tokens, training wall time."""
    runs = [load_run(str(d)) for d in run_dirs]
    tokens = [sum(float(m.get("tokens/generated") or 0.0) for m in r.metrics) for r in runs]
    # questions drawn: dynamic sampling's extra rounds count (groups seen), else the step's questions
    drawn = [sum(float(m.get("dynamic/groups_seen") or r.config["grpo"]["prompts_per_step"]) for m in r.metrics)
             for r in runs]
    walls = [wall_time_s(r) or 0.0 for r in runs]
    return {"steps": max((last_step(r) or 0) for r in runs), "tokens": sum(tokens) / len(tokens),
            "questions_drawn": sum(drawn) / len(drawn),
            "wall_s": sum(walls) / len(walls)}


def run_study(quick: bool = False, out_root: str = "runs", log=print, settings: StudySettings | None = None) -> Path:
    """Run every arm in every regime with every seed, judge the claims, write study.html and study.md."""
    s = settings or (QUICK if quick else StudySettings())
    arms = [ARMS_BY_NAME[n] for n in s.arms] if s.arms else ARMS
    study_dir = new_run_dir(out_root, "study")  # exclusive: two studies started in the same second get two folders
    started = time.perf_counter()
    regimes, results, budgets, reports = [], {}, {}, {}
    for name in s.regimes:
        regime = choose_regime(name, s, log)
        regimes.append(regime)
        regime_dir = study_dir / name
        problems = evaluate_start(regime, s, regime_dir, log)
        dirs: dict[str, list[Path]] = {}
        for seed in range(s.seeds):
            for arm in arms:
                dirs.setdefault(arm.name, []).append(run_arm(arm, regime, seed, problems, s, regime_dir, log))
        if "grpo" in dirs:
            regime.grpo_step1_all_wrong = first_step_mean(dirs["grpo"], "groups/all_wrong_frac")
        results[name] = {a: read_arm_result(d) for a, d in dirs.items()}
        budgets[name] = {a: measured_budget(d) for a, d in dirs.items()}
        reports[name] = build_report([str(p) for d in dirs.values() for p in d], str(regime_dir),
                                     title=f"regroup study, {name} regime")
    verdicts = judge_all(CLAIMS, results)
    seconds = time.perf_counter() - started
    record = {"seconds": seconds, "quick": quick, "settings": {**asdict(s), "steps": s.steps, "ks": s.ks},
              "regimes": [asdict(r) for r in regimes],
              "planned": {a.name: asdict(plan(a, s)) for a in arms}, "measured": budgets}
    write_atomic(study_dir / "study.json", json.dumps(record, indent=2, default=str))
    html = write_study_page(study_dir, s, arms, regimes, results, verdicts, budgets, seconds,
                            planned={a.name: plan(a, s) for a in arms}, protocols=PROTOCOLS, mechanisms=MECHANISMS)
    return html


def with_changes(s: StudySettings, **changes) -> StudySettings:
    return replace(s, **changes)

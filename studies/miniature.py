"""`python -m studies` (`make study`): the two papers' claims tested in miniature, under their own protocols.

On the built-in task and the warmed-up tiny model, in two regimes:

- **mid**: the demo's warm start (runs/warmup) on the task's usual mix of 1-4-step problems;
- **sparse**: a start where at least half of GRPO's step-0 groups are all wrong. Candidates are tried
  in a fixed order — 3-4-step problems from the warm start, 4-step problems from the warm start, 3-4-step
  problems from an earlier warm-up snapshot — and the first whose measured all-wrong share (G samples of
  `probe_problems` training questions) reaches `sparse_min_all_wrong` is used; the share is reported,
  and a regime that never reaches it is reported as such.

Every arm (DEFAULT_ARMS of ARMS) trains from the regime's start with each seed, is evaluated on the same
held-out problems (pass@1/8/32 from `eval_samples` samples at T = 1, and pass@1/8 from
`paper_eval_samples` samples at each paper's decoding settings), and the claims (CLAIMS, fixed here with
their margins before any run; `plan.json` records them first) are judged by `studies.claims`
(t-tests, Holm within each paper's family of verdicts). Budgets per protocol (PROTOCOLS): GRPO sees `questions` distinct
questions for `epochs` epochs (`steps = questions · epochs / prompts_per_step`); "equal questions" arms
(TA-GRPO as in its paper, grpo_matched) draw the same questions at the same steps and generate (N+1)·G
per question; "equal samples" arms generate as many samples per step as GRPO; "authors' protocol"
(ta_grpo_author) keeps GRPO's rows per step, so P/(N+1) questions per step and (N+1)x the optimizer
steps over the same epochs, as the TA-GRPO authors' scripts do; grpo_author_steps gives GRPO as many
optimizer steps. Every arm stops at its planned step count (`train.epochs` stays 0).

Isolating controls: grpo_drgrpo is GRPO with DaGRPO's Dr. GRPO advantages and constant normaliser
(every DaGRPO claim is judged against it and against plain GRPO); grpo_kl is GRPO with TA-GRPO's beta.

Sizing (`estimate_seconds`, a cost model calibrated on the registered run of 2026-12-03; study.json records
each run's measured seconds): 8 arm runs per seed (mid: grpo_drgrpo, dagrpo_mask; sparse: grpo,
grpo_drgrpo, dagrpo_anchor, dagrpo, grpo_matched, ta_grpo), 14,336 training samples per seed at 18.9 ms and
72,000 evaluation samples at 6.8 ms on one torch thread: ~13 min per seed, 25 registered seeds ~5.4 h of
one core (measured: 318 core-minutes of arm runs, 11-17 min per seed; split it over processes). `--quick`
(2 seeds, tiny budgets): ~3.4 min by the same model, whose fixed part dominates there; measured 3 min 35 s
on an idle machine with an earlier, larger arm set.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from transformers import AutoModelForCausalLM

import regroup
from regroup.data.heldout import heldout_problems
from regroup.errors import ConfigError
from regroup.eval.benchmarks import DECODING
from regroup.eval.runner import evaluate
from regroup.experiments.demo import DemoSettings, evaluate_model
from regroup.io import write_atomic
from regroup.models.load import load_tokenizer
from regroup.report import build_report
from regroup.report.runs import load_run
from regroup.report.summary import last_step, wall_time_s
from regroup.runtime.checkpoint import list_checkpoints
from regroup.runtime.rundir import RunDirLock, claim_run_dir, new_run_dir
from regroup.tasks import get_task
from regroup.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, apply_transforms
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config
from regroup.train.warmup import WarmupConfig, warmup
from studies.claims import ALPHA, T1, ArmResult, Claim, judge_all, per_seed_mean
from studies.page import write_study_page
from studies.stats import paired_t_power, seeds_for_power
from studies.table import START, TABLE, arm_results, counts_of, read_per_problem, read_table, row, write_table

CONFIG_DIR = Path(regroup.__file__).resolve().parent / "configs"  # the package data: the shipped recipes
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
    ("1-4", False): "arithmetic",
    ("1-4", True): "studies.miniature:rename_only_task",
    ("3-4", False): "studies.miniature:steps_3_4_task",
    ("3-4", True): "studies.miniature:steps_3_4_rename_only_task",
    ("4", False): "studies.miniature:steps_4_task",
    ("4", True): "studies.miniature:steps_4_rename_only_task",
}


# ---------------------------------------------------------------------------------------- settings
@dataclass
class StudySettings:
    """What one study runs."""

    seeds: int = 25
    """Registered seeds per arm: the power calculation's (`design_seeds`): the fewest giving every primary
    endpoint POWER at its paper's effect under the pilot spread (PILOT_SD)."""
    split: tuple[int, int] | None = None
    """(first seed, count): this process runs seeds first .. first + count − 1 of the registered ones (a
    study split over processes; `summarize_study` joins their folders). None: all `seeds`."""
    prompts_per_step: int = 8
    """GRPO's questions per step."""
    num_generations: int = 8
    """G."""
    questions: int = 64
    """Distinct training questions of GRPO (and of every equal-questions arm)."""
    epochs: int = 2
    """Passes over the training questions (the TA-GRPO paper's 2 epochs)."""
    data_multiplier: float = 2.5
    """Distinct questions of the grpo_data arm, relative to `questions` (TA-GRPO's "2.5x data" claim)."""
    eval_problems: int = 200
    """Held-out problems per regime, the same for every arm and the start."""
    eval_samples: int = 64
    """Samples per held-out problem at T = 1 of an arm in a pass@k (k > 1) primary endpoint of the regime
    (pass@32 from 64 samples: the unbiased estimator averages over subsets instead of one draw of 32)."""
    pass1_eval_samples: int = 32
    """Samples per held-out problem at T = 1 of the other arms (their endpoints read pass@1)."""
    paper_protocols: tuple[str, ...] = ()
    """Also evaluate at these papers' decoding settings (`regroup.eval.benchmarks.DECODING`)."""
    paper_eval_samples: int = 8
    """Samples per held-out problem at each paper's decoding settings (pass@1, pass@8)."""
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
    """Arms of ARMS to run in every regime (None: each regime's REGIME_ARMS)."""
    diagnostics_per_run: int = 4
    """Mechanism diagnostics (diversity, gradient conflict) this many times per run, evenly over its steps."""
    overrides: list[str] = field(default_factory=list)
    """Extra dotted overrides for every run."""

    @property
    def steps(self) -> int:
        """GRPO's optimizer steps: `questions · epochs / prompts_per_step`, rounded up."""
        return math.ceil(self.questions * self.epochs / self.prompts_per_step)

    @property
    def ks(self) -> list[int]:
        return [k for k in (1, 8, 32) if k <= self.eval_samples]

    @property
    def run_seeds(self) -> list[int]:
        """The seeds this process runs."""
        first, count = self.split or (0, self.seeds)
        return list(range(first, first + count))

    def regime_arms(self, regime: str) -> list[Arm]:
        """The arms this study runs in `regime`."""
        return [ARMS_BY_NAME[n] for n in (self.arms or REGIME_ARMS.get(regime, ()))]

    def arm_eval_samples(self, arm: str, regime: str) -> int:
        """`eval_samples` for an arm in a pass@k (k > 1) primary endpoint of `regime` (or with --arms, where
        every arm gets it), else `pass1_eval_samples`."""
        if self.arms is not None:
            return self.eval_samples
        wide = any(
            c.regime == regime
            and c.measure.startswith("pass@")
            and int(c.measure[5:]) > 1
            and arm in (c.arm, c.against)
            for c in PRIMARIES
        )
        return self.eval_samples if wide else min(self.eval_samples, self.pass1_eval_samples)

    @property
    def paper_ks(self) -> list[int]:
        return [k for k in (1, 8) if k <= self.paper_eval_samples]


QUICK = StudySettings(
    seeds=2,
    prompts_per_step=4,
    num_generations=4,
    questions=8,
    epochs=1,
    eval_problems=8,
    eval_samples=8,
    pass1_eval_samples=4,
    paper_eval_samples=4,
    probe_problems=8,
    early_warmup_steps=60,
    warmup_dir="runs/warmup-quick",
    warmup_steps=120,
    diagnostics_per_run=100,
)


# -------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    name: str
    config: str
    """Recipe file in configs/."""
    protocol: str
    """A key of PROTOCOLS."""
    extra: tuple[str, ...] = ()
    """Overrides that make the arm (on top of the recipe)."""
    rename_only: bool = False
    description: str = ""
    default: bool = True
    """Run by `python -m studies` without --arms (False: defined, its claims listed, run only when named)."""


PROTOCOLS = {  # protocol -> (held equal to GRPO, what differs)
    "reference": ("—", "GRPO: `questions` distinct questions for `epochs` epochs, G samples each"),
    "equal questions": (
        "questions per step, distinct questions, optimizer steps",
        "samples per question: (N+1)·G (TA-GRPO's paper protocol; grpo_matched's control); "
        "dynamic sampling draws extra questions to replace uniform groups",
    ),
    "equal samples": (
        "samples per step, optimizer steps, distinct questions in the pool",
        "questions per step: G·P / (samples per question), fewer for TA-GRPO (the demo's protocol)",
    ),
    "2.5x questions": ("epochs, questions and samples per step", "2.5x the distinct questions, so 2.5x the steps"),
    "authors' protocol": (
        "rows (prompts) and samples per optimizer step, distinct questions, epochs",
        "each question brings N+1 rows, so P/(N+1) questions per step and (N+1)x the optimizer "
        "steps (the TA-GRPO authors' scripts: 256 rows per rollout, 2 epochs)",
    ),
    "equal optimizer steps": (
        "questions and samples per step, distinct questions",
        "(N+1)x GRPO's optimizer steps, so (N+1)x the epochs: as many updates as ta_grpo_author",
    ),
}

DRGRPO = ("grpo.advantage_estimator=dr_grpo", "grpo.loss_agg=seq_sum_constant")  # DaGRPO's advantages and aggregation
TA_BETA = ("grpo.beta=0.001",)  # configs/ta_grpo.yaml's KL weight

ARMS = [
    Arm("grpo", "grpo.yaml", "reference", description="GRPO"),
    Arm(
        "grpo_drgrpo",
        "grpo.yaml",
        "equal samples",
        DRGRPO,
        description="GRPO with DaGRPO's Dr. GRPO advantages and constant normaliser: every DaGRPO arm's control",
    ),
    Arm(
        "grpo_kl",
        "grpo.yaml",
        "equal samples",
        TA_BETA,
        default=False,
        description="GRPO with TA-GRPO's KL weight (beta 0.001)",
    ),
    Arm(
        "grpo_data",
        "grpo.yaml",
        "2.5x questions",
        default=False,
        description="GRPO on 2.5x the distinct questions, same epochs",
    ),
    Arm(
        "grpo_dynamic",
        "grpo.yaml",
        "equal questions",
        ("dynamic_sampling.enabled=true",),
        default=False,
        description="GRPO + DAPO dynamic sampling (uniform groups dropped, batch refilled)",
    ),
    Arm("grpo_matched", "grpo_matched.yaml", "equal questions", description="GRPO with (N+1)·G samples of q0"),
    Arm("ta_grpo", "ta_grpo.yaml", "equal questions", description="TA-GRPO, rule rephrasings (the paper's protocol)"),
    Arm(
        "ta_grpo_author",
        "ta_grpo.yaml",
        "authors' protocol",
        ("ta.ratio_anchor=own",),  # the authors' code: each response's ratio and KL on its own prompt
        default=False,
        description="TA-GRPO as the authors' scripts run it: fixed rows per step, (N+1)x the optimizer steps, "
        "each response's ratio on its own prompt",
    ),
    Arm(
        "grpo_author_steps",
        "grpo.yaml",
        "equal optimizer steps",
        TA_BETA,  # ta_grpo_author's KL weight: the control differs from it in the pooling only
        default=False,
        description="GRPO with ta_grpo_author's optimizer steps and KL weight (is TA's gain more updates?)",
    ),
    Arm(
        "ta_grpo_eqsamples",
        "ta_grpo.yaml",
        "equal samples",
        default=False,
        description="TA-GRPO, as many samples per step as GRPO",
    ),
    Arm(
        "ta_grpo_rename",
        "ta_grpo.yaml",
        "equal questions",
        rename_only=True,
        default=False,
        description="TA-GRPO with renaming only (difficulty-preserving rephrasings)",
    ),
    Arm("dagrpo_mask", "dagrpo_mask_only.yaml", "equal samples", description="DaGRPO masks only (per sample)"),
    Arm(
        "dagrpo_mask_pair",
        "dagrpo_mask_only.yaml",
        "equal samples",
        ("mask.unit=pair",),
        default=False,
        description="DaGRPO masks only, per pair (only the pairwise advantage terms within delta dropped)",
    ),
    Arm("dagrpo_anchor", "dagrpo.yaml", "equal samples", ("mask.enabled=false",), description="DaGRPO anchors only"),
    Arm("dagrpo", "dagrpo.yaml", "equal samples", description="DaGRPO masks + anchors"),
    Arm("dagrpo_ta", "dagrpo_ta.yaml", "equal samples", default=False, description="DaGRPO + TA-GRPO"),
]
ARMS_BY_NAME = {a.name: a for a in ARMS}
DEFAULT_ARMS = tuple(a.name for a in ARMS if a.default)
"""Every arm some regime runs by default (REGIME_ARMS); the others are defined and run when named (--arms)."""

REGIME_ARMS = {
    # only the arms the registered primary endpoints (PRIMARIES) and their isolating controls need
    "mid": ("grpo_drgrpo", "dagrpo_mask"),
    "sparse": ("grpo", "grpo_drgrpo", "dagrpo_anchor", "dagrpo", "grpo_matched", "ta_grpo"),
}


SAMPLED_UNIFORM = "groups/sampled_uniform_frac"
"""Derived: the uniform share of every group sampled — for dynamic sampling 1 − dynamic/informative_frac
(its groups/uniform_frac is measured after its filter dropped the uniform groups), else groups/uniform_frac."""

MATCH_MARGIN = 0.02
"""Non-inferiority margin of the "matches 2.5x data" claim: 2 points of pass@1, fixed before any run."""

# The registered primary endpoints, fixed in code before the run and written into plan.json with their power:
# 3 per paper, each in one regime, two-sided paired t-tests over seeds, Holm within each paper's 3. The
# effects are the papers' (SPEC §6; the +6.86 against matched sampling is AIME24 pass@32), as differences in
# the measure's units. The mid regime's pass@32 is at its ceiling (97.9 % for every 16-step arm in the
# 2026-12-01 run), so no pass@32 endpoint is registered there.
PRIMARIES = [
    Claim(
        "DaGRPO",
        "Masks + anchors beat Dr. GRPO (pass@1, sparse: the paper's hard queries)",
        "dagrpo",
        "grpo_drgrpo",
        "pass@1",
        primary=True,
        regime="sparse",
        effect=0.047,
        effect_source="DaGRPO in-domain math average 48.8 vs GRPO 44.1 (SPEC §6)",
        effect_baseline="GRPO",
    ),
    Claim(
        "DaGRPO",
        "Anchors alone beat Dr. GRPO (pass@1, sparse: they rescue all-wrong groups)",
        "dagrpo_anchor",
        "grpo_drgrpo",
        "pass@1",
        primary=True,
        regime="sparse",
        effect=0.029,
        effect_source="the anchors' share of DaGRPO's gain: 48.8 (masks + anchors) − 45.9 (masks alone), SPEC §6",
        effect_derived=True,
    ),
    Claim(
        "DaGRPO",
        "Masks alone beat Dr. GRPO (pass@1, mid: mixed groups, where masks act)",
        "dagrpo_mask",
        "grpo_drgrpo",
        "pass@1",
        primary=True,
        regime="mid",
        effect=0.018,
        effect_source="DaGRPO masking alone 45.9 vs GRPO 44.1 (SPEC §6)",
    ),
    Claim(
        "TA-GRPO",
        "Higher pass@32 than matched sampling ((N+1)·G of q0, sparse): the gain is the rephrasing",
        "ta_grpo",
        "grpo_matched",
        "pass@32",
        primary=True,
        regime="sparse",
        effect=0.0686,
        effect_source="TA-GRPO vs matched sampling, pass@32 on AIME24: +6.86 (the paper's AIME24 table)",
    ),
    Claim(
        "TA-GRPO",
        "Higher pass@32 than GRPO (equal questions, sparse)",
        "ta_grpo",
        "grpo",
        "pass@32",
        primary=True,
        regime="sparse",
        effect=0.0434,
        effect_source="TA-GRPO average pass@32 over GRPO: +4.34 (Qwen3-4B; +4.97 on 1.7B), SPEC §6",
    ),
    Claim(
        "TA-GRPO",
        "Pooled rephrasings are less often uniform than matched sampling's pools of the same size (sparse)",
        "ta_grpo",
        "grpo_matched",
        "groups/sampled_uniform_frac",
        direction=-1,
        primary=True,
        regime="sparse",
        effect=0.05,
        effect_source="no number in the paper (its mechanism, stated in words): 5 points of the uniform share, "
        "the smallest reduction this study calls meaningful, fixed before the run",
    ),
]

# Pilot standard deviations of the per-seed differences, for the power calculation only: from the 2026-12-01
# run's 95 % CIs (docs/results/study-2026-12-01.md: half-width / t_{0.975, 4} is that run's SE, computed
# as √(var_s/5 + var_p/48) >= sd(Δ_s)/√5, so SE · √5 bounds sd(Δ_s) from above). They come from 48 problems
# × 32 samples; 200 × 64 can only shrink the problem and binomial share, so the seeds they ask for are an
# upper bound. Fixed before this run; the run's own spread is reported beside them, never used to resize it.
PILOT_SD = {
    ("dagrpo", "grpo_drgrpo", "pass@1", "sparse"): 2.05 / 2.7764 * math.sqrt(5) / 100,  # CI [-2.1, +2.0]
    ("dagrpo_anchor", "grpo_drgrpo", "pass@1", "sparse"): 1.8 / 2.7764 * math.sqrt(5) / 100,  # [-1.8, +1.8]
    ("dagrpo_mask", "grpo_drgrpo", "pass@1", "mid"): 2.1 / 2.7764 * math.sqrt(5) / 100,  # [-0.6, +3.6]
    ("ta_grpo", "grpo_matched", "pass@32", "sparse"): 12.3 / 2.7764 * math.sqrt(5) / 100,  # [-15.2, +9.4]
    ("ta_grpo", "grpo", "pass@32", "sparse"): 7.35 / 2.7764 * math.sqrt(5) / 100,  # [-3.6, +11.1]
    ("ta_grpo", "grpo_matched", "groups/sampled_uniform_frac", "sparse"): 0.064 / 2.7764 * math.sqrt(5),
}
POWER = 0.8
"""The power each primary endpoint is sized for, at its paper's effect."""

# Exploratory claims: judged in every regime that ran both arms, raw p and CI, never "supported".
CLAIMS = PRIMARIES + [
    Claim(
        "TA-GRPO",
        "Pooling rephrasings leaves fewer uniform-reward groups than GRPO",
        "ta_grpo",
        "grpo",
        SAMPLED_UNIFORM,
        direction=-1,
    ),
    Claim("TA-GRPO", "Higher pass@32 than GRPO (equal questions)", "ta_grpo", "grpo", "pass@32"),
    Claim("TA-GRPO", "Higher pass@1 than GRPO (equal questions)", "ta_grpo", "grpo", "pass@1"),
    Claim(
        "TA-GRPO", "Higher pass@1 than GRPO with the same KL weight (equal questions)", "ta_grpo", "grpo_kl", "pass@1"
    ),
    Claim(
        "TA-GRPO",
        "Higher pass@32 than matched sampling ((N+1)·G of q0): the gain is the rephrasing",
        "ta_grpo",
        "grpo_matched",
        "pass@32",
    ),
    Claim(
        "TA-GRPO",
        f"Matches GRPO trained on 2.5x the questions (pass@1, non-inferiority margin {100 * MATCH_MARGIN:.0f} points)",
        "ta_grpo",
        "grpo_data",
        "pass@1",
        kind="matches",
        reference="grpo",
        margin=MATCH_MARGIN,
    ),
    Claim("TA-GRPO", "Under the authors' protocol, higher pass@1 than GRPO", "ta_grpo_author", "grpo", "pass@1"),
    Claim(
        "TA-GRPO",
        "Under the authors' protocol, higher pass@1 than GRPO given as many optimizer steps "
        "(the gain is not more updates)",
        "ta_grpo_author",
        "grpo_author_steps",
        "pass@1",
    ),
    Claim(
        "TA-GRPO",
        "Under the authors' protocol, higher pass@32 than GRPO given as many optimizer steps",
        "ta_grpo_author",
        "grpo_author_steps",
        "pass@32",
    ),
    Claim("DaGRPO", "Masks + anchors beat GRPO (pass@1)", "dagrpo", "grpo", "pass@1"),
    Claim("DaGRPO", "Masks + anchors beat Dr. GRPO (pass@1)", "dagrpo", "grpo_drgrpo", "pass@1"),
    Claim("DaGRPO", "Masks alone beat GRPO (pass@1)", "dagrpo_mask", "grpo", "pass@1"),
    Claim("DaGRPO", "Masks alone beat Dr. GRPO (pass@1)", "dagrpo_mask", "grpo_drgrpo", "pass@1"),
    Claim(
        "DaGRPO", "Anchors alone beat GRPO (pass@1): they rescue all-wrong groups", "dagrpo_anchor", "grpo", "pass@1"
    ),
    Claim("DaGRPO", "Anchors alone beat Dr. GRPO (pass@1)", "dagrpo_anchor", "grpo_drgrpo", "pass@1"),
    Claim(
        "DaGRPO",
        "Masked training has less gradient conflict than GRPO (higher pos/neg gradient cosine; the "
        "logged diagnostic is measured on the unmasked batch)",
        "dagrpo_mask",
        "grpo",
        "grad_conflict/cosine",
    ),
    Claim(
        "DaGRPO",
        "Masked training has less gradient conflict than Dr. GRPO",
        "dagrpo_mask",
        "grpo_drgrpo",
        "grad_conflict/cosine",
    ),
    Claim("DaGRPO", "Pair masks beat Dr. GRPO (pass@1)", "dagrpo_mask_pair", "grpo_drgrpo", "pass@1"),
    Claim(
        "study control",
        "Pair masks beat sample masks (pass@1; contradicted = sample masks better)",
        "dagrpo_mask_pair",
        "dagrpo_mask",
        "pass@1",
    ),
    Claim(
        "study control", "Dr. GRPO's advantages and normaliser beat GRPO's (pass@1)", "grpo_drgrpo", "grpo", "pass@1"
    ),
    Claim(
        "study control",
        "TA-GRPO's pools are less often uniform than matched sampling's pools of the same size "
        "(rephrasing, not pool size, removes uniform groups)",
        "ta_grpo",
        "grpo_matched",
        SAMPLED_UNIFORM,
        direction=-1,
    ),
    Claim("study control", "Dynamic sampling beats GRPO (pass@1)", "grpo_dynamic", "grpo", "pass@1"),
    Claim(
        "study control",
        "Dynamic sampling samples fewer uniform-reward groups than GRPO (before its filter)",
        "grpo_dynamic",
        "grpo",
        SAMPLED_UNIFORM,
        direction=-1,
    ),
    Claim("study control", "TA-GRPO at equal samples beats GRPO (pass@1)", "ta_grpo_eqsamples", "grpo", "pass@1"),
    Claim(
        "study control",
        "Difficulty-preserving rephrasings beat rule rephrasings (pass@1)",
        "ta_grpo_rename",
        "ta_grpo",
        "pass@1",
    ),
    Claim("study control", "DaGRPO + TA beats DaGRPO (pass@1)", "dagrpo_ta", "dagrpo", "pass@1"),
]

MECHANISMS = [
    "reward/mean",
    SAMPLED_UNIFORM,
    "groups/uniform_frac",
    "groups/all_wrong_frac",
    "mask/frac",
    "mask/pair_frac",
    "grad_conflict/cosine",
    "anchor/logp_mean",
    "diversity",
]


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


def samples_per_question(arm: Arm, s: StudySettings) -> int:
    pooled = arm.config in ("ta_grpo.yaml", "dagrpo_ta.yaml", "grpo_matched.yaml")
    return s.num_generations * (N_VARIANTS + 1) if pooled else s.num_generations


def plan(arm: Arm, s: StudySettings) -> Budget:
    """The arm's budget under its protocol (mini_batches = 1: one optimizer step per rollout)."""
    g, p, q = s.num_generations, s.prompts_per_step, s.questions
    per_question = samples_per_question(arm, s)
    steps = s.steps
    if arm.protocol in ("equal samples", "authors' protocol") and per_question > g:
        p = max(1, p * g // per_question)  # as many rows (prompts x G samples) per step as GRPO
    if arm.protocol == "authors' protocol":
        steps = math.ceil(q * s.epochs / p)  # every question for the same epochs, P/(N+1) at a time
    if arm.protocol == "equal optimizer steps":
        steps = plan(ARMS_BY_NAME["ta_grpo_author"], s).steps
    if arm.protocol == "2.5x questions":
        q = round(q * s.data_multiplier)
        steps = math.ceil(q * s.epochs / p)
    return Budget(
        prompts_per_step=p,
        steps=steps,
        distinct_questions=q,
        questions_drawn=p * steps,
        samples_per_step=p * per_question,
        samples=p * per_question * steps,
        optimizer_steps=steps,
    )


# The cost model behind the plan's estimate (arithmetic, not a measurement; study.json records the time).
# Calibrated on the registered run of 2026-12-03 (docs/results/study-2026-12-03/: two processes of one torch
# thread each on this 2-core machine): its 200 arm runs' timing.json add up to 6,770 s of training over
# 358,400 planned training samples (18.9 ms each) and 12,306 s of evaluation over 1,800,000 evaluation
# samples (6.8 ms each: 0.36 of a training sample). The model before it (9.7 ms per training sample, an
# evaluation sample at half of one) was fitted on a 2-thread process and said 209 of those 318 core-minutes.
# FIXED_SECONDS: start-up and the regime probes (assumed).
SECONDS_PER_TRAIN_SAMPLE = 6770 / 358_400
EVAL_SAMPLE_COST = (12_306 / 1_800_000) / SECONDS_PER_TRAIN_SAMPLE
FIXED_SECONDS = 180.0
DYNAMIC_EXTRA = 1.5
"""Dynamic sampling's generation relative to its plan (up to max_rounds extra rounds: an assumption)."""


def estimate_seconds(s: StudySettings, arms: Sequence[Arm] | None = None) -> float:
    """Planned wall time (one core) of `python -m studies` with `s` under the cost model above: `arms` in every
    regime, or (None) each regime's `s.regime_arms`. Training samples count 1, evaluation samples
    EVAL_SAMPLE_COST (each evaluation: the problems × (its samples + 1 greedy), + the paper protocols)."""
    total = 0.0
    for regime in s.regimes:
        chosen = list(arms) if arms is not None else s.regime_arms(regime)
        train = sum(
            plan(a, s).samples * (DYNAMIC_EXTRA if "dynamic_sampling.enabled=true" in a.extra else 1.0) for a in chosen
        )
        paper = len(s.paper_protocols) * s.paper_eval_samples
        samples = [s.eval_samples if arms is not None else s.arm_eval_samples(a.name, regime) for a in chosen]
        evals = sum(s.eval_problems * (n + 1 + paper) for n in samples) * s.seeds
        evals += s.eval_problems * (s.eval_samples + 1 + paper)  # the start, once per regime
        total += s.seeds * train + EVAL_SAMPLE_COST * evals
    return FIXED_SECONDS + total * SECONDS_PER_TRAIN_SAMPLE


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
    out = [
        f"recipe={arm.name}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        "train.progress=false",
        f"grpo.prompts_per_step={b.prompts_per_step}",
        f"grpo.num_generations={s.num_generations}",
        f"data.num_train={b.distinct_questions}",
        f"train.steps={b.steps}",
        f"train.checkpoint_every={b.steps}",
        "train.keep_checkpoints=1",
        f"rollout.max_new_tokens={s.max_new_tokens}",
        f"data.task={TASK_NAMES[(regime.step_mix, arm.rename_only)]}",
        f"model.path={regime.warm_dir}",
    ]
    if arm.config == "grpo_matched.yaml":
        out.append(f"grpo.samples_multiplier={N_VARIANTS + 1}")
    every = max(1, b.steps // s.diagnostics_per_run)  # the same share of every arm's training, whatever its length
    out += [f"diagnostics.diversity_every={every}", f"diagnostics.grad_conflict_every={every}"]
    return out + list(arm.extra) + list(s.overrides)


# ---------------------------------------------------------------------------------------- running
def _task_for(step_mix: str):
    return get_task(TASK_NAMES[(step_mix, False)])


def measure_all_wrong(model_dir: str, problems: list, s: StudySettings) -> float:
    """Share of `problems` none of whose G samples (T = 1) is correct: GRPO's all-wrong groups at step 0."""
    from transformers import AutoModelForCausalLM  # heavy (transformers): only when a model is loaded

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    result = evaluate(
        model,
        load_tokenizer(model_dir),
        problems,
        ArithmeticTask.grade,
        n=s.num_generations,
        ks=(1,),
        temperature=1.0,
        max_new_tokens=s.max_new_tokens,
        greedy=False,
        batch_size=256,
        seed=0,
        progress=False,
    )
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
        candidates = [
            ("3-4", warm, "3-4-step problems from the warm start"),
            ("4", warm, "4-step problems from the warm start"),
            ("3-4", early, f"3-4-step problems from the warm-up stopped at SFT step {s.early_warmup_steps}"),
        ]
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


def heldout_for(regime: Regime, s: StudySettings) -> list:
    """The regime's held-out problems: none a training question of any arm."""
    task = _task_for(regime.step_mix)
    biggest = max(plan(a, s).distinct_questions for a in ARMS)
    return heldout_problems(task, s.eval_problems, 999, task.generate(biggest, seed=1234))


def evaluate_start(regime: Regime, problems: list, s: StudySettings, out_dir: Path, log) -> None:
    """The starting model's evaluation on the held-out problems (out_dir/start/eval)."""
    log(f"{regime.name}: evaluating the start on {len(problems)} held-out problems")
    evaluate_model(regime.warm_dir, problems, out_dir / "start" / "eval", _eval_settings(s), seed=0, ks=s.ks)


def _eval_settings(s: StudySettings, samples: int | None = None):
    return DemoSettings(eval_problems=s.eval_problems, eval_samples=samples or s.eval_samples)


def evaluate_at(model_dir: str, problems: list, out_dir: Path, protocol: str, s: StudySettings) -> dict:
    """pass@k at a paper's decoding preset (`regroup.eval.benchmarks.DECODING`), `paper_eval_samples` each;
    writes out_dir/summary.json and per_problem.jsonl as `demo.evaluate_model` does."""

    decoding = DECODING[protocol]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    result = evaluate(
        model,
        load_tokenizer(model_dir),
        problems,
        ArithmeticTask.grade,
        n=s.paper_eval_samples,
        ks=s.paper_ks,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        max_new_tokens=s.max_new_tokens,
        greedy=False,
        batch_size=256,
        seed=0,
        progress=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(
        json.dumps(
            {**result.summary, "protocol": protocol, "temperature": decoding.temperature, "top_p": decoding.top_p}
        )
    )
    with open(out_dir / "per_problem.jsonl", "w") as f:
        for r in result.to_dict()["problems"]:
            f.write(json.dumps(r) + "\n")
    return result.summary


def run_arm(arm: Arm, regime: Regime, seed: int, problems: list, s: StudySettings, regime_dir: Path, log) -> Path:
    run_dir = regime_dir / f"{arm.name}-s{seed}"
    cfg = load_config(CONFIG_DIR / arm.config, arm_overrides(arm, s, regime, seed, run_dir))
    t0 = time.perf_counter()
    with claim_run_dir(run_dir, "fresh", log=log):
        build_trainer(cfg, run_dir, log=log).train()
    train_seconds = time.perf_counter() - t0
    final = list_checkpoints(run_dir)[-1]
    n = s.arm_eval_samples(arm.name, regime.name)
    t1 = time.perf_counter()
    summary = evaluate_model(
        str(final), problems, run_dir / "eval", _eval_settings(s, n), seed=0, ks=[k for k in s.ks if k <= n]
    )
    for name in s.paper_protocols:  # each paper's decoding settings, beside T = 1
        evaluate_at(str(final), problems, run_dir / f"eval_{name}", name, s)
    start = regime_dir / "start" / "eval"
    if start.is_dir():  # the start is evaluated by the process that runs seed 0 only
        (run_dir / "eval_before").mkdir(exist_ok=True)
        for name in ("summary.json", "per_problem.jsonl"):
            write_atomic(run_dir / "eval_before" / name, (start / name).read_bytes())
    eval_seconds = time.perf_counter() - t1
    write_atomic(run_dir / "timing.json", json.dumps({"train_seconds": train_seconds, "eval_seconds": eval_seconds}))
    shutil.rmtree(run_dir / "checkpoints")  # evaluated; the study keeps metrics and evaluations only
    log(
        f"{regime.name} {arm.name} seed {seed}: pass@1 {summary['mean@n']:.3f} "
        f"({train_seconds:.0f} s of training, {eval_seconds:.0f} s of evaluation)"
    )
    return run_dir


def with_sampled_uniform(record: dict) -> dict:
    """The record with SAMPLED_UNIFORM added where it can be derived."""
    informative, uniform = record.get("dynamic/informative_frac"), record.get("groups/uniform_frac")
    if isinstance(informative, (int, float)):
        return {**record, SAMPLED_UNIFORM: 1.0 - float(informative)}
    if isinstance(uniform, (int, float)):
        return {**record, SAMPLED_UNIFORM: float(uniform)}
    return record


def read_counts(path: Path) -> dict[str, tuple[int, int]]:
    """problem id -> (correct, n) from an evaluation's per_problem.jsonl."""
    return counts_of(read_per_problem(path))


def run_row(regime: str, arm: str, run_dir: Path) -> dict:
    """The kept table's row of one finished arm run: its evaluations (T = 1 and each paper's protocol), the
    means of its mechanism metrics, and what it spent (steps, generated tokens, questions drawn, seconds)."""
    run = load_run(str(run_dir))
    evals = {T1: read_per_problem(run_dir / "eval" / "per_problem.jsonl")}
    for other in sorted(run_dir.glob("eval_*/per_problem.jsonl")):
        if other.parent.name != "eval_before":
            evals[other.parent.name[len("eval_") :]] = read_per_problem(other)
    records = [with_sampled_uniform(m) for m in run.metrics]
    mechanisms = {k: v for k in MECHANISMS if (v := per_seed_mean(records, k)) is not None}
    first = next((r for r in run.metrics if r.get("step") == 1), {})
    timing = json.loads((run_dir / "timing.json").read_text()) if (run_dir / "timing.json").is_file() else {}
    return row(
        regime,
        arm,
        int(run.seed),
        evals,
        mechanisms,
        steps=last_step(run) or 0,
        tokens=sum(float(m.get("tokens/generated") or 0.0) for m in run.metrics),
        # dynamic sampling's extra rounds count (groups seen), else the step's questions
        questions_drawn=sum(
            float(m.get("dynamic/groups_seen") or run.config["grpo"]["prompts_per_step"]) for m in run.metrics
        ),
        wall_s=wall_time_s(run) or 0.0,
        step1_all_wrong=first.get("groups/all_wrong_frac"),
        seconds=float(timing.get("train_seconds", 0.0)) + float(timing.get("eval_seconds", 0.0)),
    )


def study_rows(study_dirs: Sequence[Path], regimes: Sequence[Regime], arms_per_regime: Mapping) -> list[dict]:
    """The kept table of a study split over `study_dirs`: every finished run (its eval/per_problem.jsonl
    written) of the registered arms, and each regime's start (arm "start", seed 0)."""
    rows = []
    for regime in regimes:
        starts = [d / regime.name / "start" / "eval" / "per_problem.jsonl" for d in study_dirs]
        start = next((p for p in starts if p.is_file()), None)
        if start is not None:
            rows.append(row(regime.name, START, 0, {T1: read_per_problem(start)}))
        for name in arms_per_regime[regime.name]:
            for d in study_dirs:
                for p in sorted((d / regime.name).glob(f"{name}-s*")):
                    if p.name[len(name) + 2 :].isdigit() and (p / "eval" / "per_problem.jsonl").is_file():
                        rows.append(run_row(regime.name, name, p))
    return rows


def measured_budget(rows: list[dict]) -> dict:
    """Means over seeds of what an arm's runs spent: steps (the most), generated tokens, questions drawn,
    training wall time."""
    extra = [r["extra"] for r in rows]
    return {
        "steps": max(e["steps"] for e in extra),
        "tokens": sum(e["tokens"] for e in extra) / len(extra),
        "questions_drawn": sum(e["questions_drawn"] for e in extra) / len(extra),
        "wall_s": sum(e["wall_s"] for e in extra) / len(extra),
    }


def primary_power(seeds: int) -> list[dict]:
    """Each registered primary endpoint with its effect, test, level, pilot spread and the power `seeds`
    seeds give it (paired t over seeds at Holm's first-step level α/m, m = the paper's primaries: Holm's later
    steps are easier, so this is a lower bound), and the seeds POWER would need."""
    per_paper = {p: sum(c.paper == p for c in PRIMARIES) for p in dict.fromkeys(c.paper for c in PRIMARIES)}
    rows = []
    for c in PRIMARIES:
        sd = PILOT_SD[(c.arm, c.against, c.measure, c.regime)]
        level = ALPHA / per_paper[c.paper]
        rows.append(
            {
                "paper": c.paper,
                "endpoint": c.text,
                "regime": c.regime,
                "measure": c.measure,
                "difference": f"{c.arm} − {c.against}",
                "direction": c.direction,
                "effect": c.effect,
                "effect_source": c.effect_source,
                "test": "two-sided paired t-test over seeds (S − 1 df); exact sign-flip test at a zero SE",
                "level_first_holm_step": level,
                "pilot_sd_per_seed": sd,
                "seeds": seeds,
                "power": round(paired_t_power(c.effect, sd, seeds, level), 4),  # type: ignore[arg-type]
                "seeds_for_power": seeds_for_power(c.effect, sd, level, POWER),  # type: ignore[arg-type]
            }
        )
    return rows


def design_seeds() -> int:
    """The registered seed count: the fewest seeds giving every primary endpoint POWER (`primary_power`)."""
    needed = [r["seeds_for_power"] for r in primary_power(2)]
    assert all(n is not None for n in needed), "a primary endpoint cannot reach its power within 200 seeds"
    return max(needed)


def study_plan(s: StudySettings, arms: Sequence[Arm] | None = None) -> dict:
    """What a study commits to before its first run: the primary endpoints with their effects, tests and
    power, the exploratory claims, the arms per regime, the level, the seeds, the cost estimate."""
    per_regime = {r: [a.name for a in (arms if arms is not None else s.regime_arms(r))] for r in s.regimes}
    ran = {n for names in per_regime.values() for n in names}
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "alpha": ALPHA,
        "correction": "Holm within each paper's registered primary endpoints only (m = that paper's primaries); "
        "exploratory claims: raw p and CI, never 'supported'",
        "seeds": {"registered": s.seeds, "this_process": s.run_seeds},
        "primaries": primary_power(s.seeds),
        "power_target": POWER,
        "arms_per_regime": per_regime,
        "eval_samples": {r: {n: s.arm_eval_samples(n, r) for n in names} for r, names in per_regime.items()},
        "arms": [asdict(ARMS_BY_NAME[n]) for n in sorted(ran)],
        "settings": {**asdict(s), "steps": s.steps, "ks": s.ks},
        "exploratory_claims": [
            {**asdict(c), "runs": c.arm in ran and c.against in ran and (c.reference is None or c.reference in ran)}
            for c in CLAIMS
            if not c.primary
        ],
        "estimated_seconds_one_core": round(estimate_seconds(replace(s, split=None), arms)),
        "estimated_seconds_this_process": round(estimate_seconds(replace(s, seeds=len(s.run_seeds), split=None), arms)),
    }


def run_study(
    quick: bool = False,
    out_root: str = "runs",
    log=print,
    settings: StudySettings | None = None,
    resume: str | Path | None = None,
) -> Path:
    """Run every arm of each regime with this process's seeds (seed outer, so a study stopped early leaves
    complete seeds), then judge the claims over this folder and write study.html and study.md. A study split
    over processes (`StudySettings.split`) is joined with `summarize_study`.

    `resume=STUDY_DIR` continues a stopped study in its own folder, under its own plan.json and regimes.json
    (the settings, seeds and regimes it registered; `quick` and `settings` must be left unset): finished runs
    (`timing.json`, written last) are kept, and a run stopped part-way is moved to
    STUDY_DIR/unfinished/<time>/<regime>/ and run again from its start. A study folder is locked while a
    process runs it, so a resume cannot start beside the process it continues."""
    regimes: list[Regime] | None = None  # a resumed study's; None: chosen when the study starts
    if resume is not None:
        if quick or settings is not None:
            raise ValueError("resume: the study's own plan.json gives its settings; pass neither quick nor settings")
        study_dir = Path(resume)
        s, regimes = resumable_study(study_dir)
        quick = replace(s, split=None) == replace(QUICK, split=None)
    else:
        s = settings or (QUICK if quick else StudySettings())
        unknown = [n for n in (s.arms or ()) if n not in ARMS_BY_NAME]
        if unknown:
            raise ValueError(f"unknown study arm(s) {unknown}; available: {', '.join(ARMS_BY_NAME)}")
        study_dir = new_run_dir(out_root, "study")  # exclusive: two studies started in the same second get two folders
    with RunDirLock(study_dir):  # one process per study folder: a resume beside its original is refused here
        if resume is None:
            # the endpoints, effects, power, margins, level and arms, written before any run: nothing is tuned after
            write_atomic(study_dir / "plan.json", json.dumps(study_plan(s), indent=2, default=str))
        _run_seeds(study_dir, s, regimes, log)
    return summarize_study([study_dir], study_dir, log=log, quick=quick)


def resumable_study(study_dir: Path) -> tuple[StudySettings, list[Regime]]:
    """A stopped study's registered settings and regimes, checked before any model loads: its plan and
    regimes are read back, and every regime's warm start must still be there (relative paths resolve from
    the folder the study was started in)."""
    missing = [n for n in ("plan.json", "regimes.json") if not (study_dir / n).is_file()]
    if missing:
        raise ConfigError(f"--resume {study_dir}: not a started study folder (missing {', '.join(missing)})")
    s = _settings_from_plan(_read_json(study_dir / "plan.json"))
    regimes = read_regimes(study_dir, s)
    gone = [r.warm_dir for r in regimes if not (Path(r.warm_dir) / "warmup_metrics.json").is_file()]
    if gone:
        raise ConfigError(
            f"--resume {study_dir}: the study's warm start {', '.join(sorted(set(gone)))} is not here "
            "(relative paths resolve from the folder the study was started in: run from there)"
        )
    return s, regimes


def _run_seeds(study_dir: Path, s: StudySettings, regimes: list[Regime] | None, log) -> None:
    """The study's runs, seed by seed, skipping those already finished (a resumed study's); progress.json
    after each seed. `regimes`: a resumed study's (None: choose them now and write regimes.json)."""
    resuming = regimes is not None
    previous = json.loads((study_dir / "progress.json").read_text()) if (study_dir / "progress.json").is_file() else {}
    earlier_seconds = float(previous.get("seconds", 0.0))
    resumes = list(previous.get("resumes", []))
    started = time.perf_counter()
    if regimes is None:
        regimes = [choose_regime(name, s, log) for name in s.regimes]
    problems = {r.name: heldout_for(r, s) for r in regimes}
    if 0 in s.run_seeds:  # the start once, not in every process of a split study
        for r in regimes:
            if not (study_dir / r.name / "start" / "eval" / "per_problem.jsonl").is_file():
                evaluate_start(r, problems[r.name], s, study_dir / r.name, log)
    if not resuming:  # a resumed study's regimes.json is its input, never rewritten
        write_atomic(study_dir / "regimes.json", json.dumps([asdict(r) for r in regimes], indent=2, default=str))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    done: list[int] = []
    set_aside: list[str] = []
    kept = 0

    def write_progress(finished: bool) -> None:
        this = {"at": stamp, "kept_runs": kept, "set_aside": set_aside}
        record = {
            "complete_seeds": done,
            "seconds": earlier_seconds + time.perf_counter() - started,
            **({"resumes": resumes + [this]} if resuming else {}),
            **({"finished": True} if finished else {}),
        }
        write_atomic(study_dir / "progress.json", json.dumps(record))

    for seed in s.run_seeds:
        for regime in regimes:
            for arm in s.regime_arms(regime.name):
                run_dir = study_dir / regime.name / f"{arm.name}-s{seed}"
                if (run_dir / "timing.json").is_file():  # written last by run_arm: this run is finished
                    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # in case it stopped while removing them
                    kept += 1
                    continue
                if run_dir.exists():  # stopped part-way: kept aside, never deleted, and run again from its start
                    aside = study_dir / "unfinished" / stamp / regime.name / run_dir.name
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    run_dir.rename(aside)
                    set_aside.append(str(aside.relative_to(study_dir)))
                    log(f"{regime.name} {arm.name} seed {seed}: stopped part-way before; moved to {aside}, run again")
                run_arm(arm, regime, seed, problems[regime.name], s, study_dir / regime.name, log)
        done.append(seed)
        write_progress(finished=False)
        log(f"study: seed {seed} complete ({len(done)} of {len(s.run_seeds)} in this process)")
    if kept:
        log(f"study: {kept} runs finished before the resume were kept, {len(set_aside)} run again")
    write_progress(finished=True)


def _settings_from_plan(plan_json: dict) -> StudySettings:
    """The StudySettings a plan.json registered, every value checked: a hand-edited plan ends in one line
    (ConfigError), never in a traceback or a run outside the study folder."""
    if not isinstance(plan_json, dict) or not isinstance(plan_json.get("settings"), dict):
        raise ConfigError("plan.json: no settings object")
    raw = dict(plan_json["settings"])
    hints = typing.get_type_hints(StudySettings)
    unknown = sorted(set(raw) - set(hints) - {"steps", "ks"})  # steps and ks: derived, written for the reader
    if unknown:
        raise ConfigError(f"plan.json: unknown settings {unknown}")
    values = {}
    for name in (n for n in raw if n in hints):
        try:
            value = TypeAdapter(hints[name]).validate_python(raw[name])
        except ValidationError as e:
            raise ConfigError(f"plan.json: settings.{name}: {e.errors()[0]['msg']} (got {raw[name]!r})") from None
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, (int, float)) and not 0 <= v <= 1e9 for v in numbers):  # nan and 10**401 fail too
            raise ConfigError(f"plan.json: settings.{name} must be finite and in [0, 1e9], got {raw[name]!r}")
        values[name] = value
    s = StudySettings(**values)
    for name, chosen, known in (
        ("regimes", s.regimes, REGIME_ARMS),
        ("arms", s.arms or (), ARMS_BY_NAME),
        ("paper_protocols", s.paper_protocols, DECODING),
    ):
        if any(v not in known for v in chosen):
            raise ConfigError(f"plan.json: settings.{name} {list(chosen)}: each must be one of {sorted(known)}")
    return s


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None


def read_regimes(study_dir: Path, s: StudySettings) -> list[Regime]:
    """regimes.json, checked against the plan: each registered regime once, by name (a name is a folder of the
    study: never a path), with a known step mix."""
    raw = _read_json(study_dir / "regimes.json")
    try:
        regimes = TypeAdapter(list[Regime]).validate_python(raw)
    except ValidationError as e:
        raise ConfigError(f"{study_dir / 'regimes.json'}: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}") from None
    names = [r.name for r in regimes]
    if sorted(names) != sorted(s.regimes):
        raise ConfigError(f"{study_dir / 'regimes.json'}: regimes {names}, but the plan registered {list(s.regimes)}")
    mixes = [r.step_mix for r in regimes if r.step_mix not in ("1-4", "3-4", "4")]
    if mixes:
        raise ConfigError(f"{study_dir / 'regimes.json'}: unknown step mix {mixes} (1-4, 3-4 or 4)")
    return regimes


def _registered(plan_json: dict, s: StudySettings) -> dict[str, list[str]]:
    """regime -> the plan's arms (whatever the code says today)."""
    registered = plan_json.get("arms_per_regime", {})
    return {r: list(registered.get(r) or [a.name for a in s.regime_arms(r)]) for r in s.regimes}


def summarize_study(study_dirs: Sequence[Path], out_dir: Path, log=print, quick: bool = False) -> Path:
    """Join the folders of one study (split over processes) into out_dir/study.html, study.md, study.json and
    the kept table (runs.jsonl, `studies.table`): every finished run counts, paired per claim over the seeds
    both arms finished. The folders must share one plan (settings and arms). A folder that holds a kept table
    (plan.json, regimes.json, runs.jsonl: a results page's records) is summarized from that table alone."""
    study_dirs = [Path(d) for d in study_dirs]
    plans = [_read_json(d / "plan.json") for d in study_dirs]
    s = _settings_from_plan(plans[0])
    for d, other in zip(study_dirs[1:], plans[1:]):
        if replace(_settings_from_plan(other), split=None) != replace(s, split=None):
            raise ValueError(f"{d}: a different study's plan (settings differ from {study_dirs[0]})")
    regimes = read_regimes(study_dirs[0], s)
    kept = [d for d in study_dirs if (d / TABLE).is_file()]
    if kept:
        rows = [r for d in kept for r in read_table(d / TABLE)]
    else:
        rows = study_rows(study_dirs, regimes, _registered(plans[0], s))
    out_dir.mkdir(parents=True, exist_ok=True)
    if not kept:
        write_table(rows, out_dir / TABLE)
        for regime in regimes:  # the per-regime report (training curves) needs the raw run folders
            dirs = [str(p) for d in study_dirs for p in sorted((d / regime.name).glob("*-s*")) if (p / "eval").is_dir()]
            if dirs:
                build_report(dirs, str(out_dir / regime.name), title=f"regroup study, {regime.name} regime")
    return write_summary(rows, s, regimes, out_dir, log=log, quick=quick)


def write_summary(rows: list[dict], s: StudySettings, regimes: list[Regime], out_dir: Path, log=print, quick=False):
    """The page and study.json from the kept table's rows alone."""
    arm_rows = [r for r in rows if r["arm"] != START]
    by_regime = arm_results(arm_rows)
    results: dict[str, dict[str, ArmResult]] = {}
    budgets: dict[str, dict[str, dict]] = {}
    seeds_run: dict[str, dict[str, list[int]]] = {}
    for regime in regimes:
        mine = by_regime.get(regime.name, {})
        names = [a.name for a in ARMS if a.name in mine]  # the study's arm order, not the table's
        results[regime.name] = {n: mine[n] for n in names}
        runs = {
            n: sorted((r for r in arm_rows if r["regime"] == regime.name and r["arm"] == n), key=_seed) for n in names
        }
        budgets[regime.name] = {n: measured_budget(rs) for n, rs in runs.items()}
        seeds_run[regime.name] = {n: [r["seed"] for r in rs] for n, rs in runs.items()}
        first = [
            r["extra"]["step1_all_wrong"] for r in runs.get("grpo", []) if r["extra"].get("step1_all_wrong") is not None
        ]
        if first:
            regime.grpo_step1_all_wrong = sum(first) / len(first)
    verdicts = judge_all(CLAIMS, results)
    seconds = sum(float(r["extra"].get("seconds", 0.0)) for r in arm_rows)
    arms = [a for a in ARMS if any(a.name in results[r.name] for r in regimes)]
    record = {
        "core_seconds_of_arm_runs": seconds,
        "quick": quick,
        "settings": {**asdict(s), "steps": s.steps, "ks": s.ks},
        "regimes": [asdict(r) for r in regimes],
        "seeds_run": seeds_run,
        "planned": {a.name: asdict(plan(a, s)) for a in arms},
        "measured": budgets,
    }
    write_atomic(out_dir / "study.json", json.dumps(record, indent=2, default=str))
    html = write_study_page(
        out_dir,
        s,
        arms,
        regimes,
        results,
        verdicts,
        budgets,
        seconds,
        planned={a.name: plan(a, s) for a in arms},
        protocols=PROTOCOLS,
        mechanisms=MECHANISMS,
        primaries=primary_power(s.seeds),
    )
    log(f"study summary: {html}")
    return html


def _seed(r: dict) -> int:
    return int(r["seed"])

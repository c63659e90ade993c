"""`python -m studies --real2`: the real-model comparisons where RL moves the model (the gate of
`studies.gate` was met: Dr. GRPO at 1e-4 gained +13.3 [+8.5, +18.1] points of validation pass@1 in 150
steps). The design, fixed here and written to plan.json before any arm trains:

1. **The budget is the gate's**: from the SFT start, 150 optimizer steps of 2 questions × G = 8 (16 samples
   a step), Dr. GRPO's loss, lr 1e-4 constant after a 5-step linear warm-up (the gate's better rate), LoRA as
   examples/smollm2_grpo.yaml, 40 new tokens.
2. **Evaluation on unseen chains.** A problem's chain is its start amount and its (operation, operand)
   steps (`meta["start"]`, `meta["ops"]` of the built-in generator; the reference solution is a function of
   it). The evaluation split is `eval_problems` problems generated with `eval_split_seed`, keeping only those
   whose chain occurs nowhere in the training file (validation rows included) and whose question is not a
   training question, × `eval_samples` samples at T = 1. So no evaluation problem has its solution anywhere
   in training (on the 2026-12-02 test set 22 of 64 had). Almost every 1-step chain occurs in training, so the
   split holds few 1-step problems; the registered split's step counts are in the plan.
3. **A different evaluation stream for every run**: the sampler seed of run (arm, seed) is
   `eval_seed(seed, arm)` (CRC-32 of "arm/seed"), and the run's row keeps the start evaluated under that same
   stream ("step0") beside each checkpoint, so the evaluation noise is in the seed-to-seed variance and the
   gain over the start is paired on one stream.
4. **Strata**: the hard stratum (3–4-step problems, where all-wrong groups and so anchors occur) is the
   primaries' measure; all problems are secondary (exploratory).
5. **Arms**: Dr. GRPO; DaGRPO anchors on questions with no correct sample (`anchor_no_correct`); the
   **imitation control** (`sft_imitation`): SFT on exactly the references the same-seed anchor run injected,
   step by step (the same questions, count and order, read from the anchor run's `anchors.jsonl`, which this
   runner records), at the RL arms' lr, schedule and optimizer, for the same 150 steps (a step where the anchor
   run injected none advances the schedule without an update); and the **480-reference SFT** of the
   2026-12-02 study (`sft_480`: 30 steps × 16 references at a constant 3e-4), a labelled control, never a
   verdict on the paper. Anchors + masks is exploratory, run when the budget allows (`--arms`).
6. **Checkpoints**: every arm at `eval_at` (4 checkpoints) plus the start; `sft_480` at `sft480_eval_at`.
   Curves, area-under-the-curve and steps-to-target come from `studies.curves`.
7. **Registered primaries** (one DaGRPO Holm family, m = 3), paired t over seeds as every study here:
   anchors − Dr. GRPO, hard-stratum pass@1 at step 150 (the paper's +2.9); anchors − the imitation control,
   same measure (+2.9: no paper number); anchors − Dr. GRPO, hard-stratum AUC (faster emergence; +2.9 points
   of AUC, a stated smallest effect). The seeds: `power_plan` (80 % power at +2.9, Holm's first step α/3).
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from regroup.data.load import load_problems, save_problems
from regroup.errors import ConfigError
from studies.claims import ALPHA, T1, ArmResult, Claim, judge_all, verdict_label
from studies.curves import auc, curve, per_seed_curves, steps_to_target
from studies.stats import paired_t_power, seeds_for_power
from studies.table import TABLE, counts_of, read_per_problem, read_table, row

REGIME = "real2"
HARD = "hard"
"""The protocol key of the hard stratum (3–4-step problems) at the last checkpoint."""
AUC_HARD = "auc/hard"
"""The per-run AUC of hard-stratum pass@1, held as a mechanism value for the paired test."""
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PILOT_STUDY = RESULTS / "real-study-2026-12-02"
GATE = RESULTS / "gate-2026-12-04"
GATE_SECONDS_PER_RUN = 6622.0
"""The gate's measured wall time of one 150-step run with its two 128 × 4 evaluations (one thread, load 4–16)."""


@dataclass(frozen=True)
class Real2Arm:
    name: str
    kind: str
    """"rl": trained by regroup from `example` with `extra`; "imitation": SFT on the same-seed anchor run's
    injected references; "sft": SFT on shuffled references (`sft_480`)."""
    example: str = "smollm2_grpo.yaml"
    extra: tuple[str, ...] = ()
    description: str = ""


DRGRPO = ("grpo.advantage_estimator=dr_grpo", "grpo.loss_agg=seq_sum_constant", "grpo.beta=0.0")
REAL2_ARMS = [
    Real2Arm("drgrpo", "rl", "smollm2_grpo.yaml", DRGRPO, "Dr. GRPO, the gate's pilot arm"),
    Real2Arm(
        "anchor_no_correct",
        "rl",
        "smollm2_dagrpo.yaml",
        ("mask.enabled=false", "anchors.when=no_correct"),
        "Dr. GRPO + a verified reference anchor on each question with no correct sample",
    ),
    Real2Arm(
        "sft_imitation",
        "imitation",
        description="SFT on exactly the references the same-seed anchor run injected, step by step, at the RL "
        "arms' lr, schedule and optimizer (the imitation control)",
    ),
    Real2Arm("sft_480", "sft", description="the 2026-12-02 control: 30 steps x 16 references at 3e-4 (labelled)"),
    Real2Arm(
        "anchor_mask",
        "rl",
        "smollm2_dagrpo.yaml",
        ("anchors.when=no_correct",),
        "anchors (no_correct) + reference-similarity masks: exploratory, when the budget allows",
    ),
]
REAL2_ARMS_BY_NAME = {a.name: a for a in REAL2_ARMS}
DEFAULT_ARMS = ("drgrpo", "anchor_no_correct", "sft_imitation", "sft_480")

_EFFECT = 0.029
PRIMARIES = [
    Claim(
        "DaGRPO",
        "Anchors on hard queries beat Dr. GRPO (hard-stratum pass@1 at the last step)",
        "anchor_no_correct",
        "drgrpo",
        "pass@1",
        protocol=HARD,
        primary=True,
        regime=REGIME,
        effect=_EFFECT,
        effect_source="the anchors' share of DaGRPO's gain, 48.8 − 45.9 (SPEC §6)",
        effect_derived=True,
    ),
    Claim(
        "DaGRPO",
        "Anchors beat SFT on the same injected references at the same lr and schedule (hard-stratum pass@1)",
        "anchor_no_correct",
        "sft_imitation",
        "pass@1",
        protocol=HARD,
        primary=True,
        regime=REGIME,
        effect=_EFFECT,
        effect_source="no number in the paper for this control: the anchors' 2.9 points, fixed before the run",
    ),
    Claim(
        "DaGRPO",
        "Anchors make hard-stratum pass@1 emerge faster than Dr. GRPO (area under the curve)",
        "anchor_no_correct",
        "drgrpo",
        AUC_HARD,
        primary=True,
        regime=REGIME,
        effect=_EFFECT,
        effect_source="no AUC in the paper (it claims faster emergence): 2.9 points of AUC, a stated smallest effect",
    ),
]
EXPLORATORY = [
    Claim("DaGRPO", "Anchors beat Dr. GRPO (all problems, pass@1)", "anchor_no_correct", "drgrpo", "pass@1"),
    Claim(
        "DaGRPO",
        "Anchors + masks beat anchors alone (hard-stratum pass@1)",
        "anchor_mask",
        "anchor_no_correct",
        "pass@1",
        protocol=HARD,
    ),  # fmt: skip
    Claim(
        "study control",
        "Anchors beat the 480-reference SFT (hard-stratum pass@1)",
        "anchor_no_correct",
        "sft_480",
        "pass@1",
        protocol=HARD,
    ),  # fmt: skip
    Claim(
        "study control",
        "Dr. GRPO beats the imitation control (hard-stratum pass@1)",
        "drgrpo",
        "sft_imitation",
        "pass@1",
        protocol=HARD,
    ),  # fmt: skip
]


@dataclass(frozen=True)
class Real2Settings:
    """What the real-model v2 study runs (fixed before any arm; `real2_plan` writes it)."""

    model_dir: str = "models/smollm2"
    train_file: str = "data/arithmetic_boxed.jsonl"
    """`regroup data prepare arithmetic_boxed --out data/arithmetic_boxed.jsonl --limit 2000` (the gate's)."""
    val_problems: int = 128
    """The training file's last rows: never trained on; the start's truncation probe (as the gate's)."""
    steps: int = 150
    prompts_per_step: int = 2
    num_generations: int = 8
    warmup_steps: int = 5
    lr: float = 1e-4
    """The gate's better rate."""
    length: int = 40
    eval_at: tuple[int, ...] = (25, 50, 100, 150)
    eval_problems: int = 256
    eval_samples: int = 4
    eval_split_seed: int = 2027
    """The generator seed of the unseen-chain split's candidates (training: 1234; the old test set: 999)."""
    hard_steps: tuple[int, ...] = (3, 4)
    sft480_steps: int = 30
    sft480_batch: int = 16
    sft480_lr: float = 3e-4
    sft480_eval_at: tuple[int, ...] = (5, 10, 20, 30)
    registered_seeds: int = 11
    """From `power_plan` (80 % power at +2.9 on the hard stratum, α/3): tests check the two agree."""
    seeds: int = 11
    first_seed: int = 0
    arms: tuple[str, ...] = DEFAULT_ARMS
    start_dir: str | None = None
    """The stored SFT start (None: `<out>/gate-start`, the gate's)."""
    wait_seconds: float = 6 * 3600
    overrides: tuple[str, ...] = ()


QUICK = Real2Settings(
    steps=4, eval_at=(2, 4), eval_problems=8, eval_samples=2, val_problems=4, sft480_steps=2, sft480_batch=2,
    sft480_eval_at=(1, 2), registered_seeds=1, seeds=1, length=8, num_generations=2,
)  # fmt: skip
"""A few-minute plumbing version on a tiny model (not evidence)."""


# ------------------------------------------------------------------------------------------ the split
def chain_of(problem) -> tuple:
    """(start, ((op, operand), ...)) of a built-in problem, from its meta, else parsed from its reference
    solution ("7+5=12. 12-3=9. ...")."""
    meta = problem.meta or {}
    if "start" in meta and "ops" in meta:
        return int(meta["start"]), tuple((str(op), int(x)) for op, x in meta["ops"])
    import re

    steps = re.findall(r"(\d+)([+-])(\d+)=(\d+)", problem.solution or "")
    if not steps:
        raise ValueError(f"{problem.id}: no chain in its meta or its reference solution")
    return int(steps[0][0]), tuple((op, int(x)) for _, op, x, _ in steps)


def steps_of(problem) -> int:
    return len(chain_of(problem)[1])


def unseen_chain_split(training: Sequence, n: int, seed: int, task=None) -> list:
    """`n` problems generated with `seed` whose chain occurs in no training problem and whose question is not a
    training question (in generation order)."""
    from regroup.tasks import get_task

    task = task or get_task("arithmetic")
    chains = {chain_of(p) for p in training}
    questions = {p.question for p in training}
    out: list = []
    drawn = 0
    while len(out) < n:
        batch = task.generate(drawn + 4 * n, seed=seed)[drawn:]
        drawn += len(batch)
        out += [p for p in batch if chain_of(p) not in chains and p.question not in questions][: n - len(out)]
        if drawn > 200 * n:
            raise ValueError(f"unseen_chain_split: fewer than {n} unseen chains in {drawn} draws")
    return out


def hard_ids(problems: Sequence, hard_steps: Sequence[int]) -> list[str]:
    return [p.id for p in problems if steps_of(p) in hard_steps]


def eval_seed(seed: int, arm: str) -> int:
    """The evaluation sampler seed of run (arm, seed): CRC-32 of "arm/seed" (registered; distinct per run)."""
    return zlib.crc32(f"{arm}/{seed}".encode())


# ------------------------------------------------------------------------------------------ power
def pilot_sd(hard_steps: Sequence[int] = (3, 4)) -> dict:
    """The sd the seeds are powered with. One pilot seed gives no seed-to-seed sd, so: the 2026-12-02 study's
    per-seed sd of anchors − Dr. GRPO on its hard stratum (the same measure; its 64 test problems regenerated
    for their step counts), combined with the binomial evaluation noise two independent evaluation streams add
    (that study evaluated every run with sampler seed 0): 2 · mean p(1 − p)·n/(n − 1) / (n · P_hard), with
    the per-problem rates of the gate's step-150 checkpoint of 1e-4 on its hard validation problems, n = 4
    and P_hard the registered split's hard count."""
    from regroup.data.prepare import arithmetic_boxed, arithmetic_heldout

    rows = read_table(PILOT_STUDY / TABLE)
    held = arithmetic_heldout(64)
    hard = {p.id for p in held if steps_of(p) in hard_steps}
    by = {(r["arm"], r["seed"]): r for r in rows}

    def p1(r, ids):
        values = [c / n for i, (c, n) in counts_of(r["evals"][T1]).items() if i in ids]
        return sum(values) / len(values)

    seeds = sorted(s for a, s in by if a == "anchor_no_correct" and ("drgrpo", s) in by)
    diffs = [p1(by[("anchor_no_correct", s)], hard) - p1(by[("drgrpo", s)], hard) for s in seeds]
    mean = sum(diffs) / len(diffs)
    sd_seed = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    gate = {r["arm"]: r for r in read_table(GATE / TABLE)}
    training = {p.id: p for p in arithmetic_boxed(2000)}
    counts = counts_of(gate["drgrpo_lr0.0001"]["evals"]["step150"])
    rates = [(c / n) * (1 - c / n) * n / (n - 1) for i, (c, n) in counts.items() if steps_of(training[i]) in hard_steps]
    return {
        "sd_seed_2026_12_02": sd_seed,
        "sd_seed_source": f"anchor_no_correct − drgrpo, hard-stratum pass@1, per seed ({len(hard)} of 64 problems, "
        f"seeds {seeds}): " + ", ".join(f"{100 * d:+.2f}" for d in diffs),
        "bernoulli_var_per_sample": sum(rates) / len(rates),
        "bernoulli_source": f"the gate's 1e-4 run at step 150, its {len(rates)} hard validation problems x 4 samples",
    }


def power_plan(s: Real2Settings, hard_count: int | None = None) -> dict:
    """Seeds for 80 % power at +2.9 points (paired t over seeds, Holm's first step α/m, m = 3 primaries) with
    the sd of `pilot_sd` plus two streams' evaluation noise on the hard stratum; and the power the registered
    seeds give each primary, at that sd and at 1.5x and 2x it (this start's spread at 150 steps is unknown)."""
    m = len(PRIMARIES)
    level = ALPHA / m
    sd = pilot_sd(s.hard_steps)
    if hard_count is None:
        hard_count = len(hard_ids(_split(s), s.hard_steps))
    eval_var = 2 * sd["bernoulli_var_per_sample"] / (s.eval_samples * hard_count)
    total = math.sqrt(sd["sd_seed_2026_12_02"] ** 2 + eval_var)
    need = seeds_for_power(_EFFECT, total, level)
    return {
        "level_first_holm_step": level,
        "effect": _EFFECT,
        "hard_problems": hard_count,
        **sd,
        "sd_evaluation_two_streams": math.sqrt(eval_var),
        "sd_used": total,
        "seeds_for_80_percent": need,
        "seeds_for_80_percent_at_sd_seed_only": seeds_for_power(_EFFECT, sd["sd_seed_2026_12_02"], level),
        "registered_seeds": s.registered_seeds,
        "power_at_registered_seeds": {
            f"{k}x sd": paired_t_power(_EFFECT, k * total, s.registered_seeds, level) for k in (1.0, 1.5, 2.0)
        },
        "auc_note": "AUC endpoint powered with the same sd (an average over checkpoints; no AUC has been measured "
        "on this model)",
    }


# ------------------------------------------------------------------------------------------ cost
def cost_plan(s: Real2Settings, seconds_per_run: float = GATE_SECONDS_PER_RUN, gate_steps: int = 150) -> dict:
    """Core-hours from the gate's measured 6,622 s per 150-step run (2,400 training samples and 2 × 512
    evaluation samples): seconds per sample = 6622 / 3424, counting an evaluation sample as a training sample
    (the 2026-12-01 runs: 5.7 s a step of 16 on a free core and 6–8 min with a 512-sample evaluation, so about
    the same) and an SFT sequence as one (an upper bound: no generation). Also at the gate's lightest load
    (13.5 s a step)."""
    gate_samples = gate_steps * 16 + 2 * 128 * 4
    per_sample = seconds_per_run / gate_samples
    eval_samples = s.eval_problems * s.eval_samples
    per_arm = {}
    for name in s.arms:
        arm = REAL2_ARMS_BY_NAME[name]
        checkpoints = len(s.sft480_eval_at if arm.kind == "sft" else s.eval_at) + 1  # + the start on its stream
        if arm.kind == "rl":
            train = s.steps * s.prompts_per_step * s.num_generations
        elif arm.kind == "imitation":
            train = s.steps * s.prompts_per_step  # at most one anchor per question
        else:
            train = s.sft480_steps * s.sft480_batch
        per_arm[name] = (train + checkpoints * eval_samples) * per_sample
    per_seed = sum(per_arm.values())
    light = 13.5 / 16
    return {
        "seconds_per_sample": per_sample,
        "per_run_hours": {k: v / 3600 for k, v in per_arm.items()},
        "per_seed_core_hours": per_seed / 3600,
        "design_core_hours": per_seed * s.registered_seeds / 3600,
        "design_core_hours_at_light_load": per_seed * s.registered_seeds / 3600 * light / per_sample,
        "this_process_core_hours": per_seed * s.seeds / 3600,
        "start": "the gate's SFT start is reused (none to make)",
    }


# ------------------------------------------------------------------------------------------ plan
def _split(s: Real2Settings) -> list:
    """The registered split from the training problems `prepare arithmetic_boxed --limit 2000` writes (the same
    rows as the training file, generated, so that the plan needs no file)."""
    from regroup.data.prepare import arithmetic_boxed

    return unseen_chain_split(arithmetic_boxed(2000), s.eval_problems, s.eval_split_seed)


def claims() -> list[Claim]:
    return PRIMARIES + EXPLORATORY


def real2_plan(s: Real2Settings) -> dict:
    split = _split(s)
    hard = hard_ids(split, s.hard_steps)
    power = power_plan(s, len(hard))
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "the real-model comparisons where RL moves the model (the gate was met); studies/real2.py",
        "settings": asdict(s),
        "arms": [asdict(REAL2_ARMS_BY_NAME[a]) for a in s.arms],
        "run_overrides": {a: list(run_overrides(REAL2_ARMS_BY_NAME[a], s)) for a in s.arms if _is_rl(a)},
        "evaluation": {
            "split": f"{s.eval_problems} problems generated with seed {s.eval_split_seed} whose chain (start, "
            "operations) occurs in no row of the training file and whose question is no training question",
            "step_counts": dict(sorted(Counter(f"{steps_of(p)} steps" for p in split).items())),
            "hard_stratum": f"{len(hard)} problems of {'–'.join(map(str, s.hard_steps))} steps: the primaries",
            "samples": f"{s.eval_samples} per problem at T = 1, {s.length} new tokens",
            "checkpoints": {"rl and imitation": [0, *s.eval_at], "sft_480": [0, *s.sft480_eval_at]},
            "sampler_seed": "eval_seed(seed, arm) = CRC-32 of 'arm/seed'; the start (step 0) is evaluated under "
            "each run's own stream",
        },
        "primaries": [asdict(c) for c in PRIMARIES],
        "exploratory": [asdict(c) for c in EXPLORATORY],
        "curves": {
            "auc": "trapezoid over step 0 (the start on the run's stream) and every checkpoint, divided by the last "
            "step (studies.curves.auc)",
            "steps_to_target": "exploratory: the first checkpoint at which hard-stratum pass@1 reaches the run's "
            "own step-0 value + 5 points (None: never)",
        },
        "test": "two-sided paired t-test over seeds (S − 1 df), sign-flip at a zero SE; Holm over the 3 DaGRPO "
        "primaries",
        "power": power,
        "seeds": {
            "registered": s.registered_seeds,
            "this_process": list(range(s.first_seed, s.first_seed + s.seeds)),
        },
        "cost": cost_plan(s),
        "not_here": "TA-GRPO vs matched sampling (about 9 seeds for 80 % at +6.9) is decided in the miniature "
        "study; on this model only if time remains",
    }


def _is_rl(name: str) -> bool:
    return REAL2_ARMS_BY_NAME[name].kind == "rl"


def run_overrides(arm: Real2Arm, s: Real2Settings) -> tuple[str, ...]:
    """What every RL arm of v2 sets on top of `studies.real.real_arm_overrides` (the gate's pilot budget)."""
    every = math.gcd(*s.eval_at)
    return (
        *arm.extra,
        f"grpo.prompts_per_step={s.prompts_per_step}",
        f"grpo.num_generations={s.num_generations}",
        f"optim.warmup_steps={s.warmup_steps}",
        "optim.schedule=constant",
        f"train.checkpoint_every={every}",
        f"train.keep_checkpoints={s.steps // every}",
        *s.overrides,
    )


# ------------------------------------------------------------------------------------------ running
def _real(s: Real2Settings):
    from studies.real import RealSettings

    return RealSettings(
        model_dir=s.model_dir,
        train_file=s.train_file,
        steps=s.steps,
        length=s.length,
        eval_problems=s.eval_problems,
        eval_samples=s.eval_samples,
        val_problems=s.val_problems,
        val_samples=4,
        seeds=1,
    )


def record_anchors(trainer, path: Path) -> None:
    """Append, per call of the run's anchor injector (one a step), the ids of the questions it anchored to
    `path` (JSON lines {"step", "ids"}): what the imitation control trains on."""
    stage = next((st for st in trainer.recipe.stages if getattr(st, "name", "") == "anchors"), None)
    if stage is None:
        raise ConfigError("record_anchors: the run has no anchors stage")
    injector, inject = stage.injector, stage.injector.inject
    calls = [0]

    def recorded(samples, *args, **kwargs):
        before = {id(x) for x in samples}
        out, metrics = inject(samples, *args, **kwargs)
        calls[0] += 1
        ids = [x.question_id for x in out if x.is_anchor and id(x) not in before]
        with open(path, "a") as f:
            f.write(json.dumps({"step": calls[0], "ids": ids}) + "\n")
        return out, metrics

    injector.inject = recorded


def injected_references(anchor_run: Path, steps: int) -> list[list[str]]:
    """Per step (1..steps), the question ids the anchor run anchored, from its anchors.jsonl. Under
    `anchors.when=no_correct` the set depends on the run's own samples, so there is no set to rebuild
    without the record: a missing record is an error."""
    path = anchor_run / "anchors.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path}: the imitation control needs the same-seed anchor run's record (run it first)")
    per_step: list[list[str]] = [[] for _ in range(steps)]
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if 1 <= r["step"] <= steps:
            per_step[r["step"] - 1] = list(r["ids"])
    return per_step


def sft_schedule(
    cfg,
    per_step: list[list],
    lr_at: Callable[[int], float],
    save_at: Sequence[int],
    out_dir: Path,
    seed: int,
    log=print,
) -> dict[int, str]:
    """LoRA SFT of `cfg.model.path` with `cfg.optim`'s AdamW: at step t (1-based) one update on the reference
    solutions of `per_step[t - 1]` (none: no update) at lr `lr_at(t)`; the merged model is saved at each step
    of `save_at` (returned: step -> folder)."""
    import torch

    from regroup.models.load import load_policy, load_tokenizer
    from regroup.models.prompting import build_prompter, encode_response
    from regroup.train.recipes import features
    from regroup.train.warmup import sft_batches

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(cfg.model.path)
    prompter = build_prompter(cfg.data, tokenizer, builtin_model=False)
    model = load_policy(cfg.model.path, cfg.model, lora=features(cfg).lora)
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lr_at(1),
        betas=(o.beta1, o.beta2),
        weight_decay=o.weight_decay,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rng = random.Random(seed)
    saved, losses = {}, []
    model.train()
    for step, problems in enumerate(per_step, 1):
        examples = [(prompter.encode(p.question), encode_response(tokenizer, p.solution)) for p in problems]
        if examples:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            ids, labels, attention = next(sft_batches(examples, len(examples), pad, rng))  # [B, L] each
            loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        if step in save_at:
            merged = copy.deepcopy(model)
            merged = merged.merge_and_unload() if features(cfg).lora else merged
            folder = out_dir / f"checkpoint-{step}"
            merged.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            saved[step] = str(folder)
    (out_dir / "sft_metrics.json").write_text(json.dumps({"updates": len(losses), "losses": losses}))
    log(f"SFT: {len(losses)} updates over {len(per_step)} steps")
    return saved


def _evaluate(model: str, s: Real2Settings, eval_file: str, out: Path, prompt: str, seed: int) -> dict:
    from studies.real import evaluate_real

    return evaluate_real(model, _real(s), eval_file, out, prompt, s.eval_samples, seed=seed)


def run_real2(s: Real2Settings, out_root: str = "runs", log=print) -> Path:
    """This process's seeds of the v2 design: per seed, every arm of `s.arms` in order (the anchor run before
    the imitation control), each with the start and its checkpoints evaluated on its own stream."""
    from regroup.runtime.checkpoint import list_checkpoints
    from regroup.runtime.rundir import claim_run_dir, new_run_dir
    from regroup.train.build import build_trainer
    from regroup.train.schedule import lr_lambda
    from studies.real import EXAMPLES_DIR, RealArm, _wait_for, make_start, real_arm_config, split_train_val

    for path in (s.model_dir, s.train_file):
        if not Path(path).exists():
            raise ConfigError(f"the v2 study needs {path} (see studies/README.md, the real-model study)")
    if "sft_imitation" in s.arms and "anchor_no_correct" not in s.arms:
        raise ConfigError("--arms: sft_imitation trains on anchor_no_correct's injected references: run both")
    study_dir = new_run_dir(out_root, "real2")
    (study_dir / "plan.json").write_text(json.dumps(real2_plan(s), indent=2, default=str))
    real = _real(s)
    train_file, val_file = split_train_val(real, study_dir / "data")
    split = unseen_chain_split(list(load_problems(s.train_file).problems), s.eval_problems, s.eval_split_seed)
    eval_file = study_dir / "data" / "unseen.jsonl"
    save_problems(split, eval_file)
    start_dir = Path(s.start_dir) if s.start_dir else Path(out_root) / "gate-start"
    if s.first_seed == 0:
        start = make_start(real, start_dir, train_file, val_file, log)
    else:
        _wait_for(start_dir / "sft_start.json", real, "the SFT start", log)
        start = str(start_dir / "model")
    prompt = str(EXAMPLES_DIR / "smollm2_grpo.yaml")
    by_id = {p.id: p for p in load_problems(train_file).problems}
    for seed in range(s.first_seed, s.first_seed + s.seeds):
        for name in s.arms:
            arm = REAL2_ARMS_BY_NAME[name]
            run_dir = study_dir / f"{name}-s{seed}"
            stream = eval_seed(seed, name)
            t0 = time.perf_counter()
            _evaluate(start, s, str(eval_file), run_dir / "eval_step0", prompt, stream)
            if arm.kind == "rl":
                cfg = real_arm_config(
                    RealArm(name, arm.example, run_overrides(arm, s)), real, seed, run_dir, start, train_file, s.lr
                )
                with claim_run_dir(run_dir, "fresh", log=log):
                    trainer = build_trainer(cfg, run_dir, log=log)
                    if cfg.anchors.enabled:
                        record_anchors(trainer, run_dir / "anchors.jsonl")
                    trainer.train()
                checkpoints = {int(c.name.rpartition("-")[2]): str(c) for c in list_checkpoints(run_dir)}
                config = str(run_dir / "config.yaml")
            else:
                # the RL arms' config (optimizer, schedule, LoRA, prompting) for the SFT arms
                base = RealArm(name, "smollm2_grpo.yaml", run_overrides(REAL2_ARMS_BY_NAME["drgrpo"], s))
                cfg = real_arm_config(base, real, seed, run_dir / "cfg", start, train_file, s.lr)
                if arm.kind == "imitation":
                    ids = injected_references(study_dir / f"anchor_no_correct-s{seed}", s.steps)
                    per_step = [[by_id[i] for i in step] for step in ids]
                    schedule = lr_lambda(cfg.optim.warmup_steps, s.steps, cfg.optim.schedule, cfg.optim.min_lr_ratio)
                    checkpoints = sft_schedule(
                        cfg, per_step, lambda t, f=schedule: s.lr * f(t - 1), s.eval_at, run_dir, seed, log
                    )
                else:
                    pool = [p for p in by_id.values() if p.solution]
                    rng = random.Random(seed)
                    per_step = [rng.sample(pool, s.sft480_batch) for _ in range(s.sft480_steps)]
                    checkpoints = sft_schedule(
                        cfg, per_step, lambda t: s.sft480_lr, s.sft480_eval_at, run_dir, seed, log
                    )
                config = prompt
            for step in s.sft480_eval_at if arm.kind == "sft" else s.eval_at:
                summary = _evaluate(checkpoints[step], s, str(eval_file), run_dir / f"eval_step{step}", config, stream)
                log(f"real2 {name} seed {seed} step {step}: pass@1 {summary['pass@1']}")
            (run_dir / "timing.json").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    return study_dir


# ------------------------------------------------------------------------------------------ summary
def real2_rows(study_dirs: Sequence[Path]) -> list[dict]:
    """The kept table: one row per finished run, its start (step0) and every checkpoint's per-problem counts on
    its own stream, its eval seed and (anchor runs) the references injected."""
    rows = []
    for d in study_dirs:
        for run_dir in sorted(Path(d).glob("*-s*")):
            if not (run_dir / "timing.json").is_file():
                continue
            name, _, seed = run_dir.name.rpartition("-s")
            evals = {
                f"step{int(f.parent.parent.name[len('eval_step') :])}": read_per_problem(f)
                for f in sorted(run_dir.glob("eval_step*/*/per_problem.jsonl"))
            }
            anchors = run_dir / "anchors.jsonl"
            injected = (
                sum(len(json.loads(x)["ids"]) for x in anchors.read_text().splitlines()) if anchors.is_file() else None
            )
            rows.append(row(REGIME, name, int(seed), evals, eval_seed=eval_seed(int(seed), name), injected=injected))
    return rows


def real2_results(rows: Sequence[dict], hard: set[str], last: str) -> dict[str, ArmResult]:
    """arm -> ArmResult: T1 = all problems at `last` (the arm's last checkpoint key), HARD = the hard stratum
    there, and the per-run AUC of hard-stratum pass@1 as mechanism AUC_HARD."""
    out: dict[str, ArmResult] = {}
    for r in rows:
        keys = sorted(r["evals"], key=lambda k: int(k[len("step") :]))
        final = last if last in r["evals"] else keys[-1]
        counts = counts_of(r["evals"][final])
        a = out.setdefault(r["arm"], ArmResult())
        seed = int(r["seed"])
        a.per_problem[seed] = counts
        a.protocols.setdefault(HARD, {})[seed] = {i: v for i, v in counts.items() if i in hard}
        c = per_seed_curves([r], r["arm"], keys, hard)[seed]
        a.mechanisms[seed] = {AUC_HARD: auc(c, max(c))}
    return out


def summarize_real2(rows: Sequence[dict], hard: set[str], s: Real2Settings = Real2Settings()) -> str:
    """Markdown: each arm's hard-stratum curve (mean and 95 % band over seeds), steps-to-target, and the
    primaries (Holm) with the exploratory claims."""
    last = f"step{max(s.eval_at)}"
    lines = [
        "| arm | seeds | hard pass@1 by step (mean [95 % band]) | median steps to start + 5 pts |",
        "|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["arm"] for r in rows):
        keys = sorted({k for r in rows if r["arm"] == name for k in r["evals"]}, key=lambda k: int(k[4:]))
        points = curve(rows, name, keys, hard)
        cells = "; ".join(
            f"{st}: {100 * m:.1f}" + ("" if lo is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]")  # type: ignore[operator]
            for st, m, lo, hi in points
        )
        reach = []
        for one in per_seed_curves(rows, name, keys, hard).values():
            reach.append(steps_to_target(one, one.get(0, 0.0) + 0.05))
        reached = sorted(x for x in reach if x is not None)
        median = "never (most seeds)" if len(reached) * 2 < len(reach) else str(reached[(len(reach) - 1) // 2])
        lines.append(f"| {name} | {len(reach)} | {cells} | {median} |")
    verdicts = judge_all(claims(), {REGIME: real2_results(rows, hard, last)})
    lines += [
        "",
        "| paper | claim | registered | Δ | seeds | p | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        c = v.comparison
        delta = "—" if c is None or c.delta is None else f"{100 * c.delta:+.1f}"
        if v.ci is not None:
            delta += f" [{100 * v.ci[0]:+.1f}, {100 * v.ci[1]:+.1f}]"
        p = "—" if v.p is None else f"{v.p:.4f}"
        padj = "—" if v.p_adjusted is None else f"{v.p_adjusted:.4f}"
        kind = "primary" if v.claim.primary else "exploratory"
        lines.append(
            f"| {v.claim.paper} | {v.claim.text} | {kind} | {delta} | {c.seeds if c else 0} | {p} | {padj} | "
            f"{verdict_label(v)} |"
        )
    return "\n".join(lines)


def keep_real2(study_dirs: Sequence[Path], dest: Path) -> Path:
    """dest/plan.json (the first folder's) and dest/runs.jsonl (every folder's rows)."""
    import shutil

    from studies.table import write_table

    dest.mkdir(parents=True, exist_ok=True)
    plans = [Path(d) / "plan.json" for d in study_dirs if (Path(d) / "plan.json").is_file()]
    if plans and plans[0].resolve() != (dest / "plan.json").resolve():
        shutil.copyfile(plans[0], dest / "plan.json")
    return write_table(table_rows(study_dirs), dest / TABLE)


def table_rows(study_dirs: Sequence[Path]) -> list[dict]:
    kept = [d for d in study_dirs if (d / TABLE).is_file()]
    return [r for d in kept for r in read_table(d / TABLE)] + real2_rows([d for d in study_dirs if d not in kept])

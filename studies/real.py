"""`python -m studies --real`: the papers' mechanisms on a real model (SmolLM2-135M-Instruct, LoRA), from an
SFT start (the instruct model itself cuts 76 % of its responses at 40 tokens and its GRPO groups were 96-99 %
uniform: from there a study tests format learning, not the papers' claims). Before any comparison, the gate
of `studies.gate` must show that RL moves the model at the budget. This study:

1. **Start**: LoRA SFT of SmolLM2 on the training references (`sft_start`), in rounds of
   `sft_round_steps`, until the truncated share of its responses on the validation split at the study's
   length is under `sft_truncation_target` (measured after every round; `sft_start.json` records each
   round), merged and stored once in `<out>/real-start/`; every arm and seed starts from it.
2. **Learning rate**: GRPO from the start, one run per rate of `lr_grid` (seed `sweep_seed`, `steps`
   steps), scored by pass@1 on the validation split (the training file's last `val_problems` rows, never
   trained on, and not the test set); the best (ties: the smaller) is the rate of every RL arm. The grid
   and the rule are in plan.json before any run, the sweep's results in `lr_sweep.json` before the arms.
3. **Arms** (REAL_ARMS) from the start, `steps` optimizer steps each and the same on-policy samples per step
   (P·G = 16): GRPO; Dr. GRPO; DaGRPO anchors at `anchors.when=no_correct` (the paper's hard queries);
   anchors `always` (LUFFY's injection); anchors + masks; TA-GRPO with the data's 3 rephrasings (1 question
   x 4 variants x G); matched sampling (1 question x 4G); and **continued SFT** on the same references for
   the same steps with as many sequences per step (the imitation control at equal steps).
4. **Evaluation**: the held-out test file (`arithmetic_heldout`, none a training question), `eval_samples`
   per problem at T = 1 and the study's length: pass@1 and pass@k for k up to the samples drawn, the
   truncated share; from training, the uniform-group share. (A "collapsed" flag, the mean reward of the
   last 5 steps under half that of the first 5, was dropped: it compared a run with other questions than
   its own, and fired on one data order, seed 4, whose hardest questions come last.)
5. **Registered primaries** (REAL_PRIMARIES, Holm within each paper, `studies.claims`), paired over
   seeds as in the miniature study: anchors (no_correct) vs Dr. GRPO; anchors (no_correct) vs continued SFT;
   TA-GRPO vs matched sampling (pass@k at the largest k drawn).

Budget: the 2026-12-01 run measured a 30-step run at 40 tokens at 6-8 min with its evaluation on a free
core (5.7-16.4 s per step of 16 samples, by arm and load). This design at 40 tokens: 8 arms x 5 seeds = 40
runs + 3 sweep runs + the start (<= 100 SFT steps with a validation pass each 20) ~ 43 x 7 min ~ 5 h of one
core; `--first-seed` splits the seeds over processes (the start and the sweep are made once, by the seed-0
process; the others wait for them) and `--summarize` joins their folders. Measured on 2026-12-02 and -03:
480-1174 s per run (one thread, load 2-5; continued SFT the slowest, 878-1004 s), so the design is 7-8 h of
one core, more than one session: `--summarize ... --keep RECORDS` keeps the plan and the per-run table
(studies.records) so that it can span machines.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from regroup.data.load import load_problems, save_problems
from regroup.errors import ConfigError
from regroup.eval.runner import evaluate, make_grader, run_eval_cli
from regroup.models.load import load_policy, load_tokenizer
from regroup.models.prompting import build_prompter, encode_response
from regroup.report.runs import read_metrics
from regroup.report.stats import std
from regroup.runtime.checkpoint import list_checkpoints
from regroup.runtime.rundir import claim_run_dir, new_run_dir
from regroup.train.build import build_trainer
from regroup.train.recipes import features
from regroup.train.run_config import load_config
from regroup.train.warmup import sft_batches
from studies.claims import (
    ALPHA,
    T1,
    ArmResult,
    Claim,
    Verdict,
    compare_pass_at_k,
    confidence_interval,
    effect_note,
    judge_all,
    mean_pass_at_k,
    per_seed_mean,
    verdict_label,
)
from studies.stats import paired_t_power
from studies.table import START, TABLE, arm_results, counts_of, read_per_problem, read_table, row

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"  # the checkout's examples/, beside studies/
REGIME = "real"
"""The one regime of the real-model study (the key its primaries are registered under)."""


@dataclass
class RealSettings:
    """What the real-model study runs."""

    model_dir: str = "models/smollm2"
    """SmolLM2-135M-Instruct as an HF folder (`regroup model fetch smollm2 --out models/smollm2`)."""
    train_file: str = "data/arithmetic_boxed.jsonl"
    """`regroup data prepare arithmetic_boxed --out data/arithmetic_boxed.jsonl --limit 2000`."""
    heldout_file: str = "data/heldout.jsonl"
    """`regroup data prepare arithmetic_heldout --out data/heldout.jsonl --limit 64`: the test set."""
    registered_seeds: int = 5
    """The design's seed count (seeds 0 .. registered_seeds - 1): the plan's power is stated for it, whichever
    share of it a process runs."""
    seeds: int = 5
    first_seed: int = 0
    """This process runs seeds first_seed .. first_seed + seeds - 1 (split a study over processes;
    `summarize_real` joins them)."""
    steps: int = 30
    """Optimizer steps of every RL arm and of continued SFT (and of each learning-rate sweep run)."""
    length: int = 40
    """rollout.max_new_tokens of every run and evaluation: the length the start's truncated share is measured at."""
    eval_problems: int = 64
    eval_samples: int = 8
    """Samples per test problem at T = 1 (pass@1 and pass@k up to this k)."""
    val_problems: int = 32
    """The training file's last rows, held out of all training: the validation split of the sweep and the start."""
    val_samples: int = 4
    sft_lr: float = 3e-4
    """LoRA SFT learning rate of the start and of continued SFT."""
    sft_round_steps: int = 20
    sft_max_rounds: int = 5
    sft_truncation_target: float = 0.10
    """The start is SFT'd until the truncated share on the validation split is under this."""
    lr_grid: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    """GRPO learning rates tried on the validation split before the arms (the best is every RL arm's)."""
    sweep_seed: int = 1000
    """The sweep's seed: none of the study's seeds."""
    start_dir: str | None = None
    """The stored SFT start (None: `<out>/real-start`), shared by every process of a split study."""
    wait_seconds: float = 6 * 3600
    """How long a process with first_seed > 0 waits for the seed-0 process's start and sweep."""
    arms: tuple[str, ...] | None = None
    overrides: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RealArm:
    name: str
    example: str
    """Recipe in examples/."""
    extra: tuple[str, ...] = ()
    sft_only: bool = False
    """Continued SFT on the references instead of RL (the imitation control)."""
    description: str = ""


DRGRPO = ("grpo.advantage_estimator=dr_grpo", "grpo.loss_agg=seq_sum_constant", "grpo.beta=0.0")
REAL_ARMS = [
    RealArm("grpo", "smollm2_grpo.yaml", description="GRPO (examples/smollm2_grpo.yaml)"),
    RealArm("drgrpo", "smollm2_grpo.yaml", DRGRPO, description="Dr. GRPO: no std scaling, constant normaliser"),
    RealArm(
        "anchor_no_correct",
        "smollm2_dagrpo.yaml",
        ("mask.enabled=false", "anchors.when=no_correct"),
        description="Dr. GRPO + a verified reference anchor on questions with no correct sample (hard queries)",
    ),
    RealArm(
        "anchor_always",
        "smollm2_dagrpo.yaml",
        ("mask.enabled=false", "anchors.when=always"),
        description="Dr. GRPO + a reference anchor on every question (LUFFY's injection)",
    ),
    RealArm(
        "anchor_mask",
        "smollm2_dagrpo.yaml",
        ("anchors.when=no_correct",),
        description="anchors (no_correct) + reference-similarity masks (delta 3)",
    ),
    RealArm(
        "ta_grpo",
        "smollm2_grpo.yaml",
        ("ta.enabled=true", "ta.rephraser=dataset", "ta.n_variants=3", "grpo.prompts_per_step=1"),
        description="TA-GRPO with the data's 3 rule rephrasings, equal samples (1 question x 4 variants x G)",
    ),
    RealArm(
        "matched",
        "smollm2_grpo.yaml",
        ("grpo.samples_multiplier=4", "grpo.prompts_per_step=1"),
        description="matched sampling: 1 question x 4G samples of q0 (TA-GRPO's control), equal samples",
    ),
    RealArm(
        "sft_continued",
        "smollm2_grpo.yaml",
        sft_only=True,
        description="continued SFT on the references, the same steps and sequences per step (imitation control)",
    ),
]
REAL_ARMS_BY_NAME = {a.name: a for a in REAL_ARMS}

REAL_PRIMARIES = [
    Claim(
        "DaGRPO",
        "Anchors on hard queries (no_correct) beat Dr. GRPO (pass@1)",
        "anchor_no_correct",
        "drgrpo",
        "pass@1",
        primary=True,
        regime=REGIME,
        effect=0.029,
        effect_source="the anchors' share of DaGRPO's gain, 48.8 − 45.9 (SPEC §6)",
        effect_derived=True,
    ),
    Claim(
        "DaGRPO",
        "Anchors on hard queries beat continued SFT on the same references at equal steps (pass@1)",
        "anchor_no_correct",
        "sft_continued",
        "pass@1",
        primary=True,
        regime=REGIME,
        effect=0.029,
        effect_source="no number in the paper for this control: the anchors' 2.9 points, fixed before the run",
    ),
    Claim(
        "TA-GRPO",
        "TA-GRPO beats matched sampling (pass@k at the largest k drawn)",
        "ta_grpo",
        "matched",
        "pass@8",
        primary=True,
        regime=REGIME,
        effect=0.0686,
        effect_source="TA-GRPO vs matched sampling, pass@32 on AIME24 (+6.86), read at pass@8 here",
    ),
]
REAL_EXPLORATORY = [
    Claim("DaGRPO", "Anchors always (LUFFY) beat Dr. GRPO (pass@1)", "anchor_always", "drgrpo", "pass@1"),
    Claim("DaGRPO", "Anchors + masks beat anchors alone (pass@1)", "anchor_mask", "anchor_no_correct", "pass@1"),
    Claim("DaGRPO", "Dr. GRPO beats GRPO (pass@1)", "drgrpo", "grpo", "pass@1"),
    Claim("TA-GRPO", "TA-GRPO beats GRPO (pass@1)", "ta_grpo", "grpo", "pass@1"),
    Claim("TA-GRPO", "TA-GRPO beats GRPO (pass@k)", "ta_grpo", "grpo", "pass@8"),
    Claim("study control", "GRPO beats continued SFT (pass@1)", "grpo", "sft_continued", "pass@1"),
]


def real_claims(s: RealSettings) -> list[Claim]:
    """The registered and exploratory claims, pass@k read at the largest k the evaluation draws."""
    k = f"pass@{s.eval_samples}"
    return [replace(c, measure=k) if c.measure == "pass@8" else c for c in REAL_PRIMARIES + REAL_EXPLORATORY]


def real_arm_overrides(
    arm: RealArm, s: RealSettings, seed: int, run_dir: Path, model_dir: str, train_file: str, lr: float | None
) -> list[str]:
    """Dotted overrides that make `arm` at `seed` from `model_dir` (the SFT start) with learning rate `lr`."""
    return [
        f"recipe=real_{arm.name}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        f"model.path={model_dir}",
        f"data.train_file={train_file}",
        "data.question_field=question",
        "data.answer_field=answer",
        "data.solution_field=solution",
        f"train.steps={s.steps}",
        f"train.checkpoint_every={s.steps}",
        "train.progress=false",
        f"rollout.max_new_tokens={s.length}",
        *([f"optim.lr={lr}"] if lr is not None else []),
        *arm.extra,
        *s.overrides,
    ]


def real_arm_config(
    arm: RealArm,
    s: RealSettings,
    seed: int,
    run_dir: Path,
    model_dir: str | None = None,
    train_file: str | None = None,
    lr: float | None = None,
):
    """The validated RunConfig of one real-model run."""
    example = EXAMPLES_DIR / arm.example
    if not example.is_file():
        raise ConfigError(f"the real-model study reads {example}: run it from a source checkout")
    overrides = real_arm_overrides(arm, s, seed, run_dir, model_dir or s.model_dir, train_file or s.train_file, lr)
    return load_config(example, overrides)


def split_train_val(s: RealSettings, out_dir: Path) -> tuple[str, str]:
    """(train file, validation file) under out_dir/data: the training file's last `val_problems` rows are the
    validation split, never trained on (the start, the sweep and every arm train on the rest)."""
    problems = list(load_problems(s.train_file).problems)
    if len(problems) <= s.val_problems:
        raise ConfigError(f"{s.train_file}: {len(problems)} rows, need more than val_problems = {s.val_problems}")
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / "train.jsonl", out_dir / "val.jsonl"
    save_problems(problems[: -s.val_problems], train)
    save_problems(problems[-s.val_problems :], val)
    return str(train), str(val)


def _sft_steps(model, optimizer, batches, steps: int, max_grad_norm: float, losses: list) -> None:
    model.train()
    for _ in range(steps):
        ids, labels, attention = next(batches)  # [B, L] each
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()


def sft_on_references(
    cfg,
    problems: list,
    steps: int,
    lr: float,
    out_dir: Path,
    seed: int,
    log=print,
    batch_size: int | None = None,
    until=None,
    max_rounds: int = 1,
) -> str:
    """LoRA (as `cfg.model`) SFT of `cfg.model.path` on the problems' reference solutions, prompted as the
    RL run prompts (`cfg.data`), `batch_size` sequences per step (default `cfg.grpo.prompts_per_step`), loss
    on response tokens only. In rounds of `steps` steps, up to `max_rounds`: after each, `until(model,
    tokenizer, prompter)` returns (done, record) and SFT stops when done (None: one round). The adapter is
    merged and the model saved to `out_dir` (returned) with sft_metrics.json (losses, rounds)."""

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(cfg.model.path)
    prompter = build_prompter(cfg.data, tokenizer, builtin_model=False)
    examples = [(prompter.encode(p.question), encode_response(tokenizer, p.solution)) for p in problems if p.solution]
    if not examples:
        raise ValueError("sft_on_references: no problem has a reference solution")
    model = load_policy(cfg.model.path, cfg.model, lora=features(cfg).lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    size = min(batch_size or cfg.grpo.prompts_per_step, len(examples))
    batches = sft_batches(examples, size, pad, random.Random(seed))
    losses: list[float] = []
    rounds = []
    for round_index in range(max_rounds):
        _sft_steps(model, optimizer, batches, steps, cfg.optim.max_grad_norm, losses)
        if until is None:
            break
        done, record = until(model, tokenizer, prompter)
        rounds.append({"steps": (round_index + 1) * steps, **record})
        log(f"SFT round {round_index + 1}: {rounds[-1]}")
        if done:
            break
    if features(cfg).lora:
        model = model.merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "sft_metrics.json").write_text(
        json.dumps({"steps": len(losses), "batch_size": size, "lr": lr, "losses": losses, "rounds": rounds})
    )
    log(f"SFT on references: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return str(out_dir)


def truncation_probe(val_file: str, s: RealSettings, seed: int = 0):
    """`until` for `sft_on_references`: the validation split sampled at T = 1 and the study's length; done
    when the truncated share is under `s.sft_truncation_target`."""
    problems = list(load_problems(val_file).problems)
    grader = make_grader("math", "arithmetic")

    def until(model, tokenizer, prompter):
        result = evaluate(
            model,
            tokenizer,
            problems,
            grader,
            n=s.val_samples,
            ks=(1,),
            temperature=1.0,
            max_new_tokens=s.length,
            greedy=False,
            batch_size=64,
            seed=seed,
            progress=False,
            prompter=prompter,
        )
        share = result.summary["truncated_frac"]
        record = {"truncated_frac": share, "val_pass@1": result.summary["mean@n"]}
        return share < s.sft_truncation_target, record

    return until


def evaluate_real(
    model_dir: str, s: RealSettings, data_file: str, out_dir: Path, prompt_config: str, n: int, seed: int = 0
) -> dict:
    """pass@1 / pass@k (k up to n) and the truncated share on `data_file` at T = 1, prompted as `prompt_config`,
    with sampler seed `seed` (0: every evaluation of the 2026-12-02 study and the gate)."""
    rows = run_eval_cli(
        model_dir,
        [data_file],
        str(out_dir),
        n=n,
        ks=sorted({1, *(k for k in (2, 4, 8, 16, 32, 64) if k <= n)}),
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=s.length,
        checker="math",
        greedy=False,
        limit=s.eval_problems,
        seed=seed,
        progress=False,
        prompt={"config_file": prompt_config},
    )
    return rows[0]


def _wait_for(path: Path, s: RealSettings, what: str, log) -> None:
    deadline = time.monotonic() + s.wait_seconds
    while not path.is_file():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{path}: {what} did not appear within {s.wait_seconds:.0f} s (the seed-0 process makes it)"
            )
        log(f"waiting for {what} ({path})")
        time.sleep(30)


def make_start(s: RealSettings, start_dir: Path, train_file: str, val_file: str, log) -> str:
    """The SFT start, once: SFT'd on the references until its truncated share on the validation split is under
    the target (or `sft_max_rounds` rounds), stored in start_dir/model with start_dir/sft_start.json."""
    record = start_dir / "sft_start.json"
    if record.is_file():
        return str(start_dir / "model")
    grpo = REAL_ARMS_BY_NAME["grpo"]
    cfg = real_arm_config(grpo, s, 0, start_dir / "cfg", train_file=train_file)
    out = sft_on_references(
        cfg,
        list(load_problems(train_file).problems),
        s.sft_round_steps,
        s.sft_lr,
        start_dir / "model",
        seed=0,
        log=log,
        until=truncation_probe(val_file, s),
        max_rounds=s.sft_max_rounds,
    )
    rounds = json.loads((start_dir / "model" / "sft_metrics.json").read_text())["rounds"]
    reached = bool(rounds) and rounds[-1]["truncated_frac"] < s.sft_truncation_target
    record.write_text(json.dumps({"rounds": rounds, "target": s.sft_truncation_target, "reached": reached}, indent=2))
    if not reached:
        log(f"warning: the SFT start's truncated share stayed at or above {s.sft_truncation_target} ({rounds[-1]})")
    return out


def lr_sweep(s: RealSettings, sweep_dir: Path, start: str, train_file: str, val_file: str, log) -> float:
    """GRPO from the start at each rate of `lr_grid` (seed `sweep_seed`), pass@1 on the validation split; the
    best rate (ties: the smaller), written to sweep_dir/lr_sweep.json before any arm runs."""
    record = sweep_dir / "lr_sweep.json"
    if record.is_file():
        return float(json.loads(record.read_text())["chosen_lr"])
    grpo = REAL_ARMS_BY_NAME["grpo"]
    scores = []
    for lr in s.lr_grid:
        run_dir = sweep_dir / f"grpo-lr{lr:g}"
        cfg = real_arm_config(grpo, s, s.sweep_seed, run_dir, start, train_file, lr)
        with claim_run_dir(run_dir, "fresh", log=log):
            build_trainer(cfg, run_dir, log=log).train()
        final = str(list_checkpoints(run_dir)[-1])
        row = evaluate_real(final, s, val_file, run_dir / "val", str(run_dir / "config.yaml"), s.val_samples)
        scores.append({"lr": lr, "val_pass@1": row["pass@1"], "truncated_frac": row.get("truncated_frac")})
        log(f"lr sweep: lr {lr:g}: validation pass@1 {row['pass@1']}")
    best = max(scores, key=lambda r: (r["val_pass@1"], -r["lr"]))
    record.write_text(
        json.dumps({"scores": scores, "chosen_lr": best["lr"], "rule": "max val pass@1, ties: smaller lr"})
    )
    return float(best["lr"])


def real_plan(s: RealSettings, arms: list[RealArm]) -> dict:
    """What the real-model study commits to before anything trains."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": asdict(s),
        "arms": [asdict(a) for a in arms],
        "start": f"LoRA SFT on the references in rounds of {s.sft_round_steps} steps (lr {s.sft_lr}) until the "
        f"truncated share on the validation split at {s.length} tokens is under {s.sft_truncation_target} "
        f"(at most {s.sft_max_rounds} rounds), stored once",
        "lr_sweep": {
            "grid": list(s.lr_grid),
            "arm": "grpo",
            "seed": s.sweep_seed,
            "score": f"pass@1 on the validation split ({s.val_problems} rows x {s.val_samples} samples)",
            "rule": "the best rate (ties: the smaller) is every RL arm's; continued SFT keeps sft_lr",
        },
        "primaries": [asdict(c) for c in real_claims(s) if c.primary],
        "exploratory": [asdict(c) for c in real_claims(s) if not c.primary],
        "seeds": {
            "registered": s.registered_seeds,
            "this_process": list(range(s.first_seed, s.first_seed + s.seeds)),
        },
        "test": "two-sided paired t-test over seeds (S − 1 df), sign-flip at a zero SE; Holm within each paper",
        "power": {
            "pilot": "none from this start (the 2026-12-01 run started from the instruct model, where RL could not "
            "learn): the first seeds are the pilot, and the seeds are not changed after seeing them",
            # the design's seeds, not this process's share: a split process's own count says nothing of the study
            "seeds": s.registered_seeds,
            "detectable_effect_in_sd_of_seed_differences": detectable_effect(s.registered_seeds, 0.05 / 2),
        },
    }


def detectable_effect(seeds: int, alpha: float, power: float = 0.8) -> float:
    """The true mean difference, in units of the per-seed differences' sd, that the paired t-test over
    `seeds` seeds detects with `power` at level `alpha` (to 0.01)."""
    effect = 0.0
    while paired_t_power(effect, 1.0, seeds, alpha) < power and effect < 50:
        effect += 0.01
    return round(effect, 2)


def run_real_study(s: RealSettings, out_root: str = "runs", log=print) -> Path:
    """The start, the learning-rate sweep (both once: the seed-0 process), then every arm x seed from the
    start; writes real_study.json with each run's summary. Long: see the module doc's budget."""
    for path, how in (
        (s.model_dir, "regroup model fetch smollm2 --out " + s.model_dir),
        (s.train_file, "regroup data prepare arithmetic_boxed --out " + s.train_file + " --limit 2000"),
        (s.heldout_file, "regroup data prepare arithmetic_heldout --out " + s.heldout_file),
    ):
        if not Path(path).exists():
            raise ConfigError(f"the real-model study needs {path}: {how}")
    arms = [REAL_ARMS_BY_NAME[n] for n in (s.arms or [a.name for a in REAL_ARMS])]
    study_dir = new_run_dir(out_root, "real-study")
    (study_dir / "plan.json").write_text(json.dumps(real_plan(s, arms), indent=2, default=str))
    start_dir = Path(s.start_dir) if s.start_dir else Path(out_root) / "real-start"
    train_file, val_file = split_train_val(s, study_dir / "data")
    if s.first_seed == 0:
        start = make_start(s, start_dir, train_file, val_file, log)
        lr = lr_sweep(s, start_dir / "sweep", start, train_file, val_file, log)
        start_eval = evaluate_real(
            start, s, s.heldout_file, study_dir / "start", str(EXAMPLES_DIR / "smollm2_grpo.yaml"), s.eval_samples
        )
    else:
        _wait_for(start_dir / "sft_start.json", s, "the SFT start", log)
        _wait_for(start_dir / "sweep" / "lr_sweep.json", s, "the learning-rate sweep", log)
        start = str(start_dir / "model")
        lr = lr_sweep(s, start_dir / "sweep", start, train_file, val_file, log)
        start_eval = None
    records = [{"arm": "start", "seed": None, "eval": start_eval, "lr": lr}]
    for seed in range(s.first_seed, s.first_seed + s.seeds):
        for arm in arms:
            run_dir = study_dir / f"{arm.name}-s{seed}"
            t0 = time.perf_counter()
            if arm.sft_only:
                cfg = real_arm_config(arm, s, seed, run_dir, start, train_file)
                per_step = cfg.grpo.prompts_per_step * cfg.grpo.num_generations  # as many sequences as RL samples
                final = sft_on_references(
                    cfg, list(load_problems(train_file).problems), s.steps, s.sft_lr, run_dir / "model", seed, log,
                    batch_size=per_step,
                )  # fmt: skip
                prompt_config = str(EXAMPLES_DIR / arm.example)
            else:
                cfg = real_arm_config(arm, s, seed, run_dir, start, train_file, lr)
                with claim_run_dir(run_dir, "fresh", log=log):
                    build_trainer(cfg, run_dir, log=log).train()
                final = str(list_checkpoints(run_dir)[-1])
                prompt_config = str(run_dir / "config.yaml")
            summary = evaluate_real(final, s, s.heldout_file, run_dir / "eval", prompt_config, s.eval_samples)
            seconds = time.perf_counter() - t0
            records.append({"arm": arm.name, "seed": seed, "eval": summary, "seconds": seconds})
            (run_dir / "timing.json").write_text(json.dumps({"seconds": seconds}))
            log(f"real study {arm.name} seed {seed}: {summary} ({seconds:.0f} s)")
            (study_dir / "real_study.json").write_text(json.dumps(records, indent=2, default=str))
    return study_dir


# ------------------------------------------------------------------------------------------ summary
def real_rows(study_dirs: list[Path]) -> list[dict]:
    """The kept table of a real-model study split over `study_dirs`: one row per finished arm run (its held-out
    evaluation, the means of groups/uniform_frac and reward/mean and its truncated share) and
    the start's held-out evaluation (arm "start", seed 0; the start does not depend on a training seed)."""
    rows, start = [], None
    for study_dir in study_dirs:
        root = Path(study_dir)
        found = sorted(root.glob("start/*/per_problem.jsonl"))
        if found and start is None:
            start = found[0].parent
        for per_problem in sorted(root.glob("*-s*/eval/*/per_problem.jsonl")):
            bench = per_problem.parent
            name, _, seed_text = bench.parent.parent.name.rpartition("-s")
            if not seed_text.isdigit():
                continue
            metrics = bench.parent.parent / "metrics.jsonl"
            records = read_metrics(str(metrics))[0] if metrics.is_file() else []
            mechanisms = {
                k: v for k in ("groups/uniform_frac", "reward/mean") if (v := per_seed_mean(records, k)) is not None
            }
            truncated = json.loads((bench / "summary.json").read_text()).get("truncated_frac")
            rows.append(
                row(
                    REGIME,
                    name,
                    int(seed_text),
                    {T1: read_per_problem(per_problem)},
                    mechanisms,
                    truncated_frac=truncated,
                )
            )
    if start is not None:
        truncated = json.loads((start / "summary.json").read_text()).get("truncated_frac")
        rows.append(
            row(REGIME, START, 0, {T1: read_per_problem(start / "per_problem.jsonl")}, truncated_frac=truncated)
        )
    return rows


def read_real_results(rows: list[dict]) -> tuple[dict[str, ArmResult], dict[str, dict[int, dict]]]:
    """(arm -> ArmResult on the test set, arm -> seed -> {truncated, uniform}) from the kept table;
    "start" has the start's one evaluation under every seed any arm ran."""
    arms = arm_results(r for r in rows if r["arm"] != START).get(REGIME, {})
    extra: dict[str, dict[int, dict]] = {}
    for r in rows:
        if r["arm"] != START:
            extra.setdefault(r["arm"], {})[r["seed"]] = {
                "truncated_frac": r["extra"].get("truncated_frac"),
                "uniform_frac": r["mechanisms"].get("groups/uniform_frac"),
            }
    start = next((r for r in rows if r["arm"] == START), None)
    if start is not None:
        counts = counts_of(start["evals"][T1])
        seeds = sorted({s for a in arms.values() for s in a.per_problem})
        arms["start"] = ArmResult(per_problem={s: counts for s in seeds})
        truncated = start["extra"].get("truncated_frac")
        extra["start"] = {s: {"truncated_frac": truncated, "uniform_frac": None} for s in seeds}
    return arms, extra


def study_table(study_dirs: list[Path]) -> list[dict]:
    """The rows of `study_dirs`: read from a kept table (runs.jsonl) where a folder has one, else from the runs."""
    kept = [d for d in study_dirs if (d / TABLE).is_file()]
    return [r for d in kept for r in read_table(d / TABLE)] + real_rows([d for d in study_dirs if d not in kept])


def _pct(c) -> str:
    return "—" if c is None or c.delta is None else f"{100 * c.delta:.1f} %"


def _delta(c) -> str:
    if c is None or c.delta is None or c.se is None:
        return "—"
    ci = confidence_interval(c)
    return f"{100 * c.delta:+.1f} ± {100 * c.se:.1f}" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")


def summarize_real(study_dirs: list[Path], k: int | None = None, against: tuple[str, ...] = ("start", "drgrpo")) -> str:
    """Markdown: per arm, seeds, pass@1 and pass@k (± SE over seeds), Δ pass@1 against each arm of `against`
    (paired over seeds, 95 % CI), truncated share, uniform-group share; the per-seed pass@1; and the
    registered primaries' verdicts (Holm within each paper) with the exploratory claims. A verdict's "rules
    out" is scoped to the model, steps and samples; under 80 % power it reads "not detected"; where an RL arm
    of the comparison did not move from the start (its Δ vs start CI includes 0), the verdict says that it
    does not test the paper's claim."""
    arms, extra = read_real_results(study_table(study_dirs))
    if k is None:
        k = max((n for a in arms.values() for counts in a.per_problem.values() for _, n in counts.values()), default=1)
    order = (
        ["start"]
        + [a.name for a in REAL_ARMS if a.name in arms]
        + sorted(set(arms) - {"start"} - set(REAL_ARMS_BY_NAME))
    )
    shown = [b for b in against if b in arms]
    head = [
        "arm",
        "seeds",
        "pass@1",
        f"pass@{k}",
        *[f"Δ pass@1 vs {b}" for b in shown],
        "truncated",
        "uniform groups",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in (n for n in order if n in arms):
        seeds = extra.get(name, {})
        cells = [name, "1 (eval)" if name == "start" else str(len(arms[name].per_problem))]
        cells += [_pct(mean_pass_at_k(arms[name], 1)), _pct(mean_pass_at_k(arms[name], k))]
        for other in shown:
            cells.append("—" if name in ("start", other) else _delta(compare_pass_at_k(arms[name], arms[other], 1)))
        trunc = [v["truncated_frac"] for v in seeds.values() if v["truncated_frac"] is not None]
        uni = [v["uniform_frac"] for v in seeds.values() if v["uniform_frac"] is not None]
        cells.append(f"{100 * sum(trunc) / len(trunc):.0f} %" if trunc else "—")
        cells.append(f"{100 * sum(uni) / len(uni):.0f} %" if uni else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per-seed pass@1 (%):", "", "| arm | " + " | ".join(f"seed {s}" for s in _all_seeds(arms)) + " |"]
    lines.append("|" + "---|" * (1 + len(_all_seeds(arms))))
    for name in (n for n in order if n in arms and n != "start"):
        row = [name]
        for seed in _all_seeds(arms):
            counts = arms[name].per_problem.get(seed)
            if counts is None:
                row.append("—")
            else:
                value = sum(c / n for c, n in counts.values()) / len(counts)
                row.append(f"{100 * value:.1f}")
        lines.append("| " + " | ".join(row) + " |")
    s = RealSettings(eval_samples=k)
    verdicts = judge_all(real_claims(s), {REGIME: arms})
    primaries_per_paper = Counter(v.claim.paper for v in verdicts if v.claim.primary)
    lines += [
        "",
        "| paper | claim | registered | Δ [95 % CI] | seeds | p | p (Holm) | paper's effect | power at it "
        "(these seeds' sd) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    scope = f"for SmolLM2-135M with LoRA at {_steps_run(study_dirs)} steps × 16 samples"
    for v in verdicts:
        c = v.comparison
        ci = v.ci
        power = _power(v, primaries_per_paper[v.claim.paper])
        label = verdict_label(v, None if power is None else power[0], scope)
        still = [a for a in (v.claim.arm, v.claim.against) if a in arms and _rl_did_not_move(arms, a)]
        if v.claim.primary and still:
            label += (
                f"; RL did not move {' or '.join(still)} from the start (Δ vs start CI includes 0), so this does not "
                "test the paper's claim"
            )
        delta = (
            "—"
            if c is None or c.delta is None
            else f"{100 * c.delta:+.1f}" + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")
        )
        p = "—" if v.p is None else f"{v.p:.4f}"
        padj = "—" if v.p_adjusted is None else f"{v.p_adjusted:.4f}"
        lines.append(
            f"| {v.claim.paper} | {v.claim.text} | {'primary' if v.claim.primary else 'exploratory'} | {delta} "
            f"| {c.seeds if c else 0} | {p} | {padj} | "
            + ("—" if v.claim.effect is None else f"{100 * v.claim.effect:+.1f} pts{effect_note(v.claim)}")
            + f" | {observed_power(v, primaries_per_paper[v.claim.paper])} | {label} |"
        )
    return "\n".join(lines)


def _steps_run(study_dirs: list[Path]) -> int:
    """The study's optimizer steps per arm, from the first plan.json (the settings' default without one)."""
    for d in study_dirs:
        plan = Path(d) / "plan.json"
        if plan.is_file():
            return int(json.loads(plan.read_text()).get("settings", {}).get("steps", RealSettings.steps))
    return RealSettings.steps


def _rl_did_not_move(arms: dict[str, ArmResult], name: str) -> bool:
    """An RL arm whose pass@1 gain over the start has a 95 % CI that includes 0 (False: SFT, the start, or no CI)."""
    arm = REAL_ARMS_BY_NAME.get(name)
    if arm is None or arm.sft_only or "start" not in arms:
        return False
    ci = confidence_interval(compare_pass_at_k(arms[name], arms["start"], 1))
    return ci is not None and ci[0] <= 0 <= ci[1]


def _power(v: Verdict, primaries_of_its_paper: int) -> tuple[float, float] | None:
    """(power, sd) of `observed_power`, None where it is "—"."""
    c = v.comparison
    if not v.claim.primary or v.claim.effect is None or c is None or c.seeds < 2:
        return None
    sd = std(c.per_seed)
    assert sd is not None
    return paired_t_power(v.claim.effect, sd, c.seeds, ALPHA / primaries_of_its_paper), sd


def observed_power(v: Verdict, primaries_of_its_paper: int) -> str:
    """The power the seeds run give a primary at its paper's effect: the paired t over seeds at Holm's
    first-step level α/m (m = its paper's primaries; a lower bound), with the sd of these seeds' differences.
    This start had no pilot, so the plan could only give the detectable effect in sd units; this is the
    same calculation with the spread the run measured ("—": exploratory, no effect, or under 2 seeds)."""
    found = _power(v, primaries_of_its_paper)
    if found is None:
        return "—"
    power, sd = found
    return f"{100 * power:.0f} % (sd {100 * sd:.1f} pts)"


def _all_seeds(arms: dict[str, ArmResult]) -> list[int]:
    return sorted({s for name, a in arms.items() if name != "start" for s in a.per_problem})

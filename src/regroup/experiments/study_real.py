"""`regroup study --real`: the papers' mechanisms on a real model (SmolLM2-135M-Instruct, LoRA).

Arms (REAL_ARMS), each from the shipped examples on the built-in training problems with boxed
references (`regroup data prepare arithmetic_boxed`), reward `math`, the same seeds and steps:

- `grpo`: examples/smollm2_grpo.yaml on the prepared questions;
- `dagrpo_anchor`: examples/smollm2_dagrpo.yaml without masks (Dr. GRPO + 3 + 1 reference anchors);
- `dagrpo_anchor_mask`: examples/smollm2_dagrpo.yaml (+ reference-similarity masks);
- `ta_grpo`: GRPO with the data's 3 rule rephrasings pooled (ta.rephraser=dataset), one question x
  (N+1) variants x G = 16 samples per step, as many as GRPO (equal samples);
- `sft_grpo`: the imitation control: LoRA SFT on the same reference solutions for as many steps as
  the RL arms train (batch = the questions per step), merged, then GRPO from it. It tells RL with
  anchors apart from learning the answer format from the references.

Each arm is evaluated on `eval_problems` held-out built-in problems (`arithmetic_heldout`, none a
training question) x `eval_samples` at T = 1 with the math checker, as the run prompts; pass@1 is
compared per problem with GRPO's (paired over problems and seeds, `regroup.report.claims`). The
truncated share at `max_new_tokens` is recorded with every evaluation; `lengths` runs the study at
each length given (default 40, the examples' length).

Budget, measured on 2 shared CPU cores (2026-12-01, one torch thread per process, the HF sampler):
a 30-step run at 40 tokens took 6-8 min with its evaluation (5.7-16.4 s per step of 16 samples, by arm
and load), and 5 arms x 3 seeds 94 min on two processes (~103 min of one core); `--first-seed` splits
the seeds over processes and `--summarize` joins their folders into one table (README: the results). The truncated share of the
starting model at T = 1 (64 x 4 samples; at 40 tokens by the HF sampler, at 320 and 512 by
`regroup eval --backend vllm`) is 76 % at 40, 21 % at 320 and 17 % at 512 tokens (the cut samples that were read
ramble on without reaching an answer), while its pass@1 stays 0.8 % at all three: no length up to 512
gets it under 10 %, and a longer length costs about proportionally more generation and update.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from regroup.data.load import load_problems
from regroup.errors import ConfigError
from regroup.eval.runner import run_eval_cli
from regroup.experiments.study import read_counts
from regroup.models.load import load_policy, load_tokenizer
from regroup.models.prompting import build_prompter, encode_response
from regroup.report.claims import ArmResult, compare_pass_at_k, confidence_interval, mean_pass_at_k
from regroup.runtime.checkpoint import list_checkpoints
from regroup.runtime.rundir import claim_run_dir, new_run_dir
from regroup.train.build import build_trainer
from regroup.train.recipes import features
from regroup.train.run_config import load_config
from regroup.train.warmup import _batches

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"  # a source checkout's examples/


@dataclass
class RealSettings:
    """What the real-model study runs."""

    model_dir: str = "models/smollm2"
    """SmolLM2-135M-Instruct as an HF folder (`regroup model fetch smollm2 --out models/smollm2`)."""
    train_file: str = "data/arithmetic_boxed.jsonl"
    """`regroup data prepare arithmetic_boxed --out data/arithmetic_boxed.jsonl --limit 2000`."""
    heldout_file: str = "data/heldout.jsonl"
    """`regroup data prepare arithmetic_heldout --out data/heldout.jsonl --limit 64`."""
    seeds: int = 3
    first_seed: int = 0
    """Seeds first_seed .. first_seed + seeds - 1 (split a study over processes; `summarize_real` joins them)."""
    steps: int = 30
    """Optimizer steps of every RL arm, and SFT steps of the imitation control."""
    lengths: tuple[int, ...] = (40,)
    """rollout.max_new_tokens values to run the study at (40: the examples as shipped)."""
    eval_problems: int = 64
    eval_samples: int = 4
    sft_lr: float = 3e-4
    """LoRA SFT learning rate of the imitation control (the RL arms' lr)."""
    arms: tuple[str, ...] | None = None
    overrides: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RealArm:
    name: str
    example: str
    """Recipe in examples/."""
    extra: tuple[str, ...] = ()
    sft_first: bool = False
    description: str = ""


REAL_ARMS = [
    RealArm("grpo", "smollm2_grpo.yaml", description="GRPO (examples/smollm2_grpo.yaml)"),
    RealArm(
        "dagrpo_anchor",
        "smollm2_dagrpo.yaml",
        ("mask.enabled=false",),
        description="Dr. GRPO + one verified reference anchor per question (3 + 1, shaped)",
    ),
    RealArm("dagrpo_anchor_mask", "smollm2_dagrpo.yaml", description="+ reference-similarity masks (delta 3)"),
    RealArm(
        "ta_grpo",
        "smollm2_grpo.yaml",
        ("ta.enabled=true", "ta.rephraser=dataset", "ta.n_variants=3", "grpo.prompts_per_step=1"),
        description="TA-GRPO with the data's 3 rule rephrasings, equal samples (1 question x 4 x G)",
    ),
    RealArm(
        "sft_grpo",
        "smollm2_grpo.yaml",
        sft_first=True,
        description="SFT on the reference solutions for `steps` steps, then GRPO: the imitation control",
    ),
]
REAL_ARMS_BY_NAME = {a.name: a for a in REAL_ARMS}


def real_arm_overrides(
    arm: RealArm, s: RealSettings, seed: int, length: int, run_dir: Path, model_dir: str | None = None
) -> list[str]:
    """Dotted overrides that make `arm` at `seed` and `length` (model_dir: the SFT output for sft_grpo)."""
    return [
        f"recipe=real_{arm.name}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        f"model.path={model_dir or s.model_dir}",
        f"data.train_file={s.train_file}",
        "data.question_field=question",
        "data.answer_field=answer",
        "data.solution_field=solution",
        f"train.steps={s.steps}",
        f"train.checkpoint_every={s.steps}",
        "train.progress=false",
        f"rollout.max_new_tokens={length}",
        *arm.extra,
        *s.overrides,
    ]


def real_arm_config(arm: RealArm, s: RealSettings, seed: int, length: int, run_dir: Path, model_dir: str | None = None):
    """The validated RunConfig of one real-model run."""
    example = EXAMPLES_DIR / arm.example
    if not example.is_file():
        raise ConfigError(f"regroup study --real reads {example}: run it from a source checkout")
    return load_config(example, real_arm_overrides(arm, s, seed, length, run_dir, model_dir))


def sft_on_references(cfg, problems: list, steps: int, lr: float, out_dir: Path, seed: int, log=print) -> str:
    """LoRA (as `cfg.model`) SFT of `cfg.model.path` on the problems' reference solutions, prompted as the
    RL run prompts (`cfg.data`), `cfg.grpo.prompts_per_step` per batch, loss on response tokens only;
    the adapter is merged and the model saved to `out_dir` (returned), ready to start GRPO from."""

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(cfg.model.path)
    prompter = build_prompter(cfg.data, tokenizer, builtin_model=False)
    examples = [(prompter.encode(p.question), encode_response(tokenizer, p.solution)) for p in problems if p.solution]
    if not examples:
        raise ValueError("sft_on_references: no problem has a reference solution")
    model = load_policy(cfg.model.path, cfg.model, lora=features(cfg).lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = _batches(examples, min(cfg.grpo.prompts_per_step, len(examples)), pad, random.Random(seed))
    model.train()
    losses = []
    for _ in range(steps):
        ids, labels, attention = next(batches)  # [B, L] each
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    if features(cfg).lora:
        model = model.merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "sft_metrics.json").write_text(json.dumps({"steps": steps, "losses": losses}))
    log(f"SFT on references: {steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return str(out_dir)


def evaluate_real(model_dir: str, s: RealSettings, length: int, out_dir: Path, prompt_config: str) -> dict:
    """pass@1 / pass@k and the truncated share on the held-out file at T = 1, prompted as `prompt_config`."""
    rows = run_eval_cli(
        model_dir,
        [s.heldout_file],
        str(out_dir),
        n=s.eval_samples,
        ks=[1, s.eval_samples],
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=length,
        checker="math",
        greedy=False,
        limit=s.eval_problems,
        progress=False,
        prompt={"config_file": prompt_config},
    )
    return rows[0]


def run_real_study(s: RealSettings, out_root: str = "runs", log=print) -> Path:
    """Every arm x seed x length: train (SFT first for the imitation control), evaluate, and write
    real_study.json with each run's summary. Long: see the module doc's budget."""
    for path, how in (
        (s.model_dir, "regroup model fetch smollm2 --out " + s.model_dir),
        (s.train_file, "regroup data prepare arithmetic_boxed --out " + s.train_file + " --limit 2000"),
        (s.heldout_file, "regroup data prepare arithmetic_heldout --out " + s.heldout_file),
    ):
        if not Path(path).exists():
            raise ConfigError(f"regroup study --real needs {path}: {how}")
    arms = [REAL_ARMS_BY_NAME[n] for n in (s.arms or [a.name for a in REAL_ARMS])]
    study_dir = new_run_dir(out_root, "real-study")
    (study_dir / "plan.json").write_text(
        json.dumps({"settings": asdict(s), "arms": [asdict(a) for a in arms]}, indent=2)
    )
    records = []
    for length in s.lengths:
        if s.first_seed == 0:  # the start once, not in every process of a split study
            start = evaluate_real(
                s.model_dir, s, length, study_dir / f"len{length}" / "start", str(EXAMPLES_DIR / "smollm2_grpo.yaml")
            )
            records.append({"arm": "start", "length": length, "seed": None, "eval": start})
        for seed in range(s.first_seed, s.first_seed + s.seeds):
            for arm in arms:
                run_dir = study_dir / f"len{length}" / f"{arm.name}-s{seed}"
                model_dir = None
                if arm.sft_first:
                    cfg = real_arm_config(arm, s, seed, length, run_dir)
                    model_dir = sft_on_references(
                        cfg,
                        load_problems(s.train_file).problems,
                        s.steps,
                        s.sft_lr,
                        run_dir.with_name(run_dir.name + "-sft"),
                        seed,
                        log,
                    )
                cfg = real_arm_config(arm, s, seed, length, run_dir, model_dir)
                with claim_run_dir(run_dir, "fresh", log=log):
                    build_trainer(cfg, run_dir, log=log).train()
                final = str(list_checkpoints(run_dir)[-1])
                summary = evaluate_real(final, s, length, run_dir / "eval", str(run_dir / "config.yaml"))
                records.append({"arm": arm.name, "length": length, "seed": seed, "eval": summary})
                log(f"real study len {length} {arm.name} seed {seed}: {summary}")
                (study_dir / "real_study.json").write_text(json.dumps(records, indent=2, default=str))
    return study_dir


# ------------------------------------------------------------------------------------------ summary
def read_real_results(study_dirs: list[Path], length: int) -> tuple[dict[str, ArmResult], dict[str, list[float]]]:
    """(arm -> ArmResult at T = 1, arm -> truncated share per seed) of every `len<length>` run in
    `study_dirs` (a study split over processes by `first_seed`); "start" has the start's evaluation under
    every seed any arm ran (one evaluation: the start does not depend on a training seed)."""
    arms: dict[str, ArmResult] = {}
    truncated: dict[str, list[float]] = {}
    start = None
    for study_dir in study_dirs:
        root = Path(study_dir) / f"len{length}"
        if (root / "start" / "heldout" / "per_problem.jsonl").is_file():
            start = root / "start" / "heldout"
        for bench in sorted(root.glob("*-s*/eval/heldout")):
            name, _, seed = bench.parent.parent.name.rpartition("-s")
            arms.setdefault(name, ArmResult()).per_problem[int(seed)] = read_counts(bench / "per_problem.jsonl")
            truncated.setdefault(name, []).append(json.loads((bench / "summary.json").read_text())["truncated_frac"])
    if start is not None:
        counts = read_counts(start / "per_problem.jsonl")
        seeds = sorted({s for a in arms.values() for s in a.per_problem})
        arms["start"] = ArmResult(per_problem={s: counts for s in seeds})
        truncated["start"] = [json.loads((start / "summary.json").read_text())["truncated_frac"]]
    return arms, truncated


def summarize_real(
    study_dirs: list[Path], length: int, against: tuple[str, ...] = ("start", "grpo", "sft_grpo")
) -> str:
    """A markdown table: each arm's pass@1 (± SE over seeds and problems) and its paired Δ against each
    arm of `against` (± SE, 95 % CI, S − 1 df: `regroup.report.claims.compare_pass_at_k`), with the
    truncated share at `length`."""
    arms, truncated = read_real_results(study_dirs, length)
    order = (
        ["start"]
        + [a.name for a in REAL_ARMS if a.name in arms]
        + sorted(set(arms) - {"start"} - set(REAL_ARMS_BY_NAME))
    )
    head = ["arm", "seeds", "pass@1", *[f"Δ vs {b}" for b in against if b in arms], f"cut at {length} tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in (n for n in order if n in arms):
        own = mean_pass_at_k(arms[name], 1)
        cells = [
            name,
            "1 (eval)" if name == "start" else str(len(arms[name].per_problem)),
            f"{100 * own.delta:.1f} %" if own.delta is not None else "—",
        ]
        for other in (b for b in against if b in arms):
            c = compare_pass_at_k(arms[name], arms[other], 1) if other != name else None
            ci = confidence_interval(c) if c is not None else None
            if c is None or c.delta is None or c.se is None or name == "start":
                cells.append("—")
            else:
                cells.append(
                    f"{100 * c.delta:+.1f} ± {100 * c.se:.1f}"
                    + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci else "")
                )
        shares = truncated.get(name, [])
        cells.append(f"{100 * sum(shares) / len(shares):.0f} %" if shares else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""Warm-up SFT of the built-in tiny model on the task's reference solutions.

RL needs a starting model in the middle band: some groups all correct, some all wrong, most mixed.
Accuracy jumps sharply with the number of updates (measured on this model before regroup was written:
loss 0.6 → 0.03 between steps ~300 and ~700 of a 950-step schedule; a snapshot at ~610 steps gave
held-out pass@1 0.47 with 84 % of groups mixed, the finished schedule 0.81 with 42 % all correct), so
the warm-up is scheduled by steps, not wall time: a cosine schedule planned
for `schedule_steps`, stopped after `steps` (a snapshot part-way, where the model is in the band), and
the result is checked against the band and written to `DIR/warmup_metrics.json`.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from regroup.data.heldout import heldout_problems
from regroup.eval.runner import evaluate
from regroup.io import write_atomic
from regroup.models.prompting import encode_prompt, encode_response
from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer
from regroup.runtime.cpu_memory import keep_freed_memory
from regroup.tasks import get_task
from regroup.train.schedule import lr_lambda

BAND = {
    "heldout_pass1": (0.25, 0.65),
    "group_mixed": (0.30, 1.0),
    "group_all_correct": (0.05, 1.0),
    "group_all_wrong": (0.05, 1.0),
}


@dataclass
class WarmupConfig:
    """Warm-up SFT settings (defaults measured to land in the band on 2 CPU cores)."""

    steps: int = 620
    """Optimizer steps actually taken."""
    schedule_steps: int = 950
    """Length the cosine schedule is planned for (stopping before its end leaves the model mid-band)."""
    batch_size: int = 32
    """Sequences per step."""
    lr: float = 3e-3
    """Peak learning rate."""
    warmup_frac: float = 0.05
    """Linear warm-up as a fraction of schedule_steps."""
    min_lr_ratio: float = 0.1
    """Cosine floor."""
    num_train: int = 20000
    """Generated training problems."""
    variant_frac: float = 0.25
    """Fraction of SFT examples whose question is a rule rephrasing (so rephrasings stay in distribution)."""
    num_eval: int = 256
    """Held-out problems for the metrics."""
    eval_samples: int = 8
    """Samples per held-out problem at temperature 1."""
    max_new_tokens: int = 48
    """Longest sampled response in the evaluation."""
    seed: int = 0
    """Seed of initialisation and batching (data seeds are the task defaults, same as training)."""
    data_seed: int = 1234
    """Seed of the generated training set (the RL run's default data.seed)."""
    eval_seed: int = 999
    """Seed of the held-out set (the RL run's default data.eval_seed)."""
    threads: int = 2
    """torch CPU threads."""
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model."""


def sft_batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rng: random.Random):
    """Endless shuffled batches of (input_ids, labels, attention) with the loss on response tokens only."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            rows = [examples[j] for j in order[i : i + batch_size]]
            length = max(len(p) + len(r) for p, r in rows)
            ids = torch.full((batch_size, length), pad_id, dtype=torch.long)  # [B, L] right-padded
            labels = torch.full((batch_size, length), -100, dtype=torch.long)  # [B, L]
            attention = torch.zeros((batch_size, length), dtype=torch.long)  # [B, L]
            for row, (p, r) in enumerate(rows):
                seq = p + r
                ids[row, : len(seq)] = torch.tensor(seq)
                labels[row, len(p) : len(seq)] = torch.tensor(r)
                attention[row, : len(seq)] = 1
            yield ids, labels, attention


def evaluate_start(
    model, tokenizer, task, problems, n: int, max_new_tokens: int, seed: int = 0, greedy: bool = True
) -> dict:
    """held-out pass@1 (mean of n samples at T=1), greedy accuracy, group fractions, by difficulty."""
    result = evaluate(
        model,
        tokenizer,
        problems,
        task.grade,
        n=n,
        ks=(1,),
        temperature=1.0,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        batch_size=256,
        seed=seed,
        progress=False,
    )
    counts = [(r.correct, r.n) for r in result.problems]
    return {
        "heldout_pass1": result.summary["mean@n"],  # pass@1 estimated from n samples = mean@n
        "heldout_greedy": result.summary.get("greedy"),
        "heldout_stderr": result.summary.get("stderr"),
        "group_all_correct": sum(c == k for c, k in counts) / len(counts),
        "group_all_wrong": sum(c == 0 for c, k in counts) / len(counts),
        "group_mixed": sum(0 < c < k for c, k in counts) / len(counts),
        "by_difficulty": result.summary.get("by_difficulty", {}),
    }


def transform_accuracy(model, tokenizer, task, problems, n: int, max_new_tokens: int) -> dict:
    """pass@1 on each rule transformation of the same held-out problems (TA-GRPO needs rephrasings that
    shift perceived difficulty without changing the problem)."""
    out = {
        "original": evaluate_start(model, tokenizer, task, problems, n, max_new_tokens, greedy=False)["heldout_pass1"]
    }
    for name, transform in task.transforms.items():
        moved = [replace(p, question=transform(p, random.Random(f"{p.id}/{name}"))) for p in problems]
        out[name] = evaluate_start(model, tokenizer, task, moved, n, max_new_tokens, greedy=False)["heldout_pass1"]
    return out


def in_band(metrics: dict) -> bool:
    return all(lo <= metrics[k] <= hi for k, (lo, hi) in BAND.items())


def band_advice(metrics: dict) -> str:
    """What to change when the warmed-up model is outside BAND. Too weak a start gives groups that are all
    wrong, too strong a start groups that are all right, and RL learns from neither; the warm-up's steps
    move the model between the two (see the module docstring)."""
    pass1, right, wrong = metrics["heldout_pass1"], metrics["group_all_correct"], metrics["group_all_wrong"]
    if pass1 < BAND["heldout_pass1"][0] or right < BAND["group_all_correct"][0]:
        weak = True
    elif pass1 > BAND["heldout_pass1"][1] or wrong < BAND["group_all_wrong"][0]:
        weak = False
    else:  # too few mixed groups: lean away from the larger uniform side
        weak = wrong >= right
    if weak:
        return (
            "the start is too weak: warm up for more steps (regroup warmup --steps N --out DIR, N above the steps used)"
        )
    return (
        "the start is too strong: warm up for fewer steps (regroup warmup --steps N --out DIR, N below the steps used)"
    )


SPEED_ONLY = ("threads",)
"""WarmupConfig fields that change how fast the warm-up runs, not what it trains (left out of `differences`)."""


def read_finished(out_dir: str | Path) -> dict | None:
    """The metrics of the finished warm-up in `out_dir` (its `warmup_metrics.json`, written last), or None."""
    path = Path(out_dir) / "warmup_metrics.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def differences(saved: dict, cfg: WarmupConfig) -> list[str]:
    """The settings in which a finished warm-up's metrics (`saved`, with its "config") differ from `cfg`, as
    "steps 620 (asked 120)" lines; [] when they match or the metrics do not record their settings."""
    recorded = saved.get("config")
    if not isinstance(recorded, dict):
        return []
    asked = json.loads(json.dumps(asdict(cfg)))  # tuples as lists, as the metrics file holds them
    return [
        f"{key} {recorded.get(key)!r} (asked {asked[key]!r})"
        for key in asked
        if key not in SPEED_ONLY and recorded.get(key) != asked[key]
    ]


def warmup(
    out_dir: str | Path,
    cfg: WarmupConfig | None = None,
    *,
    task=None,
    log=print,
    progress=None,
    out_of_band_note: str | None = None,
) -> dict:
    """Train, evaluate and save the tiny model into `out_dir` (HF format). Returns the metrics.

    A model outside BAND is said in one warning line ending with what to change (`band_advice`), or with
    `out_of_band_note` when the caller knows better (the quick demo's short warm-up is outside on purpose)."""
    cfg = cfg or WarmupConfig()
    task = task or get_task("arithmetic")
    out_dir = Path(out_dir)
    start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    keep_freed_memory()  # the warm-up trains on the CPU (regroup.runtime.cpu_memory)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg.model, seed=cfg.seed)

    problems = task.generate(cfg.num_train, seed=cfg.data_seed)
    examples = []
    for p in problems:
        question = p.question
        if cfg.variant_frac and rng.random() < cfg.variant_frac:
            question = rng.choice(task.rephrase(p, 1, random.Random(f"sft/{p.id}")) or [question])
        examples.append((encode_prompt(tokenizer, question), encode_response(tokenizer, p.solution)))

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, int(cfg.warmup_frac * cfg.schedule_steps))

    schedule = lr_lambda(warm, cfg.schedule_steps, "cosine", cfg.min_lr_ratio, peak_in_warmup=True)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    batches = sft_batches(examples, cfg.batch_size, tokenizer.pad_token_id, rng)
    loss_value = math.nan
    for step in range(cfg.steps):
        ids, labels, attention = next(batches)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if progress is not None:
            progress(step + 1, cfg.steps, loss_value)
    train_seconds = time.perf_counter() - start

    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)  # saved before the evaluation: a failure there loses no training
    tokenizer.save_pretrained(out_dir)
    heldout = heldout_problems(task, cfg.num_eval, cfg.eval_seed, problems)
    metrics = evaluate_start(model, tokenizer, task, heldout, cfg.eval_samples, cfg.max_new_tokens)
    metrics["transform_pass1"] = transform_accuracy(model, tokenizer, task, heldout[:128], 4, cfg.max_new_tokens)
    metrics.update(
        {
            "final_loss": loss_value,
            "train_seconds": train_seconds,
            "seconds": time.perf_counter() - start,
            "parameters": sum(p.numel() for p in model.parameters()),
            "in_band": None,
            "band": BAND,
            "config": asdict(cfg),
        }
    )
    metrics["in_band"] = in_band(metrics)
    write_atomic(out_dir / "warmup_metrics.json", json.dumps(metrics, indent=2))
    if not metrics["in_band"]:
        log(
            f"warning: the warmed-up model is outside the band {BAND}: "
            f"pass1={metrics['heldout_pass1']:.3f} mixed={metrics['group_mixed']:.2f} "
            f"all_correct={metrics['group_all_correct']:.2f} all_wrong={metrics['group_all_wrong']:.2f}; "
            + (out_of_band_note or band_advice(metrics))
        )
    return metrics


def ensure_warm_model(out_dir: str | Path, log=print) -> str:
    """The cached warmed-up tiny model in `out_dir`, trained first if it is not there."""
    out_dir = Path(out_dir)
    if not (out_dir / "warmup_metrics.json").exists() or not (out_dir / "config.json").exists():
        log(f"warming up the tiny model into {out_dir} (once; cached afterwards)")
        warmup(out_dir, log=log)
    return str(out_dir)

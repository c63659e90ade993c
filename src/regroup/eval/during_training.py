"""Held-out evaluation every `train.eval_every` steps, logged as `eval/*` metrics and drawn in the report.

Questions: `data.eval_file` (same formats and field mapping as training data), else the task's generated
held-out set (never a training question). Graded with the run's reward and `rewards.correct_threshold`,
sampled with the training sampler at the training temperature, so the number is comparable across steps.
"""

from __future__ import annotations

from regroup.eval.runner import evaluate


def evaluate_during_training(trainer, problems: list) -> dict[str, float]:
    """`eval/*` metrics of the trainer's current policy on `problems` (the trainer keeps `eval_problems`' list)."""
    cfg = trainer.cfg
    if not problems or not trainer.is_main:
        return {}
    threshold = cfg.rewards.correct_threshold

    def grader(response, problem):  # 1/0 at the run's definition of correct
        value = trainer.recipe.reward_fn(response, problem)
        return None if value is None else float(value >= threshold)

    model = trainer.acc.unwrap_model(trainer.model)
    result = evaluate(
        model,
        trainer.tokenizer,
        problems,
        grader,
        n=cfg.train.eval_n,
        ks=sorted({1, cfg.train.eval_n}),
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        greedy=False,
        batch_size=cfg.rollout.batch_size,
        seed=cfg.seed + trainer.step,
        progress=False,
        sampler=trainer.sampler,
    )
    s = result.summary
    out = {f"eval/pass@{k}": float(v) for k, v in s["pass@k"].items() if v is not None}
    out["eval/mean@n"] = float(s["mean@n"])
    if s.get("stderr") is not None:
        out["eval/stderr"] = float(s["stderr"])
    return out

"""Held-out evaluation every `train.eval_every` steps, logged as `eval/*` metrics and drawn in the report.

An update hook (`regroup.diagnostics.hooks`): the trainer runs it after each step like any other, without
knowing what it measures. Questions: `data.eval_file` (same formats and field mapping as training data),
else the task's generated held-out set (never a training question), chosen once, at the first evaluation.
Graded with the run's reward and `rewards.correct_threshold`, sampled with the training sampler at the
training temperature, so the number is comparable across steps.
"""

from __future__ import annotations

from regroup.config.schema import RunConfig
from regroup.data.heldout import eval_problems
from regroup.diagnostics.hooks import UpdateHook
from regroup.eval.runner import evaluate


class HeldOutEvaluation(UpdateHook):
    """`eval/*` after steps K, 2K, ... (`train.eval_every` = K), on the process that logs (rank 0).

    `parts`: the run's built parts (`regroup.train.build.RunParts`: accelerator, model, tokenizer, sampler,
    task, training problems); `reward_fn`: the recipe's reward."""

    name = "heldout_eval"

    def __init__(self, cfg: RunConfig, parts, reward_fn, log=print):
        self.cfg, self.parts, self.reward_fn, self.log = cfg, parts, reward_fn, log
        self.every = cfg.train.eval_every
        self.problems: list | None = None

    def after_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        done = step + 1
        if not self.every or done % self.every:
            return {}
        if self.problems is None:  # chosen once, on the first evaluation, on every process alike
            self.problems = eval_problems(self.cfg, self.parts.task, self.parts.problems, self.log)
        if not self.problems or not self.parts.accelerator.is_main_process:
            return {}
        return evaluate_policy(self.cfg, self.parts, self.reward_fn, self.problems, seed=self.cfg.seed + done)


def evaluate_policy(cfg: RunConfig, parts, reward_fn, problems: list, *, seed: int) -> dict[str, float]:
    """`eval/*` metrics of the parts' current policy on `problems`."""
    threshold = cfg.rewards.correct_threshold

    def grader(response, problem):  # 1/0 at the run's definition of correct
        value = reward_fn(response, problem)
        return None if value is None else float(value >= threshold)

    result = evaluate(
        parts.accelerator.unwrap_model(parts.model),
        parts.tokenizer,
        problems,
        grader,
        n=cfg.train.eval_n,
        ks=sorted({1, cfg.train.eval_n}),
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        greedy=False,
        batch_size=cfg.rollout.batch_size,
        seed=seed,
        progress=False,
        sampler=parts.sampler,
    )
    s = result.summary
    out = {f"eval/pass@{k}": float(v) for k, v in s["pass@k"].items() if v is not None}
    out["eval/mean@n"] = float(s["mean@n"])
    if s.get("stderr") is not None:
        out["eval/stderr"] = float(s["stderr"])
    return out

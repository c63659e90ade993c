"""The reward stage: the verifiable reward of every on-policy sample, timed, with the checker's counts."""

from __future__ import annotations

import time

from regroup.registry import STAGES
from regroup.rewards import pop_counts, score_many
from regroup.stages.base import StepBatch, StepContext


def pop_reward_counts(reward_fn) -> dict[str, float]:
    """The reward function's counts since the last call (answers extracted, timeouts, ...), if it keeps any,
    plus the shares a researcher reads first: extracted / no-answer / timeout per checked response."""
    counts = pop_counts(reward_fn)
    metrics = {f"reward/{k}": float(v) for k, v in counts.items()}
    checked = counts.get("checked", 0)
    if checked:
        for key in ("extracted", "no_answer", "timeout"):
            if key in counts:
                metrics[f"reward/{key}_frac"] = counts[key] / checked
    return metrics


class RewardResponses:
    """`reward_fn(response, problem)` for each sample without a reward yet; None = could not be scored."""

    name = "reward"

    def __init__(self, reward_fn):
        self.reward_fn = reward_fn

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        t0 = time.perf_counter()
        todo = [s for s in batch.samples if s.reward is None and not s.is_anchor]
        # One batch call: the math checker's worker pool grades it in parallel and checks repeats once.
        rewards = score_many(self.reward_fn, [s.response_text for s in todo], [s.problem for s in todo])
        for s, r in zip(todo, rewards):
            s.reward = r
        metrics = {"time/reward": time.perf_counter() - t0}
        metrics.update(pop_reward_counts(self.reward_fn))
        return metrics

STAGES.register(RewardResponses.name, RewardResponses)

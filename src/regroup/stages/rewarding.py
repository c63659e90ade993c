"""The reward stage: the verifiable reward of every on-policy sample, timed, with the checker's counts."""

from __future__ import annotations

import math
import time

from regroup.config.registry import STAGES
from regroup.errors import ConfigError
from regroup.rewards import pop_counts, score_many
from regroup.stages.base import StepBatch, StepContext

FLOAT32_MAX = 3.4028234663852886e38
"""Rewards are float32 in the update: a finite reward beyond this would become inf and skip every step."""


class RewardOutputError(ConfigError):
    """A reward function returned something that is not a number or None: one line, exit 2."""


def reward_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def checked_rewards(values, fn) -> tuple[list[float | None], int]:
    """The rewards as floats (None and NaN kept: unscored) and how many were beyond float32 (made None);
    a value that is not a number (a string, a list) is refused, naming the function."""
    out: list[float | None] = []
    out_of_range = 0
    for value in values:
        if value is None:
            out.append(None)
            continue
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise RewardOutputError(
                f"reward {reward_name(fn)} returned {type(value).__name__} {str(value)[:40]!r}: "
                "a reward must return a number or None (None = could not score)"
            )
        try:
            x = float(value)
        except OverflowError:  # an int beyond float range (10**400): out of range, like 1e300
            x = FLOAT32_MAX * 2
        if math.isfinite(x) and abs(x) > FLOAT32_MAX:
            out_of_range += 1
            x = math.nan
        out.append(x)
    return out, out_of_range


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
    round_totals = ("time/reward",)  # summed over refill rounds (`stages.base.merge_rounds`)

    def __init__(self, reward_fn):
        self.reward_fn = reward_fn

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        t0 = time.perf_counter()
        todo = [s for s in batch.samples if s.reward is None and not s.is_anchor]
        # One batch call: the math checker's worker pool grades it in parallel and checks repeats once.
        rewards = score_many(self.reward_fn, [s.response_text for s in todo], [s.problem for s in todo])
        rewards, out_of_range = checked_rewards(rewards, self.reward_fn)
        for s, r in zip(todo, rewards):
            s.reward = r
        metrics = {"time/reward": time.perf_counter() - t0, "reward/out_of_range": float(out_of_range)}
        metrics.update(pop_reward_counts(self.reward_fn))
        return metrics


STAGES.register(RewardResponses.name, RewardResponses)

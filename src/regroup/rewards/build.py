"""The run's reward function from its config: registered rewards (`task`, `math`) and user rewards
(`pkg.mod:obj`), each optionally `*weight`, summed."""

from __future__ import annotations

import inspect

from regroup.config.registry import REWARDS, load_dotted
from regroup.config.schema import RewardsConfig, parse_weighted
from regroup.rewards import combine
from regroup.rewards.deadline import DeadlineReward
from regroup.rewards.isolated import DEFAULT_MEMORY_MB


def build_reward_fn(
    specs: list[str],
    task,
    workers: int = 1,
    correct_threshold: float = 1.0,
    timeout_s: float = 0.0,
    memory_mb: int = DEFAULT_MEMORY_MB,
):
    """A registered reward (`task`, `math`) or `pkg.mod:obj`, each optionally `*weight`; several are summed.

    A user reward (`pkg.mod:obj`: any callable, a function, a `functools.partial` or `lru_cache`, an object
    with `__call__`) runs in `workers` worker processes with a deadline of `timeout_s` per call when
    `timeout_s > 0` (`rewards.timeout_s`): past it, it scores None (unscored). It is imported here too, so a
    name that does not import fails now. Each worker (the math checker's too) gets `memory_mb` MiB of
    address space (0: no limit)."""
    parts = []
    for spec in specs:
        name, weight = parse_weighted(spec)
        if ":" in name:
            fn = load_dotted(name)
            if timeout_s > 0:
                fn = DeadlineReward(name, timeout_s, workers=workers, memory_mb=memory_mb)
        else:
            builder = REWARDS.get(name)
            options = {"workers": workers, "correct_threshold": correct_threshold}
            if "memory_mb" in inspect.signature(builder).parameters:  # a user's registered builder may not take it
                options["memory_mb"] = memory_mb
            fn = builder(task, **options)
        parts.append((fn, weight))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    return combine(parts)


def reward_fn_from_config(rewards_cfg: RewardsConfig, task, workers: int | None = None):
    """`build_reward_fn` of a config's `rewards` section (`workers`: instead of `rewards.workers`)."""
    return build_reward_fn(
        rewards_cfg.functions,
        task,
        rewards_cfg.workers if workers is None else workers,
        rewards_cfg.correct_threshold,
        rewards_cfg.timeout_s,
        rewards_cfg.worker_memory_mb,
    )

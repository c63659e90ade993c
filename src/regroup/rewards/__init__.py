"""Reward functions: plain callables `(response, problem) -> float | None` (None = could not be scored).

`task_grader` adapts a task's grader, `combine` sums weighted parts, and
`regroup.rewards.math_verify.MathAnswerChecker` checks math answers under a hard time limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from regroup.tasks.base import Problem

__all__ = ["RewardFn", "combine", "task_grader"]

RewardFn = Callable[[str, Problem], "float | None"]


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def combine(parts: Sequence[tuple[RewardFn, float]]) -> RewardFn:
    """A reward that is the weighted sum Σ w·r over the parts that scored (parts returning None are
    left out); None when every part returned None. Exceptions from a part propagate."""
    parts = list(parts)
    if not parts:
        raise ValueError("combine: needs at least one (reward_fn, weight) pair")
    for i, part in enumerate(parts):
        if not (isinstance(part, tuple) and len(part) == 2):
            raise ValueError(f"combine: part {i} must be a (reward_fn, weight) pair, got {part!r}")
        fn, weight = part
        if not callable(fn):
            raise ValueError(f"combine: part {i} reward function {fn!r} is not callable")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"combine: part {i} weight must be a finite number, got {weight!r}")

    def combined(response: str, problem: Problem) -> float | None:
        total, scored = 0.0, False
        for fn, weight in parts:
            value = fn(response, problem)
            if value is None:
                continue
            total += float(weight) * float(value)
            scored = True
        return total if scored else None

    combined.__name__ = "combine(" + ", ".join(f"{_name(fn)}*{w}" for fn, w in parts) + ")"
    return combined


def task_grader(task: Any) -> RewardFn:
    """The reward `task.grade(response, problem)` as a float (the task's verifiable 0/1 reward)."""
    grade = getattr(task, "grade", None)
    if not callable(grade):
        raise ValueError(f"task_grader: {task!r} has no grade(response, problem) method")

    def reward(response: str, problem: Problem) -> float | None:
        value = grade(response, problem)
        return None if value is None else float(value)

    reward.__name__ = f"{getattr(task, 'name', _name(task))}.grade"
    return reward

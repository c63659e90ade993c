"""Reward functions: plain callables `(response, problem) -> float | None` (None = could not be scored).

`task_grader` adapts a task's grader, `combine` sums weighted parts, and
`regroup.rewards.math_verify.MathAnswerChecker` checks math answers under a hard time limit.

Each of them also has `pop_counts() -> dict[str, int]`: what happened since the previous call
(checked, correct, wrong, and where known extracted, no_answer, timeout, error), for per-step logs;
`pop_counts(fn)` here reads it from any reward ({} for one without counts). `score_many(fn, responses,
problems)` scores a batch, in parallel where the reward can (the math checker's worker pool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from regroup.config.registry import REWARDS
from regroup.tasks.base import Problem

__all__ = ["RewardFn", "combine", "pop_counts", "score_many", "task_grader"]

RewardFn = Callable[[str, Problem], "float | None"]


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def pop_counts(fn: Any) -> dict[str, int]:
    """`fn.pop_counts()` for a reward that keeps counts, else {}."""
    pop = getattr(fn, "pop_counts", None)
    return dict(pop()) if callable(pop) else {}


def score_many(fn: Any, responses: Sequence[str], problems: Sequence[Problem]) -> list[float | None]:
    """`[fn(r, p) ...]` over a batch, through `fn.check_many` when it has one (the math checker's pool
    checks several answers at once; `combine` passes the batch on to its parts)."""
    if len(responses) != len(problems):
        raise ValueError(f"score_many: {len(responses)} responses for {len(problems)} problems")
    many = getattr(fn, "check_many", None)
    if callable(many):
        return list(many(responses, problems))
    return [fn(r, p) for r, p in zip(responses, problems)]


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
    return _Combined(parts)


class _Combined:
    """`combine`'s reward: callable like a plain reward, with `check_many` (the batch goes on to each
    part) and `pop_counts` (the parts' counts, summed key by key)."""

    def __init__(self, parts: list[tuple[RewardFn, float]]) -> None:
        self.parts = parts
        self.__name__ = "combine(" + ", ".join(f"{_name(fn)}*{w}" for fn, w in parts) + ")"

    def _weighted_sum(self, values: Sequence[float | None]) -> float | None:
        total, scored = 0.0, False
        for (_, weight), value in zip(self.parts, values):
            if value is None:
                continue
            total += float(weight) * float(value)
            scored = True
        return total if scored else None

    def __call__(self, response: str, problem: Problem) -> float | None:
        return self._weighted_sum([fn(response, problem) for fn, _ in self.parts])

    def check_many(self, responses: Sequence[str], problems: Sequence[Problem]) -> list[float | None]:
        by_part = [score_many(fn, responses, problems) for fn, _ in self.parts]
        return [self._weighted_sum(values) for values in zip(*by_part)]

    def pop_counts(self) -> dict[str, int]:
        """The parts' counts since the previous call, summed key by key."""
        total: dict[str, int] = {}
        for fn, _ in self.parts:
            for key, n in pop_counts(fn).items():
                total[key] = total.get(key, 0) + n
        return total


def task_grader(task: Any, correct_threshold: float = 1.0) -> RewardFn:
    """The reward `task.grade(response, problem)` as a float (the task's verifiable 0/1 reward).

    Its `pop_counts()` reports checked, correct (reward >= `correct_threshold`), wrong, error (the
    grader returned None) and, when the task has `extract_answer(response)`, extracted / no_answer.
    """
    grade = getattr(task, "grade", None)
    if not callable(grade):
        raise ValueError(f"task_grader: {task!r} has no grade(response, problem) method")
    return _TaskGrader(task, grade, correct_threshold)


class _TaskGrader:
    """`task_grader`'s reward: the task's grade as a float, counted."""

    def __init__(self, task: Any, grade: Callable[[str, Problem], Any], correct_threshold: float) -> None:
        extract = getattr(task, "extract_answer", None)
        self._grade, self._correct_threshold = grade, correct_threshold
        self._extract: Callable[[str], Any] | None = extract if callable(extract) else None
        keys = ("checked", "correct", "wrong", "error") + (("extracted", "no_answer") if self._extract else ())
        # A plain dict, not the worker pools' locked `RewardCounts`: the reward is called and its counts popped
        # by the one thread that collects (the trainer's, or the async producer's).
        self._keys = keys
        self._counts = dict.fromkeys(keys, 0)
        self.__name__ = f"{getattr(task, 'name', _name(task))}.grade"

    def __call__(self, response: str, problem: Problem) -> float | None:
        value = self._grade(response, problem)
        self._counts["checked"] += 1
        if self._extract is not None:
            self._counts["no_answer" if self._extract(response) is None else "extracted"] += 1
        if value is None:
            self._counts["error"] += 1
            return None
        self._counts["correct" if float(value) >= self._correct_threshold else "wrong"] += 1
        return float(value)

    def pop_counts(self) -> dict[str, int]:
        out, self._counts = self._counts, dict.fromkeys(self._keys, 0)
        return out


@REWARDS.register("task")
def build_task_reward(task: Any, *, workers: int = 1, correct_threshold: float = 1.0) -> RewardFn:
    """`rewards=[task]`: the task's own grader (registered rewards are built as `(task, workers=,
    correct_threshold=) -> reward`)."""
    return task_grader(task, correct_threshold=correct_threshold)


from regroup.rewards import math_verify  # noqa: E402,F401  (registers "math" beside "task")

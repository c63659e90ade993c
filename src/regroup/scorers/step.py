"""Deterministic step scorer: the task's own `step_score(response, problem) -> [1, 10]` (for the
built-in arithmetic task, a checker of the written steps). Free, exact and reproducible — the
cheapest fine-grained scorer where a task has checkable steps (SPEC §2a)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from regroup.scorers.base import ScoreItem, Scorer, check_score
from regroup.tasks.arithmetic import step_score


def _default_step_fn() -> Callable[[str, Any], float | None]:
    return step_score


class StepScorer(Scorer):
    """Wraps `step_fn(response, problem)` (default: `regroup.tasks.arithmetic.step_score`)."""

    name = "step"

    def __init__(self, step_fn: Callable[[str, Any], float | None] | None = None) -> None:
        super().__init__()
        self.step_fn = step_fn if step_fn is not None else _default_step_fn()

    def score_batch(self, items: Sequence[ScoreItem]) -> list[float | None]:
        """`step_fn` on every item; raises if an item has no Problem or a score leaves [1, 10]."""
        self._check_items(items)
        out: list[float | None] = []
        for i, item in enumerate(items):
            if item.problem is None:
                raise ValueError(f"step scorer needs ScoreItem.problem, item {i} has none")
            value = check_score(self.step_fn(item.response, item.problem), where=f"step_score on item {i}")
            self._count("failed" if value is None else "scored")
            out.append(value)
        return out

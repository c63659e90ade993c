"""The scorer interface for DaGRPO's fine-grained scores (SPEC §2a.1): a score in [1, 10] per response,
or None when the response could not be scored (it is then treated as unscored, never guessed)."""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regroup.tasks.base import Problem

SCORE_MIN = 1.0
SCORE_MAX = 10.0


@dataclass(frozen=True)
class ScoreItem:
    """One response to score: its question, the response text, a reference solution (may be None) and
    the task's Problem (needed by task-aware scorers such as `step`)."""

    question: str
    response: str
    reference: str | None = None
    problem: Problem | None = None

    def reference_text(self) -> str | None:
        """The reference solution: `reference`, else the problem's `solution`, else None."""
        if self.reference is not None:
            return self.reference
        if self.problem is not None:
            return getattr(self.problem, "solution", None)
        return None


def check_score(value: Any, *, where: str) -> float | None:
    """`value` as a float in [1, 10], None kept as None; anything else raises ValueError naming `where`."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: score must be a number in [1, 10] or None, got {value!r}") from None
    if not math.isfinite(x) or not SCORE_MIN <= x <= SCORE_MAX:
        raise ValueError(f"{where}: score must be in [1, 10], got {x}")
    return x


class Scorer(ABC):
    """Base class: `score_batch(items) -> list[float | None]` in input order, plus `stats` counters:
    `scored` (computed now), `cached` (served from a cache), `failed` (None returned)."""

    name: str = "scorer"

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter({"scored": 0, "failed": 0, "cached": 0})
        self._counts_lock = threading.Lock()

    @abstractmethod
    def score_batch(self, items: Sequence[ScoreItem]) -> list[float | None]:
        """One score in [1, 10] (or None) per item, in the order given."""

    def score(self, item: ScoreItem) -> float | None:
        """Score a single item (a batch of one)."""
        return self.score_batch([item])[0]

    @property
    def stats(self) -> dict[str, int]:
        """Counters since creation: scored, failed, cached (and scorer-specific extras)."""
        with self._counts_lock:
            return dict(self._counts)

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += n

    @staticmethod
    def _check_items(items: Sequence[ScoreItem]) -> None:
        for i, item in enumerate(items):
            if not isinstance(item, ScoreItem):
                raise TypeError(f"item {i} must be a ScoreItem, got {type(item).__name__}")
            if not isinstance(item.question, str) or not isinstance(item.response, str):
                raise TypeError(f"item {i}: question and response must be strings")

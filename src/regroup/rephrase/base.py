"""The rephraser interface for TA-GRPO (SPEC §3.1): N problem-equivalent variants per question."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regroup.tasks.base import Problem


@dataclass
class RephraseOutcome:
    """What a rephraser produced for one question.

    `variants` holds only accepted rewrites (never the original); `accepted == len(variants)`;
    `rejected` counts rewrites that failed validation; `cached` counts accepted variants served from
    the cache; `request_failures` counts requests that got no answer; `failed` is True when variants
    were asked for and none was accepted (the question then keeps its original only).
    """

    problem_id: str
    variants: list[str]
    accepted: int
    rejected: int
    cached: int
    failed: bool
    errors: list[str] = field(default_factory=list)
    request_failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary row."""
        return {
            "id": self.problem_id,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "cached": self.cached,
            "request_failures": self.request_failures,
            "failed": self.failed,
            "errors": list(self.errors),
        }


class Rephraser(ABC):
    """Base class: `rephrase_many(problems, n)` → one RephraseOutcome per problem, in order."""

    name: str = "rephraser"

    @abstractmethod
    def rephrase_many(self, problems: Sequence[Problem], n: int) -> list[RephraseOutcome]:
        """Up to `n` validated variants of each problem's question."""

    @staticmethod
    def _check_n(n: int) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n (variants per question) must be an integer >= 0, got {n!r}")

"""Rule-based rephraser: the task's own answer-preserving rewrites (no model, no network)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from regroup.rephrase.base import RephraseOutcome, Rephraser
from regroup.rephrase.validate import rejection_reason
from regroup.tasks.arithmetic import rephrase

RephraseFn = Callable[[Any, int, random.Random], list[str]]


def _default_rephrase_fn() -> RephraseFn:
    return rephrase


class RulesRephraser(Rephraser):
    """Calls `rephrase_fn(problem, n, rng)` (default: `regroup.tasks.arithmetic.rephrase`).

    Each problem gets its own `random.Random` seeded by (seed, problem id), so the variants of a
    question do not depend on which other questions are in the batch. The rules preserve the answer by
    construction, so only empty, copied and duplicate rewrites are rejected (no number check: a rule
    may legitimately write a quantity differently).
    """

    name = "rules"

    def __init__(self, rephrase_fn: RephraseFn | None = None, seed: int = 0) -> None:
        self.rephrase_fn = rephrase_fn if rephrase_fn is not None else _default_rephrase_fn()
        self.seed = seed

    def rephrase_many(self, problems: Sequence[Any], n: int) -> list[RephraseOutcome]:
        """Up to `n` rule-based variants per problem."""
        self._check_n(n)
        outcomes = []
        for p in problems:
            rng = random.Random(f"{self.seed}:{p.id}")
            candidates = list(self.rephrase_fn(p, n, rng)) if n > 0 else []
            accepted: list[str] = []
            errors: list[str] = []
            for k, text in enumerate(candidates[:n]):
                reason = rejection_reason(text, p.question, accepted, check_numbers=False)
                if reason is None:
                    accepted.append(text)
                else:
                    errors.append(f"variant {k}: {reason}")
            if n > 0 and not candidates:
                errors.append("the task's rules produced no rewrite")
            outcomes.append(
                RephraseOutcome(
                    problem_id=str(p.id),
                    variants=accepted,
                    accepted=len(accepted),
                    rejected=len(candidates[:n]) - len(accepted),
                    cached=0,
                    failed=n > 0 and not accepted,
                    errors=errors,
                )
            )
        return outcomes

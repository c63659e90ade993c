"""TA-GRPO variants as a step stage (SPEC §3.1): N problem-equivalent rephrasings per question, made once
per question and remembered (rules are seeded by the question id, so a resumed run sees the same ones)."""

from __future__ import annotations

from regroup.config.registry import STAGES
from regroup.stages.base import StepBatch, StepContext


class VariantProvider:
    name = "variants"

    def __init__(self, rephraser, n: int):
        self.rephraser = rephraser
        self.n = n
        self._memo: dict[str, list[str]] = {}
        self.failed_questions = 0

    def variants(self, problems) -> list[list[str]]:
        """Variants per problem; a question whose rephrasings all failed gets [] and trains alone."""
        missing = [p for p in problems if p.id not in self._memo]
        if missing:
            for problem, outcome in zip(missing, self.rephraser.rephrase_many(missing, self.n)):
                self._memo[problem.id] = list(outcome.variants)[: self.n]
                self.failed_questions += int(bool(outcome.failed))
        return [self._memo[p.id] for p in problems]

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        batch.variants = self.variants(batch.problems)
        alone = sum(1 for v in batch.variants if not v)
        return {
            "ta/questions_without_variants": float(alone),
            "ta/failed_questions_total": float(self.failed_questions),
        }


STAGES.register(VariantProvider.name, VariantProvider)

"""Variants already present in the data (`Problem.variants`, e.g. precomputed as in the TA-GRPO
author's release: rows with `index` = original id, `sub_index` = variant id)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from regroup.rephrase.base import RephraseOutcome, Rephraser


class DatasetRephraser(Rephraser):
    """The first `n` non-empty variants stored with each problem."""

    name = "dataset"

    def rephrase_many(self, problems: Sequence[Any], n: int) -> list[RephraseOutcome]:
        """Up to `n` stored variants per problem; a problem without any is `failed`."""
        self._check_n(n)
        outcomes = []
        for p in problems:
            stored = [v for v in (getattr(p, "variants", None) or ()) if isinstance(v, str) and v.strip()]
            chosen = stored[:n]
            outcomes.append(
                RephraseOutcome(
                    problem_id=str(p.id),
                    variants=chosen,
                    accepted=len(chosen),
                    rejected=0,
                    cached=0,
                    failed=n > 0 and not chosen,
                    errors=[] if chosen or n == 0 else ["no variants stored in the data for this question"],
                )
            )
        return outcomes

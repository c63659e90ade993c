"""DAPO dynamic sampling (Yu et al., arXiv 2503.14476, §3.2): drop groups whose rewards are all equal —
their advantages are 0, so they only dilute the batch — and sample more questions until the batch holds
`prompts_per_step` informative groups or `max_rounds` extra rounds have been drawn.

All processes agree: each process judges its own (whole) groups, the verdicts are gathered, and the
same global choice (the first `target` informative groups in group-id order) is kept everywhere. Extra
rounds draw from the question stream, whose position is checkpointed, and their group ids are new ids of
the same step, so sampling seeds never repeat and a resume is exact.
"""

from __future__ import annotations

import math

import torch

from regroup.config.registry import STAGES
from regroup.stages.base import FIXED_SHAPE_FRONT_ENDS, StepBatch, StepContext


def informative_groups(samples) -> dict[int, bool]:
    """group id -> whether its scored rewards differ (a group with < 2 scored rewards is not informative)."""
    rewards: dict[int, list[float]] = {}
    for s in samples:
        values = rewards.setdefault(s.group_id, [])
        if s.reward is not None and math.isfinite(s.reward):
            values.append(float(s.reward))
    return {g: len(v) >= 2 and max(v) > min(v) for g, v in rewards.items()}


class DynamicSampling:
    """A filter: needs `ctx.refill(round) -> StepBatch`, the collect stages run on newly drawn questions."""

    name = "dynamic_sampling"
    is_filter = True

    def __init__(self, target_groups: int, max_rounds: int):
        self.target_groups = target_groups
        self.max_rounds = max_rounds

    def unsupported_by(self, front_end: str) -> str | None:
        if front_end in FIXED_SHAPE_FRONT_ENDS:
            return (
                f"dynamic_sampling.enabled: the {front_end} batch has a fixed size, so groups cannot be dropped "
                "and refilled"
            )
        return None

    def _global_verdicts(self, batch: StepBatch, ctx: StepContext) -> list[tuple[int, bool]]:
        local = informative_groups(batch.samples)
        ids = torch.tensor(sorted(local), dtype=torch.long)  # [g]
        flags = torch.tensor([local[g] for g in sorted(local)], dtype=torch.long)  # [g]
        return sorted(zip(ctx.gather(ids).tolist(), [bool(f) for f in ctx.gather(flags).tolist()]))

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        verdicts = self._global_verdicts(batch, ctx)
        rounds = 0
        while sum(ok for _, ok in verdicts) < self.target_groups and rounds < self.max_rounds:
            rounds += 1
            refill = ctx.refill
            if refill is None:  # the recipe refuses this front-end (`unsupported_by`); here only by misuse
                raise RuntimeError(
                    "DynamicSampling needs StepContext.refill (a front-end that can draw more questions)"
                )
            batch.extend(refill(rounds))
            verdicts = self._global_verdicts(batch, ctx)
        informative = [g for g, ok in verdicts if ok]
        kept = set(informative[: self.target_groups])
        batch.keep_groups(kept)
        return {
            "dynamic/rounds": float(rounds),
            "dynamic/groups_seen": float(len(verdicts)),
            "dynamic/informative_frac": len(informative) / max(len(verdicts), 1),
            "dynamic/kept_groups": float(len(kept)),
            "dynamic/short": float(len(kept) < self.target_groups),
        }


STAGES.register(DynamicSampling.name, DynamicSampling)

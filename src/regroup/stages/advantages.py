"""The advantage stage (SPEC §1): group-normalised advantages over the whole (all-process) batch."""

from __future__ import annotations

import math

import torch

from regroup.algo.advantages import group_advantages
from regroup.registry import STAGES
from regroup.stages.base import StepBatch, StepContext


class GroupAdvantages:
    """Rewards and group ids are gathered from every process, so each group's statistics are its own
    whatever process sampled it; this process keeps its rows. Unscored rewards (None/NaN) get A = 0."""

    name = "advantages"

    def __init__(self, scale: str, eps: float):
        self.scale, self.eps = scale, eps

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        rewards = torch.tensor(
            [math.nan if s.reward is None or not math.isfinite(s.reward) else float(s.reward) for s in batch.samples],
            dtype=torch.float32,
        )  # [B]
        groups = torch.tensor([s.group_id for s in batch.samples], dtype=torch.long)  # [B]
        all_adv = group_advantages(ctx.gather(rewards), ctx.gather(groups), self.scale, self.eps)  # [B_all]
        sizes = ctx.gather(torch.tensor([len(batch.samples)])).tolist()
        start = sum(sizes[: ctx.rank])
        batch.advantages = all_adv[start : start + len(batch.samples)]  # [B]
        metrics = {"adv/abs_mean": float(batch.advantages.abs().mean()) if len(batch.samples) else 0.0}
        anchor = torch.tensor([s.is_anchor for s in batch.samples], dtype=torch.bool)
        if anchor.any():
            metrics["anchor/adv_mean"] = float(batch.advantages[anchor].mean())
        return metrics


STAGES.register(GroupAdvantages.name, GroupAdvantages)

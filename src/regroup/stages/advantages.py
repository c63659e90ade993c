"""The advantage stage (SPEC §1): the registered advantage estimator (`grpo.advantage_estimator`, default
GRPO's group-normalised advantage; `regroup.algo.advantages`) over the whole (all-process) batch."""

from __future__ import annotations

import math

import torch

from regroup.algo.loss_spec import Piece
from regroup.config.registry import STAGES
from regroup.stages.base import StepBatch, StepContext


class GroupAdvantages:
    """Rewards and group ids are gathered from every process, so each group's statistics are its own
    whatever process sampled it; this process keeps its rows. Unscored rewards (None/NaN) are NaN to the
    estimator (the built-ins give them A = 0).

    `estimator`: the run's advantage estimator with its parsed knobs (`regroup.algo.loss_config.resolve_loss`)."""

    name = "advantages"

    def __init__(self, estimator: Piece):
        self.estimator = estimator

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        rewards = torch.tensor(
            [math.nan if s.reward is None or not math.isfinite(s.reward) else float(s.reward) for s in batch.samples],
            dtype=torch.float32,
        )  # [B]
        groups = torch.tensor([s.group_id for s in batch.samples], dtype=torch.long)  # [B]
        all_rewards, all_groups = ctx.gather(rewards), ctx.gather(groups)  # [B_all] x2
        all_adv = self.estimator.fn(all_rewards, all_groups, **self.estimator.kwargs)  # [B_all]
        if not isinstance(all_adv, torch.Tensor) or all_adv.shape != all_rewards.shape:
            raise ValueError(
                f"advantage estimator {self.estimator.name!r} must return a [B] = {tuple(all_rewards.shape)} tensor, "
                f"got {tuple(all_adv.shape) if isinstance(all_adv, torch.Tensor) else type(all_adv).__name__}"
            )
        sizes = ctx.gather(torch.tensor([len(batch.samples)])).tolist()
        start = sum(sizes[: ctx.rank])
        batch.advantages = all_adv[start : start + len(batch.samples)].float()  # [B]
        metrics = {"adv/abs_mean": float(batch.advantages.abs().mean()) if len(batch.samples) else 0.0}
        anchor = torch.tensor([s.is_anchor for s in batch.samples], dtype=torch.bool)
        if anchor.any():
            metrics["anchor/adv_mean"] = float(batch.advantages[anchor].mean())
        return metrics


STAGES.register(GroupAdvantages.name, GroupAdvantages)

"""The advantage stage (SPEC §1): the registered advantage estimator (`grpo.advantage_estimator`, default
GRPO's group-normalised advantage; `regroup.algo.advantages`) over the whole (all-process) batch."""

from __future__ import annotations

import math
from typing import Any

import torch

import regroup.algo.advantages  # noqa: F401  (registers the built-in estimators, grpo and dr_grpo)
from regroup.config.registry import ADV_ESTIMATORS, STAGES, args_class, parse_args
from regroup.stages.base import StepBatch, StepContext


class GroupAdvantages:
    """Rewards and group ids are gathered from every process, so each group's statistics are its own
    whatever process sampled it; this process keeps its rows. Unscored rewards (None/NaN) are NaN to the
    estimator (the built-ins give them A = 0).

    `estimator` is an `ADV_ESTIMATORS` name or "pkg.mod:obj", `args` its knobs (a mapping or its `Args`)."""

    name = "advantages"

    def __init__(self, estimator: str = "grpo", args: Any = None):
        self.estimator = estimator
        self.fn = ADV_ESTIMATORS.get(estimator)
        knobs = args_class(self.fn)
        self.args = parse_args(knobs, args, "grpo.advantage_estimator_args", estimator)
        self.kwargs = {"args": self.args} if knobs is not None else {}  # resolved once, not per step

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        rewards = torch.tensor(
            [math.nan if s.reward is None or not math.isfinite(s.reward) else float(s.reward) for s in batch.samples],
            dtype=torch.float32,
        )  # [B]
        groups = torch.tensor([s.group_id for s in batch.samples], dtype=torch.long)  # [B]
        all_rewards, all_groups = ctx.gather(rewards), ctx.gather(groups)  # [B_all] x2
        all_adv = self.fn(all_rewards, all_groups, **self.kwargs)  # [B_all]
        if not isinstance(all_adv, torch.Tensor) or all_adv.shape != all_rewards.shape:
            raise ValueError(
                f"advantage estimator {self.estimator!r} must return a [B] = {tuple(all_rewards.shape)} tensor, "
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

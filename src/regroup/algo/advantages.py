"""Group-relative advantages (SPEC §1) and the uniform-group diagnostics (SPEC §3.6).

Matches TRL's `GRPOTrainer._generate_and_score_completions` (trl 1.16, `scale_rewards` group / batch /
none) on a positional layout, but groups are taken from an explicit `group_ids` tensor, so pooled
(TA-GRPO), anchor-augmented (DaGRPO) and out-of-order batches work unchanged: every group statistic is an
`index_add` / `scatter_reduce` over the dense group index, never a Python loop over groups and never a
positional `view(-1, G)` (SPEC §1: groups are identified by id).

Two advantage estimators are registered on `ADV_ESTIMATORS` (`grpo.advantage_estimator`), each
`(rewards[B], group_ids[B], args=...) -> advantages[B]`:
- `grpo`: `(R − mean_g R) / (std + eps)`, the std of the group (or of the batch, `scale: batch`);
- `dr_grpo`: `R − mean_g R`, unscaled (Dr. GRPO, arXiv 2503.20783 §3.1; TRL `scale_rewards="none"`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from regroup.config.fields import F, Knobs
from regroup.config.registry import ADV_ESTIMATORS

SCALES = ("group", "batch", "none")


def _check_batch(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} does not match rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    """Advantage of every sample relative to its group: `(R_i − mean_g R) / (std + eps)` (SPEC §1).

    - `rewards[B]` float, NaN = could not be scored: such a sample is left out of its group's mean and
      std and gets advantage 0.
    - `group_ids[B]` integer, arbitrary values in any order; samples with equal ids form a group.
    - `scale="group"`: std of the sample's group (unbiased, n−1); `"batch"`: group mean but one std over
      all scored rewards of the batch (TRL `scale_rewards="batch"`); `"none"`: no division (Dr. GRPO).
    - A group with fewer than two scored samples, or whose scored rewards are all equal, gives exactly 0
      for every member (no `0/eps` rounding noise).

    Returns a float tensor [B] (float32 at least; float64 in, float64 out).
    """
    _check_batch(rewards, group_ids)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(dtype)  # [B]
    if r.numel() == 0:
        return r.clone()

    scored = ~torch.isnan(r)  # [B]
    r0 = torch.where(scored, r, torch.zeros_like(r))  # [B] unscored -> 0 so sums ignore them
    uniq, index = torch.unique(group_ids, return_inverse=True)  # index [B]: the group's rank by id value
    num_groups = int(uniq.numel())
    n = torch.zeros(num_groups, dtype=torch.long, device=r.device).index_add(0, index, scored.long())  # [G]
    mean = r.new_zeros(num_groups).index_add(0, index, r0) / n.clamp(min=1).to(dtype)  # [G]
    # A group is "flat" when it carries no learning signal: < 2 scored samples or all rewards equal.
    # Detected exactly by max == min, so float rounding of the mean can never leak a nonzero value.
    g_max = r.new_full((num_groups,), -math.inf).scatter_reduce(0, index, torch.where(scored, r, -math.inf), "amax")
    g_min = r.new_full((num_groups,), math.inf).scatter_reduce(0, index, torch.where(scored, r, math.inf), "amin")
    flat = (n < 2) | (g_max == g_min)  # [G]
    live = scored & ~flat[index]  # [B] samples that get a nonzero advantage
    centred = torch.where(live, r0 - mean[index], torch.zeros_like(r0))  # [B]

    if scale == "none":
        return centred
    if scale == "group":
        # Unbiased std per group: Σ (R − mean)² / (n − 1); flat groups have centred == 0 -> std 0.
        var = r.new_zeros(num_groups).index_add(0, index, centred * centred) / (n - 1).clamp(min=1).to(dtype)  # [G]
        std = var.sqrt()[index]  # [B]
    else:  # "batch": TRL uses nanstd over every scored reward of the (gathered) batch.
        n_all = int(scored.sum())
        if n_all < 2:
            return torch.zeros_like(r0)
        mean_all = r0.sum() / n_all
        dev = torch.where(scored, r0 - mean_all, torch.zeros_like(r0))  # [B]
        std = ((dev * dev).sum() / (n_all - 1)).sqrt().expand_as(r0)  # [B]
    return torch.where(live, centred / (std + eps), torch.zeros_like(r0))


class GRPOAdvantageArgs(Knobs):
    """`grpo.advantage_estimator_args` of `advantage_estimator: grpo`."""

    scale: Literal["group", "batch"] = F(
        "group", "Divide by the std of the sample's group, or by one std over the batch (TRL scale_rewards=batch)."
    )
    eps: float = F(1e-4, "Added to the std before dividing (a uniform group has std 0).", gt=0.0, le=1.0)


@ADV_ESTIMATORS.register("grpo", args=GRPOAdvantageArgs)
def grpo_advantages(rewards: Tensor, group_ids: Tensor, args: GRPOAdvantageArgs) -> Tensor:
    """GRPO's std-normalised group advantage (SPEC §1) -> [B]."""
    return group_advantages(rewards, group_ids, args.scale, args.eps)  # [B]


@ADV_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO's unscaled group advantage `R − mean_g R` -> [B]."""
    return group_advantages(rewards, group_ids, "none")  # [B]


def group_reward_stats(
    rewards: Tensor,
    group_ids: Tensor,
    correct_value: float = 1.0,
    wrong_value: float = 0.0,
) -> dict[str, float]:
    """Fractions of groups whose scored rewards are all equal, split by kind (SPEC §3.6 diagnostics).

    Only groups with at least one scored (non-NaN) reward are counted. Keys:
    `num_groups` (counted groups), `frac_all_equal` (all scored rewards equal, including one-sample
    groups), `frac_all_correct` (all == `correct_value`), `frac_all_wrong` (all == `wrong_value`),
    `frac_mixed` (= 1 − frac_all_equal), `frac_unscored_samples` (NaN rewards / B).
    All values are 0.0 when no group has a scored reward.
    """
    _check_batch(rewards, group_ids)
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))  # [B]
    out = {
        "num_groups": 0.0,
        "frac_all_equal": 0.0,
        "frac_all_correct": 0.0,
        "frac_all_wrong": 0.0,
        "frac_mixed": 0.0,
        "frac_unscored_samples": 0.0,
    }
    if r.numel() == 0:
        return out
    scored = ~torch.isnan(r)  # [B]
    out["frac_unscored_samples"] = int((~scored).sum()) / r.numel()
    uniq, index = torch.unique(group_ids, return_inverse=True)  # index [B]: the group's rank by id value
    num_groups = int(uniq.numel())
    n = torch.zeros(num_groups, dtype=torch.long, device=r.device).index_add(0, index, scored.long())  # [G]
    g_max = r.new_full((num_groups,), -math.inf).scatter_reduce(0, index, torch.where(scored, r, -math.inf), "amax")
    g_min = r.new_full((num_groups,), math.inf).scatter_reduce(0, index, torch.where(scored, r, math.inf), "amin")
    counted = n > 0  # [G]
    num = int(counted.sum())
    if num == 0:
        return out
    equal = counted & (g_max == g_min)  # [G]
    out["num_groups"] = float(num)
    out["frac_all_equal"] = float(equal.sum()) / num
    out["frac_all_correct"] = float((equal & (g_max == correct_value)).sum()) / num
    out["frac_all_wrong"] = float((equal & (g_max == wrong_value)).sum()) / num
    out["frac_mixed"] = 1.0 - out["frac_all_equal"]
    return out

"""PPO clip, GRPO's policy loss (SPEC §1; Schulman et al. 2017 eq. 7), with INTELLECT-2's two-sided clip.

    L_t = −min(r_t·A, clip(r_t, 1−ε_low, 1+ε_high)·A),      r_t = π_θ(o_t)/π_old(o_t)

ε_low / ε_high are `grpo.eps_low` / `grpo.eps_high` (shared with GSPO and LUSPO, and with TRL's `epsilon` /
`epsilon_high`). The knob `delta` (INTELLECT-2, arXiv 2505.07291 §3.3; TRL 1.16's `GRPOConfig.delta`) also
caps the unclipped ratio from above, `r_t := min(r_t, δ)`, so a token with a negative advantage and a huge
ratio cannot produce an unbounded update; TRL recommends δ > 1 + ε_high. This is TRL 1.16's
`GRPOTrainer._compute_loss` for `loss_type` dapo / grpo / dr_grpo / bnpo (the aggregation is
`grpo.loss_agg`, `regroup.algo.losses.aggregate`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from regroup.config.fields import F, Knobs
from regroup.config.registry import POLICY_LOSSES


class ClipArgs(Knobs):
    """The knobs of the clipped losses (ppo_clip, gspo, luspo): `grpo.policy_loss_args`."""

    delta: Optional[float] = F(
        None,
        "Two-sided clip (INTELLECT-2; TRL's delta): the unclipped ratio is capped at delta; null: off. "
        "TRL recommends delta > 1 + eps_high.",
        gt=1.0,
        le=1e6,
    )


def clipped_pg_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clip per-token loss `−min(r·A, clip(r, 1−εl, 1+εh)·A)` with `r = π_θ/π_old` (SPEC §1).

    Returns `(per_token_loss[B, T], is_low_clipped[B, T], is_high_clipped[B, T])`; the flags follow TRL:
    low = `r < 1−εl and A < 0`, high = `r > 1+εh and A > 0` (the tokens whose gradient the clip removes),
    on the ratio after the `delta` cap as TRL computes them. `advantages` is [B] (one per sequence) or [B, T].
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    if logps.shape != old_logps.shape or adv.shape[0] != logps.shape[0] or adv.shape[1] not in (1, logps.shape[1]):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B] or [B, T], and logps {tuple(logps.shape)} and "
            f"old_logps {tuple(old_logps.shape)} the same [B, T]"
        )
    ratio = torch.exp(logps - old_logps)  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)  # [B, T] INTELLECT-2's upper cap on the unclipped branch
    loss = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    is_low = (ratio < 1.0 - eps_low) & (adv < 0)  # [B, T]
    is_high = (ratio > 1.0 + eps_high) & (adv > 0)  # [B, T]
    return loss, is_low, is_high


@POLICY_LOSSES.register("ppo_clip", args=ClipArgs)
def ppo_clip_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: ClipArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered PPO-clip loss: `clipped_pg_loss` with `spec.grpo.eps_low` / `spec.grpo.eps_high` and
    `args.delta`."""
    return clipped_pg_loss(logps, old_logps, advantages, spec.grpo.eps_low, spec.grpo.eps_high, args.delta)

"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1, arXiv 2506.13585, eq. 4;
ScaleRL, arXiv 2510.13786, uses it with ε_max = 5).

Instead of clipping the token update away (PPO), CISPO keeps every token's gradient and clips the
importance weight, which it detaches:

    L_t = −sg(min(r_t, ε_max)) · A · log π_θ(o_t),      r_t = π_θ(o_t)/π_old(o_t)

so the gradient is `−min(r, ε_max)·A·∇log π_θ` (REINFORCE weighted by the truncated ratio). This is TRL
1.16's `loss_type="cispo"` (`GRPOTrainer._compute_loss`, with `epsilon_high` = ε_max); the aggregation is
the caller's (TRL's cispo normalises like dapo: `grpo.loss_agg=token_mean`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.ratios import importance_ratio, per_token_advantages
from regroup.config.fields import F, Knobs
from regroup.config.registry import POLICY_LOSSES


class CISPOArgs(Knobs):
    """`grpo.policy_loss_args` of `policy_loss: cispo`."""

    clip_max: float = F(
        5.0,
        "The cap ε_max on the detached importance weight (TRL's epsilon_high for cispo; ScaleRL: 5).",
        gt=0.0,
        le=1e6,
    )


def cispo_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, clip_max: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token CISPO loss -> (loss [B, T], low [B, T], high [B, T]).

    `high` flags the tokens whose weight the cap truncates (r > ε_max and A > 0, TRL's `cispo_clip_ratio`);
    there is no lower bound, so `low` is all False.
    """
    if not clip_max > 0:
        raise ValueError(f"CISPO clip_max must be > 0, got {clip_max}")
    adv = per_token_advantages(advantages, logps)  # [B, 1] or [B, T]
    ratio = importance_ratio(logps, old_logps)  # [B, T]
    weight = torch.clamp(ratio, max=clip_max).detach()  # [B, T]
    loss = -weight * adv * logps  # [B, T]
    is_high = (ratio > clip_max) & (adv > 0)  # [B, T]
    return loss, torch.zeros_like(is_high), is_high


@POLICY_LOSSES.register("cispo", args=CISPOArgs)
def cispo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: CISPOArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered form: ε_max is `args.clip_max` (`grpo.policy_loss_args.clip_max`)."""
    return cispo_loss(logps, old_logps, advantages, args.clip_max)

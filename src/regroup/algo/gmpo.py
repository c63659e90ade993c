"""GMPO: geometric-mean policy optimisation (Zhao et al., arXiv 2507.20673, eq. 4–5).

GRPO averages the token ratios arithmetically; GMPO maximises their geometric mean, which an outlier
token moves far less, and clips each token's log ratio in log space (paper: (e^−0.4, e^0.4)):

    ℓ_t   = sgn(A) · min(sgn(A)·log r_t, sgn(A)·clamp(log r_t, −ε_low, ε_high))
    s_i   = exp( (1/|o_i|) Σ_t ℓ_t )
    L_i   = −Ā_i · s_i,    Ā_i = the response's advantage (its mean over tokens when given per token)

Each token of response i carries L_i, like GSPO's sequence loss; `grpo.loss_agg=seq_mean_token_mean` then
gives verl's `mean_i L_i`. This is verl 0.9.1's `policy_loss.loss_mode="geo_mean"`
(`verl/trainer/ppo/core_algos.py: compute_policy_loss_geo_mean`, its clip_ratio_low / clip_ratio_high
= the knobs `clip_low` / `clip_high` here; verl divides by |o_i| + 1e-8 where this divides by max(|o_i|, 1)).

Which prompt the log-probs are conditioned on is the caller's choice, so TA-GRPO's q0 ratio composes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.ratios import per_token_advantages
from regroup.config.fields import F, Knobs
from regroup.config.registry import POLICY_LOSSES


class GMPOArgs(Knobs):
    """`grpo.policy_loss_args` of `policy_loss: gmpo` (verl's clip_ratio_low / clip_ratio_high)."""

    clip_low: float = F(0.4, "A token's log ratio is clipped at -clip_low (paper: 0.4).", ge=0.0, le=20.0)
    clip_high: float = F(0.4, "A token's log ratio is clipped at +clip_high (paper: 0.4).", ge=0.0, le=20.0)


def gmpo_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """GMPO's sequence loss on every token of its response -> (loss [B, T], low [B, T], high [B, T]).

    The flags are verl's: a token whose log ratio the clamp moves, with A < 0 (low) or A > 0 (high).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"GMPO clip bounds must be >= 0, got low={clip_low}, high={clip_high}")
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    m = mask.to(logps.dtype)  # [B, T]
    n = m.sum(-1).clamp(min=1.0)  # [B]
    adv_t = per_token_advantages(advantages, logps).to(logps.dtype)  # [B, 1] or [B, T]
    adv = adv_t.squeeze(1) if advantages.dim() == 1 else (adv_t * m).sum(-1) / n  # [B] mean over the response (verl)
    sign = torch.sign(adv_t)  # [B, 1] or [B, T] the side each token's clip is pessimistic on
    lr = logps - old_logps  # [B, T]
    lr_clamped = torch.clamp(lr, -clip_low, clip_high)  # [B, T]
    lr_min = sign * torch.min(sign * lr, sign * lr_clamped)  # [B, T] pessimistic side per token
    s = torch.exp((lr_min * m).sum(-1) / n)  # [B] geometric mean of the clipped ratios
    loss = (-adv * s).unsqueeze(1).expand_as(logps)  # [B, T]
    clipped = lr.ne(lr_clamped)  # [B, T]
    return loss, clipped & (sign < 0), clipped & (sign > 0)  # [B, T] x2


@POLICY_LOSSES.register("gmpo", args=GMPOArgs)
def gmpo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: GMPOArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered form: the log-space clip is `args.clip_low` / `args.clip_high`."""
    return gmpo_loss(logps, old_logps, advantages, mask, args.clip_low, args.clip_high)


gmpo_policy_loss.ratio_level = "sequence"  # its KL correction and ratio metric use the response's ratio

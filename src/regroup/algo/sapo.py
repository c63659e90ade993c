"""SAPO: soft adaptive policy optimisation (Gao et al., arXiv 2511.20347, eq. 5–7).

A smooth gate replaces the hard clip: each token's ratio goes through a sigmoid whose temperature τ
depends on the sign of its advantage, so far-off-policy tokens are damped gradually, not cut:

    L_t = −(4/τ) · σ(τ (r_t − 1)) · A,      τ = τ_pos if A > 0 else τ_neg

At r = 1 the gate's value is 2/τ and its slope 1, so on-policy the gradient is the plain policy
gradient. This is TRL 1.16's `loss_type="sapo"` (`GRPOTrainer._compute_loss`, `sapo_temperature_pos` /
`sapo_temperature_neg`, defaults 1.0 / 1.05); TRL's sapo normalises like grpo
(`grpo.loss_agg=seq_mean_token_mean`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.ratios import importance_ratio, per_token_advantages
from regroup.config.fields import F, Knobs
from regroup.config.registry import POLICY_LOSSES


class SAPOArgs(Knobs):
    """`grpo.policy_loss_args` of `policy_loss: sapo` (TRL's `sapo_temperature_pos` / `_neg`)."""

    # >= 1e-6: the gate's scale 4/τ times a batch of tokens must stay far inside float32, where the loss is summed
    # (τ = 1e-37 passes > 0 and overflows it: every update NaN, and skipped)
    temperature_pos: float = F(1.0, "τ_pos: the gate's temperature where A > 0 (TRL's default).", ge=1e-6, le=1e3)
    temperature_neg: float = F(1.05, "τ_neg: the gate's temperature where A <= 0 (TRL's default).", ge=1e-6, le=1e3)


def sapo_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token SAPO loss -> (loss [B, T], low [B, T], high [B, T]); nothing is clipped, so both flags are False."""
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    adv = per_token_advantages(advantages, logps)  # [B, 1] or [B, T]
    ratio = importance_ratio(logps, old_logps)  # [B, T]
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(ratio.dtype)  # [B, 1] or [B, T]
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau  # [B, T]
    loss = -gate * adv  # [B, T]
    none = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)  # [B, T]
    return loss, none, none


@POLICY_LOSSES.register("sapo", args=SAPOArgs)
def sapo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: SAPOArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered form: τ_pos / τ_neg are `args.temperature_pos` / `_neg`."""
    return sapo_loss(logps, old_logps, advantages, args.temperature_pos, args.temperature_neg)

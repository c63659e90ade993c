"""The off-policy sequence mask, OPSM (DeepSeek-V3.2, arXiv 2512.02556 eq. 9; TRL 1.16's
`off_policy_mask_threshold`, `GRPOTrainer.get_off_policy_mask`).

A response with a negative advantage whose sampler drifted far from the current policy teaches mostly
noise; OPSM drops its policy-gradient term:

    keep_i = (A_i >= 0)  or  (1/|o_i|) Σ_t [log π_sampler(o_t) − log π_θ(o_t)] <= δ

The mean forward-KL estimate uses the sampler's log-probs when the backend gives them (vLLM: both the drift
from updates and the sampler-learner mismatch), else π_old; π_θ is detached. A NaN sampler log-prob (a
token the sampler could not score) counts 0, as TRL. Set with `grpo.off_policy_mask_threshold` (δ, e.g.
0.5); it multiplies the policy term of any policy loss, not the KL term.
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.loss_inputs import Mean, token_mean
from regroup.algo.ratios import per_token_advantages


@torch.no_grad()
def off_policy_mask(advantages: Tensor, logps: Tensor, sampler_logps: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """1.0 keep / 0.0 drop per response -> [B, 1] ([B, T] when the advantages are per token).

    `mask` [B, T] marks the tokens the mean KL is taken over (the on-policy loss tokens)."""
    if logps.shape != sampler_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, sampler_logps {tuple(sampler_logps.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    m = mask.bool()  # [B, T]
    kl = torch.nan_to_num(sampler_logps - logps.detach(), nan=0.0)  # [B, T]
    kl = torch.where(m, kl, torch.zeros_like(kl))  # [B, T] padding and anchors carry no evidence
    mean_kl = kl.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1).to(kl.dtype)  # [B, 1]
    adv = per_token_advantages(advantages, logps)  # [B, 1] or [B, T]
    return ((adv >= 0) | (mean_kl <= threshold)).to(logps.dtype)  # [B, 1] or [B, T]


def apply_off_policy_mask(
    pg: Tensor, advantages: Tensor, logps: Tensor, sampler_logps: Tensor, on_policy: Tensor, threshold: float
) -> tuple[Tensor, dict[str, Mean]]:
    """The policy term [B, T] times OPSM's keep mask (`off_policy_mask` against `sampler_logps`); metric
    `off_policy/masked_frac`: the share of on-policy tokens it dropped."""
    keep = off_policy_mask(advantages, logps, sampler_logps, on_policy, threshold)  # [B, 1] or [B, T]
    return pg * keep, {"off_policy/masked_frac": token_mean(1.0 - keep, on_policy)}

"""VESPO: variational sequence-level soft policy optimisation (arXiv 2602.10693), TRL 1.16's `loss_type="vespo"`.

Hard clipping is replaced by a smooth, asymmetric gamma weight of the response's importance ratio
`w_i = Π_t π_θ/π_old` (a product over the response's tokens, not GSPO's geometric mean), applied to a
REINFORCE term, detached:

    φ(w) = e^λ · w^k · e^{−λw}       (normalised so that φ(1) = 1; computed in log space)
    L_t  = −sg(φ(w_i)) · A · log π_θ(o_t)
    (k, λ) = (k_pos, λ_pos) where A >= 0, else (k_neg, λ_neg)

k sets how fast responses with w < 1 are down-weighted, λ how fast those with w > 1 are. As TRL
(`GRPOTrainer.get_gamma_weights`): the per-token log ratios are clamped to [−20, 20] before the sum, log w to
[log 1e-8, 20], λ to >= 1e-4, and a NaN / inf φ becomes 0. A sampler IS weight (`rollout.tis_cap`) is
folded into w (log w += Σ_t log clamp(IS_t)) instead of multiplying the loss, as TRL does for vespo;
TRL normalises vespo like dapo (`grpo.loss_agg=token_mean`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from regroup.algo.ratios import per_token_advantages
from regroup.config.fields import F, Knobs
from regroup.config.registry import POLICY_LOSSES

LOG_RATIO_CLAMP = 20.0  # TRL: clamp(log_ratio_per_token, -20, 20)
LOG_W_MIN = math.log(1e-8)  # TRL: log w >= log(1e-8)
LAMBDA_MIN = 1e-4  # TRL: lambda_seq.clamp(min=1e-4)


class VESPOArgs(Knobs):
    """`grpo.policy_loss_args` of `policy_loss: vespo` (TRL's `vespo_k_pos` ... `vespo_lambda_neg`)."""

    k_pos: float = F(2.0, "k where A >= 0: the power that down-weights responses with w < 1.", ge=0.0, le=100.0)
    lambda_pos: float = F(3.0, "λ where A >= 0: the decay that down-weights responses with w > 1.", ge=0.0, le=100.0)
    k_neg: float = F(3.0, "k where A < 0.", ge=0.0, le=100.0)
    lambda_neg: float = F(2.0, "λ where A < 0.", ge=0.0, le=100.0)


@torch.no_grad()
def gamma_weight(
    log_ratio: Tensor, mask: Tensor, advantages: Tensor, args: VESPOArgs, is_weight: Tensor | None = None
) -> Tensor:
    """φ(w) per response -> [B, 1] ([B, T] when the advantages are per token), detached (module docstring).

    `log_ratio` [B, T] is log π_θ − log π_old, `mask` [B, T] the tokens summed, `is_weight` ([B, T] or
    [B, 1], None: none) the sampler IS weight folded into w.
    """
    m = mask.to(log_ratio.dtype)  # [B, T]
    seq = (torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * m).sum(-1, keepdim=True)  # [B, 1]
    if is_weight is not None:
        log_is = torch.clamp(torch.log(is_weight.to(log_ratio.dtype)), LOG_W_MIN, LOG_RATIO_CLAMP)  # [B, T] or [B, 1]
        seq = seq + (log_is * m if log_is.shape == m.shape else log_is).sum(-1, keepdim=True)  # [B, 1]
    log_w = torch.clamp(seq, LOG_W_MIN, LOG_RATIO_CLAMP)  # [B, 1]
    w = torch.exp(log_w)  # [B, 1]
    adv = per_token_advantages(advantages, log_ratio)  # [B, 1] or [B, T]
    nonneg = adv >= 0  # [B, 1] or [B, T]
    k = torch.where(nonneg, args.k_pos, args.k_neg).to(log_ratio.dtype)  # [B, 1] or [B, T]
    lam = torch.where(nonneg, args.lambda_pos, args.lambda_neg).to(log_ratio.dtype).clamp(min=LAMBDA_MIN)
    log_phi = lam + k * log_w - lam * w  # [B, 1] or [B, T]
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    args: VESPOArgs,
    is_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token VESPO loss −φ(w)·A·log π_θ -> (loss [B, T], low [B, T], high [B, T]); nothing is clipped."""
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    adv = per_token_advantages(advantages, logps).to(logps.dtype)  # [B, 1] or [B, T]
    phi = gamma_weight(logps.detach() - old_logps, mask, advantages, args, is_weight)  # [B, 1] or [B, T]
    loss = -phi * adv * logps  # [B, T]
    none = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)  # [B, T]
    return loss, none, none


@POLICY_LOSSES.register("vespo", args=VESPOArgs)
def vespo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: VESPOArgs, is_weight=None
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered form: φ over the `mask` (on-policy) tokens, with the sampler IS weight folded in."""
    return vespo_loss(logps, old_logps, advantages, mask, args, is_weight)


vespo_policy_loss.folds_is_weight = True  # policy_loss passes is_weight= and does not multiply the loss by it

"""GSPO's sequence-level importance ratio and clipping (Zheng et al., arXiv 2507.18071, eq. 5–7).

`s_i(θ) = (π_θ(o_i|q) / π_old(o_i|q))^(1/|o_i|) = exp( (1/|o_i|) Σ_t log π_θ(o_{i,t}) − log π_old(o_{i,t}) )`,
and the loss of response i is `−min(s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i)`, carried by each of its
tokens, so the usual aggregation modes apply. This is TRL's `importance_sampling_level="sequence"`; its
knob `delta` caps s_i from above as PPO clip's does (`regroup.algo.ppo_clip.ClipArgs`).

Which prompt the log-probs are conditioned on is the caller's choice, so TA-GRPO's q0-anchored ratio
(SPEC §3.4) composes: pass log-probs computed on (q0, o).
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.ppo_clip import ClipArgs
from regroup.algo.ratios import clip_ratio
from regroup.config.registry import POLICY_LOSSES


def sequence_log_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """Mean per-token log ratio over each response's `mask` tokens -> [B, 1] (0 for a response with none)."""
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    m = mask.to(logps.dtype)  # [B, T]
    diff = torch.where(mask.bool(), logps - old_logps, torch.zeros_like(logps))  # [B, T]
    return (diff.sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [B, 1]


def sequence_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """GSPO's `s_i` -> [B, 1]."""
    return torch.exp(sequence_log_ratio(logps, old_logps, mask))  # [B, 1]


def sequence_clipped_pg_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token GSPO loss `−min(s·A, clip(s)·A)` broadcast over the response -> ([B, T], low [B, T], high [B, T]).

    `advantages` is [B]. The clip flags follow TRL (low: s < 1−ε_low and A < 0; high: s > 1+ε_high and A > 0)
    and are the response's flag on each of its tokens. `delta` (None: off) caps the unclipped s (TRL's delta).
    """
    if advantages.dim() != 1 or advantages.shape[0] != logps.shape[0]:
        raise ValueError(f"GSPO needs one advantage per response [B={logps.shape[0]}], got {tuple(advantages.shape)}")
    adv = advantages.unsqueeze(1).to(logps.dtype)  # [B, 1]
    s = sequence_ratio(logps, old_logps, mask)  # [B, 1]
    clipped = clip_ratio(s, eps_low, eps_high)  # [B, 1]
    if delta is not None:
        s = torch.clamp(s, max=delta)  # [B, 1] two-sided clip, as TRL applies it at the sequence level
    loss = -torch.min(s * adv, clipped * adv)  # [B, 1]
    is_low = (s < 1.0 - eps_low) & (adv < 0)  # [B, 1]
    is_high = (s > 1.0 + eps_high) & (adv > 0)  # [B, 1]
    shape = logps.shape
    return loss.expand(shape), is_low.expand(shape), is_high.expand(shape)


@POLICY_LOSSES.register("gspo", args=ClipArgs)
def gspo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: ClipArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered GSPO loss: `sequence_clipped_pg_loss` over the `mask` (on-policy) tokens, the
    `spec.grpo.eps_*` clip."""
    return sequence_clipped_pg_loss(
        logps, old_logps, advantages, mask, spec.grpo.eps_low, spec.grpo.eps_high, args.delta
    )


gspo_policy_loss.ratio_level = "sequence"  # its KL correction and ratio metric use s_i

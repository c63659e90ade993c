"""Importance-sampling correction for the sampler not being π_old (vLLM, a stale rollout worker).

The loss assumes responses were sampled from π_old; a sampler whose log-probs π_s differ (another
kernel, another precision) biases it. The correction multiplies each on-policy token's policy-gradient
term by a detached weight built from `π_old/π_s` (Yao et al., "Your efficient RL framework secretly
brings you off-policy RL training", 2025 — truncated IS; TRL's `vllm_importance_sampling_mode`):

| mode                | weight                                                                  | shape  |
|---------------------|-------------------------------------------------------------------------|--------|
| `token_truncate`    | `clamp(π_old/π_s, min, cap)` per token                                  | [B, T] |
| `token_mask`        | `π_old/π_s` per token, 0 where it is outside `[min, cap]`                | [B, T] |
| `sequence_truncate` | `clamp(Π_t π_old/π_s, min, cap)`, one per response                      | [B, 1] |
| `sequence_mask`     | `Π_t π_old/π_s`, 0 for a response whose product is outside `[min, cap]` | [B, 1] |

This is TRL 1.16's `GRPOTrainer._generate_and_score_completions` computation (`importance_sampling_ratio`)
with `vllm_importance_sampling_clip_max = cap` and `_clip_min = min` (None: unbounded below). A NaN
sampler log-prob (a token the sampler could not score) contributes ratio 1, as in TRL. The sequence
ratio is the product over the response's `mask` tokens (TRL sums the log differences, it does not
average them as GSPO's ratio does).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@torch.no_grad()
def sampler_is_weight(
    old_logps: Tensor, sampler_logps: Tensor, mask: Tensor | None, mode: str, cap: float, floor: float | None = None
) -> Tensor:
    """The detached IS weight of `mode` (module table) -> [B, T] (token modes) or [B, 1] (sequence modes).

    `mask` [B, T] marks the response tokens (needed by the sequence modes; None: every position counts);
    `cap` > 0 is the upper bound, `floor` (None: none) the lower one.
    """
    if mode not in IS_MODES:
        raise ValueError(f"IS mode must be one of {IS_MODES}, got {mode!r}")
    if old_logps.shape != sampler_logps.shape:
        raise ValueError(
            f"sampler_logps shape {tuple(sampler_logps.shape)} does not match old_logps {tuple(old_logps.shape)}"
        )
    if not cap > 0:
        raise ValueError(f"IS cap must be > 0, got {cap}")
    if floor is not None and not floor < cap:
        raise ValueError(f"IS floor ({floor}) must be < the cap ({cap})")
    diff = old_logps - sampler_logps  # [B, T]
    if mask is not None:
        diff = diff * mask.to(diff.dtype)  # [B, T] (NaN·0 stays NaN: cleared next)
    diff = torch.nan_to_num(diff, nan=0.0)  # [B, T]
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)  # [B, 1] log of the product over the response
    ratio = torch.exp(diff)  # [B, T] or [B, 1]
    if mode.endswith("truncate"):
        return ratio.clamp(min=floor, max=cap)
    low = -math.inf if floor is None else floor
    return ratio.masked_fill((ratio < low) | (ratio > cap), 0.0)

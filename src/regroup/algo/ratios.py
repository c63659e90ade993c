"""Token-level importance ratios π_θ/π_old and PPO clipping (the sampler-mismatch correction is
`regroup.algo.loss_inputs.sampler_is_weight`).

Which prompt the log-probs are conditioned on (TA-GRPO's anchored-on-q0 ratio, SPEC §3.4, versus each
response on its own prompt) is decided by the caller that computes `logps` / `old_logps`; the ratio
math here is the same for both.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} shape {tuple(a.shape)} does not match {name_b} shape {tuple(b.shape)}")


def per_token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages [B] (one per response) or [B, T] broadcastable against a [B, T] tensor -> [B, 1] or [B, T]."""
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages [B={advantages.shape[0]}] do not match logps batch size {like.shape[0]}")
        return advantages.unsqueeze(1)  # [B, 1]
    if advantages.shape != like.shape:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B] or {tuple(like.shape)}")
    return advantages  # [B, T]


def log_ratio(logps: Tensor, old_logps: Tensor) -> Tensor:
    """Per-token log importance ratio `log π_θ − log π_old`  -> [B, T]."""
    _check_same_shape(logps, old_logps, "logps", "old_logps")
    return logps - old_logps  # [B, T]


def importance_ratio(logps: Tensor, old_logps: Tensor) -> Tensor:
    """Per-token importance ratio `π_θ / π_old = exp(logps − old_logps)`  -> [B, T] (SPEC notation)."""
    return torch.exp(log_ratio(logps, old_logps))  # [B, T]


def clip_ratio(ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """PPO clipping `clip(ratio, 1 − eps_low, 1 + eps_high)` (SPEC §1; eps_high > eps_low is DAPO clip-higher); the
    epsilons' bounds are the config's (`grpo.eps_low` / `grpo.eps_high`), checked once when it loads."""
    return torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)

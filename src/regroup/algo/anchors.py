"""Tensor math for off-policy anchor tokens (DaGRPO §2b.3): LUFFY policy shaping and the plain ratio.

Anchor tokens were forced, not sampled from π_old, so the PPO ratio is undefined for them. Only the
per-token objectives live here; where anchors come from (reference solutions, a self-bootstrapped
buffer) is not tensor math and lives elsewhere.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from regroup.algo.loss_inputs import Mean, token_mean
from regroup.config.schema import AnchorConfig


def _adv_per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """Broadcast advantages [B] (or [B, T]) against a [B, T] tensor."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]


def shaped_objective(logps: Tensor, gamma: float = 0.1) -> Tensor:
    """Policy-shaping function `f(p) = p / (p + γ)` of the token probability `p = exp(logps)`  -> [B, T].

    Computed as `sigmoid(logp − log γ)`, which is the same value without overflow or 0/0 for tiny p.
    Its derivative w.r.t. logp is `γ·p / (p + γ)²`: it boosts the gradient of low-probability tokens
    (LUFFY, SPEC §2b.3). γ > 0 is `anchors.gamma`'s bound, checked once when the config loads.
    """
    return torch.sigmoid(logps - math.log(gamma))  # [B, T]


def shaped_pg_loss(logps: Tensor, advantages: Tensor, gamma: float = 0.1) -> Tensor:
    """Per-token anchor loss with policy shaping, `−A · p / (p + γ)`, no clipping (SPEC §2b.3)  -> [B, T]."""
    return -_adv_per_token(advantages, logps) * shaped_objective(logps, gamma)  # [B, T]


def plain_anchor_pg_loss(logps: Tensor, advantages: Tensor) -> Tensor:
    """Per-token anchor loss with `π_old := stop_grad(π_θ)`: `−A · exp(logp − sg(logp))`  -> [B, T].

    Its value is `−A` and its gradient `−A · ∇logp` (REINFORCE on the forced tokens) — SPEC §2b.3
    alternative `anchor_ratio="plain"`.
    """
    return -_adv_per_token(advantages, logps) * torch.exp(logps - logps.detach())  # [B, T]


def anchor_term(
    pg: Tensor, logps: Tensor, advantages: Tensor, anchor_tokens: Tensor, anchors: AnchorConfig
) -> tuple[Tensor, dict[str, Mean]]:
    """The policy term [B, T] with its anchor tokens' loss replaced (SPEC §2b.3): `anchors.ratio: shaped` gives
    `−A·p/(p+γ)` with γ = `anchors.gamma` (LUFFY, no clipping), `plain` gives `−A·exp(logp − sg(logp))`.
    `anchor_tokens` [B, T]: the forced (off-policy) loss tokens. Metrics `anchor/logp_mean` and `anchor/prob_mean`
    over them."""
    if anchor_tokens.shape != pg.shape:
        raise ValueError(
            f"anchor_token_mask shape {tuple(anchor_tokens.shape)} does not match loss_mask {tuple(pg.shape)}"
        )
    if anchors.ratio == "shaped":
        loss = shaped_pg_loss(logps, advantages, anchors.gamma)  # [B, T]
    else:
        loss = plain_anchor_pg_loss(logps, advantages)  # [B, T]
    metrics = {
        "anchor/logp_mean": token_mean(logps, anchor_tokens),
        "anchor/prob_mean": token_mean(logps.detach().exp(), anchor_tokens),
    }
    return torch.where(anchor_tokens, loss, pg), metrics

"""LUSPO: length-unbiased sequence policy optimisation (arXiv 2602.05261), TRL 1.16's `loss_type="luspo"`.

GSPO's sequence loss (`regroup.algo.gspo`, its length-normalised ratio s_i and clip) scaled by the
response's length, so that a long response weighs as much per token as a short one once the loss is
averaged per response:

    L_i = |o_i| · (−min(s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i))      on each token of response i

With `grpo.loss_agg=seq_mean_token_mean` the aggregate is `Σ_i |o_i|·ℓ_i / B`, TRL's luspo normaliser
(`(per_token_loss * mask).sum(-1).mean()`). Its knob `delta` is PPO clip's two-sided clip
(`regroup.algo.ppo_clip.ClipArgs`). One difference, by design: with β > 0 TRL sums the KL term over each
response's tokens too (luspo's aggregation applies to the whole per-token loss); here the KL term keeps
`grpo.loss_agg`'s per-response mean, so the two agree for β = 0 (docs/losses.md).
"""

from __future__ import annotations

from torch import Tensor

from regroup.algo.gspo import sequence_clipped_pg_loss
from regroup.algo.ppo_clip import ClipArgs
from regroup.config.registry import POLICY_LOSSES


def luspo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO's per-token loss times the response's `mask` length -> (loss [B, T], low [B, T], high [B, T])."""
    loss, is_low, is_high = sequence_clipped_pg_loss(logps, old_logps, advantages, mask, eps_low, eps_high, delta)
    length = mask.to(loss.dtype).sum(-1, keepdim=True)  # [B, 1] |o_i|
    return loss * length, is_low, is_high  # [B, T]


@POLICY_LOSSES.register("luspo", args=ClipArgs)
def luspo_policy_loss(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, spec, args: ClipArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """The registered form: `spec.grpo.eps_*` clip, `args.delta`, |o_i| counted over the `mask` (on-policy) tokens."""
    return luspo_loss(logps, old_logps, advantages, mask, spec.grpo.eps_low, spec.grpo.eps_high, args.delta)


luspo_policy_loss.ratio_level = "sequence"  # its KL correction and ratio metric use s_i, as GSPO's

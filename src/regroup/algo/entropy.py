"""Entropy bonus: `−c · mean_t H(π_θ(·|o_<t))`, pushing against entropy collapse (e.g. Skywork-OR1,
arXiv 2505.22312 §3.2; TRL 1.16's `entropy_coef`).

The term is the negative per-token entropy of the policy at each loss token, aggregated as a plain
token mean over the whole batch whatever `grpo.loss_agg` is, which is TRL's documented objective
`L = L_policy − entropy_coef · H` (`GRPOTrainer._compute_loss`: "the bonus is always the mean per-token
entropy regardless of loss_type"). TRL takes that mean per micro-batch; here it is the whole batch's,
so it does not depend on the micro-batch split (equal to TRL's for one micro-batch).

The entropy must be differentiable, so the trainer asks `regroup.models.logprobs.response_logps` for it with
`entropy_grad=True` only when a term `needs_entropy`; otherwise entropy stays a detached metric.
"""

from __future__ import annotations

from torch import Tensor

from regroup.config.registry import LOSS_TERMS


@LOSS_TERMS.register("entropy")
def entropy_bonus(t) -> Tensor:
    """`−H` per token [B, T] from `t.entropy` (a `regroup.algo.loss_terms.TermInputs`); its coefficient is the bonus."""
    if t.entropy is None:
        raise ValueError("the entropy term needs LossInputs.entropy (response_logps(..., entropy_grad=True))")
    return -t.entropy  # [B, T]


entropy_bonus.needs_entropy = True  # the trainer then computes a differentiable entropy
entropy_bonus.agg = "token_mean"  # TRL: a mean over tokens whatever the policy loss's aggregation

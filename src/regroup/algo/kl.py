"""Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_old (Schulman, "Approximating KL divergence",
2020; SPEC §1 uses k3). Each is `(logps[B, T], ref_logps[B, T]) -> [B, T]`, registered on `KL_ESTIMATORS`
and chosen by `grpo.kl_estimator`.

With `r = π_ref/π_θ` and `log r = ref − logp`:
- k1 `−log r`: unbiased, high variance, can be negative;
- k2 `½ (log r)²`: biased, low variance; its gradient is the right one for the reverse KL;
- k3 `r − log r − 1`: unbiased, ≥ 0 (TRL's and SPEC §1's);
- low_var_kl: k3 of the log ratio clamped to [−20, 20], then clamped to [−10, 10] — verl 0.9.1's
  `kl_penalty(..., "low_var_kl")` (`verl/trainer/ppo/core_algos.py: kl_penalty_forward`), so a token
  where the two models disagree wildly cannot produce an inf or a huge gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.loss_inputs import Mean, token_mean
from regroup.algo.loss_spec import LossSpec
from regroup.config.registry import KL_ESTIMATORS

LOW_VAR_LOG_RATIO_CLAMP = 20.0  # verl: kl = clamp(ref − logp, −20, 20)
LOW_VAR_KL_CLAMP = 10.0  # verl: clamp(k3, −10, 10)


def _check(logps: Tensor, ref_logps: Tensor) -> None:
    if logps.shape != ref_logps.shape:
        raise ValueError(f"ref_logps shape {tuple(ref_logps.shape)} does not match logps {tuple(logps.shape)}")


@KL_ESTIMATORS.register("k1")
def kl_k1(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k1 = `logp − ref` per token -> [B, T] (verl "k1" / "kl")."""
    _check(logps, ref_logps)
    return logps - ref_logps  # [B, T]


@KL_ESTIMATORS.register("k2")
def kl_k2(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k2 = `½ (logp − ref)²` per token -> [B, T] (verl "k2" / "mse")."""
    _check(logps, ref_logps)
    return 0.5 * (logps - ref_logps).square()  # [B, T]


@KL_ESTIMATORS.register("k3")
def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) per token, `exp(ref − logp) − (ref − logp) − 1` -> [B, T] (SPEC §1)."""
    _check(logps, ref_logps)
    d = ref_logps - logps  # [B, T]
    return torch.exp(d) - d - 1.0  # [B, T]


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """verl's `low_var_kl`: k3 on the clamped log ratio, clamped -> [B, T] (module docstring)."""
    _check(logps, ref_logps)
    d = torch.clamp(ref_logps - logps, min=-LOW_VAR_LOG_RATIO_CLAMP, max=LOW_VAR_LOG_RATIO_CLAMP)  # [B, T]
    return torch.clamp(torch.exp(d) - d - 1.0, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)  # [B, T]


def kl_term(
    logps: Tensor, ref_logps: Tensor, loss_mask: Tensor, spec: LossSpec, ratio: Tensor
) -> tuple[Tensor | None, dict[str, Mean]]:
    """`β · KL(π_θ ‖ π_ref)` per token [B, T] with the spec's estimator (`grpo.kl_estimator`, default k3), or None when
    β is 0. With `grpo.kl_ratio_correction` it is multiplied by the differentiable `ratio` π_θ/π_old of the policy's
    level ([B, T], or [B, 1] for a sequence-level policy): the unbiased reverse-KL gradient from π_old's samples
    (DeepSeek-V3.2; TRL's use_bias_correction_kl). Metric `kl`: the mean estimate over the loss tokens."""
    if ref_logps.shape != logps.shape:
        raise ValueError(f"ref_logps shape {tuple(ref_logps.shape)} does not match logps {tuple(logps.shape)}")
    kl = spec.kl.fn(logps, ref_logps, **spec.kl.kwargs)  # [B, T]
    metrics = {"kl": token_mean(kl, loss_mask)}
    if spec.grpo.beta == 0.0:
        return None, metrics
    term = spec.grpo.beta * kl  # [B, T]
    if spec.grpo.kl_ratio_correction:
        term = term * ratio  # [B, T]
    return term, metrics

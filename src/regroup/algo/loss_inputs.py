"""Every input of the loss besides π_θ, built in one place from tensors: π_old, the behaviour log-probs, the
sampler IS weight and OPSM's sampler log-probs (`build_loss_inputs`). A front-end runs the forward passes
(π_θ, a recomputed π_old, π_ref) and hands the tensors here; `regroup.algo.losses.policy_loss` reads the
result. Plain tensors in and out, so a front-end that captures them elsewhere (another trainer's step)
builds the same inputs.

The rules, per micro-batch of b rows and T response tokens:

- π_old: the recomputed log-probs when given, else π_θ detached (one pass over one mini-batch: ratio 1,
  as TRL); with `old_from_sampler` (`rollout.async_correction=behaviour`) the sampler's own log-probs on
  the tokens it drew and scored with a finite value, π_old elsewhere;
- the IS weight: `sampler_is_weight(π_old, π_sampler)` (the table below) on the rows the sampler scored
  on the learner's prompt, 1 on other rows; None when `rollout.tis_cap` is 0;
- OPSM's sampler log-probs: the sampler's own, NaN included (an unscored token adds 0 to the mean KL, as
  in TRL's `get_off_policy_mask`), on the rows the sampler scored on the learner's prompt, π_old on other
  rows; None when OPSM is off.

The sampler IS weight corrects for the sampler not being π_old (vLLM, a stale rollout worker): each
on-policy token's policy-gradient term is multiplied by a detached weight built from π_old/π_s (Yao et
al., "Your efficient RL framework secretly brings you off-policy RL training", 2025 — truncated IS; TRL's
`vllm_importance_sampling_mode`):

| mode                | weight                                                                  | shape  |
|---------------------|-------------------------------------------------------------------------|--------|
| `token_truncate`    | `clamp(π_old/π_s, min, cap)` per token                                  | [B, T] |
| `token_mask`        | `π_old/π_s` per token, 0 where it is outside `[min, cap]`                | [B, T] |
| `sequence_truncate` | `clamp(Π_t π_old/π_s, min, cap)`, one per response                      | [B, 1] |
| `sequence_mask`     | `Π_t π_old/π_s`, 0 for a response whose product is outside `[min, cap]` | [B, 1] |

This is TRL 1.16's `GRPOTrainer._generate_and_score_completions` computation (`importance_sampling_ratio`)
with `vllm_importance_sampling_clip_max = cap` and `_clip_min = min` (None: unbounded below). A NaN
sampler log-prob contributes ratio 1, as in TRL. The sequence ratio is the product over the response's
`mask` tokens (TRL sums the log differences, it does not average them as GSPO's ratio does).

It also holds `LossInputs` (what `policy_loss` reads besides the log-probs) and `Mean`, the form of every loss
metric: the core and each modifier report theirs as a sum and a count, so micro-batches and processes combine
exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from regroup.algo.loss_spec import LossSpec

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class LossInputs:
    """The tensors of one micro-batch the loss reads besides the log-probs."""

    advantages: Tensor  # [B] or [B, T]
    loss_mask: Tensor  # [B, T] 1 on response tokens
    ref_logps: Tensor | None = None  # [B, T] frozen reference (needed when beta != 0)
    sample_weight: Tensor | None = None  # [B] masks and weights (normaliser NOT reduced)
    anchor_token_mask: Tensor | None = None  # [B, T] forced off-policy (anchor) tokens
    is_weight: Tensor | None = None  # [B, T] or [B, 1] detached IS weight of sampler mismatch
    entropy: Tensor | None = None  # [B, T] policy entropy (differentiable when a term needs it)
    sampler_logps: Tensor | None = None  # [B, T] behaviour log-probs for OPSM (None: π_old stands in)


class Mean(NamedTuple):
    """A metric of one micro-batch as a sum and the number `n` of tokens (or rows) it is a mean over, so that
    micro-batches and processes combine exactly (Σ total / Σ n); `item()` is this micro-batch's mean (0 when n is
    0)."""

    total: Tensor
    n: Tensor

    def item(self) -> float:
        return float(self.total) / max(float(self.n), 1.0)


def token_mean(values: Tensor, where: Tensor) -> Mean:
    """The `Mean` of `values` [B, T] (or [B, 1], broadcast) over the tokens `where` [B, T] is True, detached."""
    where = where.bool()
    values = values.detach().expand(where.shape)
    if not values.is_floating_point():  # clip flags: a share of the tokens
        values = values.to(torch.get_default_dtype())
    return Mean(torch.where(where, values, torch.zeros_like(values)).sum(), where.sum().to(values.dtype))


def build_loss_inputs(
    spec: LossSpec,
    logps: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    old_logps: Tensor | None = None,
    sampler_logps: Tensor | None = None,
    sampler_rows: Tensor | None = None,
    sampled_mask: Tensor | None = None,
    old_from_sampler: bool = False,
    ref_logps: Tensor | None = None,
    sample_weight: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossInputs]:
    """`(π_old [b, T], LossInputs)` of one micro-batch, for `policy_loss(logps, π_old, inputs, spec, totals)`.

    - `logps` [b, T]: π_θ (only read detached, as π_old when `old_logps` is None);
    - `advantages` [b] or [b, T]; `loss_mask` [b, T] 1 on response tokens;
    - `old_logps` [b, T]: π_old recomputed before the first update (None: π_θ detached);
    - `sampler_logps` [b, T]: the sampler's own log-probs, NaN where it could not score a token (None:
      the sampler gave none); `sampler_rows` [b] bool: the rows they compare with the learner's (sampled
      by the engine on the prompt the learner scores; None: every row);
    - `sampled_mask` [b, T] bool: tokens the sampler drew; a loss token it did not draw is an anchor
      (forced, off-policy) token (None: every loss token was sampled);
    - `old_from_sampler`: π_old is the sampler's log-probs where it scored (the module table);
    - `ref_logps` [b, T], `sample_weight` [b], `entropy` [b, T] pass through.
    """
    old = logps.detach() if old_logps is None else old_logps  # [b, T]
    anchors = None
    if sampled_mask is not None:
        forced = loss_mask.bool() & ~sampled_mask  # [b, T]
        anchors = forced if bool(forced.any()) else None
    is_weight = opsm_logps = None
    cap, opsm = spec.rollout.tis_cap, spec.grpo.off_policy_mask_threshold
    if sampler_logps is not None and (old_from_sampler or cap > 0 or opsm is not None):
        rows = torch.ones(len(old), dtype=torch.bool, device=old.device) if sampler_rows is None else sampler_rows
        rows = rows[:, None]  # [b, 1]
        if bool(rows.any()):
            sampler = sampler_logps.to(old.dtype)  # [b, T]
            if old_from_sampler:
                drawn = rows if sampled_mask is None else rows & sampled_mask  # [b, T]
                old = torch.where(drawn & sampler.isfinite(), sampler, old)  # [b, T]
            if cap > 0:
                weight = sampler_is_weight(
                    old, sampler, loss_mask, spec.rollout.is_mode, cap, spec.rollout.is_min or None
                )
                is_weight = torch.where(rows, weight, torch.ones_like(weight))  # [b, T] or [b, 1]
            if opsm is not None:
                opsm_logps = torch.where(rows, sampler, old)  # [b, T], NaN kept: no KL evidence (TRL)
    inputs = LossInputs(
        advantages=advantages,
        loss_mask=loss_mask,
        ref_logps=ref_logps,
        sample_weight=sample_weight,
        anchor_token_mask=anchors,
        is_weight=is_weight,
        entropy=entropy,
        sampler_logps=opsm_logps,
    )
    return old, inputs


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


def truncated_is_weight(old_logps: Tensor, behaviour_logps: Tensor, cap: float) -> Tensor:
    """Truncated importance weight `min(π_old / π_behaviour, cap)` per token, detached  -> [B, T]: the
    `token_truncate` mode of `sampler_is_weight` over every position (TRL's default mode, verl's TIS)."""
    return sampler_is_weight(old_logps, behaviour_logps, None, "token_truncate", cap)  # [B, T]


def apply_is_weight(
    pg: Tensor, is_weight: Tensor, on_policy: Tensor, *, folded: bool
) -> tuple[Tensor, dict[str, Mean]]:
    """The policy term [B, T] times the IS weight ([B, T] or [B, 1]) on the on-policy tokens (anchor tokens were not
    sampled and keep theirs); unchanged when the policy `folded` the weight into its own loss (VESPO). Metric
    `is_weight/mean` over the on-policy tokens."""
    if is_weight.shape not in (on_policy.shape, (on_policy.shape[0], 1)):
        raise ValueError(
            f"is_weight shape {tuple(is_weight.shape)} must be [B, T] = {tuple(on_policy.shape)} or [B, 1]"
        )
    weight = is_weight.detach()
    if not folded:
        pg = torch.where(on_policy, pg * weight, pg)  # [B, T]
    return pg, {"is_weight/mean": token_mean(weight, on_policy)}

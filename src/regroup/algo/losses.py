"""The policy loss of one micro-batch: a short core plus named modifiers (SPEC §1, §2a.4, §2b.3).

The core, `policy_loss`: the importance ratio → the policy term (the spec's policy loss: PPO-clip by default, GSPO,
CISPO, SAPO, GMPO, VESPO, LUSPO or a user's) → aggregation with whole-batch totals. Each modifier is a function a
reader opens on its own, and reports its own metrics:

| modifier                        | where                             | on when                                  |
|---------------------------------|-----------------------------------|------------------------------------------|
| OPSM keep mask                  | `off_policy_mask.apply_off_policy_mask` | `grpo.off_policy_mask_threshold` set |
| sampler IS weight               | `loss_inputs.apply_is_weight`     | `rollout.tis_cap > 0`                    |
| anchor tokens' shaped term      | `anchors.anchor_term`             | a row holds anchor tokens (DaGRPO)       |
| sample weights (DaGRPO masks)   | `weighted` below                  | the batch carries weights                |
| β·KL and its ratio correction   | `kl.kl_term`                      | a reference is given (β > 0 adds it)     |
| extra terms (entropy, a user's) | `loss_terms.extra_terms`          | `grpo.loss_terms`, `grpo.entropy_coef`   |

Aggregation normalisers are totals over the WHOLE optimizer batch (all micro-batches, all ranks), passed in by the
caller, so that the sum of micro-batch losses (and so of their gradients) equals the loss of the full batch,
whatever the micro-batch split. With one micro-batch the three modes are TRL's `loss_type` "dapo", "grpo" and
"dr_grpo" (`TRL_LOSS_TYPES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from regroup.algo.anchors import anchor_term
from regroup.algo.gspo import sequence_ratio
from regroup.algo.kl import kl_term
from regroup.algo.loss_inputs import LossInputs, Mean, apply_is_weight, token_mean
from regroup.algo.loss_spec import LossSpec
from regroup.algo.loss_terms import TermInputs, extra_terms
from regroup.algo.off_policy_mask import apply_off_policy_mask

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_constant")
# regroup aggregation mode -> the TRL GRPOTrainer `loss_type` that computes the same loss.
TRL_LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_sum_constant": "dr_grpo"}


@dataclass(frozen=True)
class LossTotals:
    """Whole-optimizer-batch normalisers (all micro-batches, all processes)."""

    total_tokens: float
    total_sequences: int
    max_completion_length: int


def policy_loss(
    logps: Tensor, old_logps: Tensor, inputs: LossInputs, spec: LossSpec, totals: LossTotals
) -> tuple[Tensor, dict[str, Mean]]:
    """The GRPO / DaGRPO / TA-GRPO loss of one micro-batch, aggregated with whole-batch totals -> (loss, metrics).

    Per loss token: the policy term on tokens sampled from π_old (OPSM's mask and the IS weight applied when on),
    the anchors' shaped term on forced tokens, times the row's sample weight (the normalisers are NOT reduced for a
    masked row, SPEC §2a.4); plus β·KL on every loss token; then `aggregate` with `grpo.loss_agg`; plus the extra
    terms. Metrics are `Mean`s over this micro-batch: `clip/low_frac`, `clip/high_frac`, `clip/frac`,
    `ratio/mean`, `entropy` (over the on-policy tokens), `pg_loss` (per loss token), and each modifier's own.
    """
    advantages, mask = inputs.advantages, inputs.loss_mask.bool()  # [B] or [B, T], [B, T]
    check_shapes(logps, old_logps, advantages, mask, inputs, spec)
    anchors = None if inputs.anchor_token_mask is None else inputs.anchor_token_mask.bool() & mask  # [B, T]
    on_policy = mask if anchors is None else mask & ~anchors  # [B, T] tokens sampled from π_old
    # π_old is undefined on anchor and padding tokens: π_θ there (ratio 1), so no inf/NaN reaches backward.
    old = torch.where(on_policy, old_logps, logps.detach())  # [B, T]
    # The ratio is differentiable only for the KL's ratio correction; otherwise it is a metric and builds no graph.
    ratio_of = logps if spec.grpo.kl_ratio_correction else logps.detach()
    ratio = policy_ratio(ratio_of, old, on_policy, spec.ratio_level)  # [B, T] or [B, 1]
    is_weight = inputs.is_weight

    pg, low, high = policy_term(logps, old, advantages, on_policy, spec, is_weight)  # [B, T] x3
    metrics = {
        "clip/low_frac": token_mean(low, on_policy),
        "clip/high_frac": token_mean(high, on_policy),
        "clip/frac": token_mean(low | high, on_policy),
        "ratio/mean": token_mean(ratio, on_policy),
    }
    if inputs.entropy is not None:
        metrics["entropy"] = token_mean(inputs.entropy, on_policy)
    if spec.grpo.off_policy_mask_threshold is not None:
        sampler = old if inputs.sampler_logps is None else inputs.sampler_logps  # [B, T]
        pg, m = apply_off_policy_mask(pg, advantages, logps, sampler, on_policy, spec.grpo.off_policy_mask_threshold)
        metrics |= m
    if is_weight is not None:
        pg, m = apply_is_weight(pg, is_weight, on_policy, folded=spec.folds_is_weight)
        metrics |= m
    if anchors is not None:
        pg, m = anchor_term(pg, logps, advantages, anchors, spec.anchors)
        metrics |= m
    weight = None if inputs.sample_weight is None else inputs.sample_weight.to(pg.dtype).unsqueeze(1)  # [B, 1]
    pg = weighted(pg, weight)  # [B, T]
    metrics["pg_loss"] = token_mean(pg, mask)

    per_token = pg
    if inputs.ref_logps is not None:
        kl, m = kl_term(logps, inputs.ref_logps, mask, spec, ratio)
        metrics |= m
        per_token = per_token if kl is None else per_token + weighted(kl, weight)  # [B, T]
    reduce = partial(aggregate_over, mask=mask, totals=totals)
    loss = reduce(per_token, spec.grpo.loss_agg)
    if spec.terms:
        t_in = TermInputs(logps, old, advantages, mask, on_policy, inputs.entropy, inputs.ref_logps, totals)
        added, m = extra_terms(t_in, spec, weight, reduce)
        loss, metrics = loss + added, metrics | m
    return loss, metrics


def aggregate_over(values: Tensor, mode: str, *, mask: Tensor, totals: LossTotals) -> Tensor:
    """`aggregate` of `values` [B, T] over the loss tokens `mask` with the whole-batch `totals`."""
    return aggregate(values, mask, mode, **vars(totals))


def weighted(per_token: Tensor, weight: Tensor | None) -> Tensor:
    """A per-token term [B, T] times each row's sample weight [B, 1] (a DaGRPO mask as 0/1; None: unchanged)."""
    return per_token if weight is None else per_token * weight


def policy_ratio(logps: Tensor, old_logps: Tensor, on_policy: Tensor, level: str) -> Tensor:
    """The policy's importance ratio π_θ/π_old, differentiable: per token [B, T], or GSPO's per response [B, 1]."""
    if level == "sequence":
        return sequence_ratio(logps, old_logps, on_policy)  # [B, 1]
    return torch.exp(logps - old_logps)  # [B, T]


def policy_term(
    logps: Tensor, old: Tensor, advantages: Tensor, on_policy: Tensor, spec: LossSpec, is_weight: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The spec's policy loss -> (per-token loss, low-clip flags, high-clip flags), each [B, T], checked (a user's loss
    must return [B, T] tensors). A policy that `folds_is_weight` gets `is_weight` itself."""
    extra = {"is_weight": None if is_weight is None else is_weight.detach()} if spec.folds_is_weight else {}
    out = spec.policy.fn(logps, old, advantages, on_policy, spec, **spec.policy.kwargs, **extra)
    name = spec.policy.name
    if not (isinstance(out, tuple) and len(out) == 3):
        raise ValueError(f"policy loss {name!r} must return (loss, low_clip, high_clip), got {type(out).__name__}")
    for part, what in zip(out, ("loss", "low-clip flags", "high-clip flags")):
        if not isinstance(part, Tensor) or part.shape != logps.shape:
            raise ValueError(f"policy loss {name!r}: its {what} must be a [B, T] = {tuple(logps.shape)} tensor")
    return out


def check_shapes(
    logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, inputs: LossInputs, spec: LossSpec
) -> None:
    """ValueError naming the tensor whose shape does not fit the [B, T] log-probs, or the one that is missing."""
    if spec.grpo.beta != 0.0 and inputs.ref_logps is None:
        raise ValueError(f"beta={spec.grpo.beta} needs ref_logps (log-probs of the frozen reference model)")
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and loss_mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    if advantages.shape not in ((logps.shape[0],), logps.shape):
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B] or [B, T] = {tuple(logps.shape)}")
    if inputs.sample_weight is not None and inputs.sample_weight.shape != (logps.shape[0],):
        raise ValueError(f"sample_weight must be [B={logps.shape[0]}], got {tuple(inputs.sample_weight.shape)}")
    if inputs.anchor_token_mask is not None and inputs.anchor_token_mask.shape != mask.shape:
        raise ValueError(
            f"anchor_token_mask shape {tuple(inputs.anchor_token_mask.shape)} does not match loss_mask "
            f"{tuple(mask.shape)}"
        )


def aggregate(
    per_token_loss: Tensor,
    loss_mask: Tensor,
    mode: str,
    *,
    total_tokens: float,
    total_sequences: int,
    max_completion_length: int,
) -> Tensor:
    """Reduce a per-token loss [B, T] over its loss tokens to a scalar (SPEC §1 `loss_agg`).

    - `token_mean`: Σ l·m / total_tokens (TRL "dapo", verl "token-mean");
    - `seq_mean_token_mean`: Σ_i [Σ_t l·m / max(Σ_t m, 1)] / total_sequences (TRL "grpo");
    - `seq_sum_constant`: Σ l·m / (total_sequences · max_completion_length) (TRL "dr_grpo").

    `total_tokens` (loss tokens) and `total_sequences` count the whole optimizer batch, including
    sequences whose loss is later zeroed by a DaGRPO mask (SPEC §2a.4: the normaliser is not reduced).
    `total_tokens` is clamped to ≥ 1 as TRL does, so an all-padding batch gives 0, not NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"aggregation mode must be one of {AGG_MODES}, got {mode!r}")
    if per_token_loss.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} does not match per_token_loss {tuple(per_token_loss.shape)}"
        )
    if total_sequences < 1:
        raise ValueError(f"total_sequences must be >= 1, got {total_sequences}")
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")
    m = loss_mask.bool()  # [B, T]
    # where (not multiply) so a NaN/inf on a padding position cannot leak into the sum.
    masked = torch.where(m, per_token_loss, torch.zeros_like(per_token_loss))  # [B, T]
    if mode == "token_mean":
        return masked.sum() / max(float(total_tokens), 1.0)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(masked.dtype)  # [B]
        return per_seq.sum() / total_sequences
    return masked.sum() / (total_sequences * max_completion_length)


def rows_with_gradient(advantages: Tensor, sample_weight: Tensor | None, every_row: float | bool) -> Tensor:
    """[B] bool: the rows whose `policy_loss` term can have a non-zero gradient.

    The policy term of a row is multiplied by its advantage (PG, anchor shaping, GSPO, every registered
    policy loss), and all of it by its sample weight; the normalisers count every row whatever its
    terms (SPEC §2a.4). `every_row` is non-zero when the loss has a term that is not multiplied by the
    advantage (β·KL, an entropy bonus, a user term: `LossSpec.moves_every_row`; a float β is accepted).
    So a row with weight 0 (a DaGRPO mask), or with advantage 0 on every token when `every_row` is 0
    (a uniform group), adds exactly nothing to the gradient, and leaving it out of the forward changes
    no parameter. A NaN advantage or weight counts as non-zero, so the NaN guard still sees it.
    """
    if every_row:
        carries = torch.ones(advantages.shape[0], dtype=torch.bool, device=advantages.device)  # [B]
    else:
        carries = advantages.reshape(advantages.shape[0], -1).ne(0).any(dim=1)  # [B]
    if sample_weight is not None:
        carries = carries & sample_weight.ne(0)  # [B]
    return carries

"""Per-token policy-gradient loss, k3 KL, aggregation modes, and their composition (SPEC §1, §2a.4, §2b.3).

Aggregation normalisers are totals over the WHOLE optimizer batch (all micro-batches, all ranks), passed
in by the caller, so that the sum of micro-batch losses (and so of their gradients) equals the loss of
the full batch, whatever the micro-batch split. With one micro-batch the three modes are TRL's
`loss_type` "dapo", "grpo" and "dr_grpo" (see `TRL_LOSS_TYPES`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dataclasses import dataclass

from regroup.algo.anchors import plain_anchor_pg_loss, shaped_pg_loss
from regroup.algo.gspo import sequence_clipped_pg_loss, sequence_ratio
from regroup.algo.ratios import clip_ratio, importance_ratio

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_constant")
ANCHOR_RATIOS = ("shaped", "plain")
RATIO_LEVELS = ("token", "sequence")
# regroup aggregation mode -> the TRL GRPOTrainer `loss_type` that computes the same loss.
TRL_LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_sum_constant": "dr_grpo"}


def _adv_per_token(advantages: Tensor, logps: Tensor) -> Tensor:
    if advantages.dim() == 1:
        if advantages.shape[0] != logps.shape[0]:
            raise ValueError(
                f"advantages [B={advantages.shape[0]}] do not match logps batch size {logps.shape[0]}"
            )
        return advantages.unsqueeze(1)  # [B, 1]
    if advantages.shape != logps.shape:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B] or {tuple(logps.shape)}")
    return advantages  # [B, T]


def clipped_pg_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clip per-token loss `−min(r·A, clip(r, 1−εl, 1+εh)·A)` with `r = π_θ/π_old` (SPEC §1).

    Returns `(per_token_loss[B, T], is_low_clipped[B, T], is_high_clipped[B, T])`; the flags follow TRL:
    low = `r < 1−εl and A < 0`, high = `r > 1+εh and A > 0` (the tokens whose gradient the clip removes).
    `advantages` is [B] (one per sequence) or [B, T].
    """
    adv = _adv_per_token(advantages, logps)  # [B, 1] or [B, T]
    ratio = importance_ratio(logps, old_logps)  # [B, T]
    clipped = clip_ratio(ratio, eps_low, eps_high)  # [B, T]
    loss = -torch.min(ratio * adv, clipped * adv)  # [B, T]
    is_low = (ratio < 1.0 - eps_low) & (adv < 0)  # [B, T]
    is_high = (ratio > 1.0 + eps_high) & (adv > 0)  # [B, T]
    return loss, is_low, is_high


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) per token, `exp(ref − logp) − (ref − logp) − 1` -> [B, T] (SPEC §1)."""
    if logps.shape != ref_logps.shape:
        raise ValueError(f"ref_logps shape {tuple(ref_logps.shape)} does not match logps {tuple(logps.shape)}")
    d = ref_logps - logps  # [B, T]
    return torch.exp(d) - d - 1.0  # [B, T]


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


@dataclass(frozen=True)
class LossSpec:
    """What the policy loss is made of, decided once by the recipe (the front-ends only fill in tensors).

    - ratio term: `ratio_level` "token" (PPO, SPEC §1) or "sequence" (GSPO: one length-normalised ratio per
      response, clipped as a whole; `regroup.algo.gspo`); anchor tokens use `anchor_ratio` ("shaped":
      −A·p/(p+γ), SPEC §2b.3 / LUFFY; "plain": π_old := sg(π_θ));
    - PG term: −min(r·A, clip(r, 1−eps_low, 1+eps_high)·A);
    - KL term: `beta`·k3 against the reference, times the ratio when `kl_ratio_correction` (TRL's
      use_bias_correction_kl);
    - aggregation: `agg` (token_mean | seq_mean_token_mean | seq_sum_constant) with whole-batch totals.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    kl_ratio_correction: bool = False
    agg: str = "token_mean"
    ratio_level: str = "token"
    anchor_ratio: str = "shaped"
    shaping_gamma: float = 0.1


@dataclass
class LossInputs:
    """The tensors of one micro-batch the loss reads besides the log-probs."""

    advantages: Tensor  # [B] or [B, T]
    loss_mask: Tensor  # [B, T] 1 on response tokens
    ref_logps: Tensor | None = None  # [B, T] frozen reference (needed when beta != 0)
    sample_weight: Tensor | None = None  # [B] masks and weights (normaliser NOT reduced)
    anchor_token_mask: Tensor | None = None  # [B, T] forced off-policy (anchor) tokens
    is_weight: Tensor | None = None  # [B, T] truncated IS weight of sampler mismatch


@dataclass(frozen=True)
class LossTotals:
    """Whole-optimizer-batch normalisers (all micro-batches, all processes)."""

    total_tokens: float
    total_sequences: int
    max_completion_length: int


def rows_with_gradient(advantages: Tensor, sample_weight: Tensor | None, beta: float) -> Tensor:
    """[B] bool: the rows whose `policy_loss` term can have a non-zero gradient.

    Every term of a row is multiplied by its advantage (PG, anchor shaping, GSPO) or by β (KL), and all
    of it by its sample weight; the normalisers count every row whatever its terms (SPEC §2a.4). So a
    row with weight 0 (a DaGRPO mask), or with advantage 0 on every token while β = 0 (a uniform group),
    adds exactly nothing to the gradient, and leaving it out of the forward changes no parameter. A NaN
    advantage or weight counts as non-zero, so the NaN guard still sees it.
    """
    if beta != 0.0:
        carries = torch.ones(advantages.shape[0], dtype=torch.bool, device=advantages.device)  # [B]
    else:
        carries = advantages.reshape(advantages.shape[0], -1).ne(0).any(dim=1)  # [B]
    if sample_weight is not None:
        carries = carries & sample_weight.ne(0)  # [B]
    return carries


def policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    inputs: LossInputs,
    spec: LossSpec,
    totals: LossTotals,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The full GRPO / DaGRPO / TA-GRPO / GSPO policy loss of one micro-batch, aggregated with whole-batch totals.

    Per loss token (`loss_mask` True):
    - on-policy token: PPO-clip loss (SPEC §1) on the token ratio, or on the response's GSPO sequence ratio
      (`spec.ratio_level="sequence"`), times `is_weight` (truncated IS) when given;
    - anchor token (`anchor_token_mask` True, forced off-policy expert token): `−A·p/(p+γ)` with
      `anchor_ratio="shaped"` (SPEC §2b.3, LUFFY, no clipping), or `−A·exp(logp − sg(logp))` with "plain";
    - plus `beta · KL_k3(π_θ ‖ π_ref)` on every loss token when `beta != 0` (requires `ref_logps`);
      with `kl_ratio_correction=True` the k3 term is multiplied by the (differentiable) ratio π_θ/π_old,
      which is TRL's `use_bias_correction_kl=True` (its default since TRL 1.x; SPEC §1 is plain k3);
    - all of it times `sample_weight[i]` (DaGRPO distinctiveness mask as 0/1 float; SPEC §2a.4), while the
      normaliser (the totals) is NOT reduced for masked samples.

    Returns `(loss, metrics)`; metrics are detached 0-d tensors, means over THIS micro-batch:
    `pg_loss` (the aggregated policy-gradient part, without KL), `clip_low_frac`, `clip_high_frac`,
    `clip_frac` (low or high), `ratio_mean` (over on-policy loss tokens only; anchor tokens excluded;
    0 when there are none), `n_onpolicy_tokens`, `n_anchor_tokens`, `n_loss_tokens` (counts, so that
    micro-batch means can be combined exactly), `anchor_prob_mean` (mean p over anchor tokens; only when
    `anchor_token_mask` is given), `kl_mean` (mean k3 over loss tokens; only when `ref_logps` is given),
    `is_weight_mean` (over on-policy loss tokens; only when `is_weight` is given).
    """
    advantages, loss_mask = inputs.advantages, inputs.loss_mask
    ref_logps, sample_weight, is_weight = inputs.ref_logps, inputs.sample_weight, inputs.is_weight
    anchor_token_mask = inputs.anchor_token_mask
    beta, anchor_ratio, agg = spec.beta, spec.anchor_ratio, spec.agg
    if spec.ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {spec.ratio_level!r}")
    if anchor_ratio not in ANCHOR_RATIOS:
        raise ValueError(f"anchor_ratio must be one of {ANCHOR_RATIOS}, got {anchor_ratio!r}")
    if logps.shape != old_logps.shape or logps.shape != loss_mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)} must have the same [B, T] shape"
        )
    if beta != 0.0 and ref_logps is None:
        raise ValueError(f"beta={beta} needs ref_logps (log-probs of the frozen reference model)")
    mask = loss_mask.bool()  # [B, T]
    anchor = torch.zeros_like(mask) if anchor_token_mask is None else anchor_token_mask.bool()  # [B, T]
    if anchor.shape != mask.shape:
        raise ValueError(f"anchor_token_mask shape {tuple(anchor.shape)} does not match loss_mask {tuple(mask.shape)}")
    on_policy = mask & ~anchor  # [B, T]

    # π_old is undefined on anchor and padding tokens; use π_θ there (ratio 1) so that whatever the
    # caller stored cannot produce inf/NaN in the unselected branch (0·inf = NaN in backward).
    old_eff = torch.where(on_policy, old_logps, logps.detach())  # [B, T]
    if spec.ratio_level == "sequence":
        # GSPO: every token of a response carries its sequence ratio (anchor tokens are left out of it).
        pg, is_low, is_high = sequence_clipped_pg_loss(logps, old_eff, advantages, on_policy, spec.eps_low, spec.eps_high)
    else:
        pg, is_low, is_high = clipped_pg_loss(logps, old_eff, advantages, spec.eps_low, spec.eps_high)  # [B, T] x3
    if is_weight is not None:
        if is_weight.shape != mask.shape:
            raise ValueError(f"is_weight shape {tuple(is_weight.shape)} does not match loss_mask {tuple(mask.shape)}")
        pg = torch.where(on_policy, pg * is_weight.detach(), pg)  # [B, T]
    if anchor_token_mask is not None:
        if anchor_ratio == "shaped":
            anchor_loss = shaped_pg_loss(logps, advantages, spec.shaping_gamma)  # [B, T]
        else:
            anchor_loss = plain_anchor_pg_loss(logps, advantages)  # [B, T]
        pg = torch.where(anchor, anchor_loss, pg)  # [B, T]

    weight = None
    if sample_weight is not None:
        if sample_weight.shape != (logps.shape[0],):
            raise ValueError(f"sample_weight must be [B={logps.shape[0]}], got {tuple(sample_weight.shape)}")
        weight = sample_weight.to(pg.dtype).unsqueeze(1)  # [B, 1]
        pg = pg * weight  # [B, T]

    per_token = pg
    kl = None
    if ref_logps is not None:
        kl = kl_k3(logps, ref_logps)  # [B, T]
        if beta != 0.0:
            kl_term = beta * kl  # [B, T]
            if spec.kl_ratio_correction:
                # Unbiased reverse-KL gradient from π_old samples (DeepSeek-V3.2; TRL use_bias_correction_kl).
                # The correction uses the ratio of the configured level (GSPO: the sequence ratio, as TRL).
                if spec.ratio_level == "sequence":
                    kl_term = kl_term * sequence_ratio(logps, old_eff, on_policy)  # [B, T] * [B, 1]
                else:
                    kl_term = kl_term * torch.exp(logps - old_eff)  # [B, T]
            if weight is not None:
                kl_term = kl_term * weight  # [B, T]
            per_token = per_token + kl_term

    norm = dict(total_tokens=totals.total_tokens, total_sequences=totals.total_sequences,
                max_completion_length=totals.max_completion_length)
    loss = aggregate(per_token, mask, agg, **norm)

    with torch.no_grad():
        ratio = torch.exp(logps - old_eff)  # [B, T]
        if spec.ratio_level == "sequence":
            ratio = sequence_ratio(logps.detach(), old_eff, on_policy).expand_as(logps)  # [B, T]
        n_on = on_policy.sum()
        denom = n_on.clamp(min=1).to(logps.dtype)

        def on_mean(x: Tensor) -> Tensor:
            return torch.where(on_policy, x.to(logps.dtype), torch.zeros_like(logps)).sum() / denom

        metrics: dict[str, Tensor] = {
            "pg_loss": aggregate(pg.detach(), mask, agg, **norm),
            "clip_low_frac": on_mean(is_low),
            "clip_high_frac": on_mean(is_high),
            "clip_frac": on_mean(is_low | is_high),
            "ratio_mean": on_mean(ratio),
            "n_onpolicy_tokens": n_on.to(logps.dtype),
            "n_anchor_tokens": (mask & anchor).sum().to(logps.dtype),
            "n_loss_tokens": mask.sum().to(logps.dtype),
        }
        if anchor_token_mask is not None:
            am = mask & anchor
            p = torch.where(am, logps.detach().exp(), torch.zeros_like(logps))
            metrics["anchor_prob_mean"] = p.sum() / am.sum().clamp(min=1).to(logps.dtype)
        if kl is not None:
            k = torch.where(mask, kl.detach(), torch.zeros_like(kl))
            metrics["kl_mean"] = k.sum() / mask.sum().clamp(min=1).to(logps.dtype)
        if is_weight is not None:
            metrics["is_weight_mean"] = on_mean(is_weight.detach())
    return loss, metrics

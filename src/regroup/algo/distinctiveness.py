"""DaGRPO sequence-level gradient rectification: the distinctiveness mask (SPEC §2a, Xie et al. 2512.06337).

Within each group, a positive-advantage response is kept only if its fine-grained score beats every
negative one by a margin δ, and a negative one only if every positive one beats it by δ. Responses
that are not clearly better / worse than the other side are the ones whose gradients conflict.

`pair_masked_advantages` is the second, per-pair reading of "masks sample pairs with low
distinctiveness" (the wording allows it). With the group-mean baseline the advantage splits exactly into pairwise
terms: A_i = c (R_i − mean R) = (1/G) Σ_j c (R_i − R_j) = (1/G) Σ_j (A_i − A_j), c = 1 under Dr. GRPO
(advantage_estimator=dr_grpo) and c = 1 / (std + ε) of the full group under std scaling (a group constant, so the
split is exact there too). The pair reading drops only the terms of pairs whose scores do not stand
apart by δ:

    A'_i = (1/G) Σ_j m_ij (A_i − A_j),   m_ij = 0 iff A_i ≠ A_j, both scored, and S_hi − S_lo < δ

(hi = the member of the pair with the larger advantage). G and c stay those of the full group: the
masked advantage is not renormalised (SPEC §2a.4: advantages come from the full group). With two
reward levels the pairs with A_i ≠ A_j are exactly the positive-negative pairs of the per-sample rule,
and a sample whose pairs all keep (or all drop) gets the same advantage under both readings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_inputs(advantages: Tensor, scores: Tensor, group_ids: Tensor, delta: float) -> None:
    if advantages.dim() != 1 or scores.shape != advantages.shape or group_ids.shape != advantages.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, scores {tuple(scores.shape)} and group_ids "
            f"{tuple(group_ids.shape)} must all be 1-D of the same length"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")


def distinctiveness_mask(
    advantages: Tensor,
    scores: Tensor,
    group_ids: Tensor,
    delta: float,
    atol: float = 1e-6,
) -> Tensor:
    """Keep-mask λ[B] (True = keep) of SPEC §2a.2–3, computed per group.

    With `G⁺ = {A > 0}`, `G⁻ = {A < 0}` of a group, `S⁻max = max S over G⁻`, `S⁺min = min S over G⁺`:
    `λ_j = [S_j − S⁻max ≥ δ]` for j ∈ G⁺ and `λ_k = [S⁺min − S_k ≥ δ]` for k ∈ G⁻.
    - If the other side is empty (or none of it is scored), nothing on this side is masked.
    - Advantage 0 (or NaN) → True; score NaN (unscored) → True. NaN scores are ignored for S⁻max / S⁺min.
    - `atol` absorbs float rounding so that a difference of exactly δ (e.g. 7.3 − 4.3 vs 3) keeps.
    Advantages must come from the full group before masking (SPEC §2a.4).
    """
    _check_inputs(advantages, scores, group_ids, delta)
    if advantages.numel() == 0:
        return torch.ones(0, dtype=torch.bool, device=advantages.device)
    # float64: scores are on a 1–10 scale; comparisons at exactly δ must not depend on float32 rounding.
    s = scores.to(torch.float64)  # [B]
    scored = ~torch.isnan(s)  # [B]
    pos = (advantages > 0) & scored  # [B]  NaN advantages compare False: treated as 0
    neg = (advantages < 0) & scored  # [B]
    uniq, index = torch.unique(group_ids, return_inverse=True)  # index [B]: the group's rank by id value
    num_groups = int(uniq.numel())
    # [G] per group: −inf if G⁻ is empty (positives all keep), +inf if G⁺ is (negatives all keep)
    neg_max = s.new_full((num_groups,), -math.inf).scatter_reduce(0, index, torch.where(neg, s, -math.inf), "amax")
    pos_min = s.new_full((num_groups,), math.inf).scatter_reduce(0, index, torch.where(pos, s, math.inf), "amin")
    keep_pos = (s - neg_max[index]) >= (delta - atol)  # [B]
    keep_neg = (pos_min[index] - s) >= (delta - atol)  # [B]
    keep = torch.ones_like(pos)  # [B]
    keep = torch.where(pos, keep_pos, keep)
    keep = torch.where(neg, keep_neg, keep)
    return keep


def pair_masked_advantages(
    advantages: Tensor,
    scores: Tensor,
    group_ids: Tensor,
    delta: float,
    atol: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """(A' [B], stats) of the per-pair reading (module doc): only the pairwise terms of pairs whose scores
    are within δ in the wrong way are dropped.

    - A pair with an unscored (NaN) member keeps, as the per-sample rule never masks unscored samples.
    - A group whose advantages contain a NaN is left unchanged.
    - The advantages of a group must have mean 0 (the group-mean baseline that makes the split exact);
      otherwise ValueError: the pairwise terms would not add up to A_i.
    stats: `pairs` (pairs with different advantages), `pairs_masked`, `frac_pairs_masked`, and
    `adv_l1_removed` = Σ|A − A'| / Σ|A| (0 when Σ|A| = 0).
    """
    _check_inputs(advantages, scores, group_ids, delta)
    a = advantages.to(torch.float64)  # [B]
    s = scores.to(torch.float64)  # [B]
    out = a.clone()  # [B]
    pairs = masked = 0
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero(as_tuple=True)[0]  # [G]
        ag, sg = a[idx], s[idx]  # [G]
        if torch.isnan(ag).any():
            continue
        scale = float(ag.abs().max()) if ag.numel() else 0.0
        if abs(float(ag.mean())) > 1e-6 * max(1.0, scale):
            raise ValueError(
                f"group {int(g)}: advantages have mean {float(ag.mean()):.3g}, not 0; the pairwise "
                "split A_i = (1/G) sum_j (A_i - A_j) needs the group-mean baseline"
            )
        diff = ag[:, None] - ag[None, :]  # [G, G]  A_i − A_j
        gap = sg[:, None] - sg[None, :]  # [G, G]  S_i − S_j
        hi_gap = torch.where(diff > 0, gap, -gap)  # [G, G]  S_hi − S_lo
        scored = ~(torch.isnan(sg)[:, None] | torch.isnan(sg)[None, :])  # [G, G]
        drop = (diff != 0) & scored & (hi_gap < delta - atol)  # [G, G]  symmetric
        out[idx] = (diff * (~drop)).sum(dim=1) / idx.numel()  # [G]
        pairs += int((diff != 0).sum()) // 2
        masked += int(drop.sum()) // 2
    total = float(a[~torch.isnan(a)].abs().sum())
    removed = float((a - out)[~torch.isnan(a)].abs().sum())
    stats = {
        "pairs": float(pairs),
        "pairs_masked": float(masked),
        "frac_pairs_masked": masked / pairs if pairs else 0.0,
        "adv_l1_removed": removed / total if total > 0 else 0.0,
    }
    return out.to(advantages.dtype), stats


def mask_stats(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """How much a distinctiveness mask drops: fractions of positive / negative / all samples masked out.

    Keys: `frac_pos_masked` (masked positives / positives), `frac_neg_masked` (masked negatives /
    negatives), `frac_masked` (masked / B), `num_pos`, `num_neg`. A fraction with an empty denominator is 0.0.
    """
    if mask.shape != advantages.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match advantages {tuple(advantages.shape)}")
    dropped = ~mask.bool()  # [B]
    pos, neg = advantages > 0, advantages < 0  # [B]
    n_pos, n_neg, n = int(pos.sum()), int(neg.sum()), int(mask.numel())
    return {
        "frac_pos_masked": float((dropped & pos).sum()) / n_pos if n_pos else 0.0,
        "frac_neg_masked": float((dropped & neg).sum()) / n_neg if n_neg else 0.0,
        "frac_masked": float(dropped.sum()) / n if n else 0.0,
        "num_pos": float(n_pos),
        "num_neg": float(n_neg),
    }

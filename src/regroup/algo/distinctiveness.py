"""DaGRPO sequence-level gradient rectification: the distinctiveness mask (SPEC §2a, Xie et al. 2512.06337).

Within each group, a positive-advantage response is kept only if its fine-grained score beats every
negative one by a margin δ, and a negative one only if every positive one beats it by δ. Responses
that are not clearly better / worse than the other side are the ones whose gradients conflict.
"""

from __future__ import annotations

import torch
from torch import Tensor

from regroup.algo.stats import dense_group_index, segment_amax, segment_amin


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
    if advantages.dim() != 1 or scores.shape != advantages.shape or group_ids.shape != advantages.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, scores {tuple(scores.shape)} and group_ids "
            f"{tuple(group_ids.shape)} must all be 1-D of the same length"
        )
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    if advantages.numel() == 0:
        return torch.ones(0, dtype=torch.bool, device=advantages.device)
    # float64: scores are on a 1–10 scale; comparisons at exactly δ must not depend on float32 rounding.
    s = scores.to(torch.float64)  # [B]
    scored = ~torch.isnan(s)  # [B]
    pos = (advantages > 0) & scored  # [B]  NaN advantages compare False: treated as 0
    neg = (advantages < 0) & scored  # [B]
    index, num_groups = dense_group_index(group_ids)
    neg_max = segment_amax(s, index, num_groups, neg)  # [G]  −inf if G⁻ empty -> positives all keep
    pos_min = segment_amin(s, index, num_groups, pos)  # [G]  +inf if G⁺ empty -> negatives all keep
    keep_pos = (s - neg_max[index]) >= (delta - atol)  # [B]
    keep_neg = (pos_min[index] - s) >= (delta - atol)  # [B]
    keep = torch.ones_like(pos)  # [B]
    keep = torch.where(pos, keep_pos, keep)
    keep = torch.where(neg, keep_neg, keep)
    return keep


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

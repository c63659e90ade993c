"""Per-group (segment) reductions over a flat batch whose samples carry an explicit group id.

Every group statistic in `regroup.algo` (advantage baselines, DaGRPO score extremes, uniform-group
fractions) is one of these reductions: scatter / index_add over a dense group index, never a Python
loop over groups and never a positional `view(-1, G)` layout (SPEC §1: groups are identified by id).
"""

from __future__ import annotations

import torch
from torch import Tensor


def dense_group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary (unordered, non-contiguous, possibly negative) integer group ids to 0..G-1.

    Returns `(index[B] long, G)`, where equal ids get equal indices (ordered by id value).
    """
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    uniq, index = torch.unique(group_ids, return_inverse=True)
    return index.long(), int(uniq.numel())


def segment_sum(values: Tensor, index: Tensor, num_segments: int) -> Tensor:
    """Sum of `values[B]` per segment: out[g] = Σ_{i: index[i]=g} values[i]  -> [G]."""
    out = torch.zeros(num_segments, dtype=values.dtype, device=values.device)
    return out.index_add(0, index, values)  # [G]


def segment_count(valid: Tensor, index: Tensor, num_segments: int) -> Tensor:
    """Number of `valid[B]` (bool) samples per segment, as a long tensor [G]."""
    out = torch.zeros(num_segments, dtype=torch.long, device=valid.device)
    return out.index_add(0, index, valid.long())  # [G]


def segment_amax(values: Tensor, index: Tensor, num_segments: int, valid: Tensor) -> Tensor:
    """Max of `values[i]` over valid samples per segment -> [G]; −inf for a segment with none valid."""
    src = torch.where(valid, values, torch.full_like(values, float("-inf")))  # [B]
    out = torch.full((num_segments,), float("-inf"), dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, index, src, reduce="amax", include_self=True)  # [G]


def segment_amin(values: Tensor, index: Tensor, num_segments: int, valid: Tensor) -> Tensor:
    """Min of `values[i]` over valid samples per segment -> [G]; +inf for a segment with none valid."""
    src = torch.where(valid, values, torch.full_like(values, float("inf")))  # [B]
    out = torch.full((num_segments,), float("inf"), dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, index, src, reduce="amin", include_self=True)  # [G]

"""DAPO overlong handling (Yu et al., arXiv 2503.14476, §3.3–3.4) of responses cut at max_new_tokens.

- Soft overlong punishment (eq. 13), a reward shaping applied before advantages: with L_max =
  max_new_tokens and a buffer L_cache, a response of length |o| gets `−penalty·(|o| − (L_max − L_cache)) /
  L_cache` when it ends inside the buffer zone, and `−penalty` when it was cut (truncated).
- Overlong filtering: truncated responses get loss weight 0 (they still count in their group's
  statistics, and in the loss normaliser, like a DaGRPO-masked sample).
"""

from __future__ import annotations

import math

import torch

from regroup.config.registry import STAGES
from regroup.stages.base import StepBatch, StepContext


def soft_overlong_penalty(length: int, truncated: bool, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO eq. 13: 0 below L_max − L_cache, linear to −penalty at L_max, −penalty when cut."""
    if truncated:
        return -penalty
    start = max_new_tokens - buffer
    if length <= start:
        return 0.0
    return -penalty * min(length - start, buffer) / buffer


class OverlongPenalty:
    name = "overlong_penalty"

    def __init__(self, max_new_tokens: int, buffer: int, penalty: float):
        self.max_new_tokens, self.buffer, self.penalty = max_new_tokens, buffer, penalty

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        total, hit = 0.0, 0
        for s in batch.samples:
            if s.is_anchor or s.reward is None or not math.isfinite(s.reward):
                continue
            p = soft_overlong_penalty(len(s.response_ids), s.truncated, self.max_new_tokens, self.buffer, self.penalty)
            s.reward += p
            total += p
            hit += p < 0
        n = max(sum(not s.is_anchor for s in batch.samples), 1)
        return {"overlong/penalised_frac": hit / n, "overlong/penalty_mean": total / n}


class OverlongFilter:
    name = "overlong_filter"

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        keep = torch.tensor([not (s.truncated and not s.is_anchor) for s in batch.samples], dtype=torch.bool)  # [B]
        batch.multiply_weights(keep)
        return {"overlong/filtered_frac": float((~keep).float().mean()) if len(keep) else 0.0}


STAGES.register(OverlongPenalty.name, OverlongPenalty)
STAGES.register(OverlongFilter.name, OverlongFilter)

"""The learning-rate schedule, in one place: linear warm-up, then cosine decay to a floor or constant."""

from __future__ import annotations

import math


def lr_lambda(warmup_steps: int, total_steps: int, schedule: str, min_ratio: float, *, peak_in_warmup: bool = False):
    """Multiplier of the peak lr at optimizer step `step` (for `torch.optim.lr_scheduler.LambdaLR`).

    Warm-up starts at lr/(warmup+1), never at 0 (a step at lr 0 would waste a rollout), and reaches the
    peak after `warmup_steps`; then cosine to `min_ratio`·lr at `total_steps`, or constant.
    `peak_in_warmup=True` ramps as (step+1)/warmup instead, reaching the peak on the last warm-up step
    (the tiny model's SFT warm-up was measured with that ramp; RL keeps the gentler one).
    """
    ramp = warmup_steps if peak_in_warmup else warmup_steps + 1

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / ramp
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn

"""Light exponential smoothing for training curves (the raw curve is drawn faintly behind it)."""

from __future__ import annotations

from collections.abc import Sequence


def default_weight(num_points: int) -> float:
    """Smoothing weight that grows with run length: ~0.5 at 40 points, 0.83 at 200, capped at 0.9."""
    return min(0.9, 1.0 - 1.0 / (1.0 + num_points / 40.0))


def ema(values: Sequence[float], weight: float | None = None) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing).

    s_t = w·s_{t−1} + (1 − w)·x_t with s_0 = 0, reported as s_t / (1 − w^t) so the start is not
    pulled toward zero. weight 0 returns the values unchanged.
    """
    if weight is None:
        weight = default_weight(len(values))
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"EMA weight must be in [0, 1), got {weight}")
    out, acc, norm = [], 0.0, 0.0
    for x in values:
        acc = weight * acc + (1.0 - weight) * float(x)
        norm = weight * norm + (1.0 - weight)
        out.append(acc / norm)
    return out

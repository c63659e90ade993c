"""Overlong handling (`regroup.stages.overlong`): DAPO's soft penalty (eq. 13) and the overlong filter."""

from __future__ import annotations

import pytest
from helpers import stage_sample

from regroup.stages.base import StepBatch, StepContext, run_stages
from regroup.stages.overlong import OverlongFilter, OverlongPenalty, soft_overlong_penalty


def test_soft_overlong_penalty_dapo_eq13():
    # L_max 20, buffer 4: no penalty up to 16, linear to −1 at 20, −1 when cut
    assert soft_overlong_penalty(16, False, 20, 4, 1.0) == 0.0
    assert soft_overlong_penalty(18, False, 20, 4, 1.0) == pytest.approx(-0.5)
    assert soft_overlong_penalty(20, False, 20, 4, 0.5) == pytest.approx(-0.5)
    assert soft_overlong_penalty(20, True, 20, 4, 1.0) == -1.0


def test_overlong_stages():
    batch = StepBatch(
        step=0,
        samples=[
            stage_sample(0, 1.0, length=18),
            stage_sample(0, 1.0, length=20, truncated=True),
            stage_sample(0, 1.0, length=5),
            stage_sample(0, 1.0, anchor=True, length=30),
        ],
    )
    ctx = StepContext(seed=0, num_generations=4)
    m = run_stages([OverlongPenalty(20, 4, 1.0), OverlongFilter()], batch, ctx)
    assert [s.reward for s in batch.samples] == [0.5, 0.0, 1.0, 1.0]  # anchors are never penalised
    assert batch.weights.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert m["overlong/filtered_frac"] == 0.25

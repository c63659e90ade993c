"""The stage interface (`regroup.stages.base`): the step batch's rules and how refill rounds' metrics merge."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import stage_sample

from regroup.stages.base import StepBatch, merge_rounds


def test_groups_cannot_be_dropped_after_advantages():
    batch = StepBatch(
        step=0,
        problems=[SimpleNamespace(id="q0")],
        group_ids=[0],
        samples=[stage_sample(0, 1.0), stage_sample(0, 0.0)],
    )
    batch.advantages = torch.zeros(2)
    with pytest.raises(RuntimeError, match="before advantages"):
        batch.keep_groups({0})


class _Sampling:
    round_totals = ("time/rollout", "tokens/generated")
    round_rates = {"tokens_per_s": ("tokens/generated", "time/rollout")}


class _Checks:
    round_totals = ("checks",)


class _Plain:  # declares nothing: its metrics stay the first round's
    pass


def test_refill_rounds_sum_what_each_stage_declares_and_recompute_its_rates():
    first = {"time/rollout": 2.0, "tokens/generated": 100.0, "tokens_per_s": 50.0, "reward/mean": 0.5}
    rounds = [
        {"time/rollout": 1.0, "tokens/generated": 60.0, "tokens_per_s": 60.0, "reward/mean": 0.9, "checks": 2.0},
        {"time/rollout": 1.0, "tokens/generated": 40.0, "tokens_per_s": 40.0, "checks": 1.0},
    ]
    out = merge_rounds([_Sampling(), _Checks(), _Plain()], dict(first), rounds)
    # 2 + 1 + 1 s, 100 + 60 + 40 tokens -> 200 / 4 = 50 tokens/s; checks exist only in the refills: 2 + 1
    assert out == {
        "time/rollout": 4.0,
        "tokens/generated": 200.0,
        "tokens_per_s": 50.0,
        "reward/mean": 0.5,  # not a total: the first round's
        "checks": 3.0,
    }
    assert merge_rounds([_Sampling()], dict(first), []) == first  # no refill: unchanged (100 / 2 = 50)

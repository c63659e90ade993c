"""DAPO's dynamic sampling (`regroup.stages.dynamic_sampling`): which groups inform, refills, and the round cap."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import stage_sample

from regroup.stages.base import StepBatch, StepContext
from regroup.stages.dynamic_sampling import DynamicSampling, informative_groups


def test_informative_groups():
    samples = [
        stage_sample(0, 1.0),
        stage_sample(0, 0.0),
        stage_sample(1, 1.0),
        stage_sample(1, 1.0),
        stage_sample(2, None),
        stage_sample(2, 1.0),
    ]
    assert informative_groups(samples) == {0: True, 1: False, 2: False}


def _uniform_or_mixed_batch(ids, mixed):
    out = []
    for g in ids:
        out += [stage_sample(g, 1.0), stage_sample(g, 0.0 if g in mixed else 1.0)]
    return StepBatch(step=0, problems=[SimpleNamespace(id=f"q{g}") for g in ids], group_ids=list(ids), samples=out)


def test_dynamic_sampling_refills_until_full_then_keeps_the_first_target_groups():
    rounds = {1: _uniform_or_mixed_batch([10, 11], mixed={10}), 2: _uniform_or_mixed_batch([20, 21], mixed={20, 21})}
    ctx = StepContext(seed=0, num_generations=2)
    ctx.refill = lambda r: rounds[r]
    batch = _uniform_or_mixed_batch([0, 1, 2], mixed={1})
    m = DynamicSampling(target_groups=3, max_rounds=5)(batch, ctx)
    # round 0: 1 informative; round 1: +1 (10); round 2: +2 (20, 21) -> 4, keep the first 3 by group id
    assert m["dynamic/rounds"] == 2 and m["dynamic/kept_groups"] == 3 and m["dynamic/short"] == 0
    assert sorted({s.group_id for s in batch.samples}) == [1, 10, 20]
    assert batch.group_ids == [1, 10, 20]


def test_dynamic_sampling_stops_at_max_rounds_and_says_it_is_short():
    ctx = StepContext(seed=0, num_generations=2)
    ctx.refill = lambda r: _uniform_or_mixed_batch([100 + r], mixed=set())
    batch = _uniform_or_mixed_batch([0, 1], mixed={0})
    m = DynamicSampling(target_groups=2, max_rounds=2)(batch, ctx)
    assert m["dynamic/rounds"] == 2 and m["dynamic/kept_groups"] == 1 and m["dynamic/short"] == 1
    assert {s.group_id for s in batch.samples} == {0}

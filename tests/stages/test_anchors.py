"""DaGRPO's anchor stages (`regroup.stages.anchors`): the one definition of a verified answer, and which
references may be anchors (partial credit, the length cap), hand-computed."""

from __future__ import annotations

import math
from types import SimpleNamespace

from helpers import stage_sample

from regroup.stages.anchors import AnchorInjector, is_verified


def test_one_definition_of_verified():
    assert is_verified(1.0, 1.0) and is_verified(2.0, 1.0)
    assert not is_verified(0.5, 1.0) and not is_verified(None, 1.0) and not is_verified(math.nan, 1.0)
    assert not is_verified(math.inf, 1.0)
    assert is_verified(0.5, 0.5)


def _injector(reward, max_tokens=0, threshold=1.0):
    cfg = SimpleNamespace(source="reference", count=1, mode="replace", when="always", buffer_size=4)
    return AnchorInjector(
        cfg,
        lambda text, problem: reward,
        lambda text: [1] * len(text),
        correct_threshold=threshold,
        max_tokens=max_tokens,
    )


def test_partial_credit_reference_is_not_a_verified_anchor():
    # rewards=[task, fmt*0.1]: a wrong reference with the right format earns 0.1 > 0, but is not correct
    problem = SimpleNamespace(id="q", question="?", solution="wrong but formatted")
    inj = _injector(0.1)
    assert inj.reserved_slots([problem]) == [0]
    assert inj.totals["rejected_reference"] == 1


def test_over_long_reference_is_not_injected_and_is_counted():
    problem = SimpleNamespace(id="q", question="?", solution="x" * 50)
    inj = _injector(1.0, max_tokens=20)
    samples, m = inj.inject([stage_sample(0, 0.0)], [problem], [0], [[1]])
    assert m["anchor/count"] == 0 and inj.totals["too_long"] == 1
    inj = _injector(1.0, max_tokens=60)
    samples, m = inj.inject([stage_sample(0, 0.0)], [problem], [0], [[1]])
    assert m["anchor/count"] == 1 and samples[-1].is_anchor

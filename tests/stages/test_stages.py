"""The stage pipeline's pieces: seeds, dynamic sampling, overlong handling, GSPO ratio, the signal watch,
the one definition of a verified answer, and the anchor length cap (hand-computed cases)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from regroup.algo.gspo import sequence_clipped_pg_loss, sequence_ratio
from regroup.batch import Sample
from regroup.diagnostics.signals import SignalWatch
from regroup.stages.anchors import AnchorInjector, is_verified
from regroup.stages.base import StepBatch, StepContext, run_stages
from regroup.stages.dynamic_sampling import DynamicSampling, informative_groups
from regroup.stages.groups import sample_seed, samples_per_question
from regroup.stages.overlong import OverlongFilter, OverlongPenalty, soft_overlong_penalty


def _sample(group, reward, *, variant=0, anchor=False, length=3, truncated=False, text="x"):
    problem = SimpleNamespace(id=f"q{group}", question=f"question {group}", solution="ref", answer="1")
    return Sample(
        group_id=group,
        question_id=problem.id,
        variant=variant,
        is_anchor=anchor,
        prompt_ids=[1],
        ratio_prompt_ids=[1],
        response_ids=[5] * length,
        response_text=text,
        reward=reward,
        truncated=truncated,
        problem=problem,
    )


# ---- seeds ------------------------------------------------------------------------------------------


def test_seeds_unique_within_a_step_for_large_groups_and_many_variants():
    for G, N in [(8, 3), (65, 0), (128, 3), (16, 150)]:
        seeds = {
            sample_seed(0, 5, g, v, j, max_variants=N, max_samples=G)
            for g in range(80, 84)
            for v in range(N + 1)
            for j in range(G)
        }
        assert len(seeds) == 4 * (N + 1) * G, (G, N)


def test_seeds_keep_the_historical_values_for_small_groups():
    # the formula regroup used before (G <= 64, N < 101): (run*1000003 + step*10007 + group*101 + v) * 64 + j
    for run, step, g, v, j in [(0, 0, 0, 0, 0), (3, 7, 113, 2, 31), (1, 99, 1584, 3, 7)]:
        old = ((run * 1_000_003 + step * 10_007 + g * 101 + v) % 2**62) * 64 + j
        assert sample_seed(run, step, g, v, j, max_variants=3, max_samples=32) == old


def test_samples_per_question():
    assert samples_per_question(8) == 8
    assert samples_per_question(8, 4) == 32  # grpo_matched
    assert samples_per_question(8, 1, 3) == 32  # TA-GRPO pool
    assert samples_per_question(8, 1, 0, 1) == 9  # one anchor added


# ---- dynamic sampling -------------------------------------------------------------------------------


def test_informative_groups():
    samples = [_sample(0, 1.0), _sample(0, 0.0), _sample(1, 1.0), _sample(1, 1.0), _sample(2, None), _sample(2, 1.0)]
    assert informative_groups(samples) == {0: True, 1: False, 2: False}


def _uniform_or_mixed_batch(ids, mixed):
    out = []
    for g in ids:
        out += [_sample(g, 1.0), _sample(g, 0.0 if g in mixed else 1.0)]
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


def test_groups_cannot_be_dropped_after_advantages():
    batch = _uniform_or_mixed_batch([0], mixed={0})
    batch.advantages = torch.zeros(2)
    with pytest.raises(RuntimeError, match="before advantages"):
        batch.keep_groups({0})


# ---- overlong ---------------------------------------------------------------------------------------


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
            _sample(0, 1.0, length=18),
            _sample(0, 1.0, length=20, truncated=True),
            _sample(0, 1.0, length=5),
            _sample(0, 1.0, anchor=True, length=30),
        ],
    )
    ctx = StepContext(seed=0, num_generations=4)
    m = run_stages([OverlongPenalty(20, 4, 1.0), OverlongFilter()], batch, ctx)
    assert [s.reward for s in batch.samples] == [0.5, 0.0, 1.0, 1.0]  # anchors are never penalised
    assert batch.weights.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert m["overlong/filtered_frac"] == 0.25


# ---- GSPO ratio ------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_hand_computed():
    logps = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.4, 0.4]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.2, 0.4, 0.4]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    # row 0: mean(log 2, log 0.5) = 0 -> s = 1; row 1: log 2 -> s = 2
    s = sequence_ratio(logps, old, mask)
    assert s.squeeze(1).tolist() == pytest.approx([1.0, 2.0])
    loss, low, high = sequence_clipped_pg_loss(
        logps, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask, 0.2, 0.2
    )
    # row 1 is clipped at 1.2 -> loss −1.2 on each token; row 0: −1
    assert loss[:, 0].tolist() == pytest.approx([-1.0, -1.2])
    assert bool(high[1].all()) and not bool(high[0].any()) and not bool(low.any())


# ---- signal watch ----------------------------------------------------------------------------------


def test_signal_watch_warns_once_per_streak():
    w = SignalWatch(patience=3)
    bad = {"groups/uniform_frac": 1.0, "groups/all_wrong_frac": 1.0, "groups/all_correct_frac": 0.0}
    said = [w.observe(step, bad) for step in range(1, 6)]
    assert [len(x) for x in said] == [0, 0, 1, 0, 0]
    assert "uniform rewards" in said[2][0] and "100%" in said[2][0]
    assert w.observe(6, {"groups/uniform_frac": 0.5}) == []  # the streak ends
    assert [len(w.observe(s, {"mask/advantaged_frac": 0.95})) for s in range(7, 10)] == [0, 0, 1]
    assert [len(w.observe(s, {"reward/no_answer_frac": 1.0})) for s in range(10, 13)] == [0, 0, 1]


# ---- verified answers and anchor caps ------------------------------------------------------------------


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
    samples, m = inj.inject([_sample(0, 0.0)], [problem], [0], [[1]])
    assert m["anchor/count"] == 0 and inj.totals["too_long"] == 1
    inj = _injector(1.0, max_tokens=60)
    samples, m = inj.inject([_sample(0, 0.0)], [problem], [0], [[1]])
    assert m["anchor/count"] == 1 and samples[-1].is_anchor


def test_truncated_is_with_q0_ratios_is_refused_and_per_row_otherwise():
    from regroup.errors import ConfigError
    from regroup.train.run_config import load_config

    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(None, ["ta.enabled=true", "rollout.tis_cap=2.0"])
    load_config(None, ["ta.enabled=true", "ta.ratio_anchor=own", "rollout.tis_cap=2.0"])  # same prompt: fine

    # per row: an anchor row (no sampler log-probs) gets weight 1, the sampled row keeps its correction
    from regroup.train.trainer import Trainer

    trainer = Trainer.__new__(Trainer)
    from regroup.algo.losses import LossSpec

    trainer.recipe = SimpleNamespace(loss=LossSpec(is_cap=1.5))
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    part = SimpleNamespace(
        behaviour_logps=torch.log(torch.tensor([[0.25, 0.5], [1.0, 1.0]])),
        has_behaviour_logps=torch.tensor([True, False]),
        completion_mask=torch.ones(2, 2),
    )
    w = trainer._is_weight(old, part)
    assert w.tolist() == [[1.5, 1.0], [1.0, 1.0]]  # min(0.5/0.25, 1.5), 1 ; anchor row: 1
    # sequence modes: one weight per response, the product of its token ratios (2 · 1 = 2)
    trainer.recipe = SimpleNamespace(loss=LossSpec(is_cap=3.0, is_mode="sequence_truncate"))
    assert trainer._is_weight(old, part).tolist() == [[pytest.approx(2.0)], [1.0]]
    trainer.recipe = SimpleNamespace(loss=LossSpec(is_cap=1.5, is_mode="sequence_mask"))
    assert trainer._is_weight(old, part).tolist() == [[0.0], [1.0]]  # 2 > 1.5: the response is dropped


def test_judge_is_shown_the_question_the_response_answered_unless_asked_for_q0():
    from regroup.stages.masking import DistinctivenessMasker

    class Recording:
        stats: dict = {}

        def __init__(self):
            self.questions = []

        def score_batch(self, items):
            self.questions += [it.question for it in items]
            return [5.0] * len(items)

    samples = [_sample(0, 1.0), _sample(0, 0.0, variant=1)]
    samples[1].question_text = "rephrased question 0"
    for setting, want in (("own", ["question 0", "rephrased question 0"]), ("original", ["question 0", "question 0"])):
        scorer = Recording()
        DistinctivenessMasker(scorer, 3.0, question=setting).score(samples)
        assert scorer.questions == want, setting
    with pytest.raises(ValueError):
        DistinctivenessMasker(Recording(), 3.0, question="q0")

"""Signal loss is announced while it happens (SignalWatch), the metrics behind it count what they name,
and a reward or scorer that returns the wrong kind of value is refused with one line."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from regroup.algo.loss_spec import Piece
from regroup.batch import Sample
from regroup.config.registry import ADV_ESTIMATORS
from regroup.config.schema import AnchorConfig
from regroup.diagnostics.signals import SignalWatch, reward_diagnostics
from regroup.errors import ConfigError
from regroup.rewards import task_grader
from regroup.stages.advantages import GroupAdvantages
from regroup.stages.anchors import AnchorInjector, InjectAnchors, ReserveAnchorSlots
from regroup.stages.base import StepBatch, StepContext, run_stages
from regroup.stages.dynamic_sampling import DynamicSampling
from regroup.stages.masking import DistinctivenessMasker, ScorerOutputError
from regroup.stages.rewarding import RewardOutputError, RewardResponses, checked_rewards
from regroup.tasks import get_task
from regroup.tasks.base import Problem

TASK = get_task("arithmetic")

GRPO_ADVANTAGES = Piece.named("grpo.advantage_estimator", ADV_ESTIMATORS, "grpo", {})


def sample(group, reward, text="x", problem=None, anchor=False):
    problem = problem or SimpleNamespace(id=f"q{group}", question=f"question {group}", solution="ref", answer="1")
    return Sample(
        group_id=group,
        question_id=problem.id,
        variant=0,
        is_anchor=anchor,
        prompt_ids=[1],
        ratio_prompt_ids=[1],
        response_ids=[5, 6],
        response_text=text,
        reward=reward,
        problem=problem,
    )


# ---- metrics that read what they name ---------------------------------------------------------------


def test_every_reward_unscored_reads_as_uniform_not_zero():
    samples = [sample(g, r) for g in range(2) for r in (None, math.nan, None, None)]
    m = reward_diagnostics(samples)
    assert m["groups/uniform_frac"] == 1.0 and m["groups/unscored_frac"] == 1.0
    assert m["reward/unscored_frac"] == 1.0 and m["reward/unscored"] == 8.0
    # one scored mixed group + one unscored group: half the groups carry no signal
    m = reward_diagnostics([sample(0, 1.0), sample(0, 0.0), sample(1, None), sample(1, None)])
    assert m["groups/uniform_frac"] == 0.5 and m["groups/unscored_frac"] == 0.5


class FixedScorer:
    """Scores by response text; no `.stats` (a plain user scorer may keep none)."""

    name = "fixed"

    def __init__(self, by_text):
        self.by_text = by_text

    def score_batch(self, items):
        return [self.by_text.get(i.response, 5.0) for i in items]


def test_a_mask_that_removes_every_advantaged_sample_says_so():
    # group 0 mixed (rewards 1, 0), group 1 uniform: every advantaged sample scores the same -> all masked
    samples = [sample(0, 1.0, "a"), sample(0, 0.0, "b"), sample(1, 1.0, "c"), sample(1, 1.0, "d")]
    batch = StepBatch(step=0, samples=samples, problems=[s.problem for s in samples[::2]], group_ids=[0, 1])
    ctx = StepContext(seed=0, num_generations=2)
    metrics = run_stages(
        [GroupAdvantages(GRPO_ADVANTAGES), DistinctivenessMasker(FixedScorer({}), delta=3.0)], batch, ctx
    )
    assert metrics["mask/frac"] == 0.5  # uniform groups count as kept ...
    assert metrics["mask/advantaged_frac"] == 1.0  # ... but nothing with an advantage is left
    assert metrics["mask/emptied_groups"] == 1.0
    assert batch.weights.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert not any(k.startswith("scorer/") for k in metrics)  # no .stats: no scorer/* keys, no traceback


def test_dynamic_sampling_keeps_a_group_the_mask_then_empties():
    """The documented choice: dynamic sampling picks groups by reward before the mask; a group the mask
    empties stays in the batch with weight 0 (counted in mask/emptied_groups), it is not replaced."""
    samples = [
        sample(0, 1.0, "a"),
        sample(0, 0.0, "b"),
        sample(1, 1.0, "c"),
        sample(1, 0.0, "d"),
        sample(2, 0.0, "e"),
        sample(2, 0.0, "f"),
    ]
    problems = [s.problem for s in samples[::2]]
    batch = StepBatch(step=0, samples=samples, problems=problems, group_ids=[0, 1, 2])
    ctx = StepContext(seed=0, num_generations=2)
    scorer = FixedScorer({"a": 9.0, "b": 2.0, "c": 5.0, "d": 5.0})  # group 0 distinct, group 1 not
    stages = [
        DynamicSampling(target_groups=2, max_rounds=0),
        GroupAdvantages(GRPO_ADVANTAGES),
        DistinctivenessMasker(scorer, delta=3.0),
    ]
    metrics = run_stages(stages, batch, ctx)
    assert metrics["dynamic/kept_groups"] == 2.0 and sorted({s.group_id for s in batch.samples}) == [0, 1]
    assert metrics["mask/emptied_groups"] == 1.0
    assert batch.weights.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_scorer_out_of_range_or_short_is_refused_in_one_line():
    items = [sample(0, 1.0, "a"), sample(0, 0.0, "b")]
    adv = torch.tensor([1.0, -1.0])
    for bad, words in (({"a": 12.0}, "[1, 10]"), ({"a": 0.5}, "[1, 10]"), ({"a": "high"}, "number")):
        masker = DistinctivenessMasker(FixedScorer(bad), delta=1.0)
        with pytest.raises(ScorerOutputError, match=r"scorer 'fixed'.*" + re_escape(words)):
            masker.mask(items, adv, torch.tensor([0, 0]))

    class Short(FixedScorer):
        def score_batch(self, items):
            return [5.0]

    with pytest.raises(ScorerOutputError, match="1 scores for 2 responses"):
        DistinctivenessMasker(Short({}), delta=1.0).mask(items, adv, torch.tensor([0, 0]))
    assert issubclass(ScorerOutputError, ConfigError)  # the CLI prints it as one line, exit 2


def re_escape(text):
    import re

    return re.escape(text)


def test_rewards_beyond_float32_are_unscored_and_counted_and_strings_refused():
    def my_reward(response, problem):
        return 0.0

    values, out = checked_rewards([1.0, 1e300, -1e39, 3e38, None, math.nan, True], my_reward)
    assert out == 2
    assert values[0] == 1.0 and math.isnan(values[1]) and math.isnan(values[2]) and values[3] == 3e38
    assert values[4] is None and math.isnan(values[5]) and values[6] == 1.0
    with pytest.raises(RewardOutputError, match="reward my_reward returned str 'correct'"):
        checked_rewards([1.0, "correct"], my_reward)

    def huge(response, problem):
        return 1e300

    batch = StepBatch(step=0, samples=[sample(0, None), sample(0, None)])
    metrics = RewardResponses(huge)(batch, StepContext(seed=0, num_generations=2))
    assert metrics["reward/out_of_range"] == 2.0 and all(math.isnan(s.reward) for s in batch.samples)


# ---- the watch ------------------------------------------------------------------------------------------


def run_watch(watch, metrics, steps):
    return [watch.observe(s, metrics) for s in range(1, steps + 1)]


def test_watch_announces_unscored_rewards_and_failing_scorer():
    w = SignalWatch(patience=3, reward_name="rewards=my.mod:fn")
    said = run_watch(w, {"reward/unscored_frac": 1.0, "groups/uniform_frac": 1.0}, 3)
    assert [len(x) for x in said] == [0, 0, 2]
    assert any("rewards=my.mod:fn returned None or NaN for 100%" in line for line in said[2])
    said = run_watch(SignalWatch(patience=4), {"mask/unscored_frac": 1.0}, 4)
    assert "DaGRPO runs with no masks" in said[3][0]


def test_uniform_warning_suggests_only_remedies_that_apply():
    bad = {"groups/uniform_frac": 1.0, "groups/all_wrong_frac": 1.0, "groups/all_correct_frac": 0.0}
    plain = run_watch(SignalWatch(patience=1), bad, 1)[0][0]
    assert "anchors.enabled=true" in plain and "dynamic_sampling.enabled=true" in plain
    on = run_watch(SignalWatch(patience=1, anchors=True, dynamic_sampling=True), bad, 1)[0][0]
    assert "anchor" not in on and "dynamic_sampling" not in on
    refs_fail = run_watch(SignalWatch(patience=1, references_verify=False), bad, 1)[0][0]
    assert "anchor" not in refs_fail


def test_watch_announces_lost_anchors_with_the_counts():
    w = SignalWatch(patience=3, anchors=True, reward_name="rewards=math")
    lines = [
        w.observe(1, {"anchor/count": 0.0, "anchor/rejected_reference": 8.0, "anchor/too_long": 6.0}),
        w.observe(2, {"anchor/count": 0.0, "anchor/rejected_reference": 0.0, "anchor/too_long": 0.0}),
        w.observe(3, {"anchor/count": 0.0}),
    ]
    assert [len(x) for x in lines] == [0, 0, 1]
    assert "8 references failed rewards=math and 6 were longer than anchors.max_tokens" in lines[2][0]
    assert w.observe(4, {"anchor/count": 2.0}) == [] and w.anchor_losses["too_long"] == 0.0
    assert SignalWatch(patience=1).observe(1, {"anchor/count": 0.0}) == []  # anchors off: nothing to say
    # when=no_correct: no all-wrong group means no anchor by design; refused references still warn
    quiet = SignalWatch(patience=2, anchors=True, anchors_always=False)
    assert run_watch(quiet, {"anchor/count": 0.0}, 3) == [[], [], []]
    assert len(quiet.observe(4, {"anchor/count": 0.0, "anchor/rejected_reference": 1.0})) == 0
    assert len(quiet.observe(5, {"anchor/count": 0.0})) == 1


def test_non_finite_steps_and_float32_overflow_are_announced_at_once():
    w = SignalWatch(patience=3)
    said = run_watch(w, {"skipped_nonfinite": 1.0, "reward/out_of_range": 4.0}, 3)
    assert [len(x) for x in said] == [2, 0, 0]  # at the first step, once per streak
    assert any("update was skipped" in line for line in said[0])
    assert any("4 rewards were beyond float32" in line for line in said[0])
    w.observe(4, {"skipped_nonfinite": 0.0})
    assert len(w.observe(5, {"skipped_nonfinite": 1.0})) == 1  # a new streak


def test_watch_state_round_trips():
    w = SignalWatch(patience=3, anchors=True)
    w.observe(1, {"anchor/count": 0.0, "anchor/too_long": 2.0, "groups/uniform_frac": 1.0})
    v = SignalWatch(patience=3, anchors=True)
    v.load_state_dict(w.state_dict())
    assert v.streak == w.streak and v.anchor_losses == {"rejected_reference": 0.0, "too_long": 2.0}
    v.load_state_dict({"uniform": 2, "masked": 1})  # a checkpoint written before this round
    assert v.streak["uniform"] == 2


# ---- anchor metrics count what the anchor stages decided --------------------------------------------------


def test_replace_mode_anchor_metrics_count_decisions_made_before_sampling():
    p_ok, p_wrong, p_long = TASK.generate(3, seed=5)
    wrong = Problem(
        id=p_wrong.id, question=p_wrong.question, answer=p_wrong.answer, solution="#### 999", meta=p_wrong.meta
    )
    long = Problem(
        id=p_long.id,
        question=p_long.question,
        answer=p_long.answer,
        solution=p_long.solution + " " * 300,
        meta=p_long.meta,
    )
    reward = task_grader(TASK)
    inj = AnchorInjector(
        AnchorConfig(enabled=True, mode="replace", when="always"), reward, lambda text: [1] * len(text), max_tokens=100
    )
    problems = [p_ok, wrong, long]
    batch = StepBatch(step=0, problems=problems, group_ids=[0, 1, 2])
    ctx = StepContext(seed=0, num_generations=2, encode_prompt=lambda q: [1])
    assert ReserveAnchorSlots(inj)(batch, ctx) == {}
    assert batch.reserved == [1, 0, 0]
    batch.samples = [sample(g, None, text="no answer", problem=p) for g, p in enumerate(problems) for _ in range(2)]
    reward_metrics = RewardResponses(reward)(batch, ctx)
    assert reward_metrics["reward/checked"] == 6.0  # on-policy only: the 2 references checked are not counted
    metrics = InjectAnchors(inj)(batch, ctx)
    assert metrics["anchor/rejected_reference"] == 1.0 and metrics["anchor/too_long"] == 1.0
    assert metrics["anchor/count"] == 1.0 and metrics["anchor/reward_checks"] == 3.0  # 2 verdicts + 1 injected
    assert metrics["time/anchor_verify"] > 0.0
    assert reward.pop_counts().get("checked", 0) == 0  # nothing left over for the next step's reward/*
    # next step, same questions: verdicts are remembered, nothing new to count
    batch2 = StepBatch(step=1, problems=problems, group_ids=[3, 4, 5])
    ReserveAnchorSlots(inj)(batch2, ctx)
    batch2.samples = []
    m2 = InjectAnchors(inj)(batch2, ctx)
    assert m2["anchor/rejected_reference"] == 0.0 and m2["anchor/too_long"] == 0.0


def test_training_with_a_reward_that_scores_nothing_warns_in_the_log(tiny_model_dir, tmp_path):
    import sys
    from pathlib import Path

    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
    configs = Path(__file__).resolve().parents[2] / "configs"
    cfg = load_config(
        configs / "grpo.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={tmp_path / 'run'}",
            "data.num_train=16",
            "grpo.prompts_per_step=2",
            "grpo.num_generations=2",
            "rollout.max_new_tokens=4",
            "train.steps=3",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "rewards=[_user_rewards:always_none]",
            "rewards.timeout_s=0",
        ],
    )
    said = []
    metrics = build_trainer(cfg, tmp_path / "run", log=said.append).train()
    assert metrics["groups/uniform_frac"] == 1.0 and metrics["reward/unscored_frac"] == 1.0
    warnings = [line for line in said if line.startswith("warning (step 3)")]
    assert any("rewards=_user_rewards:always_none returned None or NaN for 100% of responses" in w for w in warnings)
    assert any("uniform rewards" in w and "anchors.enabled=true" in w for w in warnings)  # anchors off: suggested


def test_signal_watch_warns_once_per_streak():
    w = SignalWatch(patience=3)
    bad = {"groups/uniform_frac": 1.0, "groups/all_wrong_frac": 1.0, "groups/all_correct_frac": 0.0}
    said = [w.observe(step, bad) for step in range(1, 6)]
    assert [len(x) for x in said] == [0, 0, 1, 0, 0]
    assert "uniform rewards" in said[2][0] and "100%" in said[2][0]
    assert w.observe(6, {"groups/uniform_frac": 0.5}) == []  # the streak ends
    assert [len(w.observe(s, {"mask/advantaged_frac": 0.95})) for s in range(7, 10)] == [0, 0, 1]
    assert [len(w.observe(s, {"reward/no_answer_frac": 1.0})) for s in range(10, 13)] == [0, 0, 1]

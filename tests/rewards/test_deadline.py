"""A user reward runs under a deadline in a worker process: a hanging call scores None (unscored) and is
counted, and training goes on. Counts events, never times them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from regroup.rewards import pop_counts, score_many
from regroup.rewards.build import build_reward_fn
from regroup.rewards.deadline import DeadlineReward, UserRewardError
from regroup.tasks.base import Problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
PROBLEM = Problem(id="q", question="?", answer="1")  # what the trainer passes; it crosses to the worker as JSON


def test_a_hanging_reward_is_killed_scored_none_and_counted():
    fn = DeadlineReward("_user_rewards:hangs_on_x", timeout_s=1.0)
    try:
        assert score_many(fn, ["ok", "x", "fine"], [PROBLEM] * 3) == [1.0, None, 1.0]
        counts = pop_counts(fn)
        assert counts == {"checked": 3, "timeout": 1, "restarts": 1}
        assert fn("x again", PROBLEM) is None and fn.stats["timeout"] == 2
    finally:
        fn.close()


def test_a_dotted_reward_gets_the_deadline_unless_timeout_s_is_0():
    fn = build_reward_fn(["_user_rewards:length_reward"], None, timeout_s=5.0)
    try:
        assert isinstance(fn, DeadlineReward) and fn("abc", PROBLEM) == 3.0
    finally:
        fn.close()
    plain = build_reward_fn(["_user_rewards:length_reward"], None, timeout_s=0)
    assert not isinstance(plain, DeadlineReward) and plain("ab", PROBLEM) == 2.0


def test_errors_in_the_worker_are_one_line():
    fn = DeadlineReward("_user_rewards:raises", timeout_s=5.0)
    with pytest.raises(UserRewardError, match="reward _user_rewards:raises raised ValueError: bad input"):
        fn("r", PROBLEM)
    fn.close()
    with pytest.raises(UserRewardError, match="worker process ValueError: .*no attribute 'missing'"):
        DeadlineReward("_user_rewards:missing", timeout_s=5.0)("r", PROBLEM)
    dies = DeadlineReward("_user_rewards:dies", timeout_s=5.0)
    assert dies("r", PROBLEM) is None and dies.stats == {"checked": 1, "timeout": 0, "restarts": 1}
    dies.close()


def test_a_hanging_reward_in_a_training_step_is_unscored(tiny_model_dir, tmp_path):
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

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
            "train.steps=1",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "rewards=[_user_rewards:hangs_on_x]",
            "rewards.timeout_s=1",
            "rollout.temperature=1.0",
        ],
    )
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda m: None)
    # Make every response contain an x, so every call hangs.
    sample_stage = trainer.recipe.stages[0]
    original = sample_stage.__call__

    def with_x(batch, ctx):
        metrics = original(batch, ctx)
        for s in batch.samples:
            s.response_text = "x" + s.response_text
        return metrics

    trainer.recipe.stages[0] = type("XStage", (), {"name": "sample", "__call__": staticmethod(with_x)})()
    metrics = trainer.train()
    assert metrics["reward/unscored_frac"] == 1.0 and metrics["reward/timeout"] == 4.0
    assert metrics["groups/uniform_frac"] == 1.0
    trainer.recipe.reward_fn.close()


def test_a_timed_out_worker_is_replaced_at_once_and_lines_carry_any_text():
    """The pool kills a worker that ran past the deadline and starts the next one before the next call; a
    response with newlines and non-ASCII text crosses the JSON-lines pipe whole."""
    fn = DeadlineReward("_user_rewards:hangs_on_x", timeout_s=1.0)
    try:
        assert fn("ok", PROBLEM) == 1.0
        first = fn.pool.workers[0]
        assert fn("x", PROBLEM) is None
        assert first.proc.poll() is not None  # killed (with its group)
        following = fn.pool.workers[0]
        assert following is not first and following.proc.poll() is None  # already started
        assert fn("ok", PROBLEM) == 1.0 and fn.pool.workers[0] is following
    finally:
        fn.close()
    length = DeadlineReward("_user_rewards:length_reward", timeout_s=30.0)
    try:
        assert length("a\nb\u2028é\r\n", PROBLEM) == 7.0
    finally:
        length.close()

"""A user reward runs under a deadline in a worker process: a hanging call scores None (unscored) and is
counted, and training goes on. Counts events, never times them."""

from __future__ import annotations

import os
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
        assert counts == {"checked": 3, "timeout": 1, "restarts": 1, "protocol_errors": 0, "forked_returns": 0}
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
    assert dies("r", PROBLEM) is None
    assert dies.stats == {"checked": 1, "timeout": 0, "restarts": 1, "protocol_errors": 0, "forked_returns": 0}
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


# -- the reply protocol: a reply goes to its own request, or the call fails; never to another sample ---------------


def test_a_forked_child_that_returns_cannot_reply_for_the_worker(caplog):
    """The reward forks on "fork"; the child returns instead of calling os._exit and comes back into the worker's
    loop. It must not answer for the worker (its -1.0 once went to this sample, and it then read the next request):
    it says so, exits, and the worker's own reply is the score."""
    fn = DeadlineReward("_user_rewards:forks_on_fork", timeout_s=30.0)
    try:
        with caplog.at_level("WARNING", logger="regroup.rewards.pool"):
            assert score_many(fn, ["a", "fork", "ccc", "fork", "eeeee"], [PROBLEM] * 5) == [1.0, 4.0, 3.0, 4.0, 5.0]
        counts = pop_counts(fn)
        assert counts["forked_returns"] == 2 and counts["protocol_errors"] == 0 and counts["restarts"] == 0
        said = [r.getMessage() for r in caplog.records if "forked" in r.getMessage()]
        assert len(said) == 1 and "os._exit" in said[0]  # said once, counted each time
    finally:
        fn.close()


def test_a_line_written_on_the_reply_channel_fails_only_its_call(caplog):
    """The reward writes a reply-like line on the worker's reply channel on "bogus": that call is unscored, the
    worker replaced, the event counted and said once; every other sample keeps its own score (once they shifted:
    [1, 42, 2, 3] for [1, None, 3, 4])."""
    fn = DeadlineReward("_user_rewards:writes_on_bogus", timeout_s=30.0)
    try:
        with caplog.at_level("WARNING", logger="regroup.rewards.pool"):
            responses = ["a", "bogus", "ccc", "dddd", "bogus", "ffffff"]
            assert score_many(fn, responses, [PROBLEM] * 6) == [1.0, None, 3.0, 4.0, None, 6.0]
        counts = pop_counts(fn)
        assert counts["protocol_errors"] == 2 and counts["restarts"] == 2 and counts["checked"] == 6
        said = [r.getMessage() for r in caplog.records if "reply channel" in r.getMessage()]
        assert len(said) == 1 and "42" in said[0] and "replaced" in said[0]
    finally:
        fn.close()


def _write_on_reply_channel(worker, data: bytes) -> None:
    """Write `data` into `worker`'s reply pipe as another process would (through /proc: the same pipe)."""
    inode = os.fstat(worker.proc.stdout.fileno()).st_ino
    fds = Path(f"/proc/{worker.proc.pid}/fd")
    for fd in fds.iterdir():
        if os.readlink(fd) == f"pipe:[{inode}]":
            with open(fd, "wb", buffering=0) as pipe:
                pipe.write(data)
            return
    raise AssertionError("the worker holds no end of its reply pipe")


def test_data_on_the_reply_channel_between_calls_sends_the_next_call_to_a_new_worker():
    fn = DeadlineReward("_user_rewards:length_reward", timeout_s=30.0)
    try:
        assert fn("ab", PROBLEM) == 2.0
        first = fn.pool.workers[0]
        _write_on_reply_channel(first, b'{"id": 2, "value": 42}\n')  # even the id of the next request
        assert fn("abc", PROBLEM) == 3.0  # answered by a new worker, not by the line waiting there
        assert first.proc.poll() is not None and fn.pool.workers[0] is not first
        assert fn.stats["protocol_errors"] == 1 and fn.stats["restarts"] == 1
        # A forked child's notice between calls is counted, and the worker kept.
        second = fn.pool.workers[0]
        _write_on_reply_channel(second, b'{"forked_child": 12345}\n')
        assert fn("abcd", PROBLEM) == 4.0 and fn.pool.workers[0] is second
        assert fn.stats["forked_returns"] == 1 and fn.stats["protocol_errors"] == 1
    finally:
        fn.close()


def test_a_reward_error_quoting_an_api_key_is_shown_without_it(monkeypatch):
    key = "sk-proj-Qz7RkW2mPx9LbT4vNc8H"
    monkeypatch.setenv("REGROUP_SECRET_TEST_KEY", key)  # the worker inherits the environment
    fn = DeadlineReward("_user_rewards:raises_the_key", timeout_s=30.0)
    try:
        with pytest.raises(UserRewardError, match="raised ValueError: bad credentials") as err:
            fn("r", PROBLEM)
    finally:
        fn.close()
    assert "Qz7RkW2m" not in str(err.value) and "***" in str(err.value)

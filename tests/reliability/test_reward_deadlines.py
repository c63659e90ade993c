"""Every user reward has one deadline, `rewards.timeout_s`, whatever kind of callable it is; timeouts are a metric
and one warning naming the deadline, and a reward that times out on every call is refused before the weights load.
Real worker processes on a hostile reward (`reliability_helpers.HOSTILE_REWARDS`); each case failed before its fix."""

from __future__ import annotations

import pytest
import reliability_helpers as h

from regroup.cli import main

pytestmark = pytest.mark.reliability

problem = h.problem


@pytest.mark.parametrize(
    "name", ["hostile_rewards:slow_partial", "hostile_rewards:slow_cached", "hostile_rewards:slow_object"]
)
def test_every_kind_of_callable_gets_the_deadline(reward_dir, name):
    from regroup.rewards import pop_counts
    from regroup.rewards.build import build_reward_fn

    fn = build_reward_fn([name], None, timeout_s=1.0)
    try:
        assert fn("r", problem()) is None  # killed at 1 s, not waited for 4 s in-process
        assert pop_counts(fn)["timeout"] == 1
    finally:
        fn.close()


def test_sustained_timeouts_are_a_metric_and_one_warning_naming_the_deadline(reward_dir, caplog):
    from regroup.rewards.deadline import DeadlineReward
    from regroup.stages.rewarding import pop_reward_counts

    fn = DeadlineReward("hostile_rewards:hangs_on_x", timeout_s=0.5)
    shares = []
    try:
        with caplog.at_level("WARNING", logger="regroup.rewards.deadline"):
            for _ in range(4):  # a quarter of each batch times out
                fn.check_many(["a", "b", "c", "x"], [problem()] * 4)
                shares.append(pop_reward_counts(fn)["reward/timeout_frac"])
    finally:
        fn.close()
    assert shares == [0.25] * 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per streak, at the third batch in a row
    assert "rewards.timeout_s=0.5" in warnings[0] and "1 of 4 calls (25%)" in warnings[0]


def test_the_unscored_warning_blames_the_timeout_not_none_or_nan():
    from regroup.diagnostics.signals import SignalWatch

    watch = SignalWatch(reward_name="rewards=hostile_rewards:hangs")
    lines = []
    for step in (1, 2, 3):
        lines += watch.observe(step, {"reward/unscored_frac": 1.0, "reward/timeout_frac": 1.0})
    assert len(lines) == 1
    assert "timed out" in lines[0] and "rewards.timeout_s" in lines[0] and "None or NaN" not in lines[0]


def test_the_pre_load_check_fails_when_every_call_times_out(reward_dir, tiny_model_dir, tmp_path, capsys, no_weights):
    args = h.train_args(
        tiny_model_dir, tmp_path / "run", "grpo.yaml", "rewards=[hostile_rewards:hangs]", "rewards.timeout_s=0.5"
    )
    assert main(args) == 2
    line = h.one_line(capsys)
    assert "timed out at rewards.timeout_s=0.5" in line

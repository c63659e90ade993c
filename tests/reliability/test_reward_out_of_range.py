"""A reward returning 10**400 (an int no float holds) is counted out of range and unscored during training, and
refused in one line by the pre-load check: never an `OverflowError` traceback."""

from __future__ import annotations

import pytest
import reliability_helpers as h

from regroup.cli import main

pytestmark = pytest.mark.reliability

problem = h.problem


def test_a_reward_returning_10_to_the_400_is_counted_out_of_range_not_an_overflow(reward_dir):
    from regroup.rewards.build import build_reward_fn
    from regroup.stages.rewarding import checked_rewards

    for timeout_s in (30.0, 0.0):  # in a worker, and in-process
        fn = build_reward_fn(["hostile_rewards:huge"], None, timeout_s=timeout_s)
        try:
            assert checked_rewards([fn("r", problem())], fn)[1] == 1
        finally:
            getattr(fn, "close", lambda: None)()


def test_a_reward_returning_10_to_the_400_is_one_line_before_weights_load(
    reward_dir, tiny_model_dir, tmp_path, capsys, no_weights
):
    args = h.train_args(tiny_model_dir, tmp_path / "run", "grpo.yaml", "rewards=[hostile_rewards:huge]")
    assert main(args) == 2
    line = h.one_line(capsys)
    assert "beyond float32" in line and "OverflowError" not in line

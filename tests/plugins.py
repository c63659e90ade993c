"""Pieces the tests name by dotted path (`plugins:NAME` in a config), as a user names theirs: rewards and a
scorer. They live in a module of their own because test modules are imported by path (pytest's importlib
mode), not by name."""

from __future__ import annotations

from regroup.scorers.base import Scorer
from regroup.tasks import get_task

TASK = get_task("arithmetic")


def noisy_reward_mod5(response: str, problem) -> float | None:
    """Grade, else a length-based 0/1 (mixed groups from a random model), None when the length % 5 == 0."""
    if TASK.grade(response, problem) == 1.0:
        return 1.0
    if len(response) % 5 == 0:
        return None
    return float(len(response) % 3 == 0)


def noisy_reward_mod7(response: str, problem) -> float | None:
    """The task grade, else a length-based 0/1; None (unscorable) when the length is a multiple of 7."""
    if TASK.grade(response, problem) == 1.0:
        return 1.0
    if len(response) % 7 == 0:
        return None
    return float(len(response) % 3 == 0)


class LengthScorer(Scorer):
    """A fine-grained score from the response length (1..10): mixed DaGRPO masks from a random model."""

    name = "length"

    def score_batch(self, items):
        return [1.0 + len(it.response) % 10 for it in items]


def varied_reward(response: str, problem) -> float:
    """A reward that varies within a group, so the update moves the weights: with 16 new tokens SmolLM2
    gets every built-in problem wrong, the task reward is 0 everywhere, and so is the loss."""
    return min(len(response), 48) / 48


def graded_or_parity(response: str, problem) -> float:
    """The task grade, else the parity of the response's characters: 0/1 rewards that differ within a group of a
    random model's responses, and a correct reference solution always verifies (DaGRPO anchors)."""
    if TASK.grade(response, problem) == 1.0:
        return 1.0
    return float(sum(map(ord, response)) % 2)

"""The held-out set: generated problems a run is evaluated on, never a training question."""

from __future__ import annotations


def heldout_problems(task, num_eval: int, eval_seed: int, train_problems: list | None = None) -> list:
    """`num_eval` generated problems from another seed, minus any question that is also in training."""
    seen = {p.question for p in train_problems or []}
    problems = task.generate(2 * num_eval + 64, seed=eval_seed)
    return [p for p in problems if p.question not in seen][:num_eval]

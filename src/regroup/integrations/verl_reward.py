"""verl's reward function for regroup's tasks: `reward.custom_reward_function.path` names this file and
`name=compute_score`. It grades a response with the task's own grader against the row's ground truth.

With the plug-in's trainer (`trainer.v1.trainer_mode=regroup`) this score is what verl's reward workers log;
the recipe's reward stages (`rewards.*`) score every response again in the trainer, and their reward is the
one the advantages use and the one written back for verl's metrics. Without the plug-in's trainer it is a
plain verifiable reward for verl's own GRPO.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from regroup.tasks import Problem, get_task

TASK_KEY = "regroup_task"
"""`extra_info` key naming the task (default: "arithmetic")."""


@lru_cache(maxsize=8)
def _task(name: str) -> Any:
    return get_task(name)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **_: Any):
    """The task's grade of `solution_str` against `ground_truth` (verl's custom reward signature)."""
    info = dict(extra_info or {})
    problem = Problem(id=str(info.get("regroup_question_id", "")), question="", answer=str(ground_truth))
    return float(_task(str(info.get(TASK_KEY, "arithmetic"))).grade(solution_str, problem))

"""verl's reward function for regroup's tasks: `reward.custom_reward_function.path` names this file and
`name=compute_score`. It grades a response with the task's own grader against the row's ground truth.

Which task grades: the `regroup_task` keyword, which verl passes from the run's config
(`reward.custom_reward_function.reward_kwargs.regroup_task`; the plug-in's trainer sets it to the
recipe's `data.task`). A config is what the user typed, so it may name a task by `package.module:object`.
Without it, a dataset row's `extra_info["regroup_task"]` may name a *registered* task only: a row is data
(a shared parquet file), and data never chooses code to import. Neither: "arithmetic".

With the plug-in's trainer (`trainer.v1.trainer_mode=regroup`) this score is what verl's reward workers log;
the recipe's reward stages (`rewards.*`) score every response again in the trainer, and their reward is the
one the advantages use and the one written back for verl's metrics. Without the plug-in's trainer it is a
plain verifiable reward for verl's own GRPO.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from regroup.config.registry import TASKS
from regroup.tasks import Problem, get_task

TASK_KEY = "regroup_task"
"""The keyword (from the config's `reward_kwargs`) and the `extra_info` key (registered names only) naming
the task."""
DEFAULT_TASK = "arithmetic"


@lru_cache(maxsize=8)
def _task(name: str) -> Any:
    return get_task(name)


def row_task(extra_info: dict) -> str:
    """The task a dataset row names (`extra_info["regroup_task"]`, default "arithmetic"): a registered name, or
    ValueError; nothing is imported for a name that is not registered."""
    name = str(extra_info.get(TASK_KEY, DEFAULT_TASK))
    if name not in TASKS:
        raise ValueError(
            f"extra_info[{TASK_KEY!r}]={name!r}: a dataset row may name a registered task only "
            f"({', '.join(TASKS.names())}); name a user task in the config instead "
            f"(reward.custom_reward_function.reward_kwargs.{TASK_KEY}, set by the plug-in from data.task)"
        )
    return name


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    regroup_task: str | None = None,
    **_: Any,
):
    """The task's grade of `solution_str` against `ground_truth` (verl's custom reward signature).
    `regroup_task`: the config's task (verl's `reward_kwargs`); None: the row's registered task."""
    info = dict(extra_info or {})
    name = str(regroup_task) if regroup_task else row_task(info)
    problem = Problem(id=str(info.get("regroup_question_id", "")), question="", answer=str(ground_truth))
    return float(_task(name).grade(solution_str, problem))

"""The held-out set: generated problems a run is evaluated on, never a training question, or the run's
`data.eval_file`."""

from __future__ import annotations

from regroup.config.schema import RunConfig
from regroup.data.load import FieldMap, load_problems


def heldout_problems(task, num_eval: int, eval_seed: int, train_problems: list | None = None) -> list:
    """`num_eval` generated problems from another seed, minus any question that is also in training."""
    seen = {p.question for p in train_problems or []}
    problems = task.generate(2 * num_eval + 64, seed=eval_seed)
    return [p for p in problems if p.question not in seen][:num_eval]


def eval_problems(cfg: RunConfig, task, train_problems: list, log=print) -> list:
    """The held-out questions evaluated during training: `data.eval_file`, else the task's held-out set."""
    limit = cfg.train.eval_limit
    if cfg.data.eval_file:
        fields = FieldMap(
            question=cfg.data.question_field, answer=cfg.data.answer_field, solution=cfg.data.solution_field
        )
        return load_problems(cfg.data.eval_file, fields, skip_bad_rows=cfg.data.skip_bad_rows).problems[:limit]
    return heldout_problems(task, limit, cfg.data.eval_seed, train_problems)

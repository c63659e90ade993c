"""Tasks: where problems, graders, step scorers and rephrasings come from. `get_task` picks one by name
(a task registered on `regroup.config.registry.TASKS`, or "pkg.mod:obj")."""

from __future__ import annotations

from typing import Any

from regroup.config.registry import TASKS, load_dotted
from regroup.tasks import arithmetic  # noqa: F401  (registers "arithmetic")
from regroup.tasks.base import Problem, Task

__all__ = ["Problem", "Task", "get_task"]


def _load_dotted(spec: str) -> Any:
    if ":" not in spec:
        raise ValueError(f"task {spec!r}: expected a built-in name ({', '.join(TASKS)}) or 'package.module:object'")
    try:
        return load_dotted(spec)
    except ValueError as exc:
        raise ValueError(f"task {spec!r}: {exc}") from None


def get_task(name: str, **kwargs: Any) -> Any:
    """The task called `name`: a registered one ("arithmetic", built with `kwargs`), or "pkg.mod:obj" naming
    a task object, a task class, or a factory function (classes and factories are called with `kwargs`).

    A task needs a `name` and a `grade(response, problem) -> float`; raises ValueError otherwise.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"get_task: task name must be a non-empty string, got {name!r}")
    if name in TASKS:
        return TASKS.get(name)(**kwargs)
    obj = _load_dotted(name)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "grade")):
        obj = obj(**kwargs)
    elif kwargs:
        raise ValueError(f"task {name!r} is an object, not a class or factory: it takes no arguments {sorted(kwargs)}")
    if not callable(getattr(obj, "grade", None)):
        raise ValueError(f"task {name!r}: {type(obj).__name__} has no grade(response, problem) method")
    if not getattr(obj, "name", None):
        raise ValueError(f"task {name!r}: {type(obj).__name__} has no `name`")
    return obj

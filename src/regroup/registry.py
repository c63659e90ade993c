"""Pluggable pieces by name: a built-in name, or a user's "package.module:object" (class, factory or
ready instance).

One `Registry` per kind of piece (verl's `register_policy_loss` pattern). A built-in registers where it
is defined, with `@POLICY_LOSSES.register("cispo")`; a user's piece needs no registration: its name is
the dotted path `"package.module:object"`, which `Registry.get` imports. The registries below are the
single source of piece names: config validation, `regroup config --stages` and the docs read them.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any


def did_you_mean(name: str, known) -> str:
    """` (did you mean 'x'?)` for the closest of `known`, or ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry:
    """Named pieces of one kind. `register(name)` is a decorator; `get(name)` returns a built-in or imports a
    `"package.module:object"`; `names()` lists the built-ins in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None):
        """Register `obj` as `name` (or use as `@registry.register(name)`); a name is registered once."""
        if ":" in name:
            raise ValueError(f"{self.kind} name {name!r} must not contain ':' (that marks a dotted path)")

        def add(item):
            if name in self._items and self._items[name] is not item:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return add if obj is None else add(obj)

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self):
        return iter(self._items)

    def known(self, name: str) -> bool:
        """A built-in name, or something shaped like a dotted path (imported only by `get`)."""
        return name in self._items or ":" in name

    def get(self, name: str) -> Any:
        """The built-in called `name`, or the object a `"package.module:object"` names (ValueError otherwise)."""
        if ":" in name:
            return load_dotted(name)
        if name in self._items:
            return self._items[name]
        raise ValueError(
            f"unknown {self.kind} {name!r}; known: {', '.join(self._items)} or "
            f"'package.module:object'{did_you_mean(name, self._items)}"
        )


STAGES = Registry("stage")
"""Stage classes (`regroup.stages.base.Stage`)."""
POLICY_LOSSES = Registry("policy loss")
"""Per-token policy-gradient terms: PPO clip, GSPO, CISPO, SAPO, GMPO, ..."""
KL_ESTIMATORS = Registry("KL estimator")
"""Per-token KL(pi_theta || pi_ref) estimators: k1, k2, k3, low_var_kl."""
LOSS_TERMS = Registry("loss term")
"""Extra terms added to the policy loss (entropy bonus, ...)."""
REWARDS = Registry("reward")
"""Reward builders `(task, *, workers, correct_threshold) -> reward_fn` ("task", "math"); a dotted path names
the reward function itself."""
SCORERS = Registry("scorer")
"""Scorer classes and factories for DaGRPO masks ("step", "judge", "similarity")."""
REPHRASERS = Registry("rephraser")
"""Rephraser classes and factories for TA-GRPO ("rules", "openai", "dataset")."""
TASKS = Registry("task")
"""Task classes ("arithmetic"), built with the task's keyword settings."""


def load_dotted(path: str) -> Any:
    """The object named by `"package.module:attribute"` (attribute may be dotted: `mod:Class.factory`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:object', got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


def build_named(
    kind: str, name: str, builtins: Registry | dict[str, Callable[..., Any]], method: str, **kwargs: Any
) -> Any:
    """The `kind` called `name` built with `kwargs`: a name in `builtins` (a Registry of classes and
    factories), or a dotted path to a class or factory (called with `kwargs`) or to a ready instance
    (which takes no settings). The result must have a callable `method`."""
    if ":" in name:
        obj = load_dotted(name)
        if hasattr(obj, method) and not isinstance(obj, type):
            if kwargs:
                raise TypeError(f"{name!r} is a {kind} instance; it takes no settings, got {sorted(kwargs)}")
            built = obj
        elif callable(obj):
            built = obj(**kwargs)
        else:
            raise TypeError(f"{name!r} is neither a {kind} nor a callable that builds one")
    elif name in builtins:
        built = builtins.get(name)(**kwargs)
    else:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(builtins)} or 'package.module:object'")
    if not callable(getattr(built, method, None)):
        raise TypeError(f"{kind} {name!r} has no {method}(...) method")
    return built

"""Pluggable pieces by name: a built-in name, or a user's "package.module:object" (class, factory or instance).

One `Registry` per kind of piece (verl's `register_policy_loss` pattern): a built-in registers where it is defined,
`@POLICY_LOSSES.register("cispo", args=CISPOArgs)`; a user's piece is named by its dotted path, which `get` imports.
The registries are the single source of piece names: config validation, `regroup config --stages` and the docs read
them. A piece's knobs are a `Knobs` model (`regroup.config.fields`), attached as its `Args` attribute
(`register(..., args=)`, or `@takes(Args)` on a user's piece); `parse_args` checks the user's mapping (e.g.
`grpo.policy_loss_args`) against it, and the piece is called with the built knobs as `args=`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from regroup.config.fields import Knobs, check, did_you_mean, short
from regroup.errors import ConfigError, import_hint


class Registry:
    """Named pieces of one kind. `register(name)` is a decorator; `get(name)` returns a built-in or imports a
    `"package.module:object"`; `names()` lists the built-ins in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None, *, args: type | None = None):
        """Register `obj` as `name` (or use as `@registry.register(name)`); a name is registered once.
        `args`: the piece's knobs (a `Knobs` model), attached as its `Args` attribute."""
        if ":" in name:
            raise ValueError(f"{self.kind} name {name!r} must not contain ':' (that marks a dotted path)")
        if args is not None:
            check_args_class(args, f"{self.kind} {name!r}")

        def add(item):
            if name in self._items and self._items[name] is not item:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if args is not None:
                item.Args = args
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

    def resolve(self, key: str, name: str, must_call: bool = True) -> Any:
        """`get(name)` for the setting `key`: a ConfigError naming it when the name is unknown, its module fails to
        import, it is not callable (`must_call`), or its `Args` is malformed."""
        try:
            obj = self.get(name)
            args_class(obj)
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
        except Exception as e:  # the user's module failed while importing
            raise ConfigError(f"{key}: importing {name!r} failed: {type(e).__name__}: {e}") from None
        if must_call and not callable(obj):
            raise ConfigError(f"{key}: {name!r} is a {type(obj).__name__}, not callable")
        return obj


STAGES = Registry("stage")
"""Stage classes (`regroup.stages.base.Stage`)."""
POLICY_LOSSES = Registry("policy loss")
"""Per-token policy-gradient terms: PPO clip, GSPO, CISPO, SAPO, GMPO, VESPO, LUSPO, ..."""
KL_ESTIMATORS = Registry("KL estimator")
"""Per-token KL(pi_theta || pi_ref) estimators: k1, k2, k3, low_var_kl."""
LOSS_TERMS = Registry("loss term")
"""Extra terms added to the policy loss (entropy bonus, ...)."""
ADV_ESTIMATORS = Registry("advantage estimator")
"""Advantage estimators `(rewards[B], group_ids[B]) -> advantages[B]`: grpo (group std), dr_grpo (unscaled)."""
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
        raise ValueError(
            f"cannot import module {module_name!r} (from {path!r}): {exc}{import_hint(exc, module_name)}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


def build_named(kind: str, name: str, registry: Registry, method: str, **kwargs: Any) -> Any:
    """The `kind` called `name` built with `kwargs`: a built-in of `registry`, a dotted class or factory (called with
    `kwargs`), or a dotted ready instance (which takes no settings). The result must have a callable `method`."""
    if name not in registry and ":" not in name:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(registry)} or 'package.module:object'")
    obj = registry.get(name)
    if ":" in name and hasattr(obj, method) and not isinstance(obj, type):
        if kwargs:
            raise TypeError(f"{name!r} is a {kind} instance; it takes no settings, got {sorted(kwargs)}")
        built = obj
    elif callable(obj):
        built = obj(**kwargs)
    else:
        raise TypeError(f"{name!r} is neither a {kind} nor a callable that builds one")
    if not callable(getattr(built, method, None)):
        raise TypeError(f"{kind} {name!r} has no {method}(...) method")
    return built


# ---- a piece's knobs -------------------------------------------------------------------------------------------


def takes(args: type):
    """`@takes(Args)`: the decorated piece (a user's too) declares the knobs `Args`."""
    check_args_class(args, getattr(args, "__qualname__", "Args"))

    def attach(obj):
        obj.Args = args
        return obj

    return attach


def check_args_class(args: Any, what: str) -> None:
    """A piece's `Args`: a `Knobs` model whose knobs all have defaults (the knobs are optional)."""
    if not (isinstance(args, type) and issubclass(args, Knobs)):
        raise ValueError(f"{what}: its Args must be a regroup.config.fields.Knobs model, got {args!r}")
    for name, field in args.model_fields.items():
        if field.is_required():
            raise ValueError(f"{what}: knob {name!r} of {args.__name__} needs a default")


def args_class(obj: Any) -> type[Knobs] | None:
    """The piece's `Args`, or None when it has no knobs."""
    args = getattr(obj, "Args", None)
    if args is not None:
        check_args_class(args, f"{obj!r}")
    return args


def call_piece(piece: Any, args: Any, *inputs: Any, **extra: Any) -> Any:
    """`piece(*inputs, **extra)`, with `args=` when the piece declares knobs (an `Args`)."""
    if args_class(piece) is not None:
        extra["args"] = args
    return piece(*inputs, **extra)


def parse_args(args: type[Knobs] | None, given: Any, key: str, what: str) -> Any:
    """The knobs `args` built from the user's mapping `given` (None or {}: the defaults), or None for a piece
    without knobs. ConfigError naming `key.<knob>` for an unknown knob, a wrong type or a bound."""
    if args is not None and isinstance(given, args):
        return given
    if not isinstance(given, Mapping | None):
        raise ConfigError(f"{key}: expected a mapping of knob: value, got {type(given).__name__} {short(given)}")
    if args is None:
        if given:
            raise ConfigError(f"{key}: {what} takes no knobs, got {', '.join(map(str, given))}")
        return None
    return check(args, dict(given or {}), key + ".", owner=what)

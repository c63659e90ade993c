"""Pluggable pieces by name: a built-in name, or a user's "package.module:object" (class, factory or
ready instance).

One `Registry` per kind of piece (verl's `register_policy_loss` / `register_adv_est` pattern). A built-in
registers where it is defined, with `@POLICY_LOSSES.register("cispo", args=CISPOArgs)`; a user's piece needs
no registration: its name is the dotted path `"package.module:object"`, which `Registry.get` imports. The
registries below are the single source of piece names: config validation, `regroup config --stages` and
the docs read them.

A piece with knobs declares them as a `Knobs` model whose fields are `F(default, "help", ge=/gt=/le=/lt=)`, the
run config's own kind of setting (`regroup.config.fields`), and attaches it as the piece's `Args` attribute
(`register(..., args=)` or `@takes(Args)`, which a user's piece uses too; a frozen dataclass of `knob` fields, the
older form, is checked the same way). `parse_args(Args, mapping, key)` builds it from the user's mapping (e.g.
`grpo.policy_loss_args`): an unknown knob, a wrong type or a value out of bounds is one ConfigError naming the
key. The piece is then called with the built knobs as its `args=` keyword.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field, create_model

from regroup.config.fields import F, Knobs, check, did_you_mean
from regroup.errors import ConfigError, import_hint


def knob(default: Any, help: str, **bounds: Any) -> Any:
    """A knob of the older form of `Args`, a frozen dataclass: its default, and the setting `F(default, help,
    **bounds)` that checks it (`knob_model`)."""
    return dataclasses.field(default=default, metadata={"setting": F(default, help, **bounds)})


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
        factory: Any = builtins.get(name)  # a Registry or a plain dict of factories
        built = factory(**kwargs)
    else:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(builtins)} or 'package.module:object'")
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
    """A piece's `Args`: a `Knobs` model (or a dataclass) whose knobs all have defaults (the knobs are optional)."""
    if not (isinstance(args, type) and (issubclass(args, Knobs) or dataclasses.is_dataclass(args))):
        raise ValueError(f"{what}: its Args must be a regroup.config.fields.Knobs model, got {args!r}")
    for name, field in knob_model(args).model_fields.items():
        if field.is_required():
            raise ValueError(f"{what}: knob {name!r} of {args.__name__} needs a default")


@functools.cache
def knob_model(args: Any) -> type[BaseModel]:
    """The `Knobs` model of a piece's `Args`: itself, or one made from a dataclass's fields (their `knob` defaults
    carry the help and bounds), so both forms are checked by the one mechanism."""
    if issubclass(args, BaseModel):
        return args
    hints, missing = typing.get_type_hints(args), dataclasses.MISSING
    made: Any = lambda f: ... if f.default_factory is missing else Field(default_factory=f.default_factory)
    fields: Any = {
        f.name: (hints[f.name], f.metadata.get("setting", made(f) if f.default is missing else f.default))
        for f in dataclasses.fields(args)
    }
    try:
        return create_model(args.__name__, __base__=Knobs, **fields)
    except Exception as exc:  # a type pydantic cannot check
        raise ValueError(f"{args.__name__}: {exc}") from None


def args_class(obj: Any) -> type | None:
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


def parse_args(args: type | None, given: Any, key: str, what: str) -> Any:
    """The knobs `args` built from the user's mapping `given` (None or {}: the defaults), or None for a piece
    without knobs. ConfigError naming `key.<knob>` for an unknown knob, a wrong type or a bound."""
    if given is None:
        given = {}
    if args is not None and isinstance(given, args):
        return given
    if not isinstance(given, Mapping):
        raise ConfigError(f"{key}: expected a mapping of knob: value, got {type(given).__name__} {given!r}")
    if args is None:
        if given:
            raise ConfigError(f"{key}: {what} takes no knobs, got {', '.join(map(str, given))}")
        return None
    built = check(knob_model(args), dict(given), key + ".", owner=what)
    if built.__class__ is args:
        return built
    try:  # a dataclass: built from the checked values, its own cross-knob check (__post_init__) included
        return args(**dict(built))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key}: {exc}") from None

"""Pluggable pieces by name: a built-in name, or a user's "package.module:object" (class, factory or
ready instance).

One `Registry` per kind of piece (verl's `register_policy_loss` / `register_adv_est` pattern). A built-in
registers where it is defined, with `@POLICY_LOSSES.register("cispo", args=CISPOArgs)`; a user's piece needs
no registration: its name is the dotted path `"package.module:object"`, which `Registry.get` imports. The
registries below are the single source of piece names: config validation, `regroup config --stages` and
the docs read them.

A piece with knobs declares them as a small frozen dataclass whose fields are `knob(default, "help",
ge=/gt=/le=/lt=)` and attaches it as the piece's `Args` attribute (`register(..., args=)` or `@takes(Args)`,
which a user's piece uses too). `parse_args(Args, mapping, key)` builds it from the user's mapping (e.g.
`grpo.policy_loss_args`): an unknown knob, a wrong type or a value out of bounds is one ValueError naming
the key. The piece is then called with the built dataclass as its `args=` keyword.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args, get_origin

from regroup.errors import import_hint


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

    def register(self, name: str, obj: Any = None, *, args: type | None = None):
        """Register `obj` as `name` (or use as `@registry.register(name)`); a name is registered once.
        `args`: the piece's knobs (a dataclass of `knob` fields), attached as its `Args` attribute."""
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

_BOUNDS = ("ge", "gt", "le", "lt")
_SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def knob(default: Any, help: str, *, ge=None, gt=None, le=None, lt=None):
    """A field of a piece's `Args` dataclass: its default, its help line and, for a number, its bounds
    (ge / gt: >= / >, le / lt: <= / <). Every numeric knob of a built-in has bounds (a test checks it)."""
    return dataclasses.field(default=default, metadata={"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt})


def takes(args: type):
    """`@takes(Args)`: the decorated piece (a user's too) declares the knobs `Args` (a dataclass of `knob`s)."""
    check_args_class(args, getattr(args, "__qualname__", "Args"))

    def attach(obj):
        obj.Args = args
        return obj

    return attach


def check_args_class(args: Any, what: str) -> None:
    """A piece's `Args` must be a dataclass whose fields all have defaults (the knobs are optional)."""
    if not (isinstance(args, type) and dataclasses.is_dataclass(args)):
        raise ValueError(f"{what}: its Args must be a dataclass, got {args!r}")
    for f in dataclasses.fields(args):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{what}: knob {f.name!r} of {args.__name__} needs a default")


def args_class(obj: Any) -> type | None:
    """The piece's `Args` dataclass, or None when it has no knobs."""
    args = getattr(obj, "Args", None)
    if args is not None:
        check_args_class(args, f"{obj!r}")
    return args


def call_piece(piece: Any, args: Any, *inputs: Any, **extra: Any) -> Any:
    """`piece(*inputs, **extra)`, with `args=` when the piece declares knobs (an `Args` dataclass)."""
    if args_class(piece) is not None:
        extra["args"] = args
    return piece(*inputs, **extra)


def knob_rows(args: type) -> list[tuple[str, str, str, str]]:
    """(name, type, default, help with bounds) per knob of `args`, for the docs and `regroup config`."""
    hints = typing.get_type_hints(args)
    rows = []
    for f in dataclasses.fields(args):
        bounds = [f"{_SYMBOLS[op]} {f.metadata[op]:g}" for op in _BOUNDS if f.metadata.get(op) is not None]
        text = f.metadata.get("help", "") + (f" [{', '.join(bounds)}]" if bounds else "")
        rows.append((f.name, getattr(hints[f.name], "__name__", str(hints[f.name])), repr(f.default), text))
    return rows


def _knob_value(value: Any, hint: Any, key: str, meta: Mapping) -> Any:
    """`value` checked against the knob's type hint and bounds (ints become floats for a float knob)."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in get_args(hint) if a is not type(None))
    elif value is None:
        raise ValueError(f"{key}: must not be null")
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if not any(value == c and type(value) is type(c) for c in choices):
            raise ValueError(f"{key}: must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true/false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, str) and hint is float:  # YAML 1.1 reads "3e-4" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}: expected {'an integer' if hint is int else 'a number'}, got {value!r}")
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{key}: expected an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        ge, gt, le, lt = (meta.get(op) for op in _BOUNDS)
        if (
            (isinstance(value, float) and not math.isfinite(value))
            or (ge is not None and value < ge)
            or (gt is not None and value <= gt)
            or (le is not None and value > le)
            or (lt is not None and value >= lt)
        ):
            bounds = " and ".join(f"{_SYMBOLS[op]} {meta[op]:g}" for op in _BOUNDS if meta.get(op) is not None)
            raise ValueError(f"{key} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
        return value
    return value  # any other annotation: the piece checks it itself


def parse_args(args: type | None, given: Any, key: str, what: str) -> Any:
    """The `args` dataclass built from the user's mapping `given` (None or {}: the defaults), or None for a
    piece without knobs. ValueError naming `key.<knob>` for an unknown knob, a wrong type or a bound."""
    if given is None:
        given = {}
    if args is not None and isinstance(given, args):
        return given
    if not isinstance(given, Mapping):
        raise ValueError(f"{key}: expected a mapping of knob: value, got {type(given).__name__} {given!r}")
    if args is None:
        if given:
            raise ValueError(f"{key}: {what} takes no knobs, got {', '.join(map(str, given))}")
        return None
    hints = typing.get_type_hints(args)
    fields = {f.name: f for f in dataclasses.fields(args)}
    values = {}
    for name, value in given.items():
        if name not in fields:
            raise ValueError(
                f"{key}: unknown knob {name!r} of {what}{did_you_mean(name, fields)} (known: {', '.join(fields)})"
            )
        values[name] = _knob_value(value, hints[name], f"{key}.{name}", fields[name].metadata)
    try:
        return args(**values)
    except (TypeError, ValueError) as exc:  # the dataclass's own cross-knob check (__post_init__)
        raise ValueError(f"{key}: {exc}") from None

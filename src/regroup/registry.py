"""Pluggable pieces by name: a built-in name, or a user's "package.module:object" (class, factory or
ready instance). Used for scorers, rephrasers, reward functions and tasks."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


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


def build_named(kind: str, name: str, builtins: dict[str, Callable[..., Any]], method: str, **kwargs: Any) -> Any:
    """The `kind` called `name` built with `kwargs`: a key of `builtins`, or a dotted path to a class or
    factory (called with `kwargs`) or to a ready instance (which takes no settings). The result must
    have a callable `method`."""
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
        built = builtins[name](**kwargs)
    else:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(builtins)} or 'package.module:object'")
    if not callable(getattr(built, method, None)):
        raise TypeError(f"{kind} {name!r} has no {method}(...) method")
    return built

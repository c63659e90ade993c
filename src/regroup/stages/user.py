"""User stages by dotted path: `stages.extra` entries `[before:NAME=|after:NAME=]package.module:Object`.

`Object` is a stage class (built with no arguments) or a ready stage instance: anything with a `name` and
`__call__(batch, ctx) -> metrics` (see `regroup.stages.base`). NAME is a built-in stage the recipe runs;
an entry without a position runs after the last stage. `regroup.config.schema` checks each entry (syntax,
position, import, shape) before any model loads; `regroup.train.recipes.build_recipe` inserts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from regroup.config.registry import Registry, did_you_mean, load_dotted
from regroup.errors import ConfigError

ENTRY = re.compile(r"(?:(?P<where>before|after):(?P<anchor>[A-Za-z0-9_\-]+)=)?(?P<path>[\w.]+:[\w.]+)")


@dataclass(frozen=True)
class StageEntry:
    path: str
    """"package.module:Object"."""
    where: str = "end"
    """"before", "after" or "end"."""
    anchor: str | None = None
    """The built-in stage `where` refers to (None at the end)."""


def parse_stage_entry(text: str) -> StageEntry:
    """`after:advantages=mypkg.mod:MyStage` -> StageEntry; ValueError with the expected form otherwise."""
    match = ENTRY.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not '[before:STAGE=|after:STAGE=]package.module:Object'")
    return StageEntry(match["path"], match["where"] or "end", match["anchor"])


def _is_stage(obj: Any) -> bool:
    """A stage class (a str `name` and an instance `__call__`) or a stage instance."""
    if isinstance(obj, type):
        return isinstance(getattr(obj, "name", None), str) and "__call__" in dir(obj)
    return isinstance(getattr(obj, "name", None), str) and callable(obj)


def _import_stage(path: str) -> Any:
    try:
        obj = load_dotted(path)
    except ValueError:
        raise
    except Exception as e:  # the user's module failed while importing
        raise ValueError(f"importing {path!r} failed: {type(e).__name__}: {e}") from None
    if not _is_stage(obj):
        raise ValueError(
            f"{path!r} is not a stage: expected a class with a `name` and `__call__(batch, ctx)` "
            f"(or an instance of one), got {type(obj).__name__}"
        )
    return obj


def check_user_stage(entry: StageEntry, registry: Registry) -> None:
    """The position names a registered stage, the object imports and is shaped like a stage, and its name is
    not a built-in's (stage state is checkpointed by name). ValueError otherwise."""
    if entry.anchor is not None and entry.anchor not in registry:
        raise ValueError(
            f"{entry.where}:{entry.anchor}: no stage called {entry.anchor!r}"
            f"{did_you_mean(entry.anchor, registry.names())}; stages: {', '.join(registry.names())}"
        )
    obj = _import_stage(entry.path)
    if obj.name in registry:
        raise ValueError(f"{entry.path!r} is called {obj.name!r}, the name of a built-in stage; give it its own")


def build_user_stage(entry: StageEntry) -> Any:
    obj = _import_stage(entry.path)
    return obj() if isinstance(obj, type) else obj


def insert_user_stages(stages: list, entries: list[StageEntry]) -> list:
    """`stages` with each entry's stage built and placed before / after its anchor (in entry order), or at the
    end. ConfigError naming `stages.extra[i]` when an anchor is a stage this recipe does not run."""
    names = [s.name for s in stages]
    built = [build_user_stage(e) for e in entries]
    for i, e in enumerate(entries):
        if e.anchor is not None and e.anchor not in names:
            raise ConfigError(
                f"stages.extra[{i}]: {e.where}:{e.anchor}, but this recipe runs no {e.anchor!r} stage "
                f"(it runs: {', '.join(names)})"
            )
    out = []
    for stage in stages:
        out += [s for s, e in zip(built, entries) if e.where == "before" and e.anchor == stage.name]
        out.append(stage)
        out += [s for s, e in zip(built, entries) if e.where == "after" and e.anchor == stage.name]
    out += [s for s, e in zip(built, entries) if e.where == "end"]
    taken = [s.name for s in out]
    duplicate = next((n for n in taken if taken.count(n) > 1), None)
    if duplicate:
        raise ConfigError(f"stages.extra: two stages are called {duplicate!r} (stage state is checkpointed by name)")
    return out

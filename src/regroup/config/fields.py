"""Typed dataclass fields that carry their own help and bounds, built from YAML and dotted overrides.

`F(default, "help", ge=/gt=/le=/lt=)` declares a field (`regroup.config.schema` declares every config field with it);
`build(cls, mapping)` makes the dataclass from a mapping, checking each value against its type: `Literal`
choices (1 is not True), int / float / bool / str, `Optional`, lists (a comma string becomes a list) and
nested sections; bounds are checked by the caller (`NumericRule.check`), after the cross-section defaults
are in. Every error is a one-line ConfigError naming the dotted key. Knows nothing of regroup's sections.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from regroup.config.registry import did_you_mean
from regroup.errors import ConfigError


@dataclass(frozen=True)
class NumericRule:
    """A finite number in [low, high] (an end is open when `*_open`); None means unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        text = lambda x: (
            str(int(x)) if float(x).is_integer() and abs(x) < 2**53 else f"{x:g}"
        )  # a one-line key function (E731 is off project-wide)
        parts = [f"{'>' if self.low_open else '>='} {text(self.low)}"] if self.low is not None else []
        parts += [f"{'<' if self.high_open else '<='} {text(self.high)}"] if self.high is not None else []
        return "a finite number " + " and ".join(parts) if parts else "a finite number"

    def ok(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def check(self, key: str, value) -> None:
        if value is not None and not self.ok(value):
            raise ConfigError(f"{key} must be {self.describe()}, got {value!r}")


def at_least(low: float, high: float | None = None) -> NumericRule:
    return NumericRule(low=low, high=high)


def above(low: float, high: float | None = None) -> NumericRule:
    return NumericRule(low=low, high=high, low_open=True)


def F(default: Any, help: str, *, ge=None, gt=None, le=None, lt=None, finite: bool = False, path: bool = False):
    """A config field: its default (a section class or a list is copied per instance), its help line, and
    for a number its bounds: ge / gt (>= / >), le / lt (<= / <), or `finite=True` for any finite number.
    `path=True`: a leading `~` is expanded on load."""
    rule = None
    if finite or any(b is not None for b in (ge, gt, le, lt)):
        rule = NumericRule(gt if gt is not None else ge, lt if lt is not None else le, gt is not None, lt is not None)
    meta = {"help": help, "rule": rule, "path": path}
    if isinstance(default, type) or isinstance(default, list):
        return field(default_factory=default if isinstance(default, type) else lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def leaves(cls, prefix: str = ""):
    """(dotted key, dataclasses.Field, type hint) of every leaf field of the dataclass `cls`, depth first."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name], prefix + f.name + ".")
        else:
            yield prefix + f.name, f, hints[f.name]


def scalar_types(hint) -> list:
    """The types a hint allows besides None (`Optional[int]` -> [int])."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in get_args(hint) if a is not type(None)]
    return [hint]


YAML_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}


class YamlLoader(yaml.SafeLoader):
    """yaml.SafeLoader with YAML 1.2's booleans (true / false only): YAML 1.1 also reads on / off / yes / no
    as booleans, which made `data.chat_template=on` arrive as True. A bool field still takes those words."""


YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)

MAX_DEPTH = 32
"""Nesting a config may have (sections, lists): a real one has 4 levels; 30,000 `[` is an attack, not a recipe."""
MAX_TEXT = 1 << 20
"""Characters a config file or one override may have."""
MAX_INT_DIGITS = 18
"""Digits an integer value may have: every int field is bounded far below 10**18."""


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that names a key twice (YAML would keep the last silently): `key`, the lines of both."""

    def __init__(self, key, first_line: int, second_line: int) -> None:
        super().__init__(problem=f"duplicate key {key!r}")
        self.key, self.lines = key, (first_line, second_line)


def _construct_mapping(loader: YamlLoader, node, deep: bool = False):
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges are overridden on purpose
            key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKeyError(key, seen[key], line)
                seen[key] = line
            except TypeError:
                continue  # an unhashable key: the base constructor refuses it
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


YamlLoader.construct_mapping = _construct_mapping


def _depth(value) -> int:
    """How deeply `value` nests (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            if depth + 1 > MAX_DEPTH:
                return depth + 1
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_yaml(text: str, source: str) -> Any:
    """`text` parsed as YAML (`YamlLoader`), within the size and nesting limits, each key once; every refusal
    is one ConfigError naming `source`. Other YAML syntax errors stay `yaml.YAMLError` (callers word them)."""
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{source}: {len(text)} characters, more than a config may have ({MAX_TEXT})")
    try:
        data = yaml.load(text, Loader=YamlLoader)
    except DuplicateKeyError as e:
        first, second = e.lines
        raise ConfigError(
            f"{source}: key {e.key!r} appears twice (lines {first} and {second}); each key may appear once "
            "(YAML would silently keep the last)"
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to read (a config nests at most {MAX_DEPTH} levels)") from None
    except ValueError as e:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(f"{source}: a value is out of range ({str(e).split(';')[0][:120]})") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{source}: nested more than {MAX_DEPTH} levels deep; a config is a few sections of values")
    return data


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def check_value(value: Any, hint: Any, key: str) -> Any:
    """Check (and minimally coerce) one value against a type hint; raise ConfigError naming `key`."""
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section (mapping), got {type(value).__name__}")
        return build(hint, value, key + ".")
    if get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = scalar_types(hint)[0]
    elif value is None:
        raise ConfigError(f"{key}: must not be null")
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if not any(value == c and type(value) is type(c) for c in choices):  # 1 is not True
            hint_text = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
            raise ConfigError(f"{key}: must be one of {', '.join(map(repr, choices))}; got {value!r}{hint_text}")
        return value
    if get_origin(hint) is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return [check_value(v, get_args(hint)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, str) and value.lower() in YAML_BOOLS:
            return YAML_BOOLS[value.lower()]
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
    elif hint is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_short(value)}")
        if abs(value) >= 10**MAX_INT_DIGITS:
            raise ConfigError(f"{key}: a {len(str(abs(value)))}-digit integer is out of range")
    elif hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_short(value)}")
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range (10**400)
            raise ConfigError(f"{key}: a {len(str(abs(value)))}-digit number is out of range") from None
    elif hint is str and not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def build(cls, data: dict, prefix: str = ""):
    """An instance of the dataclass `cls` from a mapping, every value checked against its field's type (nested
    sections recursively)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            raise ConfigError(
                f"unknown config key {prefix}{name}{did_you_mean(name, fields)} (known under "
                f"{prefix or 'top level'}: {', '.join(sorted(fields))})"
            )
    kwargs = {name: check_value(value, hints[name], prefix + name) for name, value in data.items()}
    for name, value in kwargs.items():
        if fields[name].metadata.get("path") and isinstance(value, str) and value.startswith("~"):
            kwargs[name] = os.path.expanduser(value)  # `run_dir=~/x` means the home folder, not ./~
    return cls(**kwargs)


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: Path, seen: tuple = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: 'extends' loop")
    try:
        data = load_yaml(path.read_text(), str(path)) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())[:300]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = data.pop("extends", None)
    if parent:
        data = merge(read_yaml((path.parent / parent).resolve(), seen + (path,)), data)
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw, f"override {key.strip()}") if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def numeric_keys(cls) -> list[str]:
    """Dotted keys of every int / float (optional or not) leaf field of `cls`."""
    return [key for key, _, hint in leaves(cls) if any(t in (int, float) for t in scalar_types(hint))]


def numeric_rules(cls) -> dict[str, NumericRule]:
    """The bounds of every leaf field of `cls` that has them, by dotted key."""
    return {key: f.metadata["rule"] for key, f, _ in leaves(cls) if f.metadata.get("rule") is not None}


def field_docs(cls) -> list[tuple[str, str, str]]:
    """(dotted key, default, help with the bounds appended) for every leaf field of `cls`."""
    rows = []
    for key, f, _ in leaves(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rule = f.metadata.get("rule")
        rows.append((key, repr(default), f.metadata.get("help", "") + (f" [{rule.describe()}]" if rule else "")))
    return rows


def apply_overrides(data: dict, overrides, shorthands: dict[str, str] | None = None) -> dict:
    """Set each `dotted.key=value` in the nested mapping `data` (in place; also returned). `shorthands`: a
    key whose list value (or comma string) belongs to a sub-key, e.g. {"rewards": "rewards.functions"}."""
    for text in overrides:
        keys, value = parse_override(text)
        if isinstance(value, (list, str)) and ".".join(keys) in (shorthands or {}):
            keys = shorthands[".".join(keys)].split(".")  # `rewards=[math]` keeps the section's other keys
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    return data


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted.key: leaf value}; lists stay leaves."""
    if not isinstance(cfg, dict):
        return {prefix: cfg} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out

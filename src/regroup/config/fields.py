"""One way to declare and check a setting, for run-config sections (`Section`) and piece knobs (`Knobs`) alike.

A setting is a pydantic field, `name: type = F(default, "help", ge=/gt=/le=/lt=)` (or its help as the docstring under
it). pydantic checks type and bounds (strict, `extra="forbid"`, no NaN or inf) after `lenient` admits what a YAML user
writes: "3e-4" for a number, on / off / yes / no for a bool, "a,b" for a list, 2.0 for an integer. A float must be 0
or a normal float32, the dtype the loss computes in. `check` words pydantic's first error as one `ConfigError` line
naming the dotted key; `field_docs` renders the help with the bounds. Nothing is read from the environment.

Hand-written because PyYAML has none of them: YAML 1.2 booleans, each key once, size and depth limits (counted with
every alias expanded: a 500-byte file of nested aliases stands for 10^8 values), `extends:`, dotted `key=value`
overrides. A value quoted in an error line is cut short (`short`) without ever being printed whole.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import reprlib
import types
from collections.abc import Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from typing_extensions import Unpack

from regroup.errors import ConfigError
from regroup.io import NotRegularFileError, read_file_text

MAX_DEPTH = 32  # a real config nests 4 levels; 30,000 `[` is an attack, not a recipe
MAX_TEXT = 1 << 20  # characters a config file or one override may have (and its values, aliases expanded)
MAX_VALUES = 100_000  # values (scalars, lists, mappings) a config may hold, aliases expanded; a real one has hundreds
MAX_INT_DIGITS = 18  # every int setting is bounded far below 10**18
# The smallest normal and the largest float32: 1e-320 passes `gt=0` and is 0 where the loss uses it.
FLOAT32_TINY, FLOAT32_MAX = 2.0**-126, float.fromhex("0x1.fffffep+127")
YAML_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}
BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def did_you_mean(name: Any, known: Iterable[Any]) -> str:
    """` (did you mean 'x'?)` for the closest of `known`, or "" (also for a name too long to be a typo of one)."""
    text = name if isinstance(name, str) else short(name)
    if len(text) > 100:
        return ""
    close = difflib.get_close_matches(text, [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 4, 60, 60


def short(value: Any) -> str:
    """`value` as an error line quotes it: its repr up to about 80 characters. Never the whole repr first
    (`reprlib` walks at most 3 levels and 6 items of each): the repr of a value built from YAML aliases can
    run to gigabytes."""
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:60]) + f"... ({len(value)} characters)"
    try:
        text = _SHORT.repr(value)
    except Exception:  # an int past Python's 4300-digit str() limit, a repr that fails
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


class Bounds(TypedDict, total=False):
    """A number setting's bounds: >= ge, > gt, <= le, < lt."""

    ge: float
    gt: float
    le: float
    lt: float


def F(
    default: Any,
    help: str | None = None,
    *,
    finite: bool = False,
    path: bool = False,
    url: bool = False,
    resume: bool = False,
    **bounds: Unpack[Bounds],
) -> Any:
    """A setting: its default (a section class, a list or a dict is made afresh per instance), its help, its bounds
    (ge / gt / le / lt), `finite=True` for any finite number, `path=True` to expand a leading `~`, `url=True` for a
    server's address (`address_problem`), `resume=True` if a `--resume` may change it (`schema.RESUME_OVERRIDABLE`)."""
    flags = (("finite", finite), ("path", path), ("url", url), ("resume", resume))
    extra: Any = {name: True for name, on in flags if on}
    if isinstance(default, (type, list, dict)):
        made = default if isinstance(default, type) else functools.partial(type(default), default)
        return Field(default_factory=made, description=help, json_schema_extra=extra, **bounds)
    return Field(default, description=help, json_schema_extra=extra, **bounds)


def _members(hint: Any) -> list[Any]:
    """A hint's alternatives: the members of an Optional or Union, else the hint itself."""
    if get_origin(hint) in (Union, types.UnionType):
        return [m for a in get_args(hint) for m in _members(a)]
    return [hint]


def _kinds(hint: Any) -> set[Any]:
    """The types a hint admits: a Literal's values' types, list / dict for list[...] / dict[...]."""
    kinds: set[Any] = set()
    for m in _members(hint):
        kinds |= {type(c) for c in get_args(m)} if get_origin(m) is Literal else {get_origin(m) or m}
    return kinds


def _choices(hint: Any) -> list[Any]:
    """The values a Literal setting (or a union with a Literal) may take; [] for any other."""
    return [c for m in _members(hint) if get_origin(m) is Literal for c in get_args(m)]


def lenient(value: Any, hint: Any) -> Any:
    """`value` as pydantic's strict mode should see it: the spellings a YAML user writes admitted, and an integer
    too long for any setting refused before it is converted (10**400 overflows a float)."""
    kinds = _kinds(hint)
    if isinstance(value, str):
        if bool in kinds and value.lower() in YAML_BOOLS:
            value = YAML_BOOLS[value.lower()]
        elif list in kinds:
            return [v.strip() for v in value.split(",") if v.strip()]
        elif float in kinds:
            try:
                return float(value)
            except ValueError:
                return value
    choices = _choices(hint)
    if choices and not any(value == c and type(value) is type(c) for c in choices):
        raise PydanticCustomError("literal_error", "")  # pydantic takes 1 for True
    if isinstance(value, int) and not isinstance(value, bool) and kinds & {int, float}:
        what = "number" if float in kinds else "integer"
        if abs(value) >= (10**308 if float in kinds else 10**MAX_INT_DIGITS):
            raise PydanticCustomError("too_long", f"a {{n}}-digit {what} is out of range", {"n": len(str(abs(value)))})
        return float(value) if float in kinds else value
    if isinstance(value, float) and int in kinds and float not in kinds and value.is_integer():
        return int(value)
    return value


class Section(BaseModel):
    """A group of settings, checked by pydantic when built (`check`); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _lenient(cls, value: Any, info: ValidationInfo) -> Any:
        return lenient(value, cls.model_fields[str(info.field_name)].annotation)

    @field_validator("*", mode="after")
    @classmethod
    def _usable(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, float) and value != 0 and not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:
            size = "0" if abs(value) < 2.0**-150 else "subnormal" if abs(value) < FLOAT32_TINY else "inf"
            raise PydanticCustomError(
                "float32",
                "{value} is {size} in float32, the dtype of the tensors it meets; a float setting must be 0 or "
                "1.2e-38 to 3.4e+38 in size",
                {"value": repr(value), "size": size},
            )
        flags = extra(cls.model_fields[str(info.field_name)])
        if flags.get("url") and isinstance(value, str) and (problem := address_problem(value)):
            raise ValueError(problem)  # not a PydanticCustomError: its template would read braces in the address
        if flags.get("path") and isinstance(value, str):
            return os.path.expanduser(value)  # `run_dir=~/x` means the home folder, not ./~
        return value


class Knobs(Section):
    """A piece's knobs (its `Args`): settings like a section's, frozen once built."""

    model_config = ConfigDict(frozen=True)


def extra(field: FieldInfo) -> dict[str, Any]:
    """A setting's flags from `F`: finite, path, url, resume."""
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def without_user_info(url: str) -> str:
    """`url` without anything up to its last `@` after the scheme (a `user:password@`; a password may hold `/`, `?`
    or `#`, so the address is not parsed for it), nor its query or fragment: what an error line may print."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    rest = rest.rpartition("@")[2]
    return scheme + sep + re.split(r"[?#]", rest, maxsplit=1)[0]


def address_problem(url: str) -> str | None:
    """What is wrong with `url` as a server's address that request paths are appended to (`/chat/completions`,
    `/v1/models`), in words that never quote a password or a query; None when nothing is. Refused: a user name or
    password (`user:pass@host`: never sent, yet it would be kept and printed wherever the address is), a query (the
    path would be appended after it) and a fragment."""
    shown = without_user_info(url)
    if "@" in url:
        return (
            f"a user name or password in the address ('...@') is never sent, yet would be kept and printed wherever "
            f"the address is; give it without ({shown}), and a key in the environment variable api_key_env names"
        )
    if "?" in url:
        return f"has a query ('?...', not shown); request paths are appended to this address: give it without ({shown})"
    if "#" in url:
        return f"has a fragment ('#...'); request paths are appended to this address: give it without ({shown})"
    return None


def describe(field: FieldInfo) -> str:
    """ "a finite number > 0 and <= 1" for a bounded setting (or one declared `finite`), else ""."""
    found = [(op, x) for op in BOUNDS for m in field.metadata if (x := getattr(m, op, None)) is not None]
    parts = [f"{BOUNDS[op]} {x if isinstance(x, int) else f'{x:g}'}" for op, x in found]
    return " ".join(["a finite number", " and ".join(parts)]).strip() if parts or extra(field).get("finite") else ""


def explain(error: Any, cls: Any, prefix: str = "", owner: str = "") -> str:
    """One line for pydantic's `error` in a `cls` built under the dotted `prefix`; `owner`: the piece whose knobs
    `cls` holds (its unknown keys are "unknown knob ... of owner")."""
    node, key, field = cls, prefix.rstrip("."), None  # node: the model (or type) at the loc so far; a model has fields
    for part in error["loc"]:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part in getattr(node, "model_fields", {}):
            field, key = node.model_fields[part], f"{key}.{part}" if key else part
            node = field.annotation
        elif error["type"] == "extra_forbidden" and hasattr(node, "model_fields"):
            known, where = list(node.model_fields), f"{key}." if key else ""
            if owner:
                hint = did_you_mean(part, known)
                return f"{key}: unknown knob {short(part)} of {owner}{hint} (known: {', '.join(known)})"
            name = part if isinstance(part, str) and len(part) <= 80 else short(part)
            return (
                f"unknown config key {where}{name}{did_you_mean(part, known)} (known under {where or 'top level'}: "
                f"{', '.join(sorted(known))})"
            )
        else:
            break
    kind, value = error["type"], error.get("input")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number") and field:
        return f"{key} must be {describe(field)}, got {short(value)}"
    choices = _choices(field.annotation) if field else []
    if choices and kind not in ("too_long", "float32"):
        hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
        return f"{key}: must be one of {', '.join(map(repr, choices))}; got {short(value)}{hint}"
    expected = {"int": "an integer", "float": "a number", "bool": "true/false", "string": "a string"}
    expected |= {"list": "a list", "dict": "a mapping", "model": "a section (mapping)"}
    if kind.split("_")[0] in expected:
        want = "must not be null" if value is None else f"expected {expected[kind.split('_')[0]]}, got {short(value)}"
        return f"{key}: {want}"
    reason = error.get("ctx", {}).get("error", error["msg"])  # a validator's own ValueError, or ours
    return f"{key}: {reason}" if key else str(reason)


def check(cls: Any, data: Any, prefix: str = "", owner: str = "") -> Any:
    """`cls` built from the mapping `data` (its dotted keys under `prefix`); ConfigError: one line, the first error."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain(exc.errors()[0], cls, prefix, owner)) from None


def check_value(value: Any, hint: Any, **limits: Unpack[Bounds]) -> Any:
    """One value against a type and bounds, as a setting's (a command-line option's); ConfigError "must be ..."."""
    one = create_model("Value", __base__=Section, value=(hint, F(None, "", **limits)))
    try:
        return check(one, {"value": value}).value
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix("value").lstrip(": ")) from None


def leaves(cls: Any, prefix: str = "") -> Iterator[tuple[str, FieldInfo, Any]]:
    """(dotted key, FieldInfo, type hint) of every leaf setting of the model `cls`, depth first."""
    for name, field in cls.model_fields.items():
        if hasattr(field.annotation, "model_fields"):  # a section
            yield from leaves(field.annotation, prefix + name + ".")
        else:
            yield prefix + name, field, field.annotation


def field_docs(cls: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help with the bounds) of every leaf setting of `cls`: `regroup config`'s listing, and a
    piece's knobs in the docs."""
    rows = []
    for key, f, _ in leaves(cls, prefix):
        rule, text = describe(f), " ".join((f.description or "").split())
        rows.append((key, repr(f.get_default(call_default_factory=True)), text + (rule and f" [{rule}]")))
    return rows


# ---- YAML: the files, the overrides ------------------------------------------------------------------------------


class YamlLoader(yaml.SafeLoader):
    """yaml.SafeLoader with YAML 1.2's booleans (true / false only: YAML 1.1 read `data.chat_template=on` as True),
    each key of a mapping once (YAML would keep the last silently), at most MAX_DEPTH levels of nesting, and, with
    every alias (`*name`) expanded, at most MAX_VALUES values of MAX_TEXT characters in all, MAX_DEPTH levels deep."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1  # counted here, before the composer's recursion could run out of stack
        if self.depth > MAX_DEPTH and not self.check_event(yaml.ScalarEvent, yaml.AliasEvent):
            raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep; a config is a few sections of values")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        _check_expanded(node)  # before anything is built from it
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges are overridden on purpose
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                if not isinstance(key, Hashable):
                    continue  # the base constructor refuses it
                if key in seen:
                    raise yaml.YAMLError(
                        f"key {short(key)} appears twice (lines {seen[key]} and {line}); each key may appear once "
                        "(YAML would silently keep the last)"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_expanded(root: Any) -> None:
    """Refuse a document whose aliases expand it past MAX_VALUES values, MAX_TEXT characters of scalars or MAX_DEPTH
    levels, or into itself. PyYAML builds an aliased value once and shares it, so loading is cheap; whatever walks
    the result (a check, a repr, a copy, a dump) meets every copy. Counted on the node graph, each node once: an
    alias names a node that came before it, so the walk meets it done (memo) or open (a value inside itself), and it
    recurses no deeper than the nesting of the text, which the composer has bounded."""
    memo: dict[int, tuple[int, int, int]] = {}  # id(node) -> (values, characters, levels), each expanded
    open_nodes: set[int] = set()

    def size(node: Any) -> tuple[int, int, int]:
        if id(node) in memo:
            return memo[id(node)]
        if id(node) in open_nodes:
            raise yaml.YAMLError("an alias (*name) stands inside the value it names: the value would never end")
        if isinstance(node, yaml.ScalarNode):
            found = (1, len(node.value), 0)
        else:
            open_nodes.add(id(node))
            children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
            values, chars, levels = 1, 0, 0
            for child in children:
                v, c, d = size(child)
                values, chars, levels = min(values + v, MAX_VALUES + 1), min(chars + c, MAX_TEXT + 1), max(levels, d)
            open_nodes.discard(id(node))
            found = (values, chars, levels + 1)
        memo[id(node)] = found
        return found

    values, chars, levels = size(root)
    expanded = "once its aliases (*name) are expanded"
    if values > MAX_VALUES:
        raise yaml.YAMLError(f"more than {MAX_VALUES} values {expanded}; a config holds a few hundred")
    if chars > MAX_TEXT:
        raise yaml.YAMLError(f"more than {MAX_TEXT} characters of values {expanded}, more than a config may have")
    if levels > MAX_DEPTH:
        raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep {expanded}; a config is a few sections")


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"
)


def load_yaml(text: str, source: str) -> Any:
    """`text` parsed as YAML (`YamlLoader`) within the size limit; a refusal of ours is one ConfigError naming
    `source`. Other YAML syntax errors stay `yaml.YAMLError` (callers word them)."""
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{source}: over {MAX_TEXT} characters, more than a config may have")
    try:
        return yaml.load(text, Loader=YamlLoader)
    except ValueError as e:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(f"{source}: a value is out of range ({str(e).split(';')[0][:120]})") from None
    except yaml.YAMLError as e:
        if type(e) is yaml.YAMLError:  # ours, above; the parser's own are subclasses
            raise ConfigError(f"{source}: {e}") from None
        raise


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file as a mapping, its `extends:` parent (a path relative to it) merged under it. Only a regular file
    is read, and only its first MAX_TEXT + 1 characters (/dev/zero or a named pipe is one line, not a hang)."""
    if path in seen:
        raise ConfigError(f"{path}: 'extends' loop")
    try:
        data = load_yaml(read_file_text(path, MAX_TEXT + 1), str(path)) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder, not a config file") from None
    except NotRegularFileError as e:
        raise ConfigError(f"{e.strerror}; a config is a YAML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())[:300]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = data.pop("extends", None)
    return merge(read_yaml((path.parent / parent).resolve(), (*seen, path)), data) if parent else data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {short(text)} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw, f"override {key.strip()}") if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value

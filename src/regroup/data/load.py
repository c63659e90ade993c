"""Problems from files: JSONL, JSON, Parquet, CSV, `datasets.save_to_disk` folders and Hugging Face
datasets (`hf:NAME[:CONFIG][@SPLIT]`), with errors that name the file, row and field, and TA-GRPO's
released (index, sub_index) layout folded into variants."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeGuard

from regroup.io import write_atomic
from regroup.tasks.base import Problem

__all__ = ["DataError", "FieldMap", "LoadResult", "HubSpec", "parse_hub_spec", "load_problems", "save_problems"]

HUB_PREFIX = "hf:"

_FORMATS = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")


class DataError(ValueError):
    """A problem with a data file, located by file, row and field (None: not tied to one).

    `row` is 1-based: the line number in JSONL, the list position in JSON, the data row (header not
    counted) in CSV, the table row in Parquet and datasets folders.
    """

    def __init__(self, path: str | os.PathLike[str], row: int | None, field: str | None, message: str) -> None:
        self.path, self.row, self.field, self.message = str(path), row, field, message
        where = self.path
        if row is not None:
            where += f" row {row}"
        if field is not None:
            where += f" field {field!r}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # keep the four arguments when pickled (e.g. across processes)
        return (type(self), (self.path, self.row, self.field, self.message))


@dataclass(frozen=True)
class FieldMap:
    """Which column holds what; an optional field set to None is not read."""

    question: str = "question"
    """The question text (required)."""
    answer: str = "answer"
    """The final answer (required; numbers are turned into text)."""
    solution: str | None = "solution"
    """A reference solution (optional)."""
    id: str | None = "id"
    """A unique id (optional; default: the 0-based row index, or `index` in the TA layout)."""
    variants: str | None = "variants"
    """A list of rephrasings of the question (optional)."""
    difficulty: str | None = "difficulty"
    """A difficulty label (optional)."""
    meta: str | None = "meta"
    """A JSON object of task-specific structure (optional)."""
    index: str | None = "index"
    """TA-GRPO layout: the original question's id shared by its variant rows."""
    sub_index: str | None = "sub_index"
    """TA-GRPO layout: 0 for the original row, > 0 for a variant row."""


@dataclass
class LoadResult:
    """What `load_problems` read: the problems, and the rows skipped (only with skip_bad_rows=True)."""

    problems: list[Problem]
    skipped: list[DataError] = field(default_factory=list)


# ----------------------------------------------------------------------------------- reading rows


def _utf8(data: bytes, path: str, row: int | None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(path, row, None, f"invalid UTF-8 at byte {exc.start}") from None


def _jsonl_rows(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value or DataError) per non-blank line."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                text = _utf8(line, path, number)
                if not text.strip():
                    continue
                if number == 1:
                    text = text.lstrip("\ufeff")
                try:
                    yield number, json.loads(text)
                except json.JSONDecodeError as exc:
                    raise DataError(path, number, None, f"invalid JSON: {exc.msg} at column {exc.colno}") from None
                except (ValueError, RecursionError) as exc:  # huge integers, deep nesting
                    raise DataError(
                        path, number, None, f"invalid JSON: {str(exc)[:200] or 'nested too deeply'}"
                    ) from None
            except DataError as err:
                yield number, err


def _json_rows(path: str) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8-sig", errors="surrogateescape")  # bad bytes are reported per row and field below
    if not text.strip():
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(path, None, None, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # huge integers, deep nesting
        raise DataError(path, None, None, f"invalid JSON: {str(exc)[:200] or 'nested too deeply'}") from None
    if not isinstance(value, list):
        raise DataError(path, None, None, f"expected a JSON list of objects, got a {type(value).__name__}")
    yield from enumerate(value, start=1)


def _csv_rows(path: str) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8-sig", errors="surrogateescape")
    try:
        csv.field_size_limit(2**31 - 1)
    except OverflowError:  # pragma: no cover - 32-bit platforms
        csv.field_size_limit(2**30)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return
        for number, cells in enumerate(reader, start=1):
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                yield number, DataError(path, number, None, f"has {len(cells)} cells, the header has {len(header)}")
                continue
            # An empty CSV cell means "no value" (CSV cannot tell "" from missing).
            yield number, {k: v for k, v in zip(header, cells) if v != ""}
    except csv.Error as exc:
        raise DataError(path, None, None, f"invalid CSV at line {reader.line_num}: {exc}") from None


def _parquet_rows(path: str) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # heavy (pyarrow): only for .parquet files

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises many types for a corrupt file
        raise DataError(path, None, None, f"not a readable Parquet file: {exc}") from None
    yield from enumerate(table.to_pylist(), start=1)


def _dataset_rows(path: str) -> Iterator[tuple[int, Any]]:
    import datasets  # heavy (datasets): only for hub sources

    try:
        ds = datasets.load_from_disk(path)
    except Exception as exc:  # datasets raises FileNotFoundError / ValueError / others for a bad folder
        raise DataError(path, None, None, f"not a folder saved by datasets.save_to_disk: {exc}") from None
    if isinstance(ds, datasets.DatasetDict):
        raise DataError(path, None, None, f"holds several splits {sorted(ds)}; pass the path of one split folder")
    yield from enumerate(ds, start=1)


@dataclass(frozen=True)
class HubSpec:
    """A dataset read through `datasets.load_dataset(name, config, split=split)`."""

    name: str
    config: str | None = None
    split: str = "train"


def parse_hub_spec(spec: str) -> HubSpec | None:
    """`hf:NAME[:CONFIG][@SPLIT]` -> HubSpec (split defaults to train); None for anything else (a path).

    NAME is a hub id (`EleutherAI/hendrycks_math`) or a local folder of data files, which
    `load_dataset` reads offline: `hf:HuggingFaceH4/MATH-500@test`, `hf:allenai/ai2_arc:ARC-Challenge@test`.
    """
    if not spec.startswith(HUB_PREFIX):
        return None
    rest = spec[len(HUB_PREFIX) :]
    rest, at, split = rest.rpartition("@") if "@" in rest else (rest, "", "")
    name, _, config = rest.partition(":")
    if not name or (at and not split):
        raise DataError(spec, None, None, "expected hf:NAME[:CONFIG][@SPLIT], e.g. hf:HuggingFaceH4/MATH-500@test")
    return HubSpec(name, config or None, split or "train")


def load_hub_rows(spec: HubSpec, origin: str | None = None) -> list[dict]:
    """The rows of a hub (or local-folder) dataset split; DataError naming the spec when it cannot be read."""
    import datasets  # heavy (datasets): only for hub sources

    origin = origin or f"{HUB_PREFIX}{spec.name}" + (f":{spec.config}" if spec.config else "") + f"@{spec.split}"
    try:
        ds = datasets.load_dataset(spec.name, spec.config, split=spec.split)
    except Exception as exc:  # offline (ConnectionError / OfflineModeIsEnabled), unknown name, bad config or split
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise DataError(
            origin,
            None,
            None,
            f"cannot load {spec.name!r} (config {spec.config}, split {spec.split}): "
            f"{first}. Offline, save the split where the hub is reachable "
            "(Dataset.to_json / save_to_disk) and pass that file or folder",
        ) from None
    return list(ds)


def _hub_rows(path: str) -> Iterator[tuple[int, Any]]:
    spec = parse_hub_spec(path)
    assert spec is not None
    yield from enumerate(load_hub_rows(spec, origin=path), start=1)


def _rows(path: str) -> Iterator[tuple[int, Any]]:
    if path.startswith(HUB_PREFIX):
        return _hub_rows(path)
    if os.path.isdir(path):
        return _dataset_rows(path)
    if not os.path.exists(path):
        raise DataError(path, None, None, "no such file or directory")
    ext = os.path.splitext(path)[1].lower()
    readers = {
        ".jsonl": _jsonl_rows,
        ".ndjson": _jsonl_rows,
        ".json": _json_rows,
        ".csv": _csv_rows,
        ".parquet": _parquet_rows,
    }
    if ext not in readers:
        raise DataError(
            path,
            None,
            None,
            f"unsupported format {ext or '(no extension)'!r}; expected one of "
            f"{', '.join(_FORMATS)} or a datasets.save_to_disk folder",
        )
    return readers[ext](path)


# ----------------------------------------------------------------------------------- checking fields


def _has_surrogates(text: str) -> bool:
    # Bytes that were not UTF-8 come back as lone surrogates (surrogateescape), as do "\udcxx" JSON escapes.
    return any("\ud800" <= ch <= "\udfff" for ch in text)


class _Row:
    """One raw row with helpers that raise DataError naming this row and the field."""

    def __init__(self, path: str, number: int, data: Mapping[str, Any]) -> None:
        self.path, self.number, self.data = path, number, data

    def error(self, name: str | None, message: str) -> DataError:
        return DataError(self.path, self.number, name, message)

    def text(self, name: str, value: Any) -> str:
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise self.error(name, "invalid UTF-8") from None
        if not isinstance(value, str):
            raise self.error(name, f"expected text, got {type(value).__name__}")
        if _has_surrogates(value):
            raise self.error(name, "invalid UTF-8")
        return value

    def has(self, name: str | None) -> TypeGuard[str]:
        """Whether the field is mapped (`name` not None) and present with a value; True narrows `name` to str."""
        return name is not None and self.data.get(name) is not None

    def required_text(self, name: str) -> str:
        if not self.has(name):
            raise self.error(name, "missing")
        value = self.text(name, self.data[name])
        if not value.strip():
            raise self.error(name, "empty")
        return value

    def answer(self, name: str) -> str:
        value = self.data.get(name)
        if isinstance(value, bool):
            raise self.error(name, "expected text or a number, got bool")
        if isinstance(value, float) and math.isnan(value):
            value = None  # pandas writes a missing number as NaN
        if value is None:
            raise self.error(name, "missing")
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            if math.isinf(value):
                raise self.error(name, "expected a finite number")
            return str(int(value)) if value.is_integer() else repr(value)
        value = self.text(name, value)
        if not value.strip():
            raise self.error(name, "empty")
        return value.strip()

    def optional_text(self, name: str | None, numbers_ok: bool = False) -> str | None:
        if not self.has(name):
            return None
        value = self.data[name]
        if isinstance(value, float) and math.isnan(value):
            return None
        if numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # difficulty labels are often numbers (a level, a step count)
        return self.text(name, value)

    def key(self, name: str) -> str:
        """An id-like value (id, index) as text."""
        value = self.data[name]
        if isinstance(value, bool) or not isinstance(value, (str, int, bytes)):
            raise self.error(name, f"expected text or an integer, got {type(value).__name__}")
        return self.text(name, value) if not isinstance(value, int) else str(value)

    def variants(self, name: str | None) -> tuple[str, ...]:
        if not self.has(name):
            return ()
        value = self.data[name]
        if isinstance(value, str) and value.lstrip().startswith("["):  # a CSV cell holding a JSON list
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise self.error(name, "expected a list of strings (the JSON list in this cell is invalid)") from None
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise self.error(name, f"expected a list of strings, got {type(value).__name__}")
        out = []
        for i, v in enumerate(value):
            if not isinstance(v, (str, bytes)):
                raise self.error(name, f"item {i} should be text, got {type(v).__name__}")
            v = self.text(name, v)
            if not v.strip():
                raise self.error(name, f"item {i} is empty")
            out.append(v)
        return tuple(out)

    def meta(self, name: str | None) -> dict:
        if not self.has(name):
            return {}
        value = self.data[name]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise self.error(name, "expected a JSON object (the text is not valid JSON)") from None
        if not isinstance(value, Mapping):
            raise self.error(name, f"expected an object, got {type(value).__name__}")
        return dict(value)

    def sub_index(self, name: str) -> int:
        value = self.data.get(name)
        if value is None:
            raise self.error(name, "missing")
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(name, f"expected an integer >= 0, got {value!r}")
        return value


def _problem(row: _Row, fields: FieldMap, default_id: str) -> Problem:
    question = row.required_text(fields.question)
    answer = row.answer(fields.answer)
    pid = row.key(fields.id) if row.has(fields.id) else default_id
    if not pid.strip():
        raise row.error(fields.id, "empty")
    return Problem(
        id=pid,
        question=question,
        answer=answer,
        solution=row.optional_text(fields.solution),
        variants=row.variants(fields.variants),
        difficulty=row.optional_text(fields.difficulty, numbers_ok=True),
        meta=row.meta(fields.meta),
    )


# ----------------------------------------------------------------------------------- assembling


def _collect(path: str, items: Iterable[tuple[int, Any]], skipped: list[DataError]) -> list[_Row]:
    rows = []
    for number, value in items:
        try:
            if isinstance(value, DataError):
                raise value
            if not isinstance(value, Mapping):
                raise DataError(path, number, None, f"expected an object, got {type(value).__name__}")
            rows.append(_Row(path, number, value))
        except DataError as err:
            skipped.append(err)
    return rows


def _plain(rows: list[_Row], fields: FieldMap, skipped: list[DataError]) -> list[Problem]:
    problems: list[Problem] = []
    first_row: dict[str, int] = {}
    for row in rows:
        try:
            problem = _problem(row, fields, default_id=str(row.number - 1))
            if problem.id in first_row:
                raise row.error(
                    fields.id or "id", f"duplicate id {problem.id!r} (first at row {first_row[problem.id]})"
                )
            first_row[problem.id] = row.number
            problems.append(problem)
        except DataError as err:
            skipped.append(err)
    return problems


def _folded(rows: list[_Row], fields: FieldMap, skipped: list[DataError]) -> list[Problem]:
    """TA-GRPO's layout: rows sharing `index` are one question; sub_index 0 is q0, > 0 its variants."""
    index_name, sub_name = fields.index, fields.sub_index
    assert index_name is not None and sub_name is not None
    originals: dict[str, tuple[_Row, Problem]] = {}
    variants: dict[str, list[tuple[int, _Row, str]]] = {}
    seen: dict[tuple[str, int], int] = {}
    order: list[str] = []
    for row in rows:
        try:
            if not row.has(index_name):
                raise row.error(index_name, "missing (other rows use the index/sub_index layout)")
            key, sub = row.key(index_name), row.sub_index(sub_name)
            if (key, sub) in seen:
                raise row.error(
                    sub_name, f"duplicate ({index_name}={key}, {sub_name}={sub}) (first at row {seen[key, sub]})"
                )
            if sub == 0:
                # The original's id is its `index`, the key its variant rows refer to.
                problem = _problem(row, replace(fields, id=index_name), default_id=key)
                originals[key] = (row, problem)
                order.append(key)
            else:
                variants.setdefault(key, []).append((sub, row, row.required_text(fields.question)))
            seen[key, sub] = row.number
        except DataError as err:
            skipped.append(err)
    for key, items in variants.items():
        if key not in originals:
            for _, row, _ in items:
                skipped.append(row.error(sub_name, f"variant of {index_name}={key} has no original row ({sub_name}=0)"))
    problems = []
    for key in order:
        _, problem = originals[key]
        extra = tuple(text for _, _, text in sorted(variants.get(key, []), key=lambda t: t[0]))
        problems.append(
            Problem(
                problem.id,
                problem.question,
                problem.answer,
                problem.solution,
                problem.variants + extra,
                problem.difficulty,
                problem.meta,
            )
        )
    return problems


def load_problems(
    path: str | os.PathLike[str], fields: FieldMap | None = None, *, skip_bad_rows: bool = False
) -> LoadResult:
    """The problems in `path` (.jsonl, .json list, .parquet, .csv, a datasets.save_to_disk folder, or
    `hf:NAME[:CONFIG][@SPLIT]` read through `datasets.load_dataset`).

    Rows in TA-GRPO's layout (rows carrying `index` and `sub_index`) are folded: one Problem per
    `index`, its question from sub_index 0 and its variants from the others in sub_index order.
    Raises DataError naming file, row and field for the first bad row, or collects bad rows in
    `.skipped` and loads the rest when `skip_bad_rows` is True. An empty file, a file-level format
    error, or a file with no usable row always raises.
    """
    fields = fields or FieldMap()
    path = os.fspath(path)
    skipped: list[DataError] = []
    # Row errors are always collected, so that without skip_bad_rows the error raised is the first
    # bad row of the file whichever check found it.
    rows = _collect(path, _rows(path), skipped)
    if not rows and not skipped:
        raise DataError(path, None, None, "empty file: no rows")
    ta = (
        fields.index is not None
        and fields.sub_index is not None
        and any(fields.index in r.data and fields.sub_index in r.data for r in rows)
    )
    problems = (_folded if ta else _plain)(rows, fields, skipped)
    skipped.sort(key=lambda e: e.row or 0)
    if skipped and not skip_bad_rows:
        raise skipped[0]
    if not problems:
        first = f" (first: {skipped[0]})" if skipped else ""
        raise DataError(path, None, None, f"no usable rows: {len(skipped)} bad{first}")
    return LoadResult(problems, skipped)


def save_problems(problems: Iterable[Problem], path: str | os.PathLike[str]) -> None:
    """Writes `problems` as JSONL (one `Problem.to_dict()` per line), atomically, creating folders."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in problems))


def peek_columns(path: str | os.PathLike[str], max_rows: int = 1000) -> set[str]:
    """The field names found in the first `max_rows` rows of a data file (config-time checks, e.g. that a
    file has stored variants); raises DataError when the file cannot be read at all."""
    path = os.fspath(path)
    columns: set[str] = set()
    for count, (_, row) in enumerate(_rows(path)):
        if count >= max_rows:
            break
        if isinstance(row, Mapping):
            columns.update(str(k) for k in row)
    return columns


# ----------------------------------------------------------------------------------- named sources


class SourceUnavailable(DataError):
    """A named data set (a prepare target or a benchmark) that is neither local nor downloadable."""


def read_rows(path: str | os.PathLike[str]) -> list[dict]:
    """The raw rows (mappings) of a file, a datasets folder or an `hf:` spec; DataError for the first bad row."""
    path = os.fspath(path)
    rows = []
    for number, value in _rows(path):
        if isinstance(value, DataError):
            raise value
        if not isinstance(value, Mapping):
            raise DataError(path, number, None, f"expected an object, got {type(value).__name__}")
        rows.append(dict(value))
    if not rows:
        raise DataError(path, None, None, "empty file: no rows")
    return rows


def local_sources_dir() -> Path:
    """Where named data sets are looked for before the hub: $REGROUP_DATA_DIR (default ~/.cache/regroup/data)."""
    return Path(os.environ.get("REGROUP_DATA_DIR", Path.home() / ".cache" / "regroup" / "data"))


def source_rows(
    name: str, hub: HubSpec | None, source: str | None = None, fields_hint: str = "", path_flag: str = "--source PATH"
) -> tuple[list[dict], str]:
    """(rows, where they came from) of the named data set `name`.

    Looked for in order: `source` (a file, a datasets folder or an `hf:` spec) when given; a local copy
    `local_sources_dir()/NAME.{jsonl,parquet,json,csv}` or folder `NAME/`; then the hub. When none
    works, SourceUnavailable says in one line which file to place where.
    """
    if source is not None:
        return read_rows(source), source
    local = local_sources_dir()
    for candidate in [local / f"{name}{ext}" for ext in (".jsonl", ".parquet", ".json", ".csv")] + [local / name]:
        if candidate.exists():
            return read_rows(candidate), str(candidate)
    target = local / f"{name}.jsonl"
    if hub is None:
        raise SourceUnavailable(
            name, None, None, f"no hub copy is known: place the rows{fields_hint} at {target} or pass {path_flag}"
        )
    spec = f"{HUB_PREFIX}{hub.name}" + (f":{hub.config}" if hub.config else "") + f"@{hub.split}"
    try:
        return load_hub_rows(hub), spec
    except DataError as err:
        reason = err.message.split(". Offline")[0]
        config = f" ({hub.config})" if hub.config else ""
        raise SourceUnavailable(
            name,
            None,
            None,
            f"{reason}. Place the {hub.split} split of {hub.name}{config}"
            f"{fields_hint} at {target} (JSONL or Parquet), or pass {path_flag}",
        ) from None


def problems_from_rows(rows: Iterable[Mapping[str, Any]], fields: FieldMap, origin: str) -> list[Problem]:
    """Problems from in-memory rows with the same checks and TA layout folding as `load_problems`."""
    skipped: list[DataError] = []
    collected = _collect(origin, enumerate(rows, start=1), skipped)
    ta = (
        fields.index is not None
        and fields.sub_index is not None
        and any(fields.index in r.data and fields.sub_index in r.data for r in collected)
    )
    problems = (_folded if ta else _plain)(collected, fields, skipped)
    if skipped:  # the first bad row, whichever check found it
        raise min(skipped, key=lambda e: e.row or 0)
    return problems

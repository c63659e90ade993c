"""A study's kept table: one JSON line per (regime, arm, seed) with everything its verdicts are computed from.

Raw run folders (metrics, samples, weights) stay under runs/, which git ignores; what a results page keeps is
its plan and this table, and `python -m studies --summarize TABLE_DIR` recomputes every table and verdict on
the page from them alone. A row:

    {"regime": "sparse", "arm": "grpo", "seed": 3,
     "evals": {"t1": {"ids": "arith-999-0..199", "n": 64, "correct": [13, 1, 5, ...]}, "dagrpo": {...}},
     "mechanisms": {"reward/mean": 0.41, ...},   # means over the run's training steps
     "extra": {...}}                             # what a page states beside the verdicts (budget, timing)

`evals` holds the per-problem correct counts of each held-out evaluation (protocol "t1" is the T = 1 one
every arm has), so pass@k and the pairing over problems are exactly what the live study folders give. Problem
ids are packed as "prefix{first..last}" when they are one consecutive run of integers (the built-in task's
"arith-999-0" ... "arith-999-199"), else listed. The start of a regime is the row of arm "start".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from regroup.data.load import DataError
from regroup.io import write_atomic
from studies.claims import T1, ArmResult

TABLE = "runs.jsonl"
START = "start"
_RANGE = re.compile(r"^(.*?)(\d+)\.\.(\d+)$")


def pack_ids(ids: list[str]) -> str | list[str]:
    """ "prefix{a}..{b}" when the ids are prefix+a, prefix+a+1, ..., prefix+b in that order, else the list."""
    m = re.match(r"^(.*?)(\d+)$", ids[0]) if ids else None
    if m is not None:
        prefix, first = m.group(1), int(m.group(2))
        if ids == [f"{prefix}{first + i}" for i in range(len(ids))]:
            return f"{prefix}{first}..{first + len(ids) - 1}"
    return list(ids)


def unpack_ids(packed: str | list[str]) -> list[str]:
    if isinstance(packed, list):
        return [str(i) for i in packed]
    m = _RANGE.match(packed)
    if m is None:
        raise ValueError(f"not a packed id range: {packed!r}")
    prefix, first, last = m.group(1), int(m.group(2)), int(m.group(3))
    return [f"{prefix}{i}" for i in range(first, last + 1)]


def read_per_problem(path: Path) -> dict:
    """An evaluation's per_problem.jsonl as a packed eval entry: ids, n (one int when every problem drew the
    same number of samples) and the correct counts, in the file's order."""
    ids, ns, correct = [], [], []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            ids.append(str(row["id"]))
            ns.append(int(row["n"]))
            correct.append(int(row["correct"]))
    return {"ids": pack_ids(ids), "n": ns[0] if len(set(ns)) == 1 else ns, "correct": correct}


def counts_of(entry: Mapping) -> dict[str, tuple[int, int]]:
    """problem id -> (correct, n) of a packed eval entry."""
    ids = unpack_ids(entry["ids"])
    ns = entry["n"] if isinstance(entry["n"], list) else [int(entry["n"])] * len(ids)
    if not len(ids) == len(ns) == len(entry["correct"]):
        raise ValueError(f"an eval entry's ids, n and correct differ in length ({len(ids)}, {len(ns)}, ...)")
    return {i: (int(c), int(n)) for i, c, n in zip(ids, entry["correct"], ns)}


def row(regime: str, arm: str, seed: int, evals: Mapping, mechanisms: Mapping | None = None, **extra) -> dict:
    return {
        "regime": regime,
        "arm": arm,
        "seed": int(seed),
        "evals": dict(evals),
        "mechanisms": dict(mechanisms or {}),
        "extra": extra,
    }


def write_table(rows: Iterable[dict], path: Path) -> Path:
    """The rows as JSON lines, sorted by (regime, arm, seed) so that the same study gives the same bytes."""
    ordered = sorted(rows, key=lambda r: (r["regime"], r["arm"], r["seed"]))
    write_atomic(path, "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in ordered))
    return path


def read_table(path: Path) -> list[dict]:
    """The rows of a kept table, each checked (`check_row`) as it is read: a results page's records are edited
    and copied by hand, and a bad row must end in one line naming the file and the row (1-based, blank lines
    counted), not in a traceback from deep inside a verdict."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise DataError(path, number, None, f"not a JSON line ({exc})") from None
            check_row(r, path, number)
            rows.append(r)
    return rows


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object) -> bool:
    """A non-negative integer (a seed, a sample count, a correct count)."""
    return _is_int(value) and value >= 0  # type: ignore[operator]


def check_row(r: object, path: Path, number: int) -> None:
    """Raise DataError (file, row, field) unless `r` has the shape `row` writes: regime and arm strings, a
    non-negative integer seed, `evals` mapping each protocol to its ids, n and correct counts of one length,
    and `mechanisms` (numbers) and `extra` mappings."""

    def bad(field: str | None, message: str) -> DataError:
        return DataError(path, number, field, message)

    if not isinstance(r, dict):
        raise bad(None, f"not a JSON object but {type(r).__name__}")
    missing = [k for k in ("regime", "arm", "seed", "evals", "extra") if k not in r]
    if missing:
        raise bad(None, f"a row without {', '.join(missing)}")
    for key in ("regime", "arm"):
        if not isinstance(r[key], str):
            raise bad(key, f"not a string: {r[key]!r}"[:200])
    if not _count(r["seed"]):
        raise bad("seed", f"not a non-negative integer: {r['seed']!r}"[:200])
    for key in ("evals", "mechanisms", "extra"):
        if not isinstance(r.get(key, {}), dict):
            raise bad(key, f"not a mapping but {type(r[key]).__name__}")
    for name, value in r.get("mechanisms", {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"mechanisms.{name}", f"not a number: {value!r}"[:200])
    for protocol, entry in r["evals"].items():
        field = f"evals.{protocol}"
        if not isinstance(entry, dict) or not {"ids", "n", "correct"} <= set(entry):
            raise bad(field, "not a mapping with ids, n and correct")
        ids, n, correct = entry["ids"], entry["n"], entry["correct"]
        if isinstance(ids, str):
            packed = _RANGE.match(ids)
            if packed is None:
                raise bad(f"{field}.ids", f"not a packed id range (prefix0..99) or a list: {ids!r}"[:200])
            count = int(packed.group(3)) - int(packed.group(2)) + 1  # without unpacking: a range may be absurd
        elif isinstance(ids, list) and all(isinstance(i, str) for i in ids):
            count = len(ids)
        else:
            raise bad(f"{field}.ids", "not a packed id range or a list of strings")
        if not isinstance(correct, list) or not all(_count(c) for c in correct):
            raise bad(f"{field}.correct", "not a list of non-negative integers")
        ns = n if isinstance(n, list) else [n] * len(correct)
        if not all(_count(k) and k > 0 for k in ns):
            raise bad(f"{field}.n", "not a positive integer or a list of them")
        if not count == len(ns) == len(correct):
            raise bad(field, f"ids, n and correct differ in length ({count}, {len(ns)}, {len(correct)})")
        if any(c > k for c, k in zip(correct, ns)):
            raise bad(f"{field}.correct", "a correct count above its n")


def arm_results(rows: Iterable[dict]) -> dict[str, dict[str, ArmResult]]:
    """regime -> arm -> ArmResult (per-seed per-problem counts of every protocol, and mechanism means)."""
    out: dict[str, dict[str, ArmResult]] = {}
    for r in rows:
        result = out.setdefault(r["regime"], {}).setdefault(r["arm"], ArmResult())
        seed = int(r["seed"])
        for protocol, entry in r["evals"].items():
            counts = counts_of(entry)
            if protocol == T1:
                result.per_problem[seed] = counts
            else:
                result.protocols.setdefault(protocol, {})[seed] = counts
        result.mechanisms[seed] = {k: float(v) for k, v in r.get("mechanisms", {}).items()}
    return out

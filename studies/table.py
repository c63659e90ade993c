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
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            missing = {"regime", "arm", "seed", "evals"} - set(r)
            if missing:
                raise ValueError(f"{path}:{number}: a row without {sorted(missing)}")
            rows.append(r)
    return rows


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

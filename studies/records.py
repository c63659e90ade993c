"""A study's records, kept apart from its run folders: `python -m studies [--real] --summarize DIR... --keep RECORDS`.

A study runs for hours, often over several processes and sessions, and its folders hold gigabytes of
checkpoints, samples and per-step metrics that no verdict reads. What a results page keeps is small:
RECORDS/plan.json (the registered plan, written before any arm ran), RECORDS/regimes.json (the miniature
study's chosen regimes) and RECORDS/runs.jsonl, the table of `studies.table` with one row per (regime, arm,
seed). `--summarize RECORDS` recomputes every table and verdict from those files alone.

The plan and the regimes are inputs: a kept one is never overwritten by a different one (no run overwrites
another's files). The table is derived from the runs, so it is rewritten as a running study finishes runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from regroup.errors import ConfigError
from regroup.io import write_atomic
from studies.table import TABLE, write_table

INPUTS = ("plan.json", "regimes.json")


def keep_records(study_dirs: list[Path], dest: Path, rows: list[dict], log=print) -> list[Path]:
    """Write the first folder's plan (and regimes) and the table `rows` into `dest`; return what was written.
    Every folder must share the kept plan's registered primaries (a split study's processes do)."""
    first = Path(study_dirs[0])
    for d in study_dirs[1:]:
        if _primaries(Path(d)) != _primaries(first):
            raise ConfigError(f"--keep: {d} registered other primaries than {first}: not one study")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in INPUTS:
        source = first / name
        if not source.is_file():
            continue
        kept = dest / name
        if kept.is_file():
            if kept.read_text() != source.read_text():
                raise ConfigError(f"--keep: {kept} holds another plan; a kept record is never overwritten")
            continue
        write_atomic(kept, source.read_text())
        written.append(kept)
    written.append(write_table(rows, dest / TABLE))
    log(f"kept {len(rows)} rows and the plan in {dest}")
    return written


def _primaries(study_dir: Path):
    plan = study_dir / "plan.json"
    if not plan.is_file():
        return None
    data = json.loads(plan.read_text())
    return json.dumps(
        [
            {k: p.get(k) for k in ("paper", "endpoint", "regime", "measure", "difference", "effect")}
            for p in data.get("primaries", [])
        ],
        sort_keys=True,
    )

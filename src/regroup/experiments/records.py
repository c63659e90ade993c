"""A study's records, kept apart from its weights: `regroup study [--real] --summarize DIR... --keep RECORDS`.

A study runs for hours, often over several sessions and machines, and its folders hold gigabytes of
checkpoints and merged models that no summary reads. What the summaries read (plan.json, each run's
config.yaml, metrics.jsonl and evaluation files) is small: `keep_records` copies exactly that into
RECORDS/<study folder name>/ with the same layout, so `--summarize RECORDS/*` gives the same tables as
`--summarize` on the study folders themselves, from files a repository can hold.

Kept: files ending in .json, .jsonl, .yaml or .md of at most `MAX_BYTES`, outside `SKIPPED_DIRS` and not in a
model folder (one holding weights) except its `sft_metrics.json`. A run folder (`<arm>-s<seed>`, in either
study) is kept only once finished: both studies write its `timing.json` last, after its evaluation, so a
study still running can be kept at any time and again later. A record already kept is never overwritten: an
identical file is left as it is, a different one is an error (no run overwrites another's files). The
study's own progress files (`PROGRESS_FILES`, rewritten as its runs finish) are the one exception: they are
refreshed.
"""

from __future__ import annotations

import filecmp
import re
import shutil
from pathlib import Path

from regroup.errors import ConfigError

KEPT_SUFFIXES = (".json", ".jsonl", ".yaml", ".md")
SKIPPED_DIRS = frozenset({"checkpoints", "data"})
"""Resumable training state (weights, optimizer) and the study's input split (remade from the data file)."""
SKIPPED_NAMES = frozenset({"samples.jsonl"})
"""The sampled text of every step: for reading a run, not for its summary (often megabytes)."""
MAX_BYTES = 2_000_000
MODEL_RECORDS = frozenset({"sft_metrics.json"})
"""What a model folder (one with weights) keeps: its training losses, not its tokenizer or config."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
RUN_DIR = re.compile(r".+-s\d+")
"""A run folder's name in both studies: `<arm>-s<seed>`."""
FINISHED = "timing.json"
"""Written last in a run folder, after its evaluation."""
PROGRESS_FILES = frozenset({"real_study.json", "progress.json"})
"""Top-level files a running study rewrites after each run or seed: refreshed, not frozen."""


def _is_model_dir(folder: Path) -> bool:
    return any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir() if p.is_file())


def _unfinished_run(study_dir: Path, rel: Path) -> bool:
    """Whether `rel` lies in a run folder that has not written its `timing.json` yet."""
    for depth, part in enumerate(rel.parts[:-1]):
        if RUN_DIR.fullmatch(part):
            return not (study_dir.joinpath(*rel.parts[: depth + 1]) / FINISHED).is_file()
    return False


def record_files(study_dir: Path) -> list[Path]:
    """The files of `study_dir` that `keep_records` keeps, relative to it, sorted."""
    kept = []
    for path in sorted(study_dir.rglob("*")):
        rel = path.relative_to(study_dir)
        if not path.is_file() or path.is_symlink() or SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        if _unfinished_run(study_dir, rel):
            continue
        if path.suffix not in KEPT_SUFFIXES or path.name in SKIPPED_NAMES or path.stat().st_size > MAX_BYTES:
            continue
        if path.name not in MODEL_RECORDS and _is_model_dir(path.parent):
            continue
        kept.append(rel)
    return kept


def keep_records(study_dirs: list[Path], dest: Path, log=print) -> list[Path]:
    """Copy each study folder's records into dest/<its name>/ (module doc); returns the copied files.

    Checks every file before copying any: a record already in dest with other contents stops it all."""
    plan = []
    for study_dir in study_dirs:
        study_dir = Path(study_dir)
        if not study_dir.is_dir():
            raise ConfigError(f"--keep: no such study folder {study_dir}")
        target_root = Path(dest) / study_dir.name
        if target_root.resolve() == study_dir.resolve():
            continue  # already a kept record folder
        for rel in record_files(study_dir):
            source, target = study_dir / rel, target_root / rel
            same = target.exists() and filecmp.cmp(source, target, shallow=False)
            if target.exists() and not same and str(rel) not in PROGRESS_FILES:
                raise ConfigError(f"--keep: {target} exists with other contents; records are never overwritten")
            plan.append((source, target, same))
    copied = []
    for source, target, same in plan:
        if same:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied.append(target)
    log(f"kept {len(copied)} new or refreshed record files under {dest} ({len(plan) - len(copied)} already there)")
    return copied

"""Run folders: one writer at a time, no fresh run over an old one, names that cannot collide.

`claim_run_dir(path, mode)` is what a command calls before it builds a trainer:

- the folder is created (an unwritable place is a `RunDirError` naming it);
- it is LOCKED for as long as the returned `RunDirLock` is held: `fcntl.flock` on `RUN_DIR/.lock`,
  the holder's PID written inside, so a second writer gets one error naming that PID (the kernel drops
  the lock when the holder dies, even by SIGKILL, so a crash never leaves a stale lock);
- a fresh run (`mode="fresh"`) into a folder that already holds a run's files is refused; `"resume"`
  keeps them; `"overwrite"` is the user asking to discard them: everything in RUN_OUTPUTS (what regroup
  writes into a run folder), and nothing else: caches of remote answers are kept (they are still right),
  and so is any file of the user's own;
- nothing in it is followed through a symbolic link: a link planted as `.lock`, `metrics.jsonl`, ... counts
  as a run's file for the "already holds a run" check, is refused when opened, and `--overwrite` removes
  the link itself, never what it points to.

`claim_eval_dir(out, overwrite)` does the same for `regroup eval --out`.

`new_run_dir(root, name)` makes a folder that did not exist before (exclusive `mkdir`), adding `-2`,
`-3`, ... when two runs start in the same second.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from regroup.config.fields import MAX_TEXT, load_yaml
from regroup.errors import ConfigError
from regroup.io import NotRegularFileError, SymlinkError, open_nofollow, read_file_text

LOCK_FILE = ".lock"
RUN_OUTPUTS = (
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "checkpoints",
    "tb",
    "eval",
    "eval_before",
    "timing.json",
    "plots",
    "report.html",
    "report.md",
)
"""Everything regroup writes into a run folder (trainer, demo, study, `regroup eval --out RUN/eval`, `regroup
report RUN`); the "already holds a run" check and `--overwrite` both use this one list. Not in it: `.lock`
and `cache/` (answers of a judge or rewriter, still right for a new run)."""
EVAL_OUTPUTS = ("summary.json", "summary.md")
"""What `regroup eval` writes at the top of its --out folder (besides one folder per benchmark holding
EVAL_BENCH_OUTPUTS)."""
EVAL_BENCH_OUTPUTS = ("per_problem.jsonl", "summary.json")


class RunDirError(RuntimeError):
    """A run folder cannot be used as asked (held by another run, holds a run, not writable)."""


def _present(path: Path) -> bool:
    """A file or link (dangling or not) at `path`, or a folder with anything in it."""
    if path.is_symlink():
        return True
    if path.is_dir():
        return any(True for _ in path.iterdir())
    return os.path.lexists(path)


def run_outputs_present(run_dir: str | os.PathLike) -> list[str]:
    """The names of RUN_OUTPUTS present in the folder (a link counts, even a dangling one; an empty folder
    does not)."""
    run_dir = Path(run_dir)
    return [name for name in RUN_OUTPUTS if _present(run_dir / name)]


def holds_a_run(run_dir: str | os.PathLike) -> bool:
    """True when the folder has anything an earlier run (or its evaluation, report) wrote."""
    return bool(run_outputs_present(run_dir))


class RunDirLock:
    """An exclusive lock on RUN_DIR/.lock (released by `release()`, by `with`, or when the process dies)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        try:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # a linked .lock: its target untouched
        except SymlinkError as e:
            raise RunDirError(e.strerror) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"run folder {self.run_dir} is in use by another run (pid {holder}); "
                "wait for it to finish or choose another run_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self, discard_empty: bool = False, made: str | os.PathLike | None = None) -> None:
        """Unlock. `discard_empty`: when nothing but the .lock is in the folder (a run refused or stopped before
        it wrote anything), remove the .lock too, and with `made` (the outermost folder the caller created on the
        way to the run folder: the run folder itself, or a parent such as `runs/`; see `first_missing_folder`)
        the run folder and its parents up to `made` while they are empty, so that the disk is left as it was
        found. The .lock is unlinked while still held: a second writer that opened it already fails its flock;
        one that made the folder just before it is removed fails in one line (no such file)."""
        if self._fd is None:
            return
        emptied = False
        if discard_empty:
            try:
                emptied = os.listdir(self.run_dir) == [LOCK_FILE]
                if emptied:
                    os.unlink(self.path)
            except OSError:
                emptied = False
        if not emptied:
            os.ftruncate(self._fd, 0)  # no PID of a finished run is left behind to confuse a reader
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if emptied and made is not None:
            _remove_empty_folders(self.run_dir, Path(made))

    def __enter__(self) -> RunDirLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def first_missing_folder(path: str | os.PathLike) -> Path | None:
    """The outermost folder of `path` (`path` itself or one of its parents) that does not exist yet: the first
    one making `path` creates. None when `path` exists (a link counts, even a dangling one)."""
    path, top = Path(path), None
    while not os.path.lexists(path) and path != path.parent:
        top, path = path, path.parent
    return top


def _remove_empty_folders(folder: Path, top: Path) -> None:
    """Remove `folder`, then its parents up to `top` (`folder` or one of its parents), each only while empty."""
    if top != folder and top not in folder.parents:
        top = folder  # not on its way: only the run folder itself
    while True:
        try:
            folder.rmdir()  # fails, harmlessly, if another writer put something there meanwhile
        except OSError:
            return
        if folder == top:
            return
        folder = folder.parent


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"cannot write to run folder {path}: {e.strerror or e}") from None


def _remove(path: Path) -> bool:
    """Remove a file, a link (never what it points to) or a folder; True when something was there."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
        return True
    if path.is_dir():
        trash = path.parent / f".trash-{path.name}-{os.getpid()}"  # out of the way first: a crash leaves no half folder
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    return False


def _remove_trash(folder: Path) -> None:
    for leftover in folder.glob(".trash-*"):  # an earlier --overwrite killed while deleting
        if leftover.is_symlink():
            leftover.unlink()
        else:
            shutil.rmtree(leftover, ignore_errors=True)


def discard_previous_run(run_dir: Path) -> list[str]:
    """Remove what an earlier run wrote (RUN_OUTPUTS, nothing else); returns the names removed."""
    _remove_trash(run_dir)
    return [name for name in RUN_OUTPUTS if _remove(run_dir / name)]


def claim_run_dir(run_dir: str | os.PathLike, mode: str = "fresh", log=print, lock: bool = True) -> RunDirLock | None:
    """Make, lock and check a run folder for a run started as `mode` (fresh | resume | overwrite).

    Returns the held lock (None with lock=False: a non-main process of a distributed run checks only).
    """
    if mode not in ("fresh", "resume", "overwrite"):
        raise ValueError(f"mode must be fresh, resume or overwrite, got {mode!r}")
    run_dir = Path(run_dir)
    if mode == "resume" and not run_dir.is_dir():
        raise RunDirError(f"--resume {run_dir}: no such run folder")
    if lock:
        _make_dir(run_dir)
    held = RunDirLock(run_dir).acquire() if lock else None
    try:
        if mode == "fresh" and holds_a_run(run_dir):
            raise RunDirError(
                f"run folder {run_dir} already holds a run ({', '.join(run_outputs_present(run_dir))}); "
                "continue it with --resume, discard it with --overwrite, or choose another run_dir"
            )
        if mode == "overwrite" and lock:
            removed = discard_previous_run(run_dir)
            if removed:
                log(f"--overwrite: discarded {', '.join(removed)} of the previous run in {run_dir}")
    except BaseException:
        if held is not None:
            held.release()
        raise
    return held


def new_run_dir(root: str | os.PathLike, name: str, stamp: str | None = None) -> Path:
    """A new folder ROOT/NAME-STAMP (STAMP: the local time to the second), created here and now;
    when it exists (two runs in the same second) ROOT/NAME-STAMP-2, -3, ... instead."""
    root = Path(root)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create {root}: {e.strerror or e}") from None
    for n in range(1, 10_000):
        path = root / (f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise RunDirError(f"cannot create {path}: {e.strerror or e}") from None
    raise RunDirError(f"no free run folder name under {root} for {name}-{stamp}")


def eval_outputs_present(out_dir: str | os.PathLike) -> list[str]:
    """What an earlier `regroup eval` wrote in `out_dir`: EVAL_OUTPUTS and `BENCH/<EVAL_BENCH_OUTPUTS>`."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = [name for name in EVAL_OUTPUTS if os.path.lexists(out_dir / name)]
    for sub in sorted(p for p in out_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        found += [f"{sub.name}/{name}" for name in EVAL_BENCH_OUTPUTS if os.path.lexists(sub / name)]
    return found


def claim_eval_dir(out_dir: str | os.PathLike, overwrite: bool = False, log=print) -> RunDirLock:
    """Make and lock `regroup eval`'s --out folder; refuse one holding an earlier evaluation unless
    `overwrite` (then exactly those files are removed, and benchmark folders left empty by that)."""
    out_dir = Path(out_dir)
    _make_dir(out_dir)
    held = RunDirLock(out_dir).acquire()
    try:
        found = eval_outputs_present(out_dir)
        if found and not overwrite:
            raise RunDirError(
                f"eval folder {out_dir} already holds results ({', '.join(found[:4])}"
                f"{', ...' if len(found) > 4 else ''}); pass --overwrite to replace them, or choose "
                "another --out"
            )
        for name in found:
            (out_dir / name).unlink()
            parent = (out_dir / name).parent
            if parent != out_dir and not any(parent.iterdir()):
                parent.rmdir()
        if found:
            log(f"--overwrite: discarded the earlier evaluation in {out_dir}")
    except BaseException:
        held.release()
        raise
    return held


def read_saved_config(path: str | os.PathLike) -> dict:
    """The mapping in a run's config.yaml (never read through a link, only a regular file, at most MAX_TEXT + 1
    characters of it); ConfigError naming the file when it is not valid YAML or not a mapping. Callers that build
    a RunConfig from it validate it further."""
    try:
        data = load_yaml(read_file_text(path, MAX_TEXT + 1, follow_links=False), str(path))
    except (SymlinkError, NotRegularFileError) as e:
        raise ConfigError(e.strerror) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())[:300]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a saved config must be a mapping, got {type(data).__name__}")
    return data


def flatten(nested: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict (a saved config) as {dotted.key: leaf value}; lists and empty dicts stay leaves: what a resume
    compares with the checkpoint's config and the report tabulates."""
    if not isinstance(nested, dict) or not nested:
        return {prefix: nested} if prefix else {}
    return {
        k: v
        for key, value in nested.items()
        for k, v in flatten(value, f"{prefix}.{key}" if prefix else str(key)).items()
    }

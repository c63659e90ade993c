"""Run folders: one writer at a time, no fresh run over an old one, names that cannot collide.

`claim_run_dir(path, mode)` is what a command calls before it builds a trainer:

- the folder is created (an unwritable place is a `RunDirError` naming it);
- it is LOCKED for as long as the returned `RunDirLock` is held: `fcntl.flock` on `RUN_DIR/.lock`,
  the holder's PID written inside, so a second writer gets one error naming that PID (the kernel drops
  the lock when the holder dies, even by SIGKILL, so a crash never leaves a stale lock);
- a fresh run (`mode="fresh"`) into a folder that already holds a run's files is refused; `"resume"`
  keeps them; `"overwrite"` is the user asking to discard them (checkpoints, metrics, samples, config,
  TensorBoard events; caches of remote answers are kept, they are still right).

`new_run_dir(root, name)` makes a folder that did not exist before (exclusive `mkdir`), adding `-2`,
`-3`, ... when two runs start in the same second.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

LOCK_FILE = ".lock"
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl")
"""Files whose presence means the folder holds a run."""
DISCARDED_ON_OVERWRITE = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoints", "tb")


class RunDirError(RuntimeError):
    """A run folder cannot be used as asked (held by another run, holds a run, not writable)."""


def holds_a_run(run_dir: str | os.PathLike) -> bool:
    """True when the folder has a config, metrics or any checkpoint folder of an earlier run."""
    run_dir = Path(run_dir)
    if any((run_dir / name).exists() for name in RUN_FILES):
        return True
    checkpoints = run_dir / "checkpoints"
    return checkpoints.is_dir() and any(p.name.startswith("step-") for p in checkpoints.iterdir())


class RunDirLock:
    """An exclusive lock on RUN_DIR/.lock (released by `release()`, by `with`, or when the process dies)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "RunDirLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"run folder {self.run_dir} is in use by another run (pid {holder}); "
                              "wait for it to finish or choose another run_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no PID of a finished run is left behind to confuse a reader
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"cannot write to run folder {path}: {e.strerror or e}") from None


def discard_previous_run(run_dir: Path) -> list[str]:
    """Remove what an earlier run wrote (see DISCARDED_ON_OVERWRITE); returns the names removed."""
    removed = []
    for leftover in run_dir.glob(".trash-*"):  # an earlier --overwrite killed while deleting
        shutil.rmtree(leftover, ignore_errors=True)
    for name in DISCARDED_ON_OVERWRITE:
        path = run_dir / name
        if path.is_dir():
            trash = run_dir / f".trash-{name}-{os.getpid()}"  # out of the way first: a crash leaves no half folder
            os.replace(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(name)
        elif path.exists():
            path.unlink()
            removed.append(name)
    return removed


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
            raise RunDirError(f"run folder {run_dir} already holds a run (config.yaml, metrics.jsonl or checkpoints); "
                              "continue it with --resume, discard it with --overwrite, or choose another run_dir")
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

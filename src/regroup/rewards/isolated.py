"""Starting and stopping the reward worker processes (of `regroup.rewards.pool`: the user rewards' and the
math checker's).

A worker starts isolated: `python -I` reads no PYTHON* variable, no user site, and puts neither the current
folder nor a script's folder on `sys.path`, so a `json.py` planted where `regroup train` runs is never
imported. Its `sys.path` is then set to the parent's, less the current folder (kept only when the user
named it in PYTHONPATH). The top-level packages the worker must run exactly as the parent does (regroup
itself, a user reward's package) are loaded from the files the parent loaded them from, whatever the
path says: in a git worktree the venv's editable install points elsewhere.

Each worker leads its own session (and so its own process group): a timeout kills the group, so the
processes a reward started die with it; and the terminal's job control never stops a worker that writes
to it. A worker whose parent dies (even by SIGKILL) kills its own group within a second or so. An
address-space limit (RLIMIT_AS) bounds what one check may allocate.
Hand-written on subprocess: no process library starts a worker this way (isolated path, own session and
group, memory limit, orphan watchdog) or kills its whole group.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

DEFAULT_MEMORY_MB = 4096
"""Address space of one reward worker (RLIMIT_AS), MiB (`rewards.worker_memory_mb`): a check that allocates
beyond it fails (MemoryError: that call is an error) instead of taking the machine's memory."""

_BOOT = r"""
import importlib.util, json, os, sys, threading, time
def _orphaned(parent=os.getppid()):  # the parent died (SIGKILL): take the whole group down with it
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(0, 9)
threading.Thread(target=_orphaned, daemon=True).start()
_spec = json.loads(sys.argv.pop(1))
sys.path[:] = _spec["path"]
if _spec["memory_mb"]:
    import resource
    _limit = _spec["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
for _name, _origin, _where in _spec["preload"]:
    _found = importlib.util.spec_from_file_location(_name, _origin, submodule_search_locations=_where)
    _module = importlib.util.module_from_spec(_found)
    sys.modules[_name] = _module
    _found.loader.exec_module(_module)
del _spec
"""


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def worker_path() -> list[str]:
    """The parent's `sys.path` without the current folder ('' or its name), unless PYTHONPATH names it."""
    cwd = os.getcwd()
    typed = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    keep_cwd = any(_same(p, cwd) for p in typed)
    return [p for p in sys.path if p and os.path.isdir(p) and (keep_cwd or not _same(p, cwd))]


def module_origin(top: str) -> tuple[str, str, list[str] | None] | None:
    """(name, file, package folders) of the top-level module `top` as this process loads it; None for a
    module without a file (built-in, namespace package) or one that cannot be found."""
    module = sys.modules.get(top)
    spec = getattr(module, "__spec__", None) if module is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: finds it without running it
        except (ImportError, ValueError):
            return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    where = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    return top, spec.origin, where


def worker_command(
    code: str, args: Sequence[str] = (), *, preload: Sequence[str] = (), memory_mb: int = 0
) -> list[str]:
    """argv of an isolated worker running `code` (with `sys.argv[1:] == args`): the parent's path less the
    current folder, the top-level modules `preload` loaded from the parent's files, `memory_mb` MiB of
    address space at most (0: no limit)."""
    found = [m for m in (module_origin(name) for name in dict.fromkeys(preload)) if m is not None]
    spec = {"path": worker_path(), "memory_mb": int(memory_mb), "preload": found}
    return [sys.executable, "-I", "-c", _BOOT + code, json.dumps(spec), *args]


def start_worker(argv: list[str], **popen) -> subprocess.Popen:
    """`Popen(argv)` as the leader of a new session (its own process group), OMP_NUM_THREADS=1 unless set."""
    env = dict(popen.pop("env", None) or os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen(argv, env=env, close_fds=True, start_new_session=True, **popen)


def kill_group(proc: subprocess.Popen | None) -> None:
    """Kill the worker and every process of its group (what a reward spawned), then reap the worker."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its group: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that does not exit
        pass

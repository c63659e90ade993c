"""The reward worker pool, shared by the math checker and the user rewards: `size` worker processes running
the reward child (`_worker.py`), each started isolated (`regroup.rewards.isolated`: `python -I`, its own
process group, a memory limit, an orphan watchdog), each speaking JSON lines on pipes.

A call takes a free worker (the warm one first), sends one request line and waits for one reply line until
its deadline. A worker that has not answered by then is killed with its whole process group (what the
reward started dies too) and replaced at once, so the next one imports while the caller goes on; one found
dead is replaced too; each replacement is counted (`restarts`). A forked child starts its own workers.
Hand-written because no library does the job: concurrent.futures and multiprocessing pools pickle their
calls, and cannot stop a call stuck in C code except by breaking the pool, nor kill what the call started.
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from regroup.rewards.counts import RewardCounts
from regroup.rewards.isolated import kill_group, start_worker, worker_command

T = TypeVar("T")
R = TypeVar("R")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")


class WorkerStartError(RuntimeError):
    """A worker could not start: `fatal` is its own reason (a failed import, a reward that is not callable),
    else `reason` says it exited or did not start in time."""

    def __init__(self, reason: str, fatal: str | None = None) -> None:
        super().__init__(fatal or reason)
        self.reason, self.fatal = reason, fatal


class WorkerLost(Exception):
    """A call got no reply; the worker is gone and a new one is starting."""


class WorkerTimeout(WorkerLost):
    """No reply before the call's deadline: the worker and its process group were killed."""


class WorkerDied(WorkerLost):
    """The worker exited during the call (a crash, or the reward ended its own process)."""


def read_chunk(fd: int, deadline: float) -> bytes | None:
    """What a worker's pipe has, waiting until `deadline` (time.monotonic): None at the deadline, b"" when the
    worker exited."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    readable, _, _ = select.select([fd], [], [], left)
    if not readable:
        return None
    return os.read(fd, 1 << 16)


def _kill_if_ours(proc: subprocess.Popen, owner: int) -> None:
    if os.getpid() == owner:  # a forked child never kills its parent's workers
        kill_group(proc)


class _Worker:
    """One child process and its line protocol."""

    def __init__(self, argv: list[str], quiet: bool) -> None:
        stderr = subprocess.DEVNULL if quiet else None
        self.proc = start_worker(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, bufsize=0)
        self.owner = os.getpid()
        self.ready = False
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _kill_if_ours, self.proc, self.owner)

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line)
        except (BrokenPipeError, OSError):
            raise WorkerDied("the reward worker's pipe is closed") from None

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next reply; None at the deadline; raises WorkerDied when the child exited."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            chunk = read_chunk(fd, deadline)
            if chunk is None:
                return None
            if not chunk:
                raise WorkerDied("the reward worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)  # JSON back: the parent unpickles nothing

    def close(self) -> None:
        self._finalizer()


class WorkerPool:
    """`size` workers running `_worker.py` with `args` (see there), each with `memory_mb` MiB of address space
    (0: no limit) and the top-level packages `preload` loaded from the parent's files; started on first use.
    `counts` gets a `restarts` for every worker replaced. `quiet` sends the workers' stderr to /dev/null."""

    def __init__(
        self,
        args: Sequence[str],
        size: int,
        *,
        counts: RewardCounts,
        memory_mb: int,
        startup_timeout_s: float,
        preload: Sequence[str] = (),
        quiet: bool = False,
    ) -> None:
        self.args, self.preload, self.memory_mb = list(args), tuple(preload), memory_mb
        self.size, self.startup_timeout_s, self.quiet = size, startup_timeout_s, quiet
        self._counts = counts
        self.workers: list[_Worker | None] = [None] * size  # by slot; None until started
        self._free: queue.LifoQueue[int] = queue.LifoQueue()  # LIFO: a warm worker is reused first
        for slot in range(size):
            self._free.put(slot)

    def call(self, request: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """Send `request` to a free worker and return its reply, waiting `wait_s` at most. Raises WorkerTimeout
        or WorkerDied (the worker is replaced), WorkerStartError, or TypeError / ValueError for a request that
        is not JSON (before any worker is used)."""
        line = (json.dumps(request) + "\n").encode("utf-8")
        slot = self._free.get()
        try:
            worker = self._ready(slot)
            try:
                worker.send(line)
                reply = worker.read(time.monotonic() + wait_s)
            except WorkerDied:
                self._replace(slot)  # this input crashed it (e.g. a C stack overflow, or os._exit)
                raise
            if reply is None:
                self._replace(slot)  # stuck where nothing else reaches it: kill its group
                raise WorkerTimeout(f"no reply within {wait_s:g} s")
            return reply
        finally:
            self._free.put(slot)

    def run_many(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`[fn(item) for item in items]`, `size` at a time (fn calls `call`); results in order."""
        if self.size > 1 and len(items) > 1:
            with ThreadPoolExecutor(max_workers=min(self.size, len(items))) as threads:
                return list(threads.map(fn, items))
        return [fn(item) for item in items]

    def _new_worker(self) -> _Worker:
        # The command is made at each start: the path and the preloaded packages' files as they are now.
        code = f"import runpy; runpy.run_path({WORKER!r}, run_name='__main__')"
        return _Worker(worker_command(code, self.args, preload=self.preload, memory_mb=self.memory_mb), self.quiet)

    def _start(self, slot: int) -> _Worker:
        worker = self.workers[slot]
        if worker is not None and not worker.alive():
            if worker.owner == os.getpid():
                worker.close()
                self._counts.add("restarts")  # found dead while idle
            worker = None
        if worker is None:
            worker = self.workers[slot] = self._new_worker()
        return worker

    def _ready(self, slot: int) -> _Worker:
        worker = self._start(slot)
        if worker.ready:
            return worker
        try:
            reply = worker.read(time.monotonic() + self.startup_timeout_s)
        except WorkerDied:
            reply = {"died": True}
        if reply is None or "ready" not in reply:
            worker.close()
            self.workers[slot] = None
            if reply is None:
                raise WorkerStartError(f"did not start within {self.startup_timeout_s:g} s")
            fatal = reply.get("fatal")
            raise WorkerStartError("failed to start" if fatal else "exited while starting", fatal)
        worker.ready = True
        return worker

    def _replace(self, slot: int) -> None:
        """Kill the slot's worker (and its group) and start the next one now."""
        worker = self.workers[slot]
        if worker is not None:
            worker.close()
        self._counts.add("restarts")
        self.workers[slot] = self._new_worker()

    def warm_up(self) -> None:
        """Start every worker now and wait until each is ready, so no timed call pays for a start."""
        slots = [self._free.get() for _ in range(self.size)]  # all of them: nobody calls meanwhile
        try:
            for slot in slots:  # started together: they import in parallel
                self._start(slot)
            for slot in slots:
                self._ready(slot)
        finally:
            for slot in slots:
                self._free.put(slot)

    def close(self) -> None:
        """Stop every worker (a later call starts new ones)."""
        slots = [self._free.get() for _ in range(self.size)]
        for slot in slots:
            worker = self.workers[slot]
            if worker is not None and worker.owner == os.getpid():
                worker.close()
            self.workers[slot] = None
            self._free.put(slot)

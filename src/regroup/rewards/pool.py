"""The reward worker pool, shared by the math checker and the user rewards: `size` worker processes running
the reward child (`_worker.py`), each started isolated (`regroup.rewards.isolated`: `python -I`, its own
process group, a memory limit, an orphan watchdog), each speaking JSON lines on pipes.

A call takes a free worker (the warm one first), sends one request line and waits for one reply line until
its deadline. A worker that has not answered by then is killed with its whole process group (what the
reward started dies too) and replaced at once, so the next one imports while the caller goes on; one found
dead is replaced too; each replacement is counted (`restarts`). A forked child starts its own workers.

Each request carries a sequence id that its reply must carry back. Anything else on the reply channel (a
line the reward wrote there, a reply to another request, a line that is not JSON, data left after the
reply) is a protocol error: the worker is replaced and the call fails as a crashed one does
(`WorkerProtocolError`); data found there between calls sends the next request to a new worker. A process
the reward forked that came back into the worker's loop (it returned instead of calling `os._exit`) only
says so and exits (`_worker.py`). Both are counted (`protocol_errors`, `forked_returns`) and said once in
the log: a reward that does this is broken, and its scores could otherwise have gone to the wrong sample.
Hand-written because no library does the job: concurrent.futures and multiprocessing pools pickle their
calls, and cannot stop a call stuck in C code except by breaking the pool, nor kill what the call started.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from regroup.rewards.counts import RewardCounts
from regroup.rewards.isolated import kill_group, start_worker, worker_command

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")

POOL_COUNTS = ("restarts", "protocol_errors", "forked_returns")
"""The counts a pool adds to its owner's `RewardCounts` (which must have these keys)."""


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


class WorkerProtocolError(WorkerLost):
    """The reply channel held something other than the reply to the call: the worker was replaced."""


def _message(line: bytes) -> dict[str, Any] | None:
    """A reply channel line as a JSON object (JSON back: the parent unpickles nothing); None when it is not one."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _shown(data: bytes) -> str:
    """A short, redacted quote of unexpected data, for the log line."""
    from regroup.net.redact import clip  # here: the net package loads an HTTP client

    return repr(clip(data.decode("utf-8", "replace"), 80))


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
        self.last_id = 0  # of the newest request sent
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

    def read_line(self, deadline: float) -> bytes | None:
        """The next line of the reply channel; None at the deadline; raises WorkerDied when the child exited."""
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
        return line

    def unread(self) -> bytes:
        """What the reply channel holds beyond the lines read, without waiting (b"": nothing). An exited
        worker's end of file is left for the next read."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if select.select([fd], [], [], 0)[0]:
            self._buffer += os.read(fd, 1 << 16)
        data, self._buffer = self._buffer, b""
        return data

    def close(self) -> None:
        self._finalizer()


class WorkerPool:
    """`size` workers running `_worker.py` with `args` (see there), each with `memory_mb` MiB of address space
    (0: no limit) and the top-level packages `preload` loaded from the parent's files; started on first use.
    `counts` (with the keys POOL_COUNTS) gets a `restarts` for every worker replaced, a `protocol_errors` for
    every worker replaced for what it wrote on its reply channel, a `forked_returns` for every process the
    reward forked that came back into the worker. `quiet` sends the workers' stderr to /dev/null."""

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
        self._said: set[str] = set()  # the kinds of broken protocol already said in the log
        self._said_lock = threading.Lock()
        self.workers: list[_Worker | None] = [None] * size  # by slot; None until started
        self._free: queue.LifoQueue[int] = queue.LifoQueue()  # LIFO: a warm worker is reused first
        for slot in range(size):
            self._free.put(slot)

    def call(self, request: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """Send `request` to a free worker and return its reply, waiting `wait_s` at most. Raises WorkerTimeout,
        WorkerDied or WorkerProtocolError (the worker is replaced), WorkerStartError, or TypeError / ValueError
        for a request that is not JSON (before any worker is used)."""
        body = json.dumps(request)
        slot = self._free.get()
        try:
            worker = self._ready(slot)
            stray = self._stray(worker)
            if stray is not None:  # written since the last reply: this request goes to a new worker
                self._broken(slot, f"wrote {stray} on its reply channel between calls; the next call went to a new one")
                worker = self._ready(slot)
            worker.last_id += 1
            request_id = worker.last_id
            try:
                worker.send(f'{{"id": {request_id}, "request": {body}}}\n'.encode())
                reply = self._reply(worker, request_id, time.monotonic() + wait_s)
            except WorkerDied:
                self._replace(slot)  # this input crashed it (e.g. a C stack overflow, or os._exit)
                raise
            except WorkerProtocolError as e:
                self._broken(slot, str(e))
                raise
            if reply is None:
                self._replace(slot)  # stuck where nothing else reaches it: kill its group
                raise WorkerTimeout(f"no reply within {wait_s:g} s")
            return reply
        finally:
            self._free.put(slot)

    def _reply(self, worker: _Worker, request_id: int, deadline: float) -> dict[str, Any] | None:
        """The reply to request `request_id`, None at the deadline; WorkerProtocolError for any other line
        (a forked child's notice aside) or for data after the reply."""
        while True:
            line = worker.read_line(deadline)
            if line is None:
                return None
            message = _message(line)
            if self._forked_notice(message):
                continue
            got = None if message is None else message.pop("id", None)
            if type(got) is not int or got != request_id:  # JSON true is not id 1
                raise WorkerProtocolError(
                    f"wrote {_shown(line)} on its reply channel instead of reply {request_id}; that call failed"
                )
            stray = self._stray(worker)
            if stray is not None:
                raise WorkerProtocolError(
                    f"wrote {stray} on its reply channel after reply {request_id}; that call failed"
                )
            return message

    def _stray(self, worker: _Worker) -> str | None:
        """What the reply channel holds now beyond the lines read, forked children's notices aside (counted):
        None when nothing else, else a short quote of it."""
        data = worker.unread()
        lines = data.split(b"\n")
        rest = [line for line in lines[:-1] if not self._forked_notice(_message(line))]
        if lines[-1]:  # a line without its end
            rest.append(lines[-1])
        return _shown(b"\n".join(rest)) if rest else None

    def _forked_notice(self, message: dict[str, Any] | None) -> bool:
        """Whether `message` is the notice of a process the reward forked that came back into the worker
        (`_worker.py` made it exit before it wrote a reply); counted, and said once."""
        if message is None or set(message) != {"forked_child"}:
            return False
        self._counts.add("forked_returns")
        self._say_once(
            "forked",
            f"reward {self.args[-1]}: a process it forked returned into its worker instead of ending with os._exit; "
            "it was stopped before it could reply (counted as reward/forked_returns)",
        )
        return True

    def _broken(self, slot: int, what: str) -> None:
        """The worker in `slot` broke the reply protocol: counted, said once, replaced."""
        self._counts.add("protocol_errors")
        self._say_once(
            "protocol",
            f"reward {self.args[-1]}: its worker {what}; the worker was replaced (counted as reward/protocol_errors): "
            "a reward must not write to the worker's file descriptors",
        )
        self._replace(slot)

    def _say_once(self, kind: str, line: str) -> None:
        with self._said_lock:  # calls run in threads
            if kind in self._said:
                return
            self._said.add(kind)
        log.warning("warning: %s", line)

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
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            line = worker.read_line(deadline)
            while line is not None and self._forked_notice(_message(line)):
                line = worker.read_line(deadline)
        except WorkerDied:
            line = b'{"died": true}'
        reply = None if line is None else _message(line)
        if reply is None or set(reply) != {"ready"}:
            worker.close()
            self.workers[slot] = None
            if line is None:
                raise WorkerStartError(f"did not start within {self.startup_timeout_s:g} s")
            if reply is None or not reply.keys() & {"died", "fatal"}:
                raise WorkerStartError(f"wrote {_shown(line)} on its reply channel instead of its ready line")
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

"""A user reward (`rewards=[pkg.mod:obj]`: a function, a `functools.partial` or `lru_cache`, a callable
object) with a deadline: it runs in worker processes, like the math checker, and a call that does not
return within `timeout_s` is killed and scored None (unscored, counted as `timeout`), so a reward that
never returns cannot hang training.

Each child imports the reward by its dotted name, isolated (`regroup.rewards.isolated`: never from the
current folder, regroup and the reward's package from the files the parent loaded), in its own process
group (a timeout kills what the reward started too) and under an address-space limit. It reads one
length-prefixed JSON request (the response and `Problem.to_dict()`) and answers one JSON reply per request
on a private pipe: nothing is pickled either way; whatever the reward prints goes to stderr. A timed-out or
crashed worker is replaced before the next call. `workers` children score a batch (`check_many`) at once.

A number beyond float range (an int such as 10**400) comes back as the largest float, which the reward
stage counts as out of range (`reward/out_of_range`), never an OverflowError. Timeouts are counted
(`reward/timeout`, `reward/timeout_frac`) and, when they keep happening, said in one warning line naming
the deadline: each costs the whole `timeout_s`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import struct
import subprocess
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from regroup.errors import ConfigError
from regroup.rewards.counts import RewardCounts
from regroup.rewards.isolated import DEFAULT_MEMORY_MB, kill_group, start_worker, worker_command
from regroup.rewards.math_verify import read_chunk

log = logging.getLogger(__name__)

COUNTS = ("checked", "timeout", "restarts")

_CHILD = r"""
import json, numbers, os, struct, sys
channel = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
sys.stdout = sys.stderr
def plain(value):  # numpy / torch scalars become floats; an int beyond float range the largest float
    if value is None or isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        return value
    try:
        return float(value)
    except OverflowError:
        return sys.float_info.max if value > 0 else -sys.float_info.max
def not_json(value):  # anything else is the reward's error, not ours
    raise TypeError(f"returned a {type(value).__name__}, not a number")
def send(obj):
    try:
        data = json.dumps(obj, default=not_json).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"error": str(exc)[:300]}).encode()
    channel.write(struct.pack(">I", len(data)) + data)
try:
    from regroup.config.registry import load_dotted
    from regroup.tasks.base import Problem
    fn = load_dotted(sys.argv[1])
    if not callable(fn):
        raise TypeError(f"{sys.argv[1]} is a {type(fn).__name__}, not callable")
except BaseException as exc:
    send({"fatal": f"{type(exc).__name__}: {exc}"})
    sys.exit(0)
send({"ready": True})
stdin = sys.stdin.buffer
while True:
    head = stdin.read(4)
    if len(head) < 4:
        break
    request = json.loads(stdin.read(struct.unpack(">I", head)[0]))
    response, problem = request["response"], Problem.from_dict(request["problem"])
    try:
        send({"value": plain(fn(response, problem))})
    except BaseException as exc:
        send({"error": f"{type(exc).__name__}: {exc}"[:300]})
"""


class UserRewardError(ConfigError):
    """A user reward that cannot start, raises, or returns something that cannot be sent back: one line."""


class _Child:
    def __init__(self, name: str, memory_mb: int) -> None:
        top = name.partition(":")[0].split(".")[0]
        argv = worker_command(_CHILD, [name], preload=("regroup", top), memory_mb=memory_mb)
        self.proc = start_worker(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.pid = os.getpid()
        self._buffer = b""
        self._finalizer = weakref.finalize(self, kill_group, self.proc)
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both opened as pipes above
        self._stdin, self._stdout = stdin, stdout

    def send(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        try:
            self._stdin.write(struct.pack(">I", len(data)) + data)
        except (BrokenPipeError, OSError):
            pass  # the read below sees the exit

    def read(self, deadline: float) -> dict | None:
        """The next reply; None at the deadline; {"died": True} when the child exited."""
        fd = self._stdout.fileno()
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack(">I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    reply = json.loads(self._buffer[4 : 4 + size])  # JSON back: the parent unpickles nothing
                    self._buffer = self._buffer[4 + size :]
                    return reply
            chunk = read_chunk(fd, deadline)
            if chunk is None:
                return None
            if not chunk:
                return {"died": True}
            self._buffer += chunk

    def close(self) -> None:
        self._finalizer()


class _Slot:
    """One place in the worker pool: its child (None until first used, or after a kill)."""

    def __init__(self) -> None:
        self.child: _Child | None = None


class TimeoutWatch:
    """One warning line when calls keep timing out: in each of `patience` rounds in a row (a batch, or
    `calls_per_round` single calls) at least one call timed out. Any share counts: each timeout costs the
    whole deadline, so 5 % of 128 calls at 30 s is over 3 minutes of waiting a step. Fires once per streak."""

    def __init__(self, name: str, timeout_s: float, patience: int = 3, calls_per_round: int = 16) -> None:
        self.name, self.timeout_s = name, timeout_s
        self.patience, self.calls_per_round = patience, calls_per_round
        self.streak = 0
        self._pending = [0, 0]  # single calls not yet in a round: [calls, timeouts]
        self.warnings: list[str] = []

    def single(self, timed_out: bool) -> None:
        self._pending[0] += 1
        self._pending[1] += int(timed_out)
        if self._pending[0] >= self.calls_per_round:
            calls, timeouts = self._pending
            self._pending = [0, 0]
            self.round(calls, timeouts)

    def round(self, calls: int, timeouts: int) -> None:
        if not calls:
            return
        if not timeouts:
            self.streak = 0
            return
        self.streak += 1
        if self.streak == self.patience:
            line = (
                f"warning: reward {self.name}: {timeouts} of {calls} calls ({timeouts / calls:.0%}) timed out at "
                f"rewards.timeout_s={self.timeout_s:g} in each of the last {self.patience} batches "
                "(reward/timeout_frac); "
                f"each timeout waits the whole deadline (about {timeouts * self.timeout_s:.0f} s in the last batch) "
                "and scores None: make the reward faster, lower rewards.timeout_s, or raise rewards.workers"
            )
            self.warnings.append(line)
            log.warning(line)


class DeadlineReward:
    """`(response, problem) -> float | None` calling `name` ("pkg.mod:obj") in worker processes, at most
    `timeout_s` per call; past it the worker (and its process group) is killed and the call returns None
    (counted as timeout). `workers` children score a batch at once; each may use `memory_mb` MiB of address
    space (0: no limit). A callable object keeps its state per worker process (a killed worker loses it)."""

    def __init__(
        self,
        name: str,
        timeout_s: float,
        startup_timeout_s: float = 120.0,
        workers: int = 1,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"DeadlineReward: timeout_s must be > 0, got {timeout_s}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"DeadlineReward: workers must be an integer >= 1, got {workers!r}")
        if memory_mb < 0:
            raise ValueError(f"DeadlineReward: memory_mb must be >= 0, got {memory_mb}")
        self.name, self.timeout_s, self.startup_timeout_s = name, float(timeout_s), float(startup_timeout_s)
        self.workers, self.memory_mb = workers, int(memory_mb)
        self.__name__ = name
        self._counts = RewardCounts(COUNTS)
        self._slots = [_Slot() for _ in range(workers)]
        self._free: queue.LifoQueue[_Slot] = queue.LifoQueue()  # LIFO: a warm worker is reused first
        for slot in self._slots:
            self._free.put(slot)
        self.timeouts = TimeoutWatch(name, self.timeout_s)

    def pop_counts(self) -> dict[str, int]:
        return self._counts.pop()

    @property
    def stats(self) -> dict[str, int]:
        return self._counts.totals()

    def _ready_child(self, slot: _Slot) -> _Child:
        child = slot.child
        if child is not None and child.pid == os.getpid() and child.proc.poll() is None:
            return child
        if child is not None and child.pid == os.getpid():
            child.close()
            self._counts.add("restarts")
        child = slot.child = _Child(self.name, self.memory_mb)
        reply = child.read(time.monotonic() + self.startup_timeout_s)
        if reply is None or "ready" not in reply:
            child.close()
            slot.child = None
            why = "did not start in time" if reply is None else reply.get("fatal", "exited while starting")
            raise UserRewardError(f"reward {self.name}: the worker process {why}")
        return child

    def _call(self, response: str, problem: Any) -> tuple[float | None, bool]:
        """(value, whether the call timed out), in a free worker."""
        slot = self._free.get()
        try:
            child = self._ready_child(slot)
            self._counts.add("checked")
            try:
                child.send({"response": response, "problem": problem.to_dict()})
            except (TypeError, ValueError, AttributeError) as e:  # not a Problem, or meta that is not JSON
                raise UserRewardError(f"reward {self.name}: its arguments cannot be sent to the worker ({e})") from None
            reply = child.read(time.monotonic() + self.timeout_s)
            if reply is None or reply.get("died"):
                child.close()  # stuck (or crashed): its group is killed; the next call starts a fresh worker
                slot.child = None
                self._counts.add("restarts")
                if reply is None:
                    self._counts.add("timeout")
                return None, reply is None
        finally:
            self._free.put(slot)
        if "error" in reply:
            raise UserRewardError(f"reward {self.name} raised {reply['error']}")
        return reply["value"], False

    def __call__(self, response: str, problem: Any) -> float | None:
        value, timed_out = self._call(response, problem)
        self.timeouts.single(timed_out)
        return value

    def check_many(self, responses: Sequence[str], problems: Sequence[Any]) -> list[float | None]:
        """The rewards of a batch, `workers` calls at a time."""
        if len(responses) != len(problems):
            raise ValueError(f"check_many: {len(responses)} responses for {len(problems)} problems")
        pairs = list(zip(responses, problems))
        if self.workers > 1 and len(pairs) > 1:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(pairs))) as pool:
                results = list(pool.map(lambda pair: self._call(*pair), pairs))
        else:
            results = [self._call(r, p) for r, p in pairs]
        self.timeouts.round(len(results), sum(timed_out for _, timed_out in results))
        return [value for value, _ in results]

    def close(self) -> None:
        for slot in self._slots:
            if slot.child is not None and slot.child.pid == os.getpid():
                slot.child.close()
            slot.child = None

    def __getstate__(self) -> dict:
        keep = ("name", "timeout_s", "startup_timeout_s", "workers", "memory_mb")
        return {k: getattr(self, k) for k in keep}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

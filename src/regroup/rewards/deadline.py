"""A user reward (`rewards=[pkg.mod:fn]`) with a deadline: it runs in a worker process, like the math
checker, and a call that does not return within `timeout_s` is killed and scored None (unscored,
counted as `timeout`), so a reward that never returns cannot hang training.

The child imports the function by its dotted name and reads one length-prefixed JSON request (the
response and `Problem.to_dict()`) and answers one JSON reply per request on a private pipe: nothing is
pickled either way; whatever the function
prints goes to stderr. A timed-out or crashed worker is replaced before the next call.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

from regroup.errors import ConfigError
from regroup.rewards.counts import RewardCounts
from regroup.rewards.math_verify import read_chunk

COUNTS = ("checked", "timeout", "restarts")

_CHILD = r"""
import json, numbers, os, struct, sys, traceback
channel = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
sys.stdout = sys.stderr
def plain(value):  # numpy / torch scalars become floats; anything else is the reward's error, not ours
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"returned a {type(value).__name__}, not a number")
def send(obj):
    try:
        data = json.dumps(obj, default=plain).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"error": str(exc)[:300]}).encode()
    channel.write(struct.pack(">I", len(data)) + data)
try:
    from regroup.registry import load_dotted
    from regroup.tasks.base import Problem
    fn = load_dotted(sys.argv[1])
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
        send({"value": fn(response, problem)})
    except BaseException as exc:
        send({"error": f"{type(exc).__name__}: {exc}"[:300]})
"""


class UserRewardError(ConfigError):
    """A user reward that cannot start, raises, or returns something that cannot be sent back: one line."""


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


class _Child:
    def __init__(self, name: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=env,
            close_fds=True,
        )
        self.pid = os.getpid()
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _kill, self.proc)

    def send(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        except (BrokenPipeError, OSError):
            pass  # the read below sees the exit

    def read(self, deadline: float) -> dict | None:
        """The next reply; None at the deadline; {"died": True} when the child exited."""
        fd = self.proc.stdout.fileno()
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


class DeadlineReward:
    """`(response, problem) -> float | None` calling `name` ("pkg.mod:fn") in a worker process, at most
    `timeout_s` per call; past it the worker is killed and the call returns None (counted as timeout)."""

    def __init__(self, name: str, timeout_s: float, startup_timeout_s: float = 120.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"DeadlineReward: timeout_s must be > 0, got {timeout_s}")
        self.name, self.timeout_s, self.startup_timeout_s = name, float(timeout_s), float(startup_timeout_s)
        self.__name__ = name
        self._counts = RewardCounts(COUNTS)
        self._child: _Child | None = None

    def pop_counts(self) -> dict[str, int]:
        return self._counts.pop()

    @property
    def stats(self) -> dict[str, int]:
        return self._counts.totals()

    def _ready_child(self) -> _Child:
        child = self._child
        if child is not None and child.pid == os.getpid() and child.proc.poll() is None:
            return child
        if child is not None and child.pid == os.getpid():
            child.close()
            self._counts.add("restarts")
        child = self._child = _Child(self.name)
        reply = child.read(time.monotonic() + self.startup_timeout_s)
        if reply is None or "ready" not in reply:
            child.close()
            self._child = None
            why = "did not start in time" if reply is None else reply.get("fatal", "exited while starting")
            raise UserRewardError(f"reward {self.name}: the worker process {why}")
        return child

    def __call__(self, response: str, problem: Any) -> float | None:
        child = self._ready_child()
        self._counts.add("checked")
        try:
            child.send({"response": response, "problem": problem.to_dict()})
        except (TypeError, ValueError, AttributeError) as e:  # not a Problem, or meta that is not JSON
            raise UserRewardError(f"reward {self.name}: its arguments cannot be sent to the worker ({e})") from None
        reply = child.read(time.monotonic() + self.timeout_s)
        if reply is None or reply.get("died"):
            child.close()  # stuck (or crashed): the next call starts a fresh worker
            self._child = None
            self._counts.add("restarts")
            if reply is None:
                self._counts.add("timeout")
            return None
        if "error" in reply:
            raise UserRewardError(f"reward {self.name} raised {reply['error']}")
        return reply["value"]

    def check_many(self, responses: Sequence[str], problems: Sequence[Any]) -> list[float | None]:
        return [self(r, p) for r, p in zip(responses, problems)]

    def close(self) -> None:
        if self._child is not None and self._child.pid == os.getpid():
            self._child.close()
        self._child = None

    def __getstate__(self) -> dict:
        return {"name": self.name, "timeout_s": self.timeout_s, "startup_timeout_s": self.startup_timeout_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

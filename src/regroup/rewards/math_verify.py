"""A math answer checker that cannot hang: the last \\boxed{...} (or text after a marker) compared with the
problem's answer by math-verify, in a persistent worker process killed and restarted on timeout.

Why a process: math-verify's own timeout uses SIGALRM, which only works in the main thread, and
cannot interrupt C code (sympy evaluating 9^{9^{9^9}} sits in one big-integer power). A killed child
always stops. The worker is started on first use and restarted in the background after a kill.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

__all__ = ["MathAnswerChecker", "extract_boxed", "extract_after_marker"]

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the LAST complete `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    Also reads the brace-less form `\\boxed 5`. Linear in len(text): matching braces are found in one
    pass, so a long response full of unbalanced boxes cannot make it slow.
    """
    if not isinstance(text, str):
        return None
    close: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            close[stack.pop()] = i
    starts = sorted((i, cmd) for cmd in _BOX_COMMANDS for i in _find_all(text, cmd))
    for at, cmd in reversed(starts):
        j = at + len(cmd)
        if j < len(text) and text[j] == "{":
            if j in close:
                return text[j + 1 : close[j]].strip()
            continue  # never closed: try an earlier box
        if j < len(text) and text[j] == " ":
            token = text[j:].strip().split(maxsplit=1)
            if token:
                return token[0].rstrip("$.,")
    return None


def _find_all(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def extract_after_marker(text: str, marker: str) -> str | None:
    """The first non-empty line after the LAST `marker` in `text` (trailing full stop removed), or None."""
    if not isinstance(text, str) or not marker:
        return None
    at = text.rfind(marker)
    if at < 0:
        return None
    for line in text[at + len(marker) :].splitlines():
        line = line.strip().rstrip(".").strip()
        if line:
            return line
    return None


class _WorkerDied(Exception):
    pass


def _kill(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that does not exit
            pass


class _Worker:
    """One math-verify child process and its line protocol."""

    def __init__(self) -> None:
        env = dict(os.environ)
        # The child runs by file path; give it the parent's import path so it finds the same math_verify.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        env.setdefault("OMP_NUM_THREADS", "1")
        code = f"import runpy; runpy.run_path({_WORKER!r}, run_name='__main__')"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, bufsize=0, env=env, close_fds=True,
        )
        self.pid = os.getpid()
        self.ready = False
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _kill, self.proc)

    def read_line(self, deadline: float) -> dict[str, Any] | None:
        """The next reply, None at the deadline; raises _WorkerDied if the child exited."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _WorkerDied("math-verify worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def wait_ready(self, timeout_s: float) -> None:
        if self.ready:
            return
        reply = self.read_line(time.monotonic() + timeout_s)
        if reply is None:
            raise RuntimeError(f"math-verify worker did not start within {timeout_s:.0f} s")
        if "fatal" in reply:
            raise RuntimeError(f"math-verify worker failed to start: {reply['fatal']}")
        self.ready = True

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerDied(f"math-verify worker pipe closed: {exc}") from None

    def close(self) -> None:
        self._finalizer()


class MathAnswerChecker:
    """Reward `(response, problem) -> 1.0 | 0.0`: is the response's final answer `problem.answer`?

    The answer is the text after the last `marker` when `marker` is set and present, else the content
    of the last `\\boxed{...}`. It is compared with `problem.answer` by `math_verify.parse` /
    `math_verify.verify` (so `\\boxed{1/2}` matches "0.5" and `\\frac{1}{2}`).

    Never hangs or raises on a response: one longer than `max_chars` scores 0.0 unparsed; parse +
    verify get `timeout_s` of wall time in the worker (an alarm there, then a kill from here after a
    short grace); timeouts, errors and crashes score 0.0. `stats` counts checked, timeouts, too_long,
    errors, plus no_answer (nothing to extract) and restarts (worker processes replaced).
    Safe to call from several threads (calls are serialised) and after a fork (the child starts its own
    worker). Raises RuntimeError only if the worker process cannot start at all.
    """

    def __init__(self, marker: str | None = None, timeout_s: float = 2.0, max_chars: int = 20000,
                 startup_timeout_s: float = 60.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"MathAnswerChecker: timeout_s must be > 0, got {timeout_s}")
        if max_chars < 1:
            raise ValueError(f"MathAnswerChecker: max_chars must be >= 1, got {max_chars}")
        self.marker = marker
        self.timeout_s = float(timeout_s)
        self.max_chars = int(max_chars)
        self.startup_timeout_s = float(startup_timeout_s)
        # Grace after the worker's own alarm before the kill: the alarm handles pure-Python hangs
        # without a restart; the kill is for C code the alarm cannot interrupt.
        self.grace_s = min(1.0, 0.2 + 0.25 * self.timeout_s)
        self.stats = {"checked": 0, "timeouts": 0, "too_long": 0, "errors": 0, "no_answer": 0, "restarts": 0}
        self._lock = threading.Lock()
        self._worker: _Worker | None = None

    # -- extraction ------------------------------------------------------------------------------

    def extract(self, response: str) -> str | None:
        """The answer text this checker would compare, or None."""
        if self.marker:
            found = extract_after_marker(response, self.marker)
            if found is not None:
                return found
        return extract_boxed(response)

    # -- checking --------------------------------------------------------------------------------

    def __call__(self, response: str, problem: Any) -> float:
        """1.0 if the response's final answer equals `problem.answer` (math-verify), else 0.0."""
        with self._lock:
            self.stats["checked"] += 1
            if not isinstance(response, str):
                self.stats["errors"] += 1
                return 0.0
            if len(response) > self.max_chars:
                self.stats["too_long"] += 1
                return 0.0
            pred = self.extract(response)
            gold = getattr(problem, "answer", None)
            if pred is None or not pred.strip():
                self.stats["no_answer"] += 1
                return 0.0
            if gold is None or len(str(gold)) > self.max_chars:
                self.stats["errors"] += 1
                return 0.0
            return self._verify(str(gold), pred)

    def _verify(self, gold: str, pred: str) -> float:
        worker = self._ensure_worker()  # a worker that died while idle is replaced here
        try:
            worker.send({"gold": gold, "pred": pred, "budget": self.timeout_s})
            reply = worker.read_line(time.monotonic() + self.timeout_s + self.grace_s)
        except _WorkerDied:
            self.stats["errors"] += 1  # this input crashed the worker (e.g. a C stack overflow)
            self._restart()
            return 0.0
        if reply is None:
            self.stats["timeouts"] += 1  # stuck where the alarm cannot reach: kill it
            self._restart()
            return 0.0
        if reply.get("timeout"):
            self.stats["timeouts"] += 1
            return 0.0
        if "error" in reply:
            self.stats["errors"] += 1
            return 0.0
        return 1.0 if reply.get("ok") else 0.0

    def _ensure_worker(self) -> _Worker:
        worker = self._worker
        if worker is None or worker.pid != os.getpid() or worker.proc.poll() is not None:
            if worker is not None and worker.pid == os.getpid():
                worker.close()
            worker = self._worker = _Worker()
        try:
            worker.wait_ready(self.startup_timeout_s)
        except _WorkerDied:
            worker.close()
            self._worker = None
            raise RuntimeError("math-verify worker exited while starting (is math-verify installed?)") from None
        except RuntimeError:
            worker.close()
            self._worker = None
            raise
        return worker

    def _restart(self) -> None:
        """Kill the current worker and start the next one now, so it imports while the caller goes on."""
        if self._worker is not None:
            self._worker.close()
        self.stats["restarts"] += 1
        self._worker = _Worker()

    def warm_up(self) -> None:
        """Start the worker now (otherwise the first call pays the ~0.5 s start)."""
        with self._lock:
            self._ensure_worker()

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        with self._lock:
            if self._worker is not None and self._worker.pid == os.getpid():
                self._worker.close()
            self._worker = None

    def __enter__(self) -> MathAnswerChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # A process handle and a lock do not pickle; the copy starts its own worker when first called.
        state = self.__dict__.copy()
        state["_worker"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MathAnswerChecker(marker={self.marker!r}, timeout_s={self.timeout_s}, max_chars={self.max_chars})"

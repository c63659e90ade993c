"""The child process of the reward worker pool (`regroup.rewards.pool`), run by file path (`runpy`): one JSON
request per line on stdin, {"id": n, "request": {...}}, one JSON reply per line on a private copy of stdout,
{"id": n, ...the reply}: whatever a library or a reward prints goes to stderr, so it cannot corrupt the replies.
Nothing is pickled either way.

The reply channel belongs to this process: a program the reward runs (fork + exec) does not inherit it (the copy
is close-on-exec), and a process the reward forked that comes back here (it returned or raised instead of calling
`os._exit`) writes no reply: it sends one {"forked_child": pid} line, which the pool counts, and exits at once,
before it could read a request meant for this worker.

`sys.argv[1:]` says what it checks:
- `math`: math-verify. Imports nothing from regroup, so it starts as fast as math-verify imports.
  Request {"gold": str, "pred": str, "budget": seconds}; reply {"ok": bool} | {"timeout": true} | {"error": str}.
- `user pkg.mod:obj`: a user reward, imported by its dotted name (regroup is preloaded by the parent).
  Request {"response": str, "problem": Problem.to_dict()}; reply {"value": number | None} | {"error": str}.
First line, without an id: {"ready": true} once the checker is imported (and, for math, warmed by one check),
or {"fatal": str}.
"""

from __future__ import annotations

import json
import numbers
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, cast


class _CannotStart(Exception):
    """The checker cannot be set up; its message is the whole reason."""


class _Budget(BaseException):
    """Raised by the alarm. A BaseException, so math-verify's `except Exception` blocks let it through."""


def _on_alarm(signum, frame):  # the signal handler signature
    raise _Budget()


def _math_checker() -> Callable[[dict], dict]:
    import logging  # here: a user-reward worker has no use for it

    logging.disable(logging.WARNING)  # math-verify warns once that its own timeout is off: the budget times it
    try:
        from math_verify import parse, verify  # here, so that a failing import is reported, not raised
    except BaseException as exc:  # reported to the parent as the reason the worker cannot start
        raise _CannotStart(f"cannot import math_verify: {exc!r}") from None

    def parsed(text: str, wrap: bool) -> list:
        # Bare answers ("1/2", "x^2+1") parse best inside \boxed{}; text already holding LaTeX delimiters or a
        # box is parsed as it is. Either way fall back to the other form.
        forms = [f"\\boxed{{{text}}}", text] if wrap else [text, f"\\boxed{{{text}}}"]
        for form in forms:
            got = parse(form, parsing_timeout=None)
            if got:
                return got
        return []

    try:
        # The first parse/verify pays for lazy imports and grammar set-up (~0.5 s, more on a loaded machine).
        # Pay it here, before "ready", so no timed check ever does.
        verify(parsed("1", wrap=True), parsed("1", wrap=True), timeout_seconds=None)
    except BaseException as exc:
        raise _CannotStart(f"math_verify does not work: {exc!r}") from None
    signal.signal(signal.SIGALRM, _on_alarm)

    def check(request: dict) -> dict:
        gold_text, pred_text = request["gold"], request["pred"]
        try:  # outside the finally: an alarm that fires while it resets the timer is still a timeout
            signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request.get("budget", 2.0))))
            try:
                gold = parsed(gold_text, wrap="\\boxed" not in gold_text and "$" not in gold_text)
                pred = parsed(pred_text, wrap=True)
                return {"ok": bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Budget:
            return {"timeout": True}

    return check


def _plain(value: Any) -> Any:
    """numpy / torch scalars become floats; an int beyond float range the largest float (the reward stage
    counts it out of range, never an OverflowError)."""
    if value is None or isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        return value
    try:
        return float(value)
    except OverflowError:
        return sys.float_info.max if cast(float, value) > 0 else -sys.float_info.max


def _user_reward(name: str) -> Callable[[dict], dict]:
    from regroup.config.registry import load_dotted  # here: a math worker never imports regroup
    from regroup.tasks.base import Problem  # here: a math worker never imports regroup

    fn = load_dotted(name)
    if not callable(fn):
        raise TypeError(f"{name} is a {type(fn).__name__}, not callable")
    return lambda request: {"value": _plain(fn(request["response"], Problem.from_dict(request["problem"])))}


def _not_json(value: Any) -> Any:  # anything else a reward returns is its error, not ours
    raise TypeError(f"returned a {type(value).__name__}, not a number")


def main() -> None:
    owner = os.getpid()
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")  # os.dup: close-on-exec
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(reply: dict) -> None:
        if os.getpid() != owner:  # a forked child of the reward came back here: it must not speak for the worker
            channel.write(json.dumps({"forked_child": os.getpid()}) + "\n")
            os._exit(1)
        try:
            line = json.dumps(reply, default=_not_json)
        except (TypeError, ValueError) as exc:
            line = json.dumps({"id": reply.get("id"), "error": str(exc)[:300]})
        channel.write(line + "\n")

    try:
        check = _math_checker() if sys.argv[1] == "math" else _user_reward(sys.argv[2])
    except BaseException as exc:  # the parent turns it into one clear error
        message = str(exc) if isinstance(exc, _CannotStart) else f"{type(exc).__name__}: {exc}"
        send({"fatal": message})
        return
    send({"ready": True})
    for line in sys.stdin.buffer:
        message = json.loads(line)
        try:
            reply = check(message["request"])
        except KeyboardInterrupt:
            return
        except BaseException as exc:  # RecursionError, MemoryError, the reward's own errors: that call's error
            reply = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        send({"id": message["id"], **reply})


if __name__ == "__main__":
    main()

"""The child process behind `MathAnswerChecker`: reads one JSON request per line on stdin, answers one
JSON line on the protocol channel. Run by file path (runpy), so it imports nothing from regroup and
starts as fast as math-verify imports.

Request: {"gold": str, "pred": str, "budget": float seconds}.
Reply: {"ok": bool} | {"timeout": true} | {"error": str}; first line {"ready": true} (sent after one
untimed warm-up check) or {"fatal": str}.
"""

from __future__ import annotations

import json
import os
import signal
import sys


class _Budget(BaseException):
    """Raised by the alarm. A BaseException, so math-verify's `except Exception` blocks let it through."""


def _on_alarm(signum, frame):  # the signal handler signature
    raise _Budget()


def _parse(parse, text: str, wrap: bool) -> list:
    # Bare answers ("1/2", "x^2+1") parse best inside \boxed{}; text already holding LaTeX delimiters or a
    # box is parsed as it is. Either way fall back to the other form.
    forms = [f"\\boxed{{{text}}}", text] if wrap else [text, f"\\boxed{{{text}}}"]
    for form in forms:
        got = parse(form, parsing_timeout=None)
        if got:
            return got
    return []


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever a library prints must not corrupt the protocol
    sys.stdout = sys.stderr
    try:
        import logging  # with the math_verify import it guards: the worker reports any failure

        logging.disable(logging.WARNING)  # math-verify warns once that its own timeout is off: we time it here
        from math_verify import parse, verify  # in the worker, so a failing import is reported, not raised
    except BaseException as exc:  # report anything: the parent turns it into a clear error
        channel.write(json.dumps({"fatal": f"cannot import math_verify: {exc!r}"}) + "\n")
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        # The first parse/verify pays for lazy imports and grammar set-up (~0.5 s, more on a loaded
        # machine). Pay it here, before "ready", so no timed check ever does.
        verify(_parse(parse, "1", wrap=True), _parse(parse, "1", wrap=True), timeout_seconds=None)
    except BaseException as exc:  # anything the check raised is reported to the parent
        channel.write(json.dumps({"fatal": f"math_verify does not work: {exc!r}"}) + "\n")
        return
    channel.write(json.dumps({"ready": True}) + "\n")
    reply: dict[str, object]
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold_text, pred_text = request["gold"], request["pred"]
            signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request.get("budget", 2.0))))
            try:
                gold = _parse(parse, gold_text, wrap="\\boxed" not in gold_text and "$" not in gold_text)
                pred = _parse(parse, pred_text, wrap=True)
                ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = {"ok": ok}
        except _Budget:
            reply = {"timeout": True}
        except KeyboardInterrupt:
            return
        except BaseException as exc:  # RecursionError, MemoryError, sympy errors: all mean "no score"
            reply = {"error": repr(exc)[:300]}
        channel.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()

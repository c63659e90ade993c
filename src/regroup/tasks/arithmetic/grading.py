"""Answer extraction, the binary grader, and the deterministic step scorer of the arithmetic task."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

ANSWER_MARKER = "####"

_INT = re.compile(r"[-\u2212]?\d+")
# "a op b = c" as the reference writes it ("7+5=12"), with spaces and a few other operator glyphs allowed.
_STEP = re.compile(r"([-\u2212]?\d{1,12})\s*([-+*/x\u00d7\u2212])\s*(\d{1,12})\s*=\s*([-\u2212]?\d{1,12})")
_MAX_DIGITS = 30  # longer "integers" are junk; int() of thousands of digits is slow (and capped in 3.11+)
_MAX_STEPS = 64  # scoring looks at this many steps at most, so junk cannot make it slow

# DaGRPO step-score weights (SPEC §2a step 1): correctness dominates, reasoning splits the rest.
W_CORRECT, W_VALID, W_COMPLETE = 0.5, 0.25, 0.25


def format_answer(value: object) -> str:
    """The final line a response should end with, e.g. "#### 9"."""
    return f"{ANSWER_MARKER} {value}"


def _to_int(token: str) -> int | None:
    token = token.replace("\u2212", "-")
    if len(token.lstrip("-")) > _MAX_DIGITS:
        return None
    return int(token)


def extract_answer(response: str) -> str | None:
    """The first integer after the LAST "####" in `response` (as text, e.g. "-3"), or None if absent."""
    if not isinstance(response, str):
        return None
    at = response.rfind(ANSWER_MARKER)
    if at < 0:
        return None
    match = _INT.search(response, at + len(ANSWER_MARKER))
    if match is None:
        return None
    value = _to_int(match.group())
    return None if value is None else str(value)


def _answer_int(problem: Any) -> int | None:
    try:
        return _to_int(str(problem.answer).strip())
    except (ValueError, AttributeError):
        return None


def grade(response: str, problem: Any) -> float:
    """1.0 if the extracted final answer equals `problem.answer` as an integer, else 0.0 (never raises)."""
    got, want = extract_answer(response), _answer_int(problem)
    return 1.0 if got is not None and want is not None and int(got) == want else 0.0


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op in "-\u2212":
        return a - b
    if op in "*x\u00d7":
        return a * b
    return a // b if b != 0 and a % b == 0 else None  # "/" only counts when exact


def _steps(text: str) -> list[tuple[int, str, int, int]]:
    """(a, op, b, c) for each "a op b = c" written in `text` (the first _MAX_STEPS)."""
    out = []
    for m in _STEP.finditer(text):
        a, b, c = _to_int(m.group(1)), _to_int(m.group(3)), _to_int(m.group(4))
        if a is None or b is None or c is None:
            continue
        op = "-" if m.group(2) == "\u2212" else m.group(2)
        out.append((a, op, b, c))
        if len(out) >= _MAX_STEPS:
            break
    return out


def _reference(problem: Any) -> tuple[int, list[tuple[str, int]]] | None:
    """(start, [(op, operand), ...]) of the reference chain: from meta, else from the written solution."""
    meta = getattr(problem, "meta", None) or {}
    try:
        return int(meta["start"]), [(str(op), int(x)) for op, x in meta["ops"]]
    except (KeyError, TypeError, ValueError):
        pass
    steps = _steps(getattr(problem, "solution", None) or "")
    if not steps:
        return None
    return steps[0][0], [(op, b) for _, op, b, _ in steps]


def step_score(response: str, problem: Any) -> float:
    """A deterministic 1-10 score of an arithmetic response (DaGRPO's fine-grained scorer, SPEC §2a step 1).

        score = 1 + 9 * (0.5 * correct + 0.25 * valid + 0.25 * complete)

    - correct: 1 if the final answer (after the last "####") equals the problem's answer, else 0.
    - valid: the fraction of written "a op b = c" steps that are right (a op b really is c) and chained
      (each step starts from the previous step's result); 0 when no step is written.
    - complete: the fraction of the reference's facts the response states, the facts being its start
      amount (as the first step's `a`) and each of its (op, operand) steps, counted only from valid
      steps and matched as a multiset. Order is not required, because + and - steps commute and a
      reordered (TA-GRPO) variant is solved in another order with the same facts.

    The reference is `problem.meta` (start, ops) for generated problems, else the steps written in
    `problem.solution`; without either, complete = 1 if the last valid step's result is the answer.
    The reference solution scores 10.0, text with no steps and no answer 1.0. Never raises on junk.
    """
    text = response if isinstance(response, str) else ""
    correct = grade(text, problem)
    steps = _steps(text)
    ok = []
    for i, (a, op, b, c) in enumerate(steps):
        chained = i == 0 or a == steps[i - 1][3]
        ok.append(chained and _apply(a, op, b) == c)
    valid = sum(ok) / len(steps) if steps else 0.0

    ref = _reference(problem)
    if ref is None:
        want = _answer_int(problem)
        good = [c for (_, _, _, c), fine in zip(steps, ok) if fine]
        complete = 1.0 if good and want is not None and good[-1] == want else 0.0
    else:
        start, ops = ref
        facts = int(bool(steps) and steps[0][0] == start)
        have = Counter((op, b) for (_, op, b, _), fine in zip(steps, ok) if fine)
        facts += sum((Counter(ops) & have).values())
        complete = facts / (1 + len(ops))
    return 1.0 + 9.0 * (W_CORRECT * correct + W_VALID * valid + W_COMPLETE * complete)

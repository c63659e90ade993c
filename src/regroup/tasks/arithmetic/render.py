"""How an arithmetic problem is written: a `Surface` (the problem's structure plus every wording choice)
and `render`, which turns it into question text. Generation and every transformation edit a Surface and
render it, so transformations compose and can never change the arithmetic by accident."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Templates and verbs. Index 0 / the first two verbs per op are the canonical forms the generator
# writes; the rest exist for `reword`, so a rephrasing can use wording the model has not seen.
START_TEMPLATES = ("{name} has {n} {obj}.", "{name} starts with {n} {obj}.", "At first, {name} has {n} {obj}.")
STEP_VERBS: dict[str, tuple[str, ...]] = {
    "+": ("finds {n} more", "buys {n} more", "gets {n} more", "is given {n} more"),
    "-": ("gives away {n}", "loses {n}", "sells {n}", "uses {n}"),
}
CANONICAL_VERBS = 2  # the generator draws verbs among the first CANONICAL_VERBS of each op
QUESTION_LAST = (
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have at the end?",
    "How many {obj} does {name} end up with?",
)
QUESTION_FIRST = ("How many {obj} will {name} have in the end?", "How many {obj} does {name} end up with?")


@dataclass(frozen=True)
class Surface:
    """A problem's structure (start, steps) and how it is worded."""

    name: str
    pronoun: str
    obj: str
    start: int
    steps: tuple[tuple[str, int, int], ...]
    """(op, operand, verb index into STEP_VERBS[op]) per step, in text order."""
    start_template: int = 0
    question_template: int = 0
    """Index into QUESTION_FIRST when question_first, else into QUESTION_LAST."""
    question_first: bool = False
    name_as_subject: bool = False
    """Steps say "Mia finds ..." instead of "She finds ..."."""
    bullets: bool = False
    """Steps as a "- " list, one per line."""


def render(s: Surface) -> str:
    """The question text a Surface describes."""
    fill = {"name": s.name, "obj": s.obj}
    start = START_TEMPLATES[s.start_template].format(n=s.start, **fill)
    subject = s.name if s.name_as_subject else s.pronoun
    steps = [f"{subject} {STEP_VERBS[op][verb].format(n=operand)}." for op, operand, verb in s.steps]
    templates = QUESTION_FIRST if s.question_first else QUESTION_LAST
    question = templates[s.question_template].format(**fill)
    if s.bullets:
        body = "\n".join([start] + [f"- {step}" for step in steps])
        return f"{question}\n{body}" if s.question_first else f"{body}\n{question}"
    parts = [start, *steps]
    return " ".join([question, *parts] if s.question_first else [*parts, question])


def values_of(start: int, ops: list[tuple[str, int]] | tuple[tuple[str, int, int], ...]) -> list[int]:
    """The running value after each step: the intermediate values of the chain, the last being the answer."""
    out, value = [], start
    for step in ops:
        op, operand = step[0], step[1]
        value = value + operand if op == "+" else value - operand
        out.append(value)
    return out


def solution_text(start: int, ops: list[tuple[str, int]], marker: str) -> str:
    """The fixed-format reference solution, e.g. "7+5=12. 12-3=9. #### 9"."""
    parts, value = [], start
    for op, operand in ops:
        new = value + operand if op == "+" else value - operand
        parts.append(f"{value}{op}{operand}={new}.")
        value = new
    return " ".join(parts + [f"{marker} {value}"])


def surface_from_meta(meta: dict[str, Any], problem_id: str = "?") -> Surface:
    """The canonical Surface stored in a generated problem's meta (JSON round-tripped or not)."""
    try:
        ops = [(str(op), int(n)) for op, n in meta["ops"]]
        verbs = [int(v) for v in meta.get("verbs", [0] * len(ops))]
        return Surface(
            name=str(meta["name"]),
            pronoun=str(meta["pronoun"]),
            obj=str(meta["object"]),
            start=int(meta["start"]),
            steps=tuple((op, n, v) for (op, n), v in zip(ops, verbs, strict=True)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"problem {problem_id!r} has no arithmetic structure in meta (need name, pronoun, object, start, ops): "
            f"{exc!r}"
        ) from None

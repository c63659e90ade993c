"""Problem-equivalent transformations of arithmetic questions (TA-GRPO's q1..qN, SPEC §3.1).

Each transformation edits the problem's `Surface` (structure + wording) and never the arithmetic, so
the answer is kept by construction; `solve_question` checks that independently in the tests.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace

from regroup.tasks.arithmetic.config import ArithmeticConfig
from regroup.tasks.arithmetic.render import (
    QUESTION_FIRST,
    QUESTION_LAST,
    START_TEMPLATES,
    STEP_VERBS,
    Surface,
    render,
    surface_from_meta,
    values_of,
)
from regroup.tasks.base import Problem

SurfaceEdit = Callable[[Surface, random.Random, tuple[int, int]], Surface]
Transform = Callable[[Problem, random.Random], str]

_DEFAULTS = ArithmeticConfig()
_MAX_PERMUTATIONS = 24  # 4 steps have 24 orders; longer chains are sampled


def _rename(s: Surface, rng: random.Random, _limits: tuple[int, int]) -> Surface:
    """Another person (always) and, half the time, another object."""
    name, pronoun = rng.choice([np for np in _DEFAULTS.names if np[0] != s.name])
    obj = s.obj
    if rng.random() < 0.5:
        obj = rng.choice([o for o in _DEFAULTS.objects if o != s.obj])
    return replace(s, name=name, pronoun=pronoun, obj=obj)


def _step_orders(s: Surface, limits: tuple[int, int]) -> list[tuple[tuple[str, int, int], ...]]:
    """Other orders of the steps that read differently and keep every running value in [lo, hi]."""
    lo, hi = limits
    seen = {tuple((op, x) for op, x, _ in s.steps)}
    out = []
    perms = itertools.permutations(s.steps)
    for order in itertools.islice(perms, _MAX_PERMUTATIONS):
        key = tuple((op, x) for op, x, _ in order)
        if key in seen:
            continue
        seen.add(key)
        if all(lo <= v <= hi for v in values_of(s.start, order)):
            out.append(order)
    return out


def _reorder(s: Surface, rng: random.Random, limits: tuple[int, int]) -> Surface:
    """Change the order of information: the steps in another valid order, or the question first (or both)."""
    orders = _step_orders(s, limits)
    choice = rng.choice(["steps", "question", "both"]) if orders else "question"
    if choice in ("steps", "both"):
        s = replace(s, steps=rng.choice(orders))
    if choice in ("question", "both"):
        # Moving the question flips between the two template lists; keep the index valid.
        s = replace(
            s,
            question_first=not s.question_first,
            question_template=rng.randrange(len(QUESTION_LAST if s.question_first else QUESTION_FIRST)),
        )
    return s


def _reword(s: Surface, rng: random.Random, _limits: tuple[int, int]) -> Surface:
    """Other verbs, sentence templates or format (a bullet list); at least one of them changes."""
    edits = ["verbs", "start", "question", "subject", "bullets"]
    chosen = [e for e in edits if rng.random() < 0.4] or [rng.choice(edits)]
    if "verbs" in chosen and s.steps:
        steps = []
        for op, x, verb in s.steps:
            if rng.random() < 0.6:
                verb = rng.choice([v for v in range(len(STEP_VERBS[op])) if v != verb])
            steps.append((op, x, verb))
        if steps == list(s.steps):  # make sure the edit happens
            op, x, verb = steps[0]
            steps[0] = (op, x, (verb + 1) % len(STEP_VERBS[op]))
        s = replace(s, steps=tuple(steps))
    if "start" in chosen:
        s = replace(s, start_template=rng.choice([t for t in range(len(START_TEMPLATES)) if t != s.start_template]))
    if "question" in chosen:
        templates = QUESTION_FIRST if s.question_first else QUESTION_LAST
        s = replace(s, question_template=rng.choice([t for t in range(len(templates)) if t != s.question_template]))
    if "subject" in chosen:
        s = replace(s, name_as_subject=not s.name_as_subject)
    if "bullets" in chosen:
        s = replace(s, bullets=not s.bullets)
    return s


SURFACE_EDITS: dict[str, SurfaceEdit] = {"rename": _rename, "reorder": _reorder, "reword": _reword}


def _limits(problem: Problem) -> tuple[int, int]:
    meta = problem.meta or {}
    return int(meta.get("min_value", _DEFAULTS.min_value)), int(meta.get("max_value", _DEFAULTS.max_value))


def apply_transforms(problem: Problem, names: list[str] | tuple[str, ...], rng: random.Random) -> str:
    """`problem.question` rewritten by the named transformations in order (answer unchanged).

    Needs the structure a generated problem keeps in `meta`; raises ValueError for an unknown name or
    a problem without it.
    """
    unknown = [n for n in names if n not in SURFACE_EDITS]
    if unknown:
        raise ValueError(f"unknown arithmetic transformation(s) {unknown}; known: {sorted(SURFACE_EDITS)}")
    surface, limits = surface_from_meta(problem.meta, problem.id), _limits(problem)
    for name in names:
        surface = SURFACE_EDITS[name](surface, rng, limits)
    return render(surface)


def rename(problem: Problem, rng: random.Random) -> str:
    """The question with another person's name (and pronoun) and possibly another object."""
    return apply_transforms(problem, ["rename"], rng)


def reorder(problem: Problem, rng: random.Random) -> str:
    """The question with its information in another order: steps reordered (values stay in range) or
    the question sentence first."""
    return apply_transforms(problem, ["reorder"], rng)


def reword(problem: Problem, rng: random.Random) -> str:
    """The question with other verbs, sentence templates or a bullet-list format."""
    return apply_transforms(problem, ["reword"], rng)


TRANSFORMS: dict[str, Transform] = {"rename": rename, "reorder": reorder, "reword": reword}


def rephrase(problem: Problem, n: int, rng: random.Random) -> list[str]:
    """`n` distinct rephrasings of `problem.question`, none equal to it, each keeping the answer.

    Tries every single transformation first (in a random order), then random combinations of two or
    three. Returns fewer than `n` only if the problem has fewer distinct forms within the attempt limit.
    """
    if n < 0:
        raise ValueError(f"rephrase: n must be >= 0, got {n}")
    names = list(SURFACE_EDITS)
    seen = {problem.question}
    out: list[str] = []
    plans = [[name] for name in rng.sample(names, len(names))]
    attempts = 0
    while len(out) < n and attempts < 20 * n + 20:
        plan = plans[attempts] if attempts < len(plans) else rng.sample(names, rng.choice([2, 3]))
        attempts += 1
        text = apply_transforms(problem, plan, rng)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out

"""Seeded generation of arithmetic word problems."""

from __future__ import annotations

import random

from regroup.tasks.arithmetic.config import ArithmeticConfig
from regroup.tasks.arithmetic.grading import ANSWER_MARKER
from regroup.tasks.arithmetic.render import CANONICAL_VERBS, Surface, render, solution_text, values_of
from regroup.tasks.base import Problem

# Rejection sampling gives up after this many draws for one problem: only an (almost) infeasible
# config gets there, and an endless loop would be worse than a clear error.
_MAX_TRIES = 10_000


def _in_range(values: list[int], cfg: ArithmeticConfig) -> bool:
    if any(v < cfg.min_value or v > cfg.max_value for v in values):
        return False
    return cfg.allow_zero_answer or values[-1] != 0


def _draw_chain(rng: random.Random, k: int, cfg: ArithmeticConfig) -> tuple[int, list[tuple[str, int]]]:
    """A start and k uniform (op, operand) steps whose every value stays in range.

    The whole chain is redrawn when any value leaves the range (rather than forcing the next op), so
    ops and operands stay uniform given feasibility and no value becomes a shortcut answer.
    """
    for _ in range(_MAX_TRIES):
        start = rng.randint(cfg.min_value, cfg.max_value)
        ops = [(rng.choice(cfg.operations), rng.randint(cfg.min_operand, cfg.max_operand)) for _ in range(k)]
        if _in_range([start, *values_of(start, ops)], cfg):
            return start, ops
    raise ValueError(
        f"ArithmeticConfig allows (almost) no {k}-step problem: values "
        f"{cfg.min_value}..{cfg.max_value}, operands {cfg.min_operand}..{cfg.max_operand}, "
        f"operations {cfg.operations}"
    )


def generate(n: int, seed: int, config: ArithmeticConfig | None = None) -> list[Problem]:
    """`n` problems drawn with `random.Random(seed)`: the same (n, seed, config) gives the same problems.

    Each has id `arith-<seed>-<i>`, a question like "Mia has 7 shells. She finds 5 more. She gives
    away 3. How many shells does Mia have now?", the solution "7+5=12. 12-3=9. #### 9", difficulty
    "steps=<k>", and its structure in `meta` (name, pronoun, object, start, ops, verbs, values).
    """
    if n < 0:
        raise ValueError(f"generate: n must be >= 0, got {n}")
    cfg = config if config is not None else ArithmeticConfig()
    rng = random.Random(seed)
    counts = sorted(cfg.step_probs)
    weights = [cfg.step_probs[k] for k in counts]
    problems = []
    for i in range(n):
        k = rng.choices(counts, weights)[0]
        start, ops = _draw_chain(rng, k, cfg)
        name, pronoun = rng.choice(cfg.names)
        obj = rng.choice(cfg.objects)
        verbs = [rng.randrange(CANONICAL_VERBS) for _ in ops]
        surface = Surface(name, pronoun, obj, start, tuple((op, x, v) for (op, x), v in zip(ops, verbs)))
        values = values_of(start, ops)
        problems.append(
            Problem(
                id=f"arith-{seed}-{i}",
                question=render(surface),
                answer=str(values[-1]),
                solution=solution_text(start, ops, ANSWER_MARKER),
                difficulty=f"steps={k}",
                meta={
                    "name": name,
                    "pronoun": pronoun,
                    "object": obj,
                    "start": start,
                    "ops": [[op, x] for op, x in ops],
                    "verbs": verbs,
                    "values": values,
                    "min_value": cfg.min_value,
                    "max_value": cfg.max_value,
                },
            )
        )
    return problems

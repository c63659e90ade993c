"""The built-in task: short multi-step arithmetic word problems a ~1M-parameter model learns in minutes.

`generate` makes seeded problems, `grade` is the binary reward, `step_score` the cheap DaGRPO scorer,
`TRANSFORMS` / `rephrase` the TA-GRPO rephrasings, and `ArithmeticTask` bundles them for the trainer.
"""

from __future__ import annotations

from regroup.config.registry import TASKS
from regroup.tasks.arithmetic.config import ArithmeticConfig
from regroup.tasks.arithmetic.generator import generate
from regroup.tasks.arithmetic.grading import ANSWER_MARKER, extract_answer, format_answer, grade, step_score
from regroup.tasks.arithmetic.solver import solve_question
from regroup.tasks.arithmetic.transforms import TRANSFORMS, apply_transforms, rename, reorder, rephrase, reword
from regroup.tasks.base import Problem

__all__ = [
    "ANSWER_MARKER",
    "ArithmeticConfig",
    "ArithmeticTask",
    "TRANSFORMS",
    "apply_transforms",
    "extract_answer",
    "format_answer",
    "generate",
    "grade",
    "rename",
    "rephrase",
    "reorder",
    "reword",
    "solve_question",
    "step_score",
]


class ArithmeticTask:
    """The arithmetic task as the trainer uses it (name, generator, grader, step scorer, rephraser)."""

    name = "arithmetic"
    answer_marker = ANSWER_MARKER
    transforms = TRANSFORMS

    def __init__(self, config: ArithmeticConfig | dict | None = None) -> None:
        self.config = ArithmeticConfig(**config) if isinstance(config, dict) else (config or ArithmeticConfig())

    def generate(self, n: int, seed: int, config: ArithmeticConfig | None = None) -> list[Problem]:
        """`n` reproducible problems for `seed` (with this task's config unless another is given)."""
        return generate(n, seed, config if config is not None else self.config)

    # The grading functions themselves (a method that only forwarded to them would be a call per sample).
    grade = staticmethod(grade)
    """1.0 if the final answer after the last "####" is right, else 0.0 (`grading.grade`)."""
    step_score = staticmethod(step_score)
    """The deterministic 1-10 step score (`grading.step_score`)."""
    rephrase = staticmethod(rephrase)
    """`n` distinct answer-preserving rephrasings of the question (`transforms.rephrase`)."""
    extract_answer = staticmethod(extract_answer)
    """The final answer a response gives, or None (`grading.extract_answer`)."""
    format_answer = staticmethod(format_answer)
    """The answer line a response should end with (`grading.format_answer`)."""

    def __repr__(self) -> str:
        return f"ArithmeticTask({self.config!r})"


TASKS.register(ArithmeticTask.name, ArithmeticTask)

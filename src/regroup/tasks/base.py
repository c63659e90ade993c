"""The problem record every task and data loader produces, and the interface a task offers the trainer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One question with its verifiable answer (and optionally a reference solution and rephrasings)."""

    id: str
    """Unique question id."""
    question: str
    """The question text q0 as shown to the policy."""
    answer: str
    """Canonical final answer as text."""
    solution: str | None = None
    """Reference chain of thought ending with the task's answer marker (DaGRPO anchors, SFT)."""
    variants: tuple[str, ...] = ()
    """Precomputed problem-equivalent rephrasings of `question` (TA-GRPO q1..qN)."""
    difficulty: str | None = None
    """A label such as "steps=3", used to report accuracy by difficulty."""
    meta: dict = field(default_factory=dict, compare=False)
    """Task-specific structure (JSON-serialisable); not part of equality."""

    def to_dict(self) -> dict[str, Any]:
        """The problem as a JSON-serialisable dict (variants as a list)."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "solution": self.solution,
            "variants": list(self.variants),
            "difficulty": self.difficulty,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Problem:
        """The Problem a `to_dict` output (or any mapping with id/question/answer) describes.

        Raises ValueError naming the key when a required key is missing or a value has the wrong type.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"Problem.from_dict needs a mapping, got {type(d).__name__}")
        for key in ("id", "question", "answer"):
            if d.get(key) is None:
                raise ValueError(f"Problem.from_dict: missing key {key!r}")
        if not isinstance(d["question"], str):
            raise ValueError(f"Problem.from_dict: 'question' must be a string, got {type(d['question']).__name__}")
        variants = d.get("variants") or ()
        if isinstance(variants, str) or not all(isinstance(v, str) for v in variants):
            raise ValueError("Problem.from_dict: 'variants' must be a list of strings")
        meta = d.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise ValueError(f"Problem.from_dict: 'meta' must be an object, got {type(meta).__name__}")
        difficulty = d.get("difficulty")
        solution = d.get("solution")
        return cls(
            id=str(d["id"]),
            question=d["question"],
            answer=str(d["answer"]),
            solution=None if solution is None else str(solution),
            variants=tuple(variants),
            difficulty=None if difficulty is None else str(difficulty),
            meta=dict(meta),
        )


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task: a name and a grader.

    The rest is optional, looked up where a recipe needs it (the built-in arithmetic task has all of it):
    `generate(n, seed) -> list[Problem]` (training questions without `data.train_file`; the warm-up),
    `step_score(response, problem) -> float` in [1, 10] (the step scorer), `rephrase(problem, n, rng)
    -> list[str]` (the rule rephraser), `extract_answer(response)` (the reward's no-answer counts).
    """

    name: str

    def grade(self, response: str, problem: Problem) -> float:
        """1.0 if `response` answers `problem` correctly, else 0.0."""
        ...

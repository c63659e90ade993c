"""Settings of the built-in multi-step arithmetic task."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

SUPPORTED_OPERATIONS = ("+", "-")

_DEFAULT_NAMES: tuple[tuple[str, str], ...] = (
    ("Mia", "She"),
    ("Tom", "He"),
    ("Ana", "She"),
    ("Ben", "He"),
    ("Zoe", "She"),
    ("Sam", "He"),
    ("Lily", "She"),
    ("Max", "He"),
    ("Ella", "She"),
    ("Leo", "He"),
    ("Ava", "She"),
    ("Jack", "He"),
)
_DEFAULT_OBJECTS: tuple[str, ...] = (
    "shells",
    "apples",
    "coins",
    "stamps",
    "marbles",
    "books",
    "pens",
    "cards",
    "stickers",
    "eggs",
)
_WORD = re.compile(r"^[A-Za-z]+$")


@dataclass
class ArithmeticConfig:
    """What the generated word problems look like.

    The defaults are the setting the tiny model learns in minutes (measured before regroup was written):
    its warm-up reached held-out pass@1 0.47 with 84 % of groups mixed, where numbers up to 99 with ×2/×3
    steps gave 0.02–0.11 and 63–86 % of groups all wrong.
    """

    min_value: int = 1
    """Smallest allowed start amount, intermediate value and answer."""
    max_value: int = 20
    """Largest allowed start amount, intermediate value and answer."""
    min_operand: int = 1
    """Smallest amount added or removed in one step (>= 1: "finds 0 more" is not a step)."""
    max_operand: int = 9
    """Largest amount added or removed in one step."""
    operations: tuple[str, ...] = SUPPORTED_OPERATIONS
    """Step operations to draw from, uniformly; a subset of ("+", "-")."""
    step_probs: Mapping[int, float] = field(default_factory=lambda: {1: 0.3, 2: 0.3, 3: 0.3, 4: 0.1})
    """Probability of each number of steps (normalised; keys >= 1)."""
    allow_zero_answer: bool = False
    """Whether a final answer of 0 may occur (only matters when min_value <= 0): x - x answers bias a model."""
    names: tuple[tuple[str, str], ...] = _DEFAULT_NAMES
    """(name, subject pronoun) pairs for the person in the problem; at least two, so renaming can change it."""
    objects: tuple[str, ...] = _DEFAULT_OBJECTS
    """Plural nouns for the counted objects; at least two, so renaming can change them."""

    def __post_init__(self) -> None:
        # YAML gives lists and string keys: normalise before checking.
        self.operations = tuple(self.operations)
        self.names = tuple((str(n), str(p)) for n, p in self.names)
        self.objects = tuple(str(o) for o in self.objects)
        try:
            self.step_probs = {int(k): float(v) for k, v in dict(self.step_probs).items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ArithmeticConfig.step_probs must map step counts to probabilities: {exc}") from None
        if self.min_value > self.max_value:
            raise ValueError(f"ArithmeticConfig: min_value {self.min_value} > max_value {self.max_value}")
        if self.min_operand < 1 or self.min_operand > self.max_operand:
            raise ValueError(
                f"ArithmeticConfig: need 1 <= min_operand <= max_operand, got {self.min_operand}..{self.max_operand}"
            )
        bad_ops = [op for op in self.operations if op not in SUPPORTED_OPERATIONS]
        if bad_ops or not self.operations:
            raise ValueError(
                f"ArithmeticConfig.operations must be a non-empty subset of {SUPPORTED_OPERATIONS}, "
                f"got {self.operations}"
            )
        probs = self.step_probs
        if (
            not probs
            or any(k < 1 for k in probs)
            or any(not math.isfinite(v) or v < 0 for v in probs.values())
            or sum(probs.values()) <= 0
        ):
            raise ValueError(
                f"ArithmeticConfig.step_probs needs keys >= 1 and non-negative weights with a positive sum, got {probs}"
            )
        if len(set(self.names)) < 2 or any(not _WORD.match(n) or not _WORD.match(p) for n, p in self.names):
            raise ValueError("ArithmeticConfig.names needs at least two distinct (Name, Pronoun) pairs of letters")
        if len(set(self.objects)) < 2 or any(not _WORD.match(o) for o in self.objects):
            raise ValueError("ArithmeticConfig.objects needs at least two distinct plural nouns of letters")
        if not self.allow_zero_answer and self.min_value <= 0 <= self.max_value and self.min_value == self.max_value:
            raise ValueError("ArithmeticConfig: the value range is {0} but allow_zero_answer is False")

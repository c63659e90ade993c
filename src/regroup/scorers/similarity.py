"""A cheap reference-similarity scorer: no model, no network (SPEC §2a "cheaper scorers must exist").

score = 1 + 9 · (w · answer_agreement + (1 − w) · token_F1(response, reference))

* `token_F1` is the SQuAD-style F1 of the multisets of tokens (lower-cased words, numbers and the
  operators + - * / = ^ × ÷) of the response and of the reference solution;
* `answer_agreement` is 1 when the response's final answer equals the expected answer (the problem's
  `answer`, else the reference's own final answer), else 0. The final answer is the last `\\boxed{…}`,
  else what follows the last "answer is" / "answer:" / "####", else the last number;
* `w` = `answer_weight` (default 0.5).

With no reference text the score is `1 + 9 · agreement`; with neither a reference nor an expected
answer the item cannot be scored (None).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from regroup.scorers.base import ScoreItem, Scorer, check_score

_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+|[+\-*/=^×÷]")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_ANSWER_MARK = re.compile(r"(?:answer\s*(?:is|:)|####)\s*(.+)", re.IGNORECASE)


def tokens(text: str) -> list[str]:
    """Lower-cased word, number and operator tokens of `text`."""
    return _TOKEN.findall(text.lower())


def token_f1(response: str, reference: str) -> float:
    """F1 between the token multisets of `response` and `reference` (0 when either has no token)."""
    a, b = Counter(tokens(response)), Counter(tokens(reference))
    common = sum((a & b).values())
    if common == 0:
        return 0.0
    precision = common / sum(a.values())
    recall = common / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: no usable answer


def extract_final_answer(text: str) -> str | None:
    """The final answer written in `text` (see the module docstring for the rule), or None."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    marks = _ANSWER_MARK.findall(text)
    if marks:
        tail = marks[-1].strip()
        num = _NUMBER.search(tail)
        return num.group(0) if num else tail.rstrip(" .")
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def normalise_answer(ans: str) -> str:
    """Canonical text of an answer: no $ or spaces or thousands commas or trailing dot; numbers as
    their shortest decimal form (`7.0` → `7`)."""
    s = ans.strip().strip("$").replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+(?:,\d{3})*(?:\.\d+)?", s):
        s = s.replace(",", "")
        f = float(s)
        return str(int(f)) if f.is_integer() else repr(f)
    return s.lower()


def answers_agree(response: str, expected: str) -> bool:
    """Whether the final answer of `response` equals `expected` after normalisation."""
    got = extract_final_answer(response)
    return got is not None and normalise_answer(got) == normalise_answer(expected)


class SimilarityScorer(Scorer):
    """Reference-similarity score in [1, 10]; `grade_fn(response, problem) -> [0, 1]` (e.g. a task's
    grader) replaces the built-in answer extraction when the item carries a problem."""

    name = "similarity"

    def __init__(self, answer_weight: float = 0.5, grade_fn: Callable[[str, Any], float] | None = None) -> None:
        super().__init__()
        if not 0.0 <= answer_weight <= 1.0:
            raise ValueError(f"answer_weight must be in [0, 1], got {answer_weight}")
        self.answer_weight = answer_weight
        self.grade_fn = grade_fn

    def _agreement(self, item: ScoreItem, reference: str | None) -> float | None:
        if self.grade_fn is not None and item.problem is not None:
            g = float(self.grade_fn(item.response, item.problem))
            if not 0.0 <= g <= 1.0:
                raise ValueError(f"grade_fn must return a value in [0, 1], got {g}")
            return g
        expected = getattr(item.problem, "answer", None) if item.problem is not None else None
        if expected is None and reference is not None:
            expected = extract_final_answer(reference)
        if expected is None:
            return None
        return 1.0 if answers_agree(item.response, str(expected)) else 0.0

    def score_item(self, item: ScoreItem) -> float | None:
        """The similarity score of one item (formula in the module docstring)."""
        reference = item.reference_text()
        agree = self._agreement(item, reference)
        if reference is None:
            return None if agree is None else 1.0 + 9.0 * agree
        f1 = token_f1(item.response, reference)
        if agree is None:
            return 1.0 + 9.0 * f1
        w = self.answer_weight
        return 1.0 + 9.0 * (w * agree + (1.0 - w) * f1)

    def score_batch(self, items: Sequence[ScoreItem]) -> list[float | None]:
        """Score every item locally; None only where there is nothing to compare with."""
        self._check_items(items)
        out = [check_score(self.score_item(it), where=f"similarity item {i}") for i, it in enumerate(items)]
        for v in out:
            self._count("failed" if v is None else "scored")
        return out

"""Checks that a rewritten question is a usable, problem-equivalent variant of the original.

A rewrite is rejected when it is empty, a copy of the original (ignoring case and whitespace), a copy
of an already-accepted variant, or (for free-form LLM rewrites) when its multiset of numbers differs
from the original's: a changed, dropped or added quantity can change the answer, and a question is
better left with fewer variants than with a wrong one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

# thousands-separated numbers first ("1,250"), then plain integers / decimals
_NUMBER = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def normalise_text(text: str) -> str:
    """Lower-case `text` with all runs of whitespace collapsed to one space, stripped."""
    return " ".join(text.lower().split())


def numbers_in(text: str) -> Counter[str]:
    """The multiset of numbers (integers and decimals, unsigned) written in digits in `text`, in
    canonical form: `1,250` → `1250`, `3.50` → `3.5`, `007` → `7`."""
    out: Counter[str] = Counter()
    for raw in _NUMBER.findall(text):
        try:
            d = Decimal(raw.replace(",", ""))
        except InvalidOperation:  # pragma: no cover - the regex only matches valid numbers
            continue
        out[format(d.normalize(), "f")] += 1
    return out


def _describe(counter: Counter[str]) -> str:
    return ", ".join(sorted(counter.elements(), key=lambda s: (float(s), s)))


def rejection_reason(
    variant: str,
    original: str,
    accepted: Iterable[str] = (),
    *,
    check_numbers: bool = True,
    verifier: Callable[[str, Any], bool] | None = None,
    problem: Any = None,
) -> str | None:
    """Why `variant` must be rejected as a rewrite of `original`, or None when it is acceptable."""
    if not variant or not variant.strip():
        return "empty rewrite"
    norm = normalise_text(variant)
    if norm == normalise_text(original):
        return "copy of the original"
    if any(norm == normalise_text(a) for a in accepted):
        return "duplicate of another variant"
    if check_numbers:
        want, got = numbers_in(original), numbers_in(variant)
        if want != got:
            parts = []
            if want - got:
                parts.append(f"missing {_describe(want - got)}")
            if got - want:
                parts.append(f"extra {_describe(got - want)}")
            return "numbers changed (" + "; ".join(parts) + ")"
    if verifier is not None and not verifier(variant, problem):
        return "rejected by verifier"
    return None

"""An independent reader of arithmetic question text, used to prove that transformations keep the answer.

It shares no code or tables with the generator and renderer: it reads English sentences with its own
verb lists, so a rewrite that changed the arithmetic (or wrote a sentence it cannot read) is caught.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.?!\n]+")
_NUMBER = re.compile(r"\d+")
# Sentences that state how much the person has before anything happens.
_START = re.compile(r"\b(has|have|had|starts with|started with|begins with|began with)\b", re.IGNORECASE)
# Step verbs, by their effect on the amount (own lists, deliberately not the renderer's).
_GAIN = re.compile(
    r"\b(finds|found|buys|bought|gets|got|receives|received|is given|was given|wins|won|"
    r"picks up|collects)\b",
    re.IGNORECASE,
)
_LOSS = re.compile(r"\b(gives away|gave away|loses|lost|sells|sold|uses|used|eats|ate|drops|dropped)\b", re.IGNORECASE)


def solve_question(text: str) -> int:
    """The final amount a (possibly rephrased) arithmetic question describes.

    Reads every sentence: the question sentence (with "?") is skipped; exactly one sentence states the
    start ("has 7", "starts with 7"); every other sentence with a number is a gain or a loss by its
    verb. Raises ValueError naming the sentence it cannot read.
    """
    start: int | None = None
    change = 0
    for raw in _SENTENCE_END.split(text.replace("?", "?\n")):
        sentence = raw.strip().lstrip("-*\u2022 ").strip()
        if not sentence:
            continue
        numbers = _NUMBER.findall(sentence)
        if not numbers:
            continue  # the question, or filler
        if len(numbers) != 1:
            raise ValueError(f"solve_question: expected one number in {sentence!r}")
        value = int(numbers[0])
        gain, loss = _GAIN.search(sentence), _LOSS.search(sentence)
        if gain and not loss:
            change += value
        elif loss and not gain:
            change -= value
        elif _START.search(sentence) and start is None:
            start = value
        else:
            raise ValueError(f"solve_question: cannot read {sentence!r}")
    if start is None:
        raise ValueError(f"solve_question: no starting amount in {text!r}")
    return start + change

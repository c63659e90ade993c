"""Named benchmarks for `regroup eval --bench`: where each is published, how a row of its schema becomes
a `Problem`, how answers are graded, and the sampling protocol the papers report (SPEC §5).

Math benchmarks are graded by math-verify on the last `\\boxed{}`; the multiple-choice ones
(GPQA-Diamond, ARC-Challenge, MMLU-Pro) put lettered options in the question and grade the chosen
letter (`extract_choice`). Rows are read from `--bench-file NAME=PATH` when given, else from a local
copy in `$REGROUP_DATA_DIR`, else from the hub.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regroup.data.load import HubSpec, source_rows
from regroup.data.prepare import answer_text, first_text
from regroup.rewards.math_verify import extract_boxed
from regroup.tasks.base import Problem

LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class Protocol:
    """Sampling settings of one paper's evaluation."""

    temperature: float
    top_p: float
    n: int
    ks: tuple[int, ...]


@dataclass(frozen=True)
class Benchmark:
    name: str
    hub: HubSpec
    fields: str
    """The published columns read (named in the offline message)."""
    answer_type: str
    """"math" (math-verify on the last \\boxed{}) or "choice" (the chosen letter)."""
    to_problem: Callable[[Mapping[str, Any], int], Problem | None]
    protocols: Mapping[str, Protocol]
    """Per paper: "dagrpo" (Xie et al.) and, where the paper evaluates it, "ta_grpo" (Le et al.)."""


# ---------------------------------------------------------------------------------- multiple choice


def choice_question(question: str, options: Sequence[str]) -> str:
    """The question followed by lettered options, one per line ("A. ...")."""
    lines = [f"{LETTERS[i]}. {str(opt).strip()}" for i, opt in enumerate(options)]
    return question.strip() + "\n\n" + "\n".join(lines)


# "answer is (B)", "Answer: B", "the correct answer is \\text{B}": the word case-insensitive, the letter a capital.
_ANSWER_IS = re.compile(r"(?i:answer)\s*(?i:is)?\s*:?\s*\(?\s*(?:\\text\{)?([A-Z])(?![A-Za-z])")


def extract_choice(response: str, num_options: int) -> str | None:
    """The letter a response chose, among the first `num_options` letters, or None.

    In order: the last `\\boxed{...}` (`\\boxed{B}`, `\\boxed{(B)}`, `\\boxed{\\text{B}}`, `\\boxed{B. text}`);
    the last "answer is (B)" / "Answer: B"; else the last standalone capital letter A.. (not part of a word).
    """
    valid = LETTERS[:num_options]
    boxed = extract_boxed(response)
    if boxed is not None:
        inner = re.sub(r"\\text(?:bf)?\{([^}]*)\}", r"\1", boxed).strip().strip("()").strip()
        m = re.match(r"([A-Z])(?![A-Za-z])", inner)
        if m and m.group(1) in valid:
            return m.group(1)
    found = [m.group(1) for m in _ANSWER_IS.finditer(response) if m.group(1) in valid]
    if found:
        return found[-1]
    standalone = [m.group(1) for m in re.finditer(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", response) if m.group(1) in valid]
    return standalone[-1] if standalone else None


def grade_choice(response: str, problem: Problem) -> float:
    """1.0 when the response chose the problem's letter (`problem.answer`), else 0.0."""
    num = int(problem.meta.get("num_options", len(LETTERS)))
    return 1.0 if extract_choice(response, num) == problem.answer else 0.0


def _stable_shuffle(items: list[str], key: str) -> list[str]:
    """A permutation fixed by `key` (hash-seeded), so every run shows the same option order."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def gpqa_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """GPQA (Rein et al.): Question, Correct Answer, Incorrect Answer 1-3; options shuffled per question."""
    question, correct = first_text(row, "Question"), first_text(row, "Correct Answer")
    wrong = [first_text(row, f"Incorrect Answer {k}") for k in (1, 2, 3)]
    if not question or not correct or not all(wrong):
        return None
    pid = str(row.get("Record ID") or i)
    options = _stable_shuffle([correct.strip(), *(w.strip() for w in wrong)], f"gpqa:{pid}")  # type: ignore[union-attr]
    letter = LETTERS[options.index(correct.strip())]
    return Problem(
        id=pid,
        question=choice_question(question, options),
        answer=letter,
        meta={"num_options": len(options), "choices": options},
    )


def arc_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """ARC (Clark et al.): question, choices {text, label}, answerKey (a letter, or a digit in a few rows)."""
    question, choices, key = (
        first_text(row, "question"),
        row.get("choices") or {},
        str(row.get("answerKey", "")).strip(),
    )
    texts, labels = list(choices.get("text") or []), [str(x) for x in choices.get("label") or []]
    if not question or not texts or len(texts) != len(labels) or key not in labels:
        return None
    return Problem(
        id=str(row.get("id") or i),
        question=choice_question(question, texts),
        answer=LETTERS[labels.index(key)],
        meta={"num_options": len(texts), "choices": texts},
    )


def mmlu_pro_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """MMLU-Pro (Wang et al.): question, options (up to 10), answer (letter), answer_index, category."""
    question, options = first_text(row, "question"), [o for o in row.get("options") or [] if str(o).strip()]
    index = row.get("answer_index")
    if not isinstance(index, int) and isinstance(row.get("answer"), str) and row["answer"].strip() in LETTERS:
        index = LETTERS.index(row["answer"].strip())
    if not question or not options or not isinstance(index, int) or not 0 <= index < len(options):
        return None
    return Problem(
        id=str(row.get("question_id", i)),
        question=choice_question(question, options),
        answer=LETTERS[index],
        difficulty=first_text(row, "category"),
        meta={"num_options": len(options), "choices": options},
    )


# -------------------------------------------------------------------------------------------- math


def math_answer_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """Math benchmarks with a question and a final answer (MATH-500, AIME, AMC, Minerva)."""
    question = first_text(row, "problem", "question", "Problem", "Question")
    answer = answer_text(row.get("answer", row.get("Answer")))
    if answer is None and first_text(row, "solution"):
        answer = extract_boxed(row["solution"])
    if not question or not answer:
        return None
    pid = row.get("unique_id") or row.get("id") or row.get("ID") or i
    return Problem(
        id=str(pid),
        question=question,
        answer=answer,
        difficulty=str(row["level"]) if row.get("level") is not None else None,
    )


def olympiad_row(row: Mapping[str, Any], i: int) -> Problem | None:
    """OlympiadBench (He et al.): question, final_answer (a list of `$...$`), context, unit."""
    question, answer = first_text(row, "question"), answer_text(row.get("final_answer"))
    if not question or not answer:
        return None
    if first_text(row, "context"):
        question = row["context"].strip() + "\n\n" + question
    return Problem(id=str(row.get("id", i)), question=question, answer=answer)


# ---------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Decoding:
    """A named decoding preset: the sampling settings without the benchmark-specific n and k."""

    temperature: float
    top_p: float
    source: str


DECODING: dict[str, Decoding] = {
    "t1": Decoding(1.0, 1.0, "plain sampling at T = 1 (the tiny-model study's primary evaluation)"),
    "dagrpo": Decoding(0.6, 1.0, "DaGRPO / LUFFY: T = 0.6 (LUFFY's val_temperature), top-p 1.0"),
    "ta_grpo": Decoding(0.6, 0.95, "TA-GRPO authors' test.py: T = 0.6, top-p 0.95, n = 128, 3072 tokens"),
}
"""`regroup eval --protocol NAME` and the studies' extra evaluations."""

# DaGRPO: T = 0.6, top-p 1.0, avg@32 on AIME24/25 and AMC, pass@1 elsewhere. TA-GRPO (the authors'
# test.py): T = 0.6, top-p 0.95, n = 128, pass@k for k = 1, 2, 4, ..., 128, up to 3072 new tokens.
_AVG32 = Protocol(0.6, 1.0, 32, (1, 32))
_PASS1 = Protocol(0.6, 1.0, 1, (1,))
_TA = Protocol(0.6, 0.95, 128, (1, 2, 4, 8, 16, 32, 64, 128))

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark(
            "math500",
            HubSpec("HuggingFaceH4/MATH-500", None, "test"),
            " (fields problem, answer)",
            "math",
            math_answer_row,
            {"dagrpo": _PASS1},
        ),
        Benchmark(
            "aime24",
            HubSpec("HuggingFaceH4/aime_2024", None, "train"),
            " (fields problem, answer)",
            "math",
            math_answer_row,
            {"dagrpo": _AVG32, "ta_grpo": _TA},
        ),
        Benchmark(
            "aime25",
            HubSpec("math-ai/aime25", None, "test"),
            " (fields problem, answer)",
            "math",
            math_answer_row,
            {"dagrpo": _AVG32, "ta_grpo": _TA},
        ),
        Benchmark(
            "amc23",
            HubSpec("math-ai/amc23", None, "test"),
            " (fields question, answer)",
            "math",
            math_answer_row,
            {"dagrpo": _AVG32, "ta_grpo": _TA},
        ),
        Benchmark(
            "minerva",
            HubSpec("math-ai/minervamath", None, "test"),
            " (fields question, answer)",
            "math",
            math_answer_row,
            {"dagrpo": _PASS1, "ta_grpo": _TA},
        ),
        Benchmark(
            "olympiadbench",
            HubSpec("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
            " (fields question, final_answer)",
            "math",
            olympiad_row,
            {"dagrpo": _PASS1, "ta_grpo": _TA},
        ),
        Benchmark(
            "gpqa_diamond",
            HubSpec("Idavidrein/gpqa", "gpqa_diamond", "train"),
            " (fields Question, Correct Answer, Incorrect Answer 1-3)",
            "choice",
            gpqa_row,
            {"dagrpo": _PASS1, "ta_grpo": _TA},
        ),
        Benchmark(
            "arc_c",
            HubSpec("allenai/ai2_arc", "ARC-Challenge", "test"),
            " (fields question, choices, answerKey)",
            "choice",
            arc_row,
            {"dagrpo": _PASS1},
        ),
        Benchmark(
            "mmlu_pro",
            HubSpec("TIGER-Lab/MMLU-Pro", None, "test"),
            " (fields question, options, answer_index)",
            "choice",
            mmlu_pro_row,
            {"dagrpo": _PASS1},
        ),
    ]
}


def parse_bench_list(spec: str) -> list[str]:
    """ "math500,aime24" -> names, checked against the registry (ValueError naming the unknown ones)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown or not names:
        raise ValueError(f"unknown benchmark(s) {unknown or spec!r}; choose from {', '.join(BENCHMARKS)}")
    return names


def protocol(bench: Benchmark, paper: str) -> Protocol:
    """The bench's sampling protocol from `paper`; the DaGRPO one where that paper did not evaluate it."""
    return bench.protocols.get(paper) or bench.protocols["dagrpo"]


def load_benchmark(name: str, source: str | None = None, limit: int | None = None) -> tuple[list[Problem], str, int]:
    """(problems, where the rows came from, rows skipped as unusable) of benchmark `name`."""
    bench = BENCHMARKS[name]
    rows, origin = source_rows(name, bench.hub, source, bench.fields, f"--bench-file {name}=PATH")
    problems = [p for i, row in enumerate(rows) if (p := bench.to_problem(row, i)) is not None]
    skipped = len(rows) - len(problems)
    if not problems:
        raise ValueError(f"{name}: no usable rows in {origin}; expected{bench.fields}")
    return (problems[:limit] if limit is not None else problems), origin, skipped


def grader_for(bench: Benchmark, math_checker) -> Callable[[str, Problem], float]:
    """The grading function of `bench`: the letter grader, or the shared math-verify checker."""
    return grade_choice if bench.answer_type == "choice" else math_checker

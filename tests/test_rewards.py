"""Reward functions: combine, task_grader, and the math-verify checker with its hard time limit."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import pytest

from regroup.rewards import combine, task_grader
from regroup.rewards.math_verify import MathAnswerChecker, extract_after_marker, extract_boxed
from regroup.tasks.base import Problem

pytest.importorskip("math_verify")


def P(answer: str) -> Problem:
    return Problem("p", "question", answer)


@pytest.fixture(scope="module")
def checker():
    with MathAnswerChecker(timeout_s=0.5) as c:
        c.warm_up()
        yield c


# -- extraction ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{3} and then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),     # the last box
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),                                    # nested braces balanced
    ("\\boxed{a} \\boxed{unclosed", "a"),                                   # an unclosed box is skipped
    ("\\fbox{7}", "7"),
    ("\\boxed 5$.", "5"),
    ("no box here", None),
    ("\\boxed{", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_is_linear():
    text = "\\boxed{" * 50_000  # 350k chars of unclosed boxes
    start = time.perf_counter()
    assert extract_boxed(text) is None
    assert time.perf_counter() - start < 1.0


def test_extract_after_marker():
    assert extract_after_marker("x #### 3 #### 42.\nmore", "####") == "42"
    assert extract_after_marker("#### \n\n 7", "####") == "7"
    assert extract_after_marker("nothing", "####") is None


# -- math-verify checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("response,answer,expected", [
    ("The answer is \\boxed{1/2}.", "0.5", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1+x^2}", "x^2+1", 1.0),
    ("first \\boxed{3} then \\boxed{4}", "4", 1.0),
    ("first \\boxed{4} then \\boxed{3}", "4", 0.0),
    ("\\boxed{0.6}", "0.5", 0.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
    ("the answer is 0.5", "0.5", 0.0),  # no box: no answer
])
def test_math_answers(checker, response, answer, expected):
    assert checker(response, P(answer)) == expected


def test_marker_mode():
    with MathAnswerChecker(marker="####", timeout_s=0.5) as c:
        assert c("7+5=12. #### 12", P("12")) == 1.0
        assert c("#### 1/2", P("0.5")) == 1.0
        assert c("#### 11", P("12")) == 0.0
        assert c("no marker but \\boxed{12}", P("12")) == 1.0  # falls back to the box


def test_pathological_inputs_finish_quickly():
    with MathAnswerChecker(timeout_s=0.5, max_chars=20000) as c:
        c.warm_up()
        cases = [
            "\\boxed{9^{9^{9^9}}}",
            "\\boxed{9^9^9^9}",
            "\\boxed{" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "}",
            "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
            "\\boxed{1}" + "x" * 1_000_000,  # 1 MB
        ]
        for text in cases:
            start = time.perf_counter()
            assert c(text, P("1")) == 0.0
            assert time.perf_counter() - start < 0.5 + c.grace_s + 0.5, text[:40]
        s = c.stats
        assert s["checked"] == 5 and s["too_long"] == 1
        assert s["timeouts"] + s["errors"] + s["no_answer"] >= 1  # the deep ones never silently "pass"
        assert c("\\boxed{2}", P("2")) == 1.0  # and the checker still works afterwards


def test_a_stuck_worker_is_killed_and_replaced():
    # SIGSTOP makes the worker deaf to its own alarm, like C code that never returns to Python.
    with MathAnswerChecker(timeout_s=0.3) as c:
        c.warm_up()
        os.kill(c._worker.proc.pid, signal.SIGSTOP)
        start = time.perf_counter()
        assert c("\\boxed{2}", P("2")) == 0.0
        assert time.perf_counter() - start < 0.3 + c.grace_s + 0.5
        assert c.stats["timeouts"] == 1 and c.stats["restarts"] == 1
        assert c("\\boxed{2}", P("2")) == 1.0


def test_a_dead_worker_is_replaced():
    with MathAnswerChecker(timeout_s=0.5) as c:
        c.warm_up()
        old = c._worker.proc
        old.kill()
        old.wait()
        assert c("\\boxed{3}", P("3")) == 1.0 and c._worker.proc is not old


def test_threads_and_pickling(checker):
    results = []

    def work(i: int) -> None:
        results.append(checker(f"\\boxed{{{i}}}", P(str(i))))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [1.0] * 8
    copy = pickle.loads(pickle.dumps(checker))
    assert copy._worker is None and copy.timeout_s == checker.timeout_s
    copy.close()


def test_junk_types_score_zero(checker):
    assert checker(None, P("1")) == 0.0  # type: ignore[arg-type]
    assert checker("\\boxed{1}", object()) == 0.0


def test_checker_overhead_is_small(checker):
    start = time.perf_counter()
    for i in range(50):
        checker(f"\\boxed{{{i}}}", P(str(i)))
    assert (time.perf_counter() - start) / 50 < 0.05  # measured ~2 ms per call on 2 cores


def test_checker_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        MathAnswerChecker(timeout_s=0)
    with pytest.raises(ValueError, match="max_chars"):
        MathAnswerChecker(max_chars=0)


# -- combine / task_grader ----------------------------------------------------------------------------


def test_combine_weighted_sum_and_none():
    one = lambda r, p: 1.0  # noqa: E731
    half = lambda r, p: 0.5  # noqa: E731
    none = lambda r, p: None  # noqa: E731
    assert combine([(one, 2.0), (half, -1.0)])("x", P("1")) == pytest.approx(1.5)
    assert combine([(one, 0.5), (none, 3.0)])("x", P("1")) == pytest.approx(0.5)  # None parts are left out
    assert combine([(none, 1.0), (none, 2.0)])("x", P("1")) is None
    with pytest.raises(ValueError, match="at least one"):
        combine([])
    with pytest.raises(ValueError, match="weight"):
        combine([(one, float("nan"))])
    with pytest.raises(ValueError, match="not callable"):
        combine([("task", 1.0)])


def test_task_grader():
    from regroup.tasks import get_task

    reward = task_grader(get_task("arithmetic"))
    p = P("9")
    assert reward("#### 9", p) == 1.0 and reward("#### 8", p) == 0.0
    assert isinstance(reward("#### 9", p), float)
    with pytest.raises(ValueError, match="no grade"):
        task_grader(object())

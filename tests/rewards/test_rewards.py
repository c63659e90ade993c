"""Reward functions: combine, task_grader, and the math-verify checker with its hard time limit."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading

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


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so \\boxed{3} and then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # the last box
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # nested braces balanced
        ("\\boxed{a} \\boxed{unclosed", "a"),  # an unclosed box is skipped
        ("\\fbox{7}", "7"),
        ("\\boxed 5$.", "5"),
        ("no box here", None),
        ("\\boxed{", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def _python_lines_run(fn, *args) -> int:
    """How many Python lines `fn(*args)` executes (the work it does, whatever the machine's speed)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


def test_extract_boxed_is_linear():
    # unclosed boxes: doubling the text doubles the work of a linear scan, and quadruples a quadratic one
    small, large = ("\\boxed{" * n for n in (2_000, 4_000))
    assert extract_boxed(large) is None
    ratio = _python_lines_run(extract_boxed, large) / _python_lines_run(extract_boxed, small)
    assert 1.8 < ratio < 2.5


def test_extract_after_marker():
    assert extract_after_marker("x #### 3 #### 42.\nmore", "####") == "42"
    assert extract_after_marker("#### \n\n 7", "####") == "7"
    assert extract_after_marker("nothing", "####") is None


# -- math-verify checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,answer,expected",
    [
        ("The answer is \\boxed{1/2}.", "0.5", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1+x^2}", "x^2+1", 1.0),
        ("first \\boxed{3} then \\boxed{4}", "4", 1.0),
        ("first \\boxed{4} then \\boxed{3}", "4", 0.0),
        ("\\boxed{0.6}", "0.5", 0.0),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
        ("the answer is 0.5", "0.5", 0.0),  # no box: no answer
    ],
)
def test_math_answers(checker, response, answer, expected):
    assert checker(response, P(answer)) == expected


def test_marker_mode():
    with MathAnswerChecker(marker="####", timeout_s=0.5) as c:
        assert c("7+5=12. #### 12", P("12")) == 1.0
        assert c("#### 1/2", P("0.5")) == 1.0
        assert c("#### 11", P("12")) == 0.0
        assert c("no marker but \\boxed{12}", P("12")) == 1.0  # falls back to the box


def test_pathological_inputs_end_in_counted_outcomes():
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
            assert c(text, P("1")) == 0.0, text[:40]
        s = c.pop_counts()
        assert s["checked"] == 5 and s["too_long"] == 1 and s["extracted"] == 4 and s["correct"] == 0
        assert s["wrong"] + s["timeout"] + s["error"] == 4  # every extracted answer ended in one outcome
        assert s["timeout"] >= 1  # 9^{9^{9^9}} cannot finish in 0.5 s: a timeout, not a wrong answer
        assert c("\\boxed{2}", P("2")) == 1.0  # and the checker still works afterwards


def test_a_stuck_worker_is_killed_and_replaced():
    # SIGSTOP makes the worker deaf to its own alarm, like C code that never returns to Python.
    with MathAnswerChecker(timeout_s=0.3) as c:
        c.warm_up()
        stuck = c.pool.workers[0].proc
        os.kill(stuck.pid, signal.SIGSTOP)
        assert c("\\boxed{2}", P("2")) == 0.0
        assert stuck.poll() is not None  # killed
        counts = c.pop_counts()
        assert (counts["timeout"], counts["restarts"], counts["wrong"]) == (1, 1, 0)
        # The replacement is warmed (imported, one check done) before the next timed check: on a loaded
        # machine its first check must not run under the 0.3 s limit while it is still importing.
        c.warm_up()
        assert c("\\boxed{2}", P("2")) == 1.0
        assert c.pop_counts()["correct"] == 1


def test_a_dead_worker_is_replaced():
    with MathAnswerChecker(timeout_s=0.5) as c:
        c.warm_up()
        old = c.pool.workers[0].proc
        old.kill()
        old.wait()
        assert c("\\boxed{3}", P("3")) == 1.0 and c.pool.workers[0].proc is not old
        assert c.pop_counts()["restarts"] == 1


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
    assert copy.pool.workers == [None] and copy.timeout_s == checker.timeout_s
    copy.close()


def test_junk_types_score_zero(checker):
    assert checker(None, P("1")) == 0.0  # type: ignore[arg-type]
    assert checker("\\boxed{1}", object()) == 0.0


def test_checker_counts_every_outcome(checker):
    checker.pop_counts()
    responses = ["\\boxed{31}", "\\boxed{41}", "no box", "\\boxed{31}", None]  # pairs no other test checks
    scores = [checker(r, P("31")) for r in responses]
    assert scores == [1.0, 0.0, 0.0, 1.0, 0.0]
    counts = checker.pop_counts()
    assert counts == {
        "checked": 5,
        "extracted": 3,
        "no_answer": 1,
        "too_long": 0,
        "correct": 2,
        "wrong": 1,
        "timeout": 0,
        "error": 1,
        "cached": 1,
        "restarts": 0,
        "protocol_errors": 0,
        "forked_returns": 0,
    }
    assert checker.pop_counts()["checked"] == 0  # popped
    assert checker.stats["checked"] >= 5  # stats keep counting since creation


def test_checker_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        MathAnswerChecker(timeout_s=0)
    with pytest.raises(ValueError, match="max_chars"):
        MathAnswerChecker(max_chars=0)
    with pytest.raises(ValueError, match="workers"):
        MathAnswerChecker(workers=0)


# -- combine / task_grader ----------------------------------------------------------------------------


def test_combine_weighted_sum_and_none():
    one = lambda r, p: 1.0
    half = lambda r, p: 0.5
    none = lambda r, p: None
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


# -- pool, hostile batches, counts of task_grader / combine --------------------------------------------

HOSTILE = "\\boxed{9^{9^{9^9}}}"


def test_twenty_copies_of_a_hostile_box_cost_one_timeout():
    with MathAnswerChecker(timeout_s=0.3) as c:
        c.warm_up()
        assert c.check_many([HOSTILE] * 20, [P("1")] * 20) == [0.0] * 20
        counts = c.pop_counts()
        # every copy is reported as a timeout (not as wrong); only the first one was actually run
        assert (counts["timeout"], counts["wrong"], counts["cached"]) == (20, 0, 19)
        # a timeout is not remembered across calls (a loaded machine can cause one); a finished check is
        assert c(HOSTILE, P("1")) == 0.0 and c.pop_counts()["cached"] == 0
        assert c("\\boxed{7}", P("7")) == c("\\boxed{7}", P("7")) == 1.0 and c.pop_counts()["cached"] == 1


def test_a_pool_checks_distinct_hostile_answers_in_parallel_and_counts_each_timeout():
    hostile = [f"\\boxed{{9^{{9^{{9^{{{k}}}}}}}}}" for k in range(5, 13)]  # 8 distinct towers, each too slow
    easy = [f"\\boxed{{{i}}}" for i in range(4)]
    with MathAnswerChecker(timeout_s=0.3, workers=4) as c:
        c.warm_up()
        assert all(w is not None and w.ready for w in c.pool.workers) and len(c.pool.workers) == 4
        pids = {w.proc.pid for w in c.pool.workers}
        scores = c.check_many(hostile + easy, [P("1")] * len(hostile) + [P(str(i)) for i in range(4)])
        assert scores == [0.0] * len(hostile) + [1.0] * 4
        counts = c.pop_counts()
        assert (counts["timeout"], counts["correct"], counts["wrong"], counts["cached"]) == (8, 4, 0, 0)
        assert len(pids) == 4  # four processes


def test_a_correct_but_slow_answer_is_a_timeout_not_wrong():
    # 9,951 ones summed: correct, but parsing it takes longer than this limit.
    long_sum = "\\boxed{" + "+".join(["1"] * 9951) + "}"
    with MathAnswerChecker(timeout_s=0.3) as c:
        c.warm_up()
        assert c(long_sum, P("9951")) == 0.0
        counts = c.pop_counts()
        assert (counts["extracted"], counts["timeout"], counts["wrong"], counts["correct"]) == (1, 1, 0, 0)


def test_task_grader_counts():
    from regroup.tasks import get_task

    reward = task_grader(get_task("arithmetic"))
    p = P("9")
    assert [reward(r, p) for r in ("#### 9", "#### 8", "no answer at all")] == [1.0, 0.0, 0.0]
    assert reward.pop_counts() == {"checked": 3, "correct": 1, "wrong": 2, "error": 0, "extracted": 2, "no_answer": 1}
    assert reward.pop_counts()["checked"] == 0


def test_combine_sums_its_parts_counts_and_scores_batches():
    from regroup.rewards import pop_counts, score_many
    from regroup.tasks import get_task

    task_reward = task_grader(get_task("arithmetic"))
    with MathAnswerChecker(marker="####", timeout_s=2.0, workers=2) as math_reward:
        both = combine([(task_reward, 1.0), (math_reward, 0.5)])
        responses = ["#### 9", "#### 8", "nothing"]
        assert score_many(both, responses, [P("9")] * 3) == [1.5, 0.0, 0.0]
        assert both("#### 9", P("9")) == 1.5
        counts = pop_counts(both)
        assert counts["checked"] == 8 and counts["correct"] == 4  # 4 responses x 2 parts
        assert counts["no_answer"] == 2 and counts["timeout"] == 0
        assert pop_counts(both)["checked"] == 0 and pop_counts(lambda r, p: 1.0) == {}

"""The built-in arithmetic task: generator, transformations, grader, step scorer, task registry."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from regroup.tasks import get_task
from regroup.tasks.arithmetic import (
    TRANSFORMS,
    ArithmeticConfig,
    ArithmeticTask,
    extract_answer,
    generate,
    grade,
    rephrase,
    solve_question,
    step_score,
)
from regroup.tasks.arithmetic.render import render, surface_from_meta
from regroup.tasks.base import Problem


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return generate(5000, seed=7)


def _mia() -> Problem:
    """The brief's example, built by hand so every expected number below is checkable by eye."""
    return Problem(
        id="mia",
        question="Mia has 7 shells. She finds 5 more. She gives away 3. How many shells does Mia have now?",
        answer="9",
        solution="7+5=12. 12-3=9. #### 9",
        difficulty="steps=2",
        meta={
            "name": "Mia",
            "pronoun": "She",
            "object": "shells",
            "start": 7,
            "ops": [["+", 5], ["-", 3]],
            "verbs": [0, 0],
            "values": [12, 9],
            "min_value": 1,
            "max_value": 20,
        },
    )


# -- Problem ------------------------------------------------------------------------------------------


def test_problem_json_round_trip():
    p = _mia()
    back = Problem.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p and back.meta == p.meta and back.variants == ()
    with pytest.raises(ValueError, match="'answer'"):
        Problem.from_dict({"id": "1", "question": "q"})


# -- generator ----------------------------------------------------------------------------------------


def test_generation_is_deterministic_by_seed():
    a, b, c = generate(50, seed=3), generate(50, seed=3), generate(50, seed=4)
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]
    assert [p.question for p in a] != [p.question for p in c]
    assert a[0].id == "arith-3-0" and a[49].id == "arith-3-49"


def test_the_example_shape():
    p = _mia()
    assert render(surface_from_meta(p.meta)) == p.question
    assert solve_question(p.question) == 9


def test_values_in_range_and_solutions_consistent(problems):
    for p in problems:
        meta = p.meta
        chain = [meta["start"], *meta["values"]]
        assert all(1 <= v <= 20 for v in chain), p
        assert all(1 <= x <= 9 for _, x in meta["ops"])
        assert int(p.answer) == chain[-1] != 0
        assert p.difficulty == f"steps={len(meta['ops'])}"
        assert p.solution.endswith(f"#### {p.answer}")
        assert render(surface_from_meta(meta)) == p.question  # meta really describes the question
        assert solve_question(p.question) == int(p.answer)


def test_step_count_distribution(problems):
    counts = Counter(p.difficulty for p in problems)
    # 0.3/0.3/0.3/0.1 of 5000: binomial SD ≈ 32 (21 for 0.1); ±5 SD bounds.
    for k, share in ((1, 0.3), (2, 0.3), (3, 0.3), (4, 0.1)):
        assert abs(counts[f"steps={k}"] - 5000 * share) < 5 * (5000 * share * (1 - share)) ** 0.5


def test_no_answer_dominates(problems):
    counts = Counter(int(p.answer) for p in problems)
    # 20 possible answers, 5% each if uniform. The restricted random walk favours the middle
    # (measured: 3.3% for 1, 6.4% at most), so: every value occurs at least 1.5% of the time (a missing
    # value would be a hole the model can exploit) and none more than 10% (a generator that clipped sums
    # at 99 once made "99" a common answer, and the model learned that shortcut).
    assert set(counts) == set(range(1, 21))
    assert min(counts.values()) / 5000 > 0.015
    assert max(counts.values()) / 5000 < 0.10


def test_config_changes_the_range():
    cfg = ArithmeticConfig(min_value=0, max_value=5, max_operand=3, operations=("-",), step_probs={"2": 1})
    ps = generate(200, seed=1, config=cfg)
    assert all(p.difficulty == "steps=2" and "more" not in p.question for p in ps)
    assert all(0 < int(p.answer) <= 5 for p in ps)  # zero answers are excluded even with min_value 0
    assert all(0 <= v <= 5 for p in ps for v in [p.meta["start"], *p.meta["values"]])


@pytest.mark.parametrize(
    "bad",
    [
        {"min_value": 5, "max_value": 1},
        {"operations": ("*",)},
        {"step_probs": {0: 1.0}},
        {"min_operand": 0},
        {"names": (("Mia", "She"),)},
    ],
)
def test_config_errors(bad):
    with pytest.raises(ValueError, match="ArithmeticConfig"):
        ArithmeticConfig(**bad)


def test_infeasible_config_raises_instead_of_looping():
    cfg = ArithmeticConfig(min_value=1, max_value=2, min_operand=5, max_operand=9)
    with pytest.raises(ValueError, match="allows"):
        generate(1, seed=0, config=cfg)


# -- transformations ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_keeps_answer_and_changes_text(problems, name):
    rng = random.Random(name)
    for p in problems[:1000]:
        text = TRANSFORMS[name](p, rng)
        assert text != p.question
        assert solve_question(text) == int(p.answer), (name, p.question, text)


def test_reorder_moves_information():
    p = _mia()
    seen = {TRANSFORMS["reorder"](p, random.Random(s)) for s in range(40)}
    assert "Mia has 7 shells. She gives away 3. She finds 5 more. How many shells does Mia have now?" in seen
    assert any(t.startswith("How many shells") for t in seen)
    # 7-3=4 then +5=9: in range. A step order leaving [1, 20] is never used:
    q = _mia()
    q = Problem(q.id, "x", "1", meta={**q.meta, "start": 18, "ops": [["+", 2], ["-", 19]], "values": [20, 1]})
    for s in range(40):
        assert "gives away 19. She finds 2" not in TRANSFORMS["reorder"](q, random.Random(s))


def test_rename_changes_the_person():
    text = TRANSFORMS["rename"](_mia(), random.Random(0))
    assert "Mia" not in text and solve_question(text) == 9


def test_rephrase_gives_distinct_variants(problems):
    rng = random.Random(0)
    for p in problems[:200]:
        out = rephrase(p, 5, rng)
        assert len(out) == 5 and len(set(out)) == 5 and p.question not in out
        assert all(solve_question(t) == int(p.answer) for t in out)
    assert rephrase(problems[0], 0, rng) == []


def test_transform_needs_structure():
    with pytest.raises(ValueError, match="no arithmetic structure"):
        TRANSFORMS["rename"](Problem("u1", "Add 2 and 3.", "5"), random.Random(0))


def test_solver_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="cannot read"):
        solve_question("Mia has 7 shells. She juggles 3. How many shells does Mia have now?")
    with pytest.raises(ValueError, match="no starting amount"):
        solve_question("She finds 3 more.")


# -- grader -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,expected",
    [
        ("7+5=12. 12-3=9. #### 9", 1.0),
        ("#### 9", 1.0),
        ("#### 9.", 1.0),
        ("7+5=12. 12-3=9. #### 8", 0.0),  # wrong
        ("7+5=12. 12-3=9. 9", 0.0),  # no marker
        ("#### 4 wait #### 9", 1.0),  # the last marker wins
        ("#### 9 then #### 4", 0.0),
        ("####", 0.0),
        ("#### nine", 0.0),
        ("", 0.0),
        ("\x00\ufffd#### " + "9" * 5000, 0.0),  # junk, a huge number
    ],
)
def test_grade(response, expected):
    assert grade(response, _mia()) == expected


def test_extract_answer():
    assert extract_answer("a #### -3 b") == "-3"
    assert extract_answer("no marker 5") is None
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert grade("#### 5", Problem("x", "q", "five")) == 0.0  # a non-integer answer never matches


# -- step scorer --------------------------------------------------------------------------------------


def test_step_score_cases():
    p = _mia()
    # score = 1 + 9 * (0.5 correct + 0.25 valid + 0.25 complete); complete counts start + 2 ops = 3 facts
    assert step_score("7+5=12. 12-3=9. #### 9", p) == 10.0
    assert step_score("7 + 5 = 12\n12 - 3 = 9\n#### 9", p) == 10.0
    # a corrupted step: 7+5=13 is wrong, 13-3=10 is right and chained -> valid 1/2; start counts,
    # only (-,3) from valid steps -> complete 2/3; answer wrong
    assert step_score("7+5=13. 13-3=10. #### 10", p) == pytest.approx(1 + 9 * (0.25 * 0.5 + 0.25 * 2 / 3))
    # right steps, wrong final answer
    assert step_score("7+5=12. 12-3=9. #### 8", p) == pytest.approx(1 + 9 * 0.5)
    # a missing step but the right answer: valid 1, complete (start + op)/3
    assert step_score("7+5=12. #### 9", p) == pytest.approx(1 + 9 * (0.5 + 0.25 + 0.25 * 2 / 3))
    # the other order of steps is as complete
    assert step_score("7-3=4. 4+5=9. #### 9", p) == 10.0
    # an unchained step (does not start from the previous result) is not valid
    assert step_score("7+5=12. 11-3=8. #### 8", p) == pytest.approx(1 + 9 * (0.25 * 0.5 + 0.25 * 2 / 3))
    assert step_score("garbage", p) == 1.0
    assert step_score("", p) == 1.0


def test_step_score_orders_responses():
    p = _mia()
    ref = step_score(p.solution, p)
    corrupted = step_score("7+5=13. 13-3=10. #### 10", p)
    wrong = step_score("7+5=12. 12-3=9. #### 8", p)
    missing = step_score("7+5=12. #### 9", p)
    garbage = step_score("blah 12 #### x", p)
    assert ref == 10.0 > missing > wrong > corrupted > garbage == 1.0


def test_step_score_bounds_on_generated_and_junk(problems):
    rng = random.Random(0)
    for p in problems[:300]:
        assert step_score(p.solution, p) == 10.0
        junk = "".join(rng.choice("0123456789+-=#. x") for _ in range(rng.randint(0, 80)))
        assert 1.0 <= step_score(junk, p) <= 10.0
    assert step_score(None, problems[0]) == 1.0  # type: ignore[arg-type]


def test_step_score_without_meta_uses_the_solution():
    p = Problem("t1", "Ann has 3 apples. She buys 4 more. How many apples does she have?", "7", "3 + 4 = 7")
    assert step_score("3 + 4 = 7\n#### 7", p) == 10.0
    assert step_score("3 + 4 = 8\n#### 8", p) == pytest.approx(1 + 9 * 0.25 * 0.5)
    bare = Problem("t2", "q", "7")
    assert step_score("3+4=7. #### 7", bare) == 10.0  # no reference: the chain must end at the answer


# -- task object and registry -------------------------------------------------------------------------


def test_task_object_and_registry():
    task = get_task("arithmetic")
    assert isinstance(task, ArithmeticTask) and task.name == "arithmetic" and task.answer_marker == "####"
    p = task.generate(3, seed=1)[0]
    assert task.grade(p.solution, p) == 1.0 and task.step_score(p.solution, p) == 10.0
    assert len(task.rephrase(p, 2, random.Random(0))) == 2
    assert set(task.transforms) == {"rename", "reorder", "reword"}
    small = get_task("arithmetic", config={"max_value": 9})
    assert all(int(q.answer) <= 9 for q in small.generate(50, seed=0))


def test_registry_loads_dotted_paths():
    assert get_task("regroup.tasks.arithmetic:ArithmeticTask").name == "arithmetic"
    with pytest.raises(ValueError, match="cannot import module"):
        get_task("no_such_module_xyz:Task")
    with pytest.raises(ValueError, match="has no attribute"):
        get_task("regroup.tasks.arithmetic:Nope")
    with pytest.raises(ValueError, match="no grade"):
        get_task("regroup.tasks.base:Problem", id="1", question="q", answer="a")
    with pytest.raises(ValueError, match="built-in name"):
        get_task("unknown")

"""Step and similarity scorers (hand-computed values) and the scorer registry."""

from __future__ import annotations

import math
import textwrap

import pytest

from regroup.net import ChatClient
from regroup.scorers import JudgeScorer, ScoreItem, SimilarityScorer, StepScorer, build_scorer
from regroup.scorers.similarity import extract_final_answer, normalise_answer, token_f1, tokens


class P:
    """A minimal stand-in problem (only the attributes scorers read)."""

    def __init__(self, answer=None, solution=None):
        self.answer = answer
        self.solution = solution


# -- similarity --------------------------------------------------------------------------------------


def test_tokens_and_f1_by_hand():
    assert tokens("Tom has 3 apples; 3+4=7.") == ["tom", "has", "3", "apples", "3", "+", "4", "=", "7"]
    # response 4 tokens, reference 3, common {a, b} = 2: P = 1/2, R = 2/3, F1 = 4/7
    assert token_f1("a b c d", "a b x") == pytest.approx(4 / 7)
    assert token_f1("", "a") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # multiset overlap {a, b}


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so x = \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{3} then \\boxed{4}", "4"),
        ("The answer is: 7.", "7"),
        ("steps...\n#### 1,250", "1,250"),
        ("3 + 4 = 7, then 7 - 2 = 5", "5"),
        ("no numbers here", None),
        ("\\boxed{unbalanced", None),
    ],
)
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


def test_normalise_answer():
    assert normalise_answer("1,250") == "1250"
    assert normalise_answer(" $7.0 ") == "7"
    assert normalise_answer("0.50") == "0.5"
    assert normalise_answer("X+1") == "x+1"


def test_similarity_scores_by_hand():
    s = SimilarityScorer()
    items = [
        # F1: response 10 tokens, reference 5, all 5 shared → P 1/2, R 1, F1 2/3; answers agree (7 = 7)
        # → 1 + 9·(0.5·1 + 0.5·2/3) = 8.5
        ScoreItem("q", "3 + 4 = 7 so the answer is 7", "3 + 4 = 7"),
        # nothing shared, answer 8 ≠ 7 → 1
        ScoreItem("q", "I think it is 8", "3 + 4 = 7"),
        # no reference text: answer agreement only, against problem.answer → 10
        ScoreItem("q", "\\boxed{12}", None, P(answer="12")),
        ScoreItem("q", "\\boxed{13}", None, P(answer="12")),
        # reference taken from problem.solution; expected answer from problem.answer (5), response says 7
        # F1("3 + 4 = 7", "3 + 4 = 7") = 1 → 1 + 9·(0 + 0.5) = 5.5
        ScoreItem("q", "3 + 4 = 7", None, P(answer="5", solution="3 + 4 = 7")),
        # nothing to compare with → unscored
        ScoreItem("q", "anything", None),
    ]
    assert s.score_batch(items) == pytest.approx([8.5, 1.0, 10.0, 1.0, 5.5, None])
    assert s.stats == {"scored": 5, "failed": 1, "cached": 0}


def test_similarity_weight_and_grade_fn():
    pure_f1 = SimilarityScorer(answer_weight=0.0)
    assert pure_f1.score(ScoreItem("q", "a b c d", "a b x")) == pytest.approx(1 + 9 * 4 / 7)
    graded = SimilarityScorer(answer_weight=1.0, grade_fn=lambda resp, prob: 0.5)
    assert graded.score(ScoreItem("q", "whatever", "ref", P(answer="1"))) == pytest.approx(5.5)
    with pytest.raises(ValueError, match="answer_weight"):
        SimilarityScorer(answer_weight=1.5)
    bad = SimilarityScorer(grade_fn=lambda r, p: 2.0)
    with pytest.raises(ValueError, match="grade_fn"):
        bad.score(ScoreItem("q", "x", "ref", P(answer="1")))


# -- step --------------------------------------------------------------------------------------------


def test_step_scorer_wraps_step_fn_and_checks_range():
    calls = []

    def step_fn(response, problem):
        calls.append((response, problem.answer))
        return {"good": 9, "bad": 2, "unknown": None}[response]

    s = StepScorer(step_fn)
    items = [ScoreItem("q", r, None, P(answer="1")) for r in ("good", "bad", "unknown")]
    assert s.score_batch(items) == [9.0, 2.0, None]
    assert calls == [("good", "1"), ("bad", "1"), ("unknown", "1")]
    assert s.stats == {"scored": 2, "failed": 1, "cached": 0}
    with pytest.raises(ValueError, match="item 0 has none"):
        s.score_batch([ScoreItem("q", "good")])
    with pytest.raises(ValueError, match=r"must be in \[1, 10\]"):
        StepScorer(lambda r, p: 11).score_batch([ScoreItem("q", "x", None, P())])
    with pytest.raises(ValueError, match=r"must be in \[1, 10\]"):
        StepScorer(lambda r, p: math.nan).score_batch([ScoreItem("q", "x", None, P())])


def test_step_scorer_on_the_arithmetic_task():
    from regroup.tasks.arithmetic import generate, step_score

    problem = generate(1, seed=0)[0]
    assert problem.solution == "14+5=19. 19-7=12. 12-8=4. #### 4"  # pinned: the case below is written for it
    good = problem.solution
    wrong_step = "14+5=19. 19-7=13. 13-8=5. #### 5"
    s = StepScorer()  # default: the arithmetic task's step_score
    got = s.score_batch([ScoreItem(problem.question, r, None, problem) for r in (good, wrong_step, "no idea")])
    assert got == [step_score(good, problem), step_score(wrong_step, problem), step_score("no idea", problem)]
    assert got[0] == 10.0
    assert 1.0 <= got[2] <= got[1] < got[0]


# -- registry ----------------------------------------------------------------------------------------


def test_build_scorer_by_name():
    assert isinstance(build_scorer("similarity", answer_weight=0.25), SimilarityScorer)
    assert build_scorer("step", step_fn=lambda r, p: 5).score_batch([ScoreItem("q", "r", None, P())]) == [5.0]
    judge = build_scorer("judge", base_url="http://127.0.0.1:9/v1", model="gpt-4o", api_key_env=None, concurrency=3)
    assert isinstance(judge, JudgeScorer)
    assert judge.client.to_dict()["concurrency"] == 3 and judge.client.model == "gpt-4o"
    client = ChatClient("http://127.0.0.1:9/v1", "m", api_key_env=None)
    assert build_scorer("judge", client=client).client is client
    with pytest.raises(ValueError, match="base_url and model"):
        build_scorer("judge")
    with pytest.raises(TypeError, match="unknown judge settings"):
        build_scorer("judge", base_url="http://x", model="m", colour="red")
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        build_scorer("nope")


def test_build_scorer_from_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_scorers.py").write_text(
        textwrap.dedent(
            """
            from regroup.scorers import Scorer

            class LengthScorer(Scorer):
                def __init__(self, cap=10):
                    super().__init__()
                    self.cap = cap
                def score_batch(self, items):
                    return [float(max(1, min(self.cap, len(it.response)))) for it in items]

            READY = LengthScorer(cap=3)
            NOT_A_SCORER = 42

            def make(cap):
                return LengthScorer(cap)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    item = ScoreItem("q", "abcdef")
    assert build_scorer("my_scorers:LengthScorer", cap=4).score_batch([item]) == [4.0]
    assert build_scorer("my_scorers:make", cap=5).score_batch([item]) == [5.0]
    assert build_scorer("my_scorers:READY").score_batch([item]) == [3.0]
    with pytest.raises(TypeError, match="takes no settings"):
        build_scorer("my_scorers:READY", cap=2)
    with pytest.raises(TypeError, match="neither a scorer"):
        build_scorer("my_scorers:NOT_A_SCORER")
    with pytest.raises(ValueError, match="has no attribute"):
        build_scorer("my_scorers:Missing")
    with pytest.raises(ValueError, match="cannot import module"):
        build_scorer("no_such_module_xyz:thing")

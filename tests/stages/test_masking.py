"""DaGRPO's distinctiveness mask stage (`regroup.stages.masking`)."""

from __future__ import annotations

import pytest
from helpers import stage_sample

from regroup.stages.masking import DistinctivenessMasker


def test_judge_is_shown_the_question_the_response_answered_unless_asked_for_q0():
    class Recording:
        stats: dict = {}

        def __init__(self):
            self.questions = []

        def score_batch(self, items):
            self.questions += [it.question for it in items]
            return [5.0] * len(items)

    samples = [stage_sample(0, 1.0), stage_sample(0, 0.0, variant=1)]
    samples[1].question_text = "rephrased question 0"
    for setting, want in (("own", ["question 0", "rephrased question 0"]), ("original", ["question 0", "question 0"])):
        scorer = Recording()
        DistinctivenessMasker(scorer, 3.0, question=setting).score(samples)
        assert scorer.questions == want, setting
    with pytest.raises(ValueError):
        DistinctivenessMasker(Recording(), 3.0, question="q0")

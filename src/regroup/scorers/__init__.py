"""Fine-grained response scorers for DaGRPO's distinctiveness masks (SPEC §2a.1): step, judge, similarity."""

from regroup.scorers.base import ScoreItem, Scorer
from regroup.scorers.judge import JudgeScorer, build_judge_messages, parse_judge_score
from regroup.scorers.registry import SCORERS, build_scorer
from regroup.scorers.similarity import SimilarityScorer
from regroup.scorers.step import StepScorer

__all__ = [
    "SCORERS",
    "JudgeScorer",
    "ScoreItem",
    "Scorer",
    "SimilarityScorer",
    "StepScorer",
    "build_judge_messages",
    "build_scorer",
    "parse_judge_score",
]

"""TA-GRPO rephrasers (SPEC §3.1): N problem-equivalent variants per question — rules, openai, dataset."""

from regroup.rephrase.base import RephraseOutcome, Rephraser
from regroup.rephrase.dataset import DatasetRephraser
from regroup.rephrase.llm import OpenAIRephraser, build_rewrite_messages, extract_rewrite
from regroup.rephrase.registry import REPHRASERS, build_rephraser
from regroup.rephrase.rules import RulesRephraser
from regroup.rephrase.run import run_rephrase, summarise
from regroup.rephrase.validate import numbers_in, rejection_reason

__all__ = [
    "REPHRASERS",
    "DatasetRephraser",
    "OpenAIRephraser",
    "RephraseOutcome",
    "Rephraser",
    "RulesRephraser",
    "build_rephraser",
    "build_rewrite_messages",
    "extract_rewrite",
    "numbers_in",
    "rejection_reason",
    "run_rephrase",
    "summarise",
]

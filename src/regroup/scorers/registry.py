"""`build_scorer(name, **kwargs)`: the built-in scorers by name, or a user's by dotted path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regroup.config.registry import SCORERS, build_named
from regroup.net import ChatClient, DiskCache
from regroup.net.build import client_and_cache
from regroup.scorers.base import Scorer
from regroup.scorers.judge import JudgeScorer
from regroup.scorers.similarity import SimilarityScorer
from regroup.scorers.step import StepScorer


def build_judge(
    client: ChatClient | None = None,
    cache: DiskCache | None = None,
    prompt_version: str = "v1",
    *,
    base_url: str | None = None,
    model: str | None = None,
    cache_path: str | Path | None = None,
    structured: str = "none",
    max_tokens: int | None = None,
    **client_kwargs: Any,
) -> JudgeScorer:
    """A JudgeScorer from a ready client, or from `base_url` + `model` (+ ChatClient settings);
    `cache_path` opens a DiskCache there. `structured` / `max_tokens`: see `JudgeScorer`."""
    client, cache = client_and_cache(
        "judge", "https://api.openai.com/v1, gpt-4o", client, cache, base_url, model, cache_path, client_kwargs
    )
    return JudgeScorer(client, cache, prompt_version, structured=structured, max_tokens=max_tokens)


SCORERS.register("step", StepScorer)
SCORERS.register("judge", build_judge)
SCORERS.register("similarity", SimilarityScorer)


def build_scorer(name: str, **kwargs: Any) -> Scorer:
    """The scorer `name` ("step", "judge", "similarity", or "package.module:object") built with `kwargs`.

    A dotted object may be a class or factory (called with `kwargs`) or a ready scorer instance.
    """
    return build_named("scorer", name, SCORERS, "score_batch", **kwargs)

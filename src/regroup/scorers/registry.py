"""`build_scorer(name, **kwargs)`: the built-in scorers by name, or a user's by dotted path."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regroup.net import ChatClient, DiskCache
from regroup.net.build import client_and_cache
from regroup.scorers.base import Scorer
from regroup.scorers.judge import JudgeScorer
from regroup.scorers.similarity import SimilarityScorer
from regroup.scorers.step import StepScorer


def load_dotted(path: str) -> Any:
    """The object named by `"package.module:attribute"` (attribute may be dotted: `mod:Class.factory`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:object', got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


def build_judge(
    client: ChatClient | None = None,
    cache: DiskCache | None = None,
    prompt_version: str = "v1",
    *,
    base_url: str | None = None,
    model: str | None = None,
    cache_path: str | Path | None = None,
    **client_kwargs: Any,
) -> JudgeScorer:
    """A JudgeScorer from a ready client, or from `base_url` + `model` (+ ChatClient settings);
    `cache_path` opens a DiskCache there."""
    client, cache = client_and_cache("judge", "https://api.openai.com/v1, gpt-4o", client, cache,
                                     base_url, model, cache_path, client_kwargs)
    return JudgeScorer(client, cache, prompt_version)


SCORERS: dict[str, Callable[..., Scorer]] = {
    "step": StepScorer,
    "judge": build_judge,
    "similarity": SimilarityScorer,
}


def build_scorer(name: str, **kwargs: Any) -> Scorer:
    """The scorer `name` ("step", "judge", "similarity", or "package.module:object") built with `kwargs`.

    A dotted object may be a class or factory (called with `kwargs`) or a ready scorer instance.
    """
    if ":" in name:
        obj = load_dotted(name)
        if hasattr(obj, "score_batch") and not isinstance(obj, type):
            if kwargs:
                raise TypeError(f"{name!r} is a scorer instance; it takes no settings, got {sorted(kwargs)}")
            scorer = obj
        elif callable(obj):
            scorer = obj(**kwargs)
        else:
            raise TypeError(f"{name!r} is neither a scorer nor a callable that builds one")
    elif name in SCORERS:
        scorer = SCORERS[name](**kwargs)
    else:
        raise ValueError(f"unknown scorer {name!r}; known: {sorted(SCORERS)} or 'package.module:object'")
    if not callable(getattr(scorer, "score_batch", None)):
        raise TypeError(f"scorer {name!r} has no score_batch(items) method")
    return scorer

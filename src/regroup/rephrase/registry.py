"""`build_rephraser(name, **kwargs)`: the built-in rephrasers by name, or a user's by dotted path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from regroup.net import ChatClient, DiskCache
from regroup.rephrase.base import Rephraser
from regroup.rephrase.dataset import DatasetRephraser
from regroup.rephrase.llm import OpenAIRephraser
from regroup.rephrase.rules import RulesRephraser
from regroup.scorers.registry import load_dotted

_CLIENT_ARGS = (
    "api_key_env", "timeout_s", "max_retries", "backoff_s", "max_backoff_s", "concurrency", "temperature", "max_tokens",
)


def build_openai_rephraser(
    client: ChatClient | None = None,
    cache: DiskCache | None = None,
    prompt_version: str = "v1",
    verifier: Callable[[str, Any], bool] | None = None,
    *,
    base_url: str | None = None,
    model: str | None = None,
    cache_path: str | Path | None = None,
    **client_kwargs: Any,
) -> OpenAIRephraser:
    """An OpenAIRephraser from a ready client, or from `base_url` + `model` (+ ChatClient settings);
    `cache_path` opens a DiskCache there."""
    unknown = set(client_kwargs) - set(_CLIENT_ARGS)
    if unknown:
        raise TypeError(f"unknown rewriter settings {sorted(unknown)}; client settings are {list(_CLIENT_ARGS)}")
    if client is None:
        if not base_url or not model:
            raise ValueError(
                "the openai rewriter needs base_url and model (e.g. https://api.openai.com/v1, gpt-4-turbo)"
            )
        client = ChatClient(base_url, model, **client_kwargs)
    elif base_url or model or client_kwargs:
        raise ValueError("give the rewriter either a client or base_url/model/client settings, not both")
    if cache is None and cache_path is not None:
        cache = DiskCache(cache_path)
    return OpenAIRephraser(client, cache, prompt_version, verifier)


REPHRASERS: dict[str, Callable[..., Rephraser]] = {
    "rules": RulesRephraser,
    "openai": build_openai_rephraser,
    "dataset": DatasetRephraser,
}


def build_rephraser(name: str, **kwargs: Any) -> Rephraser:
    """The rephraser `name` ("rules", "openai", "dataset", or "package.module:object") built with
    `kwargs`; a dotted object may be a class / factory or a ready instance."""
    if ":" in name:
        obj = load_dotted(name)
        if hasattr(obj, "rephrase_many") and not isinstance(obj, type):
            if kwargs:
                raise TypeError(f"{name!r} is a rephraser instance; it takes no settings, got {sorted(kwargs)}")
            rephraser = obj
        elif callable(obj):
            rephraser = obj(**kwargs)
        else:
            raise TypeError(f"{name!r} is neither a rephraser nor a callable that builds one")
    elif name in REPHRASERS:
        rephraser = REPHRASERS[name](**kwargs)
    else:
        raise ValueError(f"unknown rewriter {name!r}; known: {sorted(REPHRASERS)} or 'package.module:object'")
    if not callable(getattr(rephraser, "rephrase_many", None)):
        raise TypeError(f"rewriter {name!r} has no rephrase_many(problems, n) method")
    return rephraser

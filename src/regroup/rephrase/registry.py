"""`build_rephraser(name, **kwargs)`: the built-in rephrasers by name, or a user's by dotted path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from regroup.config.registry import REPHRASERS, build_named
from regroup.net import ChatClient, DiskCache
from regroup.net.build import client_and_cache
from regroup.rephrase.base import Rephraser
from regroup.rephrase.dataset import DatasetRephraser
from regroup.rephrase.llm import OpenAIRephraser
from regroup.rephrase.rules import RulesRephraser


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
    client, cache = client_and_cache(
        "openai rewriter",
        "https://api.openai.com/v1, gpt-4-turbo",
        client,
        cache,
        base_url,
        model,
        cache_path,
        client_kwargs,
    )
    return OpenAIRephraser(client, cache, prompt_version, verifier)


REPHRASERS.register("rules", RulesRephraser)
REPHRASERS.register("openai", build_openai_rephraser)
REPHRASERS.register("dataset", DatasetRephraser)


def build_rephraser(name: str, **kwargs: Any) -> Rephraser:
    """The rephraser `name` ("rules", "openai", "dataset", or "package.module:object") built with
    `kwargs`; a dotted object may be a class / factory or a ready instance."""
    return build_named("rewriter", name, REPHRASERS, "rephrase_many", **kwargs)

"""Building a client + cache from plain settings (config values), shared by the judge and the rewriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regroup.net.cache import DiskCache
from regroup.net.client import ChatClient

CLIENT_ARGS = (
    "api_key_env",
    "timeout_s",
    "max_retries",
    "backoff_s",
    "max_backoff_s",
    "concurrency",
    "temperature",
    "max_tokens",
    "attempt_timeout_s",
    "max_response_bytes",
    "extra_body",
)


def client_and_cache(
    what: str,
    example: str,
    client: ChatClient | None,
    cache: DiskCache | None,
    base_url: str | None,
    model: str | None,
    cache_path: str | Path | None,
    client_kwargs: dict[str, Any],
) -> tuple[ChatClient, DiskCache | None]:
    """A ready client, or one built from `base_url` + `model` (+ ChatClient settings); `cache_path` opens a
    DiskCache there. `what` names the service in errors ("judge", "rewriter"); `example` shows a valid pair."""
    unknown = set(client_kwargs) - set(CLIENT_ARGS)
    if unknown:
        raise TypeError(f"unknown {what} settings {sorted(unknown)}; client settings are {list(CLIENT_ARGS)}")
    if client is None:
        if not base_url or not model:
            raise ValueError(f"the {what} needs base_url and model (e.g. {example})")
        client = ChatClient(base_url, model, **client_kwargs)
    elif base_url or model or client_kwargs:
        raise ValueError(f"give the {what} either a client or base_url/model/client settings, not both")
    if cache is None and cache_path is not None:
        cache = DiskCache(cache_path)
    return client, cache

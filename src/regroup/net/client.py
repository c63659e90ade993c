"""A small OpenAI-compatible chat-completions client, standard library only, shared by judge and rewriter.

Retries with capped exponential backoff and jitter on connection errors, timeouts, HTTP 5xx / 408 /
429 (honouring `Retry-After`), malformed JSON and partial bodies; other 4xx are final. A call that
still fails returns a failed `Result` instead of raising, so a batch of thousands goes on.

The API key is read from the environment variable *named* in the config at each call, and is never
kept on the object: it cannot end up in a repr, a pickle, a config dump, a log line or an error message.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, str]]

# Error kinds recorded in `Result.error_kind` and `ChatClient.stats["errors"]`.
RETRYABLE_KINDS = frozenset({"connection", "timeout", "http_5xx", "http_429", "http_408", "malformed", "partial"})


class MissingAPIKeyError(RuntimeError):
    """The environment variable that should hold the API key is unset or empty."""


@dataclass(frozen=True)
class Result:
    """Outcome of one chat call: `text` when `ok`, else `error` (a message) and `error_kind`."""

    ok: bool
    text: str | None
    error: str | None
    attempts: int
    error_kind: str | None = None


class _AttemptError(Exception):
    """One failed HTTP attempt: its kind, a safe message, and the server's Retry-After if any."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header given in seconds; None when absent or not a number.

    (The HTTP-date form is rare for APIs; it falls back to the client's own backoff.)
    """
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return seconds


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Seconds to sleep before retry number `attempt` (1-based): equal-jitter exponential backoff.

    The nominal delay `min(cap, base · 2^(attempt-1))` is jittered uniformly into [delay/2, delay] so
    that many clients failing together do not retry in lock-step.
    """
    delay = min(cap_s, base_s * (2.0 ** max(0, attempt - 1)))
    return rng.uniform(delay / 2.0, delay)


def _redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced (servers sometimes echo a key in errors)."""
    if secret:
        text = text.replace(secret, "***")
    return text


class ChatClient:
    """OpenAI-compatible `/chat/completions` client with retries, a concurrency bound and counters.

    `base_url` is the API root (e.g. `https://api.openai.com/v1` or a local vLLM `http://host:8000/v1`);
    `api_key_env` names the environment variable holding the key (None: send no Authorization header,
    for local servers). `max_retries` counts retries after the first attempt.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        concurrency: int = 16,
        temperature: float = 0.0,
        max_tokens: int = 1024,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty model name")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError(f"backoff_s and max_backoff_s must be >= 0, got {backoff_s}, {max_backoff_s}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.concurrency = int(concurrency)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._url = (
            self.base_url if self.base_url.endswith("/chat/completions") else self.base_url + "/chat/completions"
        )
        self._opener = urllib.request.build_opener()
        self._slots = threading.BoundedSemaphore(self.concurrency)  # bound across all callers
        self._rng = random.Random()
        self._stats_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._final_failures: Counter[str] = Counter()

    # -- configuration (never the key) -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The client's settings, safe to log or save: names the key's variable, never its value."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "backoff_s": self.backoff_s,
            "max_backoff_s": self.max_backoff_s,
            "concurrency": self.concurrency,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def __repr__(self) -> str:
        return "ChatClient(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def __getstate__(self) -> dict[str, Any]:
        return self.to_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def _api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise MissingAPIKeyError(
                f"environment variable {self.api_key_env} is not set; it must hold the API key for "
                f"{self.base_url} (or set api_key_env to None for a server without authentication)"
            )
        return key

    # -- counters ----------------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """Counters: calls, ok, failures, requests (HTTP attempts), retries, `errors` (every failed
        attempt by kind), `failures_by_kind` (calls that ended failed, by their last error kind) and
        `failure_rate` (failures / calls)."""
        with self._stats_lock:
            calls = self._counts["calls"]
            return {
                "calls": calls,
                "ok": self._counts["ok"],
                "failures": self._counts["failures"],
                "requests": self._counts["requests"],
                "retries": self._counts["retries"],
                "errors": dict(self._errors),
                "failures_by_kind": dict(self._final_failures),
                "failure_rate": (self._counts["failures"] / calls) if calls else 0.0,
            }

    def reset_stats(self) -> None:
        """Zero every counter."""
        with self._stats_lock:
            self._counts.clear()
            self._errors.clear()
            self._final_failures.clear()

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counts[name] += n

    # -- one HTTP attempt --------------------------------------------------------------------------
    def _attempt(self, payload: bytes) -> str:
        key = self._api_key()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self._url, data=payload, headers=headers, method="POST")
        try:
            with self._slots:
                self._count("requests")
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    body = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, key) from None
        except http.client.IncompleteRead as exc:
            got = len(exc.partial)
            raise _AttemptError("partial", f"partial body: got {got} bytes before the connection ended") from None
        except TimeoutError:
            raise _AttemptError("timeout", f"no answer within {self.timeout_s:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _AttemptError("timeout", f"no answer within {self.timeout_s:g} s") from None
            raise _AttemptError("connection", f"connection failed: {_redact(str(exc.reason), key)}") from None
        except (OSError, http.client.HTTPException) as exc:
            # Dropped connections (RemoteDisconnected, resets) and protocol garbage.
            detail = _redact(str(exc), key)
            raise _AttemptError("connection", f"connection failed: {type(exc).__name__}: {detail}") from None
        return self._parse_body(body, key)

    def _http_error(self, exc: urllib.error.HTTPError, key: str | None) -> _AttemptError:
        status = exc.code
        try:
            detail = exc.read(300).decode("utf-8", "replace")
        except Exception:  # the error body itself may be cut short; the status is what matters
            detail = ""
        retry_after = parse_retry_after(exc.headers.get("Retry-After") if exc.headers else None)
        exc.close()
        detail = _redact(" ".join(detail.split()), key)
        message = f"HTTP {status}" + (f": {detail}" if detail else "")
        if status == 429:
            return _AttemptError("http_429", message, retry_after)
        if status == 408:
            return _AttemptError("http_408", message, retry_after)
        if status >= 500:
            return _AttemptError("http_5xx", message, retry_after)
        return _AttemptError("http_4xx", message)

    @staticmethod
    def _parse_body(body: bytes, key: str | None) -> str:
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            snippet = _redact(body[:80].decode("utf-8", "replace"), key)
            raise _AttemptError("malformed", f"response is not valid JSON ({len(body)} bytes): {snippet!r}") from None
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise _AttemptError("malformed", "response JSON has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise _AttemptError("malformed", f"choices[0].message.content is {type(content).__name__}, not a string")
        return content

    # -- public calls ------------------------------------------------------------------------------
    def _payload(self, messages: Messages, temperature: float | None, max_tokens: int | None) -> bytes:
        msgs = [dict(m) for m in messages]
        for i, m in enumerate(msgs):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} must have string 'role' and 'content', got keys {sorted(m)}")
        body = {
            "model": self.model,
            "messages": msgs,
            "temperature": self.temperature if temperature is None else temperature,
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
        }
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    def complete(
        self, messages: Messages, *, temperature: float | None = None, max_tokens: int | None = None
    ) -> Result:
        """Send one chat request, retrying transient faults; returns the reply text or a failure record.

        Raises only for caller errors (malformed `messages`, missing API key variable).
        """
        return self._run(self._payload(messages, temperature, max_tokens))

    def _run(self, payload: bytes) -> Result:
        self._count("calls")
        attempts = 0
        while True:
            attempts += 1
            try:
                text = self._attempt(payload)
            except _AttemptError as err:
                with self._stats_lock:
                    self._errors[err.kind] += 1
                if not err.retryable or attempts > self.max_retries:
                    with self._stats_lock:
                        self._counts["failures"] += 1
                        self._final_failures[err.kind] += 1
                    log.debug("chat call failed after %d attempt(s): %s", attempts, err.message)
                    return Result(False, None, err.message, attempts, err.kind)
                if err.retry_after is not None:
                    # Honour the server's Retry-After, capped so one bad header cannot stall a run.
                    delay = min(err.retry_after, self.max_backoff_s)
                else:
                    delay = backoff_delay(attempts, self.backoff_s, self.max_backoff_s, self._rng)
                self._count("retries")
                log.debug("chat attempt %d failed (%s: %s); retrying in %.2f s", attempts, err.kind, err.message, delay)
                time.sleep(delay)
                continue
            self._count("ok")
            return Result(True, text, None, attempts)

    def complete_many(
        self,
        requests: Sequence[Messages],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        on_result: Callable[[int, Result], None] | None = None,
    ) -> list[Result]:
        """Run `complete` over every message list on a pool of `concurrency` threads; results keep the
        order of `requests`. `on_result(index, result)` is called as each finishes (e.g. a progress bar).
        """
        self._api_key()  # a missing key is a setup error: say so once, before any request is sent
        payloads: list[bytes] = []
        for i, messages in enumerate(requests):
            if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
                raise ValueError(f"request {i} must be a list of messages, got {type(messages).__name__}")
            payloads.append(self._payload(messages, temperature, max_tokens))
        if not payloads:
            return []

        def run(i: int) -> Result:
            result = self._run(payloads[i])
            if on_result is not None:
                on_result(i, result)
            return result

        workers = min(self.concurrency, len(requests))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="regroup-chat") as pool:
            return list(pool.map(run, range(len(requests))))

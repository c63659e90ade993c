"""A small OpenAI-compatible chat-completions client on httpx2, shared by judge and rewriter.

httpx2, not classic httpx: it is httpx's next major line and the core install already brings it
(huggingface_hub requires it), so the project carries one HTTP stack, not two. Retries are tenacity's.

Retries with capped exponential backoff and jitter on connection errors, timeouts, HTTP 5xx / 408 /
429 (honouring `Retry-After`, capped), malformed JSON and partial bodies; other 4xx are final. A call
that still fails returns a failed `Result` instead of raising, so a batch of thousands goes on.

Bounds: `timeout_s` is ONE deadline for the whole call (every attempt, backoff and Retry-After wait
included). Each attempt is a task on the network loop (`regroup.net.loop`), cancelled when its deadline
passes wherever it waits (a free connection, connect, TLS, headers, body), so a server trickling one byte
at a time cannot hold a call longer; httpx's own timeouts bound each read, not a call, and are off.
`attempt_timeout_s` (default: the same) caps a single attempt, so a hung attempt can leave time for a
retry. Redirects are not followed. A reply over `max_response_bytes` is refused unread (hand-written:
httpx has no size cap; `Accept-Encoding: identity`, so what is counted is what is parsed).

The API key is read from the environment variable *named* in the config at each call, and is never
kept on the object: it cannot end up in a repr, a pickle or a config dump. Everything a server sends
back (reply text, error bodies) passes through `regroup.net.redact` before anyone sees it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import ssl
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import tenacity

from regroup.net.loop import run_sync
from regroup.net.redact import check_key_env_name, clip, redact, remember_secret

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, str]]

# Error kinds recorded in `Result.error_kind` and `ChatClient.stats["errors"]`. "deadline" (the call's
# total deadline ran out) and "oversize" (reply over max_response_bytes) are final.
RETRYABLE_KINDS = frozenset({"connection", "timeout", "http_5xx", "http_429", "http_408", "malformed", "partial"})
# Counters `pop_counts()` returns (events since the previous pop), for per-step logging.
EVENT_COUNTS = (
    "calls",
    "ok",
    "failures",
    "retries",
    "retry_after_waits",
    "retry_after_capped",
    "deadline_hits",
    "oversize",
)
ERROR_BODY_BYTES = 64 * 1024  # read this much of an error body (then redact, then cut to ERROR_CHARS)
ERROR_CHARS = 300
SNIPPET_CHARS = 80
# Sent with every request: no compressed reply, so the size cap counts the bytes that are parsed.
BASE_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}


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


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _AttemptError) and exc.retryable


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


# -- one HTTP exchange, shared by ChatClient and request_json ------------------------------------------


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process for every pool: building one loads the system's certificates (~0.2 s)."""
    return httpx2.create_ssl_context()


def _new_http(max_connections: int | None = None) -> httpx2.AsyncClient:
    """A connection pool that follows no redirect (a POST's key would go along to another address) and has
    no timeout of its own: the caller's deadline cancels the request. Used on the network loop only."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx2.AsyncClient(verify=_tls(), timeout=None, follow_redirects=False, limits=limits)


def _close_later(http: httpx2.AsyncClient, loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """Close a pool that is no longer used, on the loop it was made on (not in a forked child)."""
    if os.getpid() == pid and loop.is_running():
        asyncio.run_coroutine_threadsafe(http.aclose(), loop)


def redirect_refusal(status: int, location: str, key: str | None, fix: str) -> str:
    """The one line for a 3xx, which is never followed: the status, the new address (redacted, cut), why it
    is not followed, and `fix` (what to set instead)."""
    where = clip(location, ERROR_CHARS, [key])
    return (
        f"HTTP {status} redirect to {where or 'another address'}: redirects are not followed "
        f"(the API key would go along); {fix}"
    )


async def _status_error(response: httpx2.Response, key: str | None, fix: str) -> _AttemptError:
    """The error for a reply that is not 2xx: its status, the start of its body (redacted), Retry-After."""
    status = response.status_code
    if 300 <= status < 400:
        return _AttemptError("http_4xx", redirect_refusal(status, response.headers.get("Location", ""), key, fix))
    raw = b""
    try:
        async for chunk in response.aiter_raw():
            raw += chunk
            if len(raw) >= ERROR_BODY_BYTES:
                break
    except httpx2.HTTPError:  # the error body itself may be cut short; the status is what matters
        pass
    detail = clip(" ".join(raw[:ERROR_BODY_BYTES].decode("utf-8", "replace").split()), ERROR_CHARS, [key])
    message = f"HTTP {status}" + (f": {detail}" if detail else "")
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if status == 429:
        return _AttemptError("http_429", message, retry_after)
    if status == 408:
        return _AttemptError("http_408", message, retry_after)
    if status >= 500:
        return _AttemptError("http_5xx", message, retry_after)
    return _AttemptError("http_4xx", message)


async def _read_capped(response: httpx2.Response, cap: int) -> bytes:
    """The whole body, refusing one over `cap` bytes (announced or actually sent)."""
    announced = response.headers.get("Content-Length", "").strip()
    expected = int(announced) if announced.isdigit() else None
    if expected is not None and expected > cap:
        raise _AttemptError("oversize", f"reply of {expected} bytes is over the {cap}-byte limit")
    chunks: list[bytes] = []
    got = 0
    cut = False
    try:
        async for chunk in response.aiter_raw():
            got += len(chunk)
            if got > cap:
                raise _AttemptError("oversize", f"reply is over the {cap}-byte limit")
            chunks.append(chunk)
    except httpx2.TransportError:  # the connection ended inside the body
        cut = True
    if cut or (expected is not None and got < expected):
        of = f" of {expected}" if expected is not None else ""
        raise _AttemptError("partial", f"partial body: got {got}{of} bytes before the connection ended")
    return b"".join(chunks)


async def _exchange(
    http: httpx2.AsyncClient,
    method: str,
    url: str,
    data: bytes | None,
    headers: dict[str, str],
    key: str | None,
    cap: int,
    fix: str,
) -> bytes:
    """One request and its whole 2xx body; every failure is an `_AttemptError` of its kind."""
    try:
        async with http.stream(method, url, content=data, headers=headers) as response:
            if not response.is_success:
                raise await _status_error(response, key, fix)
            return await _read_capped(response, cap)
    except httpx2.HTTPError as exc:  # refused, dropped before a reply, protocol garbage: never a crash
        raise _AttemptError("connection", f"connection failed: {redact(_reason(exc), [key])}") from None


def _reason(exc: BaseException) -> str:
    """What went wrong, with the innermost cause httpx wrapped: "All connection attempts failed" alone does
    not say that the connection was refused."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    root = exc
    for _ in range(8):  # httpx -> httpcore -> anyio -> the OS error, chained as cause or context
        inner = root.__cause__ or root.__context__
        if inner is None:
            break
        root = inner
    if getattr(root, "exceptions", None):  # an exception group: one failure per address tried
        root = root.exceptions[0]  # type: ignore[attr-defined]
    return text if root is exc or str(root) in text else f"{text} ({type(root).__name__}: {root})"


def _parse_body(body: bytes, key: str | None) -> str:
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        snippet = clip(body.decode("utf-8", "replace"), SNIPPET_CHARS, [key])  # redacted before it is cut
        raise _AttemptError("malformed", f"response is not valid JSON ({len(body)} bytes): {snippet!r}") from None
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _AttemptError("malformed", "response JSON has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise _AttemptError("malformed", f"choices[0].message.content is {type(content).__name__}, not a string")
    return redact(content, [key])  # a reply quoting the key must not carry it into a cache


class ChatClient:
    """OpenAI-compatible `/chat/completions` client with retries, deadlines, a concurrency bound and counters.

    `base_url` is the API root (e.g. `https://api.openai.com/v1` or a local vLLM `http://host:8000/v1`);
    `api_key_env` names the environment variable holding the key (None or "": send no Authorization
    header, for local servers). `extra_body` is merged into every request body: server-specific options
    such as a `response_format` JSON schema, or vLLM's `structured_outputs`. `max_retries` counts retries
    after the first attempt. `timeout_s` is the total deadline of one call, retries included;
    `attempt_timeout_s` (None: `timeout_s`) bounds one attempt.
    `max_backoff_s` caps both the backoff and a server's `Retry-After`. `max_response_bytes` caps a reply.
    `max_tokens` None (default) sends none: the server's own limit. vLLM refuses a request whose
    max_tokens exceeds its max_model_len (HTTP 400: measured with 1024 against a 512-token SmolLM2 server,
    which failed every judge and rewriter request); it caps a smaller one to what the context leaves.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        concurrency: int = 16,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        attempt_timeout_s: float | None = None,
        max_response_bytes: int = 4 * 1024 * 1024,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty model name")
        api_key_env = api_key_env or None  # "" like None: a server without authentication, no header sent
        check_key_env_name(api_key_env, "api_key_env")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if attempt_timeout_s is not None and not attempt_timeout_s > 0:
            raise ValueError(f"attempt_timeout_s must be > 0, got {attempt_timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError(f"backoff_s and max_backoff_s must be >= 0, got {backoff_s}, {max_backoff_s}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (or None: not sent), got {max_tokens}")
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.attempt_timeout_s = None if attempt_timeout_s is None else float(attempt_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.concurrency = int(concurrency)
        self.temperature = float(temperature)
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.max_response_bytes = int(max_response_bytes)
        reserved = {"model", "messages"} & set(extra_body or {})
        if reserved:
            raise ValueError(f"extra_body may not set {sorted(reserved)}: they come from the call")
        self.extra_body = json.loads(json.dumps(dict(extra_body or {})))  # a plain-JSON copy (fails early if not)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._url = (
            self.base_url if self.base_url.endswith("/chat/completions") else self.base_url + "/chat/completions"
        )
        self._http = _new_http(self.concurrency)  # made here, not on the loop (where it is used): no wait there
        self._http_pid = os.getpid()
        self._http_closer: weakref.finalize | None = None
        self._rng = random.Random()
        self._stats_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._since_pop: Counter[str] = Counter()
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
            "attempt_timeout_s": self.attempt_timeout_s,
            "max_retries": self.max_retries,
            "backoff_s": self.backoff_s,
            "max_backoff_s": self.max_backoff_s,
            "concurrency": self.concurrency,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "max_response_bytes": self.max_response_bytes,
            "extra_body": self.extra_body,
        }

    def __repr__(self) -> str:
        return "ChatClient(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def __getstate__(self) -> dict[str, Any]:
        return self.to_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("extra_body", {})
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
        remember_secret(key)  # so every later redact() in this process removes it, wherever text goes
        return key

    # -- counters ----------------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """Counters since creation: calls, ok, failures, requests (HTTP attempts), retries,
        retry_after_waits (retries that waited a server's Retry-After), retry_after_capped (of those,
        waits cut to max_backoff_s), deadline_hits (calls ended by their total deadline), oversize
        (replies over max_response_bytes), `errors` (every failed attempt by kind), `failures_by_kind`
        (calls that ended failed, by their last error kind) and `failure_rate` (failures / calls)."""
        with self._stats_lock:
            calls = self._counts["calls"]
            out: dict[str, Any] = {name: self._counts[name] for name in ("calls", "ok", "failures", "requests")}
            out.update({name: self._counts[name] for name in EVENT_COUNTS if name not in out})
            out.update(
                {
                    "errors": dict(self._errors),
                    "failures_by_kind": dict(self._final_failures),
                    "failure_rate": (self._counts["failures"] / calls) if calls else 0.0,
                }
            )
            return out

    def pop_counts(self) -> dict[str, int]:
        """Events since the previous `pop_counts` (calls, ok, failures, requests, retries, retry_after_waits,
        retry_after_capped, deadline_hits, oversize), then zero them: one call per training step."""
        with self._stats_lock:
            out = {name: self._since_pop[name] for name in ("requests", *EVENT_COUNTS)}
            self._since_pop.clear()
            return out

    def reset_stats(self) -> None:
        """Zero every counter."""
        with self._stats_lock:
            self._counts.clear()
            self._since_pop.clear()
            self._errors.clear()
            self._final_failures.clear()

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counts[name] += n
            self._since_pop[name] += n

    # -- one call: attempts retried by tenacity within the deadline ---------------------------------
    def _http_client(self) -> httpx2.AsyncClient:
        """This client's connection pool, `concurrency` connections at most across all callers (on the network
        loop; a forked child makes its own: the parent's connections are not its to use)."""
        if self._http_pid != os.getpid():
            self._http, self._http_pid, self._http_closer = _new_http(self.concurrency), os.getpid(), None
        if self._http_closer is None:
            loop = asyncio.get_running_loop()
            self._http_closer = weakref.finalize(self, _close_later, self._http, loop, os.getpid())
            self._http_closer.atexit = False
        return self._http

    async def _call(self, payload: bytes) -> Result:
        self._count("calls")
        deadline = time.monotonic() + self.timeout_s
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(_retryable),
            stop=tenacity.stop_after_attempt(self.max_retries + 1) | tenacity.stop_before_delay(self.timeout_s),
            wait=self._wait,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            text: str = await retrying(self._attempt, payload, deadline)
        except _AttemptError as err:  # final: not retryable, no retry left, or no time left to wait for one
            attempts = retrying.statistics["attempt_number"]
            kind, message = err.kind, err.message
            if err.retryable and attempts <= self.max_retries:
                kind = "deadline"
                message = f"{err.message}; no time left to retry within the {self.timeout_s:g} s deadline"
            if kind == "deadline":
                self._count("deadline_hits")
            return self._fail(kind, message, attempts)
        self._count("ok")
        return Result(True, text, None, retrying.statistics["attempt_number"])

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Seconds before the next attempt: the server's Retry-After (capped at max_backoff_s, counted), else
        the jittered backoff. tenacity asks before it checks the deadline, as the counts expect."""
        err = state.outcome.exception() if state.outcome is not None else None
        if state.attempt_number > self.max_retries or not isinstance(err, _AttemptError):
            return 0.0  # no retry follows: nothing to wait for, nothing to count
        if err.retry_after is not None:
            self._count("retry_after_waits")
            if err.retry_after > self.max_backoff_s:
                self._count("retry_after_capped")
            return min(err.retry_after, self.max_backoff_s)
        return backoff_delay(state.attempt_number, self.backoff_s, self.max_backoff_s, self._rng)

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        self._count("retries")
        err = state.outcome.exception() if state.outcome is not None else None
        log.debug("chat attempt %d failed (%s); retrying in %.2f s", state.attempt_number, err, state.upcoming_sleep)

    async def _attempt(self, payload: bytes, deadline: float) -> str:
        """One HTTP attempt within its own limit and the call's deadline; every failure counted by kind."""
        try:
            return await self._timed_attempt(payload, deadline)
        except _AttemptError as err:
            with self._stats_lock:
                self._errors[err.kind] += 1
            if err.kind == "oversize":
                self._count("oversize")
            raise

    async def _timed_attempt(self, payload: bytes, deadline: float) -> str:
        key = self._api_key()
        now = time.monotonic()
        if now >= deadline:
            raise _AttemptError("deadline", f"no complete answer within the {self.timeout_s:g} s deadline")
        per_attempt = self.attempt_timeout_s if self.attempt_timeout_s is not None else self.timeout_s
        attempt_deadline = min(deadline, now + per_attempt)
        headers = {**BASE_HEADERS, "Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._count("requests")
        fix = "set base_url to the final address"
        exchange = _exchange(
            self._http_client(), "POST", self._url, payload, headers, key, self.max_response_bytes, fix
        )
        try:
            body = await asyncio.wait_for(exchange, attempt_deadline - now)
        except asyncio.TimeoutError:
            if attempt_deadline >= deadline:  # cut by the call's deadline, not just this attempt's
                raise _AttemptError(
                    "deadline", f"no complete answer within the {self.timeout_s:g} s deadline"
                ) from None
            raise _AttemptError("timeout", f"no complete answer within {per_attempt:g} s") from None
        return _parse_body(body, key)

    # -- public calls ------------------------------------------------------------------------------
    def _payload(
        self,
        messages: Messages,
        temperature: float | None,
        max_tokens: int | None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> bytes:
        msgs = [dict(m) for m in messages]
        for i, m in enumerate(msgs):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} must have string 'role' and 'content', got keys {sorted(m)}")
        body = {
            "model": self.model,
            "messages": msgs,
            "temperature": self.temperature if temperature is None else temperature,
        }
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit is not None:  # unset: the server's own limit (vLLM refuses one over its max_model_len)
            body["max_tokens"] = limit
        body.update(self.extra_body)
        body.update(extra_body or {})
        if {"model", "messages"} & set(extra_body or {}):
            raise ValueError("extra_body may not set model or messages: they come from the call")
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    def complete(
        self,
        messages: Messages,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Result:
        """Send one chat request, retrying transient faults within `timeout_s` in all; returns the reply
        text or a failure record. `extra_body` adds request fields for this call (over the client's own).
        Raises only for caller errors (malformed `messages`, missing API key)."""
        return run_sync(self._call(self._payload(messages, temperature, max_tokens, extra_body)))

    def _fail(self, kind: str, message: str, attempts: int) -> Result:
        with self._stats_lock:
            self._counts["failures"] += 1
            self._since_pop["failures"] += 1
            self._final_failures[kind] += 1
        log.debug("chat call failed after %d attempt(s): %s", attempts, message)
        return Result(False, None, message, attempts, kind)

    def complete_many(
        self,
        requests: Sequence[Messages],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        on_result: Callable[[int, Result], None] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> list[Result]:
        """Run `complete` over every message list, `concurrency` at a time (a call's deadline starts when it
        does); results keep the order of `requests`. `on_result(index, result)` is called as each finishes
        (e.g. a progress bar).
        """
        self._api_key()  # a missing key is a setup error: say so once, before any request is sent
        payloads: list[bytes] = []
        for i, messages in enumerate(requests):
            if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
                raise ValueError(f"request {i} must be a list of messages, got {type(messages).__name__}")
            payloads.append(self._payload(messages, temperature, max_tokens, extra_body))
        if not payloads:
            return []

        return run_sync(self._call_many(payloads, on_result))

    async def _call_many(self, payloads: list[bytes], on_result: Callable[[int, Result], None] | None) -> list[Result]:
        """`concurrency` workers on the network loop, each taking the next request when its call ends."""
        results: list[tuple[int, Result]] = []
        todo = iter(range(len(payloads)))

        async def worker() -> None:
            for i in todo:  # one iterator shared by the workers: each request is taken once
                result = await self._call(payloads[i])
                results.append((i, result))
                if on_result is not None:
                    on_result(i, result)

        await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(payloads)))))
        return [result for _, result in sorted(results, key=lambda pair: pair[0])]


class RequestError(RuntimeError):
    """One JSON request (`request_json`) failed: the server is down, answered an error, or ran past the deadline."""


_shared_http: tuple[int, httpx2.AsyncClient] | None = None  # request_json's pool: (pid, pool)


def _request_http() -> httpx2.AsyncClient:
    """request_json's connection pool, one per process (used on the network loop)."""
    global _shared_http
    if _shared_http is None or _shared_http[0] != os.getpid():
        _shared_http = (os.getpid(), _new_http())
    return _shared_http[1]


async def _request(
    url: str, data: bytes | None, headers: dict[str, str], key: str | None, timeout_s: float, cap: int
) -> bytes:
    method = "GET" if data is None else "POST"
    exchange = _exchange(_request_http(), method, url, data, headers, key, cap, "use the final address")
    try:
        return await asyncio.wait_for(exchange, timeout_s)
    except asyncio.TimeoutError:
        raise RequestError(f"{url}: no complete answer within the {timeout_s:g} s deadline") from None
    except _AttemptError as err:
        raise RequestError(f"{url}: {err.message}") from None


def request_json(
    url: str,
    body: Any = None,
    *,
    api_key: str | None = None,
    timeout_s: float = 60.0,
    max_response_bytes: int = 64 * 1024 * 1024,
) -> Any:
    """POST `body` as JSON to `url` (GET when `body` is None) and return the decoded JSON reply (None for an
    empty one), within ONE deadline of `timeout_s` kept as `ChatClient` keeps it (a server that trickles
    bytes cannot hold it longer). No retries: the caller (a rollout step) fails fast.

    Raises `RequestError` with one line naming the URL and what went wrong (connection refused, HTTP
    status with the server's detail, deadline, bad JSON, a reply over `max_response_bytes`); the key is
    redacted from anything quoted. Redirects are refused, as `ChatClient` refuses them: the key is never
    sent to the new address.
    """
    data = None if body is None else json.dumps(body).encode("utf-8")
    headers = dict(BASE_HEADERS)
    if data is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
        remember_secret(api_key)
    _request_http()  # made here on first use, not on the loop
    raw = run_sync(_request(url, data, headers, api_key, timeout_s, max_response_bytes))
    if not raw.strip():
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RequestError(
            f"{url}: reply is not JSON: {clip(raw.decode('utf-8', 'replace'), SNIPPET_CHARS, [api_key])!r}"
        ) from None

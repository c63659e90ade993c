"""A small OpenAI-compatible chat-completions client on httpcore2 (httpx2's HTTP core), shared by judge and rewriter.

Hand-written: the call-wide deadline and size cap (httpcore has neither), the retry loop (tenacity: a hook per counter).

Retries with capped exponential backoff and jitter on connection errors, timeouts, HTTP 5xx / 408 /
429 (honouring `Retry-After`, capped), malformed JSON and partial bodies; other 4xx are final. A call
that still fails returns a failed `Result` instead of raising, so a batch of thousands goes on.

Bounds: `timeout_s` is ONE deadline for the whole call (every attempt, backoff and Retry-After wait
included): every socket operation of an attempt (connect, TLS, each read and write) ends by the attempt's
deadline, so a server trickling one byte at a time cannot hold a call longer. An attempt runs in the
calling thread and is over when it returns: nothing of it reaches the server after the call.
`attempt_timeout_s` (default: the same) caps a single attempt, so a hung attempt can leave time for a
retry. A reply over `max_response_bytes` is refused unread. Redirects are not followed. Proxies: as urllib
read them (http_proxy, https_proxy, no_proxy), when the client is made.

The API key is read from the environment variable *named* in the config at each call, and is never
kept on the object: it cannot end up in a repr, a pickle or a config dump. A value no header can carry (a
line break from a Windows .env file, a non-ASCII character) is refused as a missing one is, before any
request. A `base_url` with a user name or password, a query or a fragment is refused when the client is made.
Everything a server sends back (reply text, error bodies) passes through `regroup.net.redact` before anyone
sees it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import ssl
import threading
import time
import urllib.parse
import urllib.request
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# httpx2's transport layer, used directly: httpx2.Client's request and response models, cookie jar and hooks
# took ~700 more Python calls per request (measured at 64 concurrent calls).
import httpcore2

from regroup.config.fields import address_problem, without_user_info
from regroup.errors import ConfigError
from regroup.net.redact import KEY_FIX, check_key_env_name, clip, key_value_problem, redact, remember_secret

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
# Sent with every request: no compressed reply (the size cap counts the bytes that are parsed).
BASE_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity", "User-Agent": "regroup"}


class MissingAPIKeyError(RuntimeError):
    """The environment variable that should hold the API key is unset or empty, or holds a value no HTTP header can
    carry (a line break, a non-ASCII character): a setup error, raised before any request is sent."""


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


# -- httpcore, every socket operation bound to one deadline ------------------------------------------


class _Clock(httpcore2.SyncBackend):
    """httpcore's socket backend, every operation (connect, TLS handshake, each read and write) ending by `at`,
    the deadline of the one attempt using it: httpcore gives each read the same timeout, which a server
    trickling a byte per read never trips. No operation outlives the deadline, and none starts past it."""

    at = math.inf

    def left(self, timeout: float | None, expired: type[Exception]) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired("the deadline has passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        left = self.left(timeout, httpcore2.ConnectTimeout)
        return _Stream(super().connect_tcp(host, port, left, local_address, socket_options), self)


class _Stream(httpcore2.NetworkStream):
    """A socket stream of `_Clock`: each operation waits at most what is left of the clock's deadline."""

    def __init__(self, inner: httpcore2.NetworkStream, clock: _Clock) -> None:
        self._inner, self._clock = inner, clock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._clock.left(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for i in range(0, len(buffer), 1 << 16):  # the deadline is read again for each 64 KiB
            self._inner.write(buffer[i : i + (1 << 16)], self._clock.left(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        left = self._clock.left(timeout, httpcore2.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left), self._clock)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


@functools.cache
def _tls() -> ssl.SSLContext:
    """The certificates urllib trusted (the system's, or SSL_CERT_FILE / SSL_CERT_DIR), loaded once per process."""
    return ssl.create_default_context()


def _proxy_for(url: str) -> httpcore2.Proxy | None:
    """The proxy urllib used for `url`: http_proxy / https_proxy (either case) unless no_proxy names its host,
    read by urllib's own `getproxies` and `proxy_bypass`; a user and password in the proxy's address become
    its Basic Proxy-Authorization, as urllib sent them."""
    target = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(target.scheme)
    if not proxy or urllib.request.proxy_bypass(target.netloc.rpartition("@")[2]):
        return None
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    auth = None
    if parts.username and parts.password:
        auth = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password))
    return httpcore2.Proxy(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl(), auth=auth)


class _Connections:
    """Keep-alive connections to one address, each in a one-connection httpcore pool lent to one attempt at a
    time: one pool for all would scan every connection under its lock at each request and release, which at
    64 concurrent calls costs more than the HTTP itself. A forked child starts without its parent's."""

    def __init__(self, url: str) -> None:
        self._target = httpcore2.URL(url)  # parsed once, not at every request
        self._proxy = _proxy_for(url)
        self._tls = _tls() if url.startswith("https:") else None  # http: no certificates to load (~30 ms)
        self._idle: list[tuple[httpcore2.ConnectionPool, _Clock]] = []
        self._pid = os.getpid()
        weakref.finalize(self, _close_all, self._idle)

    def exchange(
        self, method: str, data: bytes | None, headers: dict[str, str], deadline: float, cap: int
    ) -> tuple[int, dict[str, str], bytes]:
        """One request, every socket operation ending by `deadline`: status, headers (names in lower case) and
        body (of a 2xx: whole, at most `cap` bytes). Returns when the exchange is over, its connection back in
        the pool after a whole reply or closed (on any error, or a body left unread): nothing is sent later."""
        if self._pid != os.getpid():
            self._idle.clear()  # the parent's sockets: never written to from here (they close with the objects)
            self._pid = os.getpid()
        try:
            pool, clock = self._idle.pop()
        except IndexError:
            clock = _Clock()
            # An idle connection is dropped after 4 s, before uvicorn (vLLM's server) closes it at 5 s: a request
            # sent as the server closes would fail and cost a retry.
            pool = httpcore2.ConnectionPool(
                ssl_context=self._tls, proxy=self._proxy, max_connections=1, keepalive_expiry=4.0, network_backend=clock
            )
        clock.at = deadline
        try:
            with pool.stream(method, self._target, headers=list(headers.items()), content=data) as response:
                head = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
                if 200 <= response.status < 300:
                    return response.status, head, _read_capped(response, head, cap)
                return response.status, head, _error_body(response)
        finally:
            self._idle.append((pool, clock))

    def __enter__(self) -> _Connections:
        return self

    def __exit__(self, *exc: object) -> None:
        _close_all(self._idle)


def _close_all(idle: list[tuple[httpcore2.ConnectionPool, _Clock]]) -> None:
    while idle:
        idle.pop()[0].close()


def _read_capped(response: httpcore2.Response, head: dict[str, str], cap: int) -> bytes:
    """The whole body, refusing one over `cap` bytes (announced or actually sent)."""
    announced = head.get("content-length", "").strip()
    expected = int(announced) if announced.isdigit() else None
    if expected is not None and expected > cap:
        raise _AttemptError("oversize", f"reply of {expected} bytes is over the {cap}-byte limit")
    chunks: list[bytes] = []
    got = 0
    try:
        for chunk in response.iter_stream():
            got += len(chunk)
            if got > cap:
                raise _AttemptError("oversize", f"reply is over the {cap}-byte limit")
            chunks.append(chunk)
    except httpcore2.RemoteProtocolError:  # the connection ended inside the body
        of = f" of {expected}" if expected is not None else ""
        raise _AttemptError("partial", f"partial body: got {got}{of} bytes before the connection ended") from None
    return b"".join(chunks)


def _error_body(response: httpcore2.Response) -> bytes:
    """The first ERROR_BODY_BYTES of an error reply's body, best effort: the status is what matters."""
    raw = b""
    with contextlib.suppress(httpcore2.NetworkError, httpcore2.ProtocolError):  # not a timeout: that ends the call
        for chunk in response.iter_stream():
            raw += chunk
            if len(raw) >= ERROR_BODY_BYTES:
                break
    return raw[:ERROR_BODY_BYTES]


def _reason(exc: BaseException, key: str | None) -> str:
    """A transport failure: the OS error ("[Errno 111] Connection refused") or the protocol failure, named."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpcore2.RemoteProtocolError):
        text = f"{type(exc).__name__}: {text}"
    return redact(text, [key])


def _http_message(status: int, head: dict[str, str], body: bytes, key: str | None, fix: str) -> str:
    """The one line for a reply that is not a 2xx: the status and the server's detail (redacted, then cut); for
    a 3xx, which is never followed, the new address, why it is not followed, and `fix` (what to set instead)."""
    if 300 <= status < 400:
        where = clip(head.get("location", ""), ERROR_CHARS, [key])
        return (
            f"HTTP {status} redirect to {where or 'another address'}: redirects are not followed "
            f"(the API key would go along); {fix}"
        )
    detail = clip(" ".join(body.decode("utf-8", "replace").split()), ERROR_CHARS, [key])
    return f"HTTP {status}" + (f": {detail}" if detail else "")


class ChatClient:
    """OpenAI-compatible `/chat/completions` client with retries, deadlines, a concurrency bound and counters.

    `base_url` is the API root (e.g. `https://api.openai.com/v1` or a local vLLM `http://host:8000/v1`), without
    `user:pass@`, query or fragment (a `ConfigError` that never prints them);
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
        if isinstance(base_url, str) and (problem := address_problem(base_url)):
            raise ConfigError(f"base_url: {problem}")  # before anything keeps it: its password never reaches a repr
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty model name")
        api_key_env = api_key_env or None  # "" like None: a server without authentication, no header sent
        check_key_env_name(api_key_env, "api_key_env")
        api_key_env = api_key_env or None  # "" means no authentication, as None does
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
        self._connections = _Connections(self._url)
        self._slots = threading.BoundedSemaphore(self.concurrency)  # bound across all callers
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
        if problem := key_value_problem(key):  # httpcore would refuse the header at every attempt, each one retried
            raise MissingAPIKeyError(f"environment variable {self.api_key_env} {problem} ({KEY_FIX})")
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

    # -- one HTTP attempt --------------------------------------------------------------------------
    def _attempt(self, payload: bytes, deadline: float) -> str:
        key = self._api_key()
        now = time.monotonic()
        if now >= deadline:
            raise _AttemptError("deadline", f"no complete answer within the {self.timeout_s:g} s deadline")
        per_attempt = self.attempt_timeout_s if self.attempt_timeout_s is not None else self.timeout_s
        attempt_deadline = min(deadline, now + per_attempt)
        ends_call = attempt_deadline >= deadline  # cut by the call's deadline, not just this attempt's
        headers = {**BASE_HEADERS, "Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if not self._slots.acquire(timeout=attempt_deadline - now):
            raise self._expired(ends_call, per_attempt, "waiting for a free connection")
        try:
            self._count("requests")
            cap = self.max_response_bytes
            status, head, body = self._connections.exchange("POST", payload, headers, attempt_deadline, cap)
        except Exception as exc:  # every transport failure becomes a kind, never a crash
            if isinstance(exc, httpcore2.TimeoutException) or time.monotonic() >= attempt_deadline:
                raise self._expired(ends_call, per_attempt) from None
            if isinstance(exc, _AttemptError):  # oversize, or a body cut short by the server
                raise
            raise _AttemptError("connection", f"connection failed: {_reason(exc, key)}") from None
        finally:
            self._slots.release()
        if not 200 <= status < 300:
            raise self._http_error(status, head, body, key)
        return self._parse_body(body, key)

    def _expired(self, ends_call: bool, per_attempt: float, where: str = "") -> _AttemptError:
        during = f" ({where})" if where else ""
        if ends_call:
            return _AttemptError("deadline", f"no complete answer within the {self.timeout_s:g} s deadline{during}")
        return _AttemptError("timeout", f"no complete answer within {per_attempt:g} s{during}")

    @staticmethod
    def _http_error(status: int, head: dict[str, str], body: bytes, key: str | None) -> _AttemptError:
        message = _http_message(status, head, body, key, "set base_url to the final address")
        kind = {429: "http_429", 408: "http_408"}.get(status, "http_5xx" if status >= 500 else "http_4xx")
        return _AttemptError(kind, message, None if kind == "http_4xx" else parse_retry_after(head.get("retry-after")))

    @staticmethod
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
        return self._run(self._payload(messages, temperature, max_tokens, extra_body))

    def _fail(self, kind: str, message: str, attempts: int) -> Result:
        with self._stats_lock:
            self._counts["failures"] += 1
            self._since_pop["failures"] += 1
            self._final_failures[kind] += 1
        log.debug("chat call failed after %d attempt(s): %s", attempts, message)
        return Result(False, None, message, attempts, kind)

    def _run(self, payload: bytes) -> Result:
        self._count("calls")
        deadline = time.monotonic() + self.timeout_s
        attempts = 0
        while True:
            attempts += 1
            try:
                text = self._attempt(payload, deadline)
            except _AttemptError as err:
                with self._stats_lock:
                    self._errors[err.kind] += 1
                if err.kind == "deadline":
                    self._count("deadline_hits")
                    return self._fail(err.kind, err.message, attempts)
                if err.kind == "oversize":
                    self._count("oversize")
                if not err.retryable or attempts > self.max_retries:
                    return self._fail(err.kind, err.message, attempts)
                if err.retry_after is not None:
                    # Honour the server's Retry-After, capped so one bad header cannot stall a run.
                    delay = min(err.retry_after, self.max_backoff_s)
                    self._count("retry_after_waits")
                    if err.retry_after > self.max_backoff_s:
                        self._count("retry_after_capped")
                else:
                    delay = backoff_delay(attempts, self.backoff_s, self.max_backoff_s, self._rng)
                if time.monotonic() + delay >= deadline:
                    self._count("deadline_hits")
                    message = f"{err.message}; no time left to retry within the {self.timeout_s:g} s deadline"
                    return self._fail("deadline", message, attempts)
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
        extra_body: Mapping[str, Any] | None = None,
    ) -> list[Result]:
        """Run `complete` over every message list on a pool of `concurrency` threads; results keep the
        order of `requests`. `on_result(index, result)` is called as each finishes (e.g. a progress bar).
        """
        self._api_key()  # a missing key is a setup error: say so once, before any request is sent
        payloads: list[bytes] = []
        for i, messages in enumerate(requests):
            if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
                raise ValueError(f"request {i} must be a list of messages, got {type(messages).__name__}")
            payloads.append(self._payload(messages, temperature, max_tokens, extra_body))
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


class RequestError(RuntimeError):
    """One JSON request (`request_json`) failed: the server is down, answered an error, or ran past the deadline."""


def request_json(
    url: str,
    body: Any = None,
    *,
    api_key: str | None = None,
    timeout_s: float = 60.0,
    max_response_bytes: int = 64 * 1024 * 1024,
) -> Any:
    """POST `body` as JSON to `url` (GET when `body` is None) and return the decoded JSON reply (None for an
    empty one), within ONE deadline of `timeout_s` enforced as in `ChatClient` (a server
    that trickles bytes cannot hold it longer). No retries: the caller (a rollout step) fails fast.

    Raises `RequestError` with one line naming the URL and what went wrong (connection refused, HTTP
    status with the server's detail, deadline, bad JSON); the key is redacted from anything quoted.
    Redirects are refused, as `ChatClient` refuses them: the key is never sent to the new address.
    """
    if problem := address_problem(url):
        raise RequestError(f"{without_user_info(url)}: {problem}")
    if api_key and (problem := key_value_problem(api_key)):
        raise RequestError(f"{url}: the API key {problem} ({KEY_FIX})")
    data = None if body is None else json.dumps(body).encode("utf-8")
    headers = dict(BASE_HEADERS)
    if data is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
        remember_secret(api_key)
    deadline = time.monotonic() + timeout_s
    method = "GET" if data is None else "POST"
    try:
        with _Connections(url) as connections:  # one connection for one call: the vLLM server backend makes few
            status, head, raw = connections.exchange(method, data, headers, deadline, max_response_bytes)
    except Exception as exc:  # every transport failure becomes one line
        if isinstance(exc, httpcore2.TimeoutException) or time.monotonic() >= deadline:
            raise RequestError(f"{url}: no complete answer within the {timeout_s:g} s deadline") from None
        if isinstance(exc, _AttemptError) and exc.kind == "oversize":
            raise RequestError(f"{url}: reply is over the {max_response_bytes}-byte limit") from None
        reason = exc.message if isinstance(exc, _AttemptError) else _reason(exc, api_key)
        raise RequestError(f"{url}: connection failed: {reason}") from None
    if not 200 <= status < 300:
        raise RequestError(f"{url}: {_http_message(status, head, raw, api_key, 'use the final address')}")
    if not raw.strip():
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RequestError(
            f"{url}: reply is not JSON: {clip(raw.decode('utf-8', 'replace'), SNIPPET_CHARS, [api_key])!r}"
        ) from None

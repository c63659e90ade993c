"""A small OpenAI-compatible chat-completions client, standard library only, shared by judge and rewriter.

Retries with capped exponential backoff and jitter on connection errors, timeouts, HTTP 5xx / 408 /
429 (honouring `Retry-After`, capped), malformed JSON and partial bodies; other 4xx are final. A call
that still fails returns a failed `Result` instead of raising, so a batch of thousands goes on.

Bounds: `timeout_s` is ONE deadline for the whole call (every attempt, backoff and Retry-After wait
included); a watchdog shuts the socket down when it passes, so a server trickling one byte at a time
cannot hold a call longer. `attempt_timeout_s` (default: the same) caps a single attempt, so a hung
attempt can leave time for a retry. A reply over `max_response_bytes` is refused unread.

The API key is read from the environment variable *named* in the config at each call, and is never
kept on the object: it cannot end up in a repr, a pickle or a config dump. Everything a server sends
back (reply text, error bodies) passes through `regroup.net.redact` before anyone sees it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

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


# -- the watchdog behind the total deadline -----------------------------------------------------------


class _Expiry:
    """Shuts down the sockets of one attempt when its deadline passes.

    A socket timeout only bounds each read; a server sending a byte every half second never trips it.
    Shutting the socket down from a timer wakes the blocked read wherever it is (connect, TLS, headers,
    body), and `expired` tells the attempt that the deadline, not the server, ended it.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._done = False

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            if self._done:
                return sock
            self._sockets.append(sock)
            if self._timer is None:
                self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
                self._timer.daemon = True
                self._timer.start()
        return sock

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for sock in self._sockets:
                try:
                    # the plain socket's method, also for TLS sockets: no TLS close handshake
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed (or a raw socket handed over to TLS)

    def cancel(self) -> None:
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()


def _watched(connection_class: type, expiry: _Expiry) -> Callable[..., http.client.HTTPConnection]:
    """`connection_class` whose sockets `expiry` watches: the raw one as created (TCP connect, TLS
    handshake, plain HTTP) and, for HTTPS, the TLS socket that replaces it."""

    class Watched(connection_class):  # a subclass: it sets the private socket factory from inside the class
        _create_connection: Callable[..., socket.socket]  # set by HTTPConnection.__init__ (not in typeshed)

        def __init__(self, host: str, **kwargs: Any):
            super().__init__(host, **kwargs)
            create = self._create_connection
            self._create_connection = lambda *a, **k: expiry.watch(create(*a, **k))

        def connect(self) -> None:
            super().connect()
            expiry.watch(self.sock)

    return Watched


class _WatchedRequest(urllib.request.Request):
    """A request that carries the `_Expiry` the watched handlers below put on its sockets."""

    def __init__(self, url: str, expiry: _Expiry, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.expiry = expiry


def _expiry_of(req: urllib.request.Request) -> _Expiry:
    if not isinstance(req, _WatchedRequest):
        raise TypeError(f"a watched handler needs a _WatchedRequest, got {type(req).__name__}")
    return req.expiry


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, _expiry_of(req)), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        # _context: set by HTTPSHandler.__init__ and passed on the same way by urllib's own https_open;
        # typeshed leaves the private attribute out.
        context = self._context  # type: ignore[attr-defined]
        return self.do_open(_watched(http.client.HTTPSConnection, _expiry_of(req)), req, context=context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: a POST would lose its deadline watch (and its body), and the API key
    would go along to another address. The 3xx surfaces as an HTTP error naming the new address."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # urllib's signature
        return None


def redirect_refusal(exc: urllib.error.HTTPError, key: str | None, fix: str) -> str:
    """The one line for a 3xx that `_NoRedirect` did not follow: the status, the new address (redacted,
    cut), why it is not followed, and `fix` (what to set instead)."""
    where = clip(str(exc.headers.get("Location", "")) if exc.headers else "", ERROR_CHARS, [key])
    return (
        f"HTTP {exc.code} redirect to {where or 'another address'}: redirects are not followed "
        f"(the API key would go along); {fix}"
    )


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
        self._opener = urllib.request.build_opener(_WatchedHTTPHandler, _WatchedHTTPSHandler, _NoRedirect)
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
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        expiry = _Expiry(attempt_deadline)
        request = _WatchedRequest(self._url, expiry, data=payload, headers=headers, method="POST")
        if not self._slots.acquire(timeout=attempt_deadline - now):
            raise self._expired(ends_call, per_attempt, "waiting for a free connection")
        try:
            self._count("requests")
            with self._opener.open(request, timeout=max(1e-3, attempt_deadline - time.monotonic())) as response:
                body = self._read_capped(response)
        except urllib.error.HTTPError as exc:
            error = self._http_error(exc, key)
            if expiry.expired:
                raise self._expired(ends_call, per_attempt) from None
            raise error from None
        except _AttemptError as err:  # oversize, or a body cut short: by the server, or by the watchdog
            if expiry.expired:
                raise self._expired(ends_call, per_attempt) from None
            raise err from None
        except Exception as exc:  # every transport failure becomes a kind, never a crash
            if expiry.expired or _is_timeout(exc):
                raise self._expired(ends_call, per_attempt) from None
            raise self._transport_error(exc, key) from None
        finally:
            expiry.cancel()
            self._slots.release()
        if expiry.expired:  # the watchdog fired between the last byte and its cancel
            raise self._expired(ends_call, per_attempt)
        return self._parse_body(body, key)

    def _expired(self, ends_call: bool, per_attempt: float, where: str = "") -> _AttemptError:
        during = f" ({where})" if where else ""
        if ends_call:
            return _AttemptError("deadline", f"no complete answer within the {self.timeout_s:g} s deadline{during}")
        return _AttemptError("timeout", f"no complete answer within {per_attempt:g} s{during}")

    def _read_capped(self, response: http.client.HTTPResponse) -> bytes:
        """The whole body, refusing one over `max_response_bytes` (announced or actually sent)."""
        cap = self.max_response_bytes
        announced = response.headers.get("Content-Length")
        expected = int(announced) if announced and announced.strip().isdigit() else None
        if expected is not None and expected > cap:
            raise _AttemptError("oversize", f"reply of {expected} bytes is over the {cap}-byte limit")
        chunks: list[bytes] = []
        got = 0
        while True:
            chunk = response.read(min(65536, cap + 1 - got))
            if not chunk:
                break
            got += len(chunk)
            if got > cap:
                raise _AttemptError("oversize", f"reply is over the {cap}-byte limit")
            chunks.append(chunk)
        if expected is not None and got < expected:
            raise _AttemptError("partial", f"partial body: got {got} of {expected} bytes before the connection ended")
        return b"".join(chunks)

    @staticmethod
    def _transport_error(exc: BaseException, key: str | None) -> _AttemptError:
        if isinstance(exc, http.client.IncompleteRead):
            return _AttemptError("partial", f"partial body: got {len(exc.partial)} bytes before the connection ended")
        if isinstance(exc, urllib.error.URLError):
            return _AttemptError("connection", f"connection failed: {redact(str(exc.reason), [key])}")
        # Dropped connections (RemoteDisconnected, resets) and protocol garbage.
        return _AttemptError("connection", f"connection failed: {type(exc).__name__}: {redact(str(exc), [key])}")

    def _http_error(self, exc: urllib.error.HTTPError, key: str | None) -> _AttemptError:
        status = exc.code
        try:
            detail = exc.read(ERROR_BODY_BYTES).decode("utf-8", "replace")
        except Exception:  # the error body itself may be cut short; the status is what matters
            detail = ""
        retry_after = parse_retry_after(exc.headers.get("Retry-After") if exc.headers else None)
        exc.close()
        detail = clip(" ".join(detail.split()), ERROR_CHARS, [key])  # redacted before it is cut
        message = f"HTTP {status}" + (f": {detail}" if detail else "")
        if 300 <= status < 400:
            message = redirect_refusal(exc, key, "set base_url to the final address")
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


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or (
        isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, TimeoutError)
    )


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
    empty one), within ONE deadline of `timeout_s` enforced by the same watchdog as `ChatClient` (a server
    that trickles bytes cannot hold it longer). No retries: the caller (a rollout step) fails fast.

    Raises `RequestError` with one line naming the URL and what went wrong (connection refused, HTTP
    status with the server's detail, deadline, bad JSON); the key is redacted from anything quoted.
    Redirects are refused, as `ChatClient` refuses them: the key is never sent to the new address.
    """
    data = None if body is None else json.dumps(body).encode("utf-8")
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
        remember_secret(api_key)
    expiry = _Expiry(time.monotonic() + timeout_s)
    request = _WatchedRequest(url, expiry, data=data, headers=headers, method="GET" if data is None else "POST")
    # Redirects are refused as the chat client refuses them: never the key (or the body) to a new address.
    opener = urllib.request.build_opener(_WatchedHTTPHandler, _WatchedHTTPSHandler, _NoRedirect)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            raw = response.read(max_response_bytes + 1)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            exc.close()
            raise RequestError(f"{url}: {redirect_refusal(exc, api_key, 'use the final address')}") from None
        detail = exc.read(ERROR_BODY_BYTES).decode("utf-8", "replace") if exc.fp else ""
        exc.close()
        detail = clip(" ".join(detail.split()), ERROR_CHARS, [api_key])
        raise RequestError(f"{url}: HTTP {exc.code}" + (f": {detail}" if detail else "")) from None
    except Exception as exc:  # every transport failure becomes one line
        if expiry.expired or _is_timeout(exc):
            raise RequestError(f"{url}: no complete answer within the {timeout_s:g} s deadline") from None
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise RequestError(f"{url}: connection failed: {redact(str(reason), [api_key])}") from None
    finally:
        expiry.cancel()
    if expiry.expired:
        raise RequestError(f"{url}: no complete answer within the {timeout_s:g} s deadline")
    if len(raw) > max_response_bytes:
        raise RequestError(f"{url}: reply is over the {max_response_bytes}-byte limit")
    if not raw.strip():
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RequestError(
            f"{url}: reply is not JSON: {clip(raw.decode('utf-8', 'replace'), SNIPPET_CHARS, [api_key])!r}"
        ) from None

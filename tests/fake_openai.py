"""A scripted OpenAI-compatible chat server for tests (127.0.0.1, port 0, one thread per request).

Usage:
    with FakeOpenAI(api_key="sk-test") as srv:
        srv.responder = lambda body: "SCORE: 7"          # default answer, from the request JSON
        srv.queue(Status(500), RateLimit(0.2), Malformed())  # the next requests misbehave, in order
        client = ChatClient(srv.base_url, "fake-model", api_key_env="FAKE_KEY")

Behaviours: `Answer(content)`, `Slow(seconds, then)`, `Status(code, retry_after)`, `RateLimit(s)`,
`Malformed()`, `Partial()`, `Drop()`, `Trickle(interval)` (the whole reply, headers too, one byte at a
time), `Hang(seconds)` (read the request, send nothing), `Huge(n_bytes, announce)` (a valid reply of
that size, with or without Content-Length); `stop_listening()` / `start_listening()` / `down_for(s)` /
`down_until(condition)` refuse connections and come back on the same port. Every request is recorded in
`srv.requests`; a wrong or missing `Authorization: Bearer <api_key>` header gets 401 and `auth_ok=False` in
the record.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Answer:
    """Reply 200 with this content (None: ask the server's `responder`)."""

    content: str | None = None


@dataclass(frozen=True)
class Slow:
    """Sleep, then behave as `then`."""

    seconds: float
    then: Action = field(default_factory=Answer)


@dataclass(frozen=True)
class Status:
    """Reply with this HTTP status and an OpenAI-style error body (optional Retry-After header)."""

    code: int
    retry_after: str | None = None
    message: str = "fake error"


def RateLimit(retry_after: float | str | None = None) -> Status:  # reads like the others
    """HTTP 429 with `Retry-After: <retry_after>`."""
    return Status(429, None if retry_after is None else str(retry_after), "rate limited")


@dataclass(frozen=True)
class Malformed:
    """Reply 200 with a body that is not JSON."""

    body: bytes = b'{"choices": [{"message": {"content": "unterminated'


@dataclass(frozen=True)
class Partial:
    """Announce a full JSON body, send half of it, close the connection."""


@dataclass(frozen=True)
class Drop:
    """Close the connection without any reply."""


@dataclass(frozen=True)
class Trickle:
    """Send the whole reply (status line and headers included) one byte every `interval` seconds."""

    interval: float = 0.5
    content: str = "SCORE: 5"
    headers_first: bool = False  # True: status line and headers at once, only the body trickles


@dataclass(frozen=True)
class Hang:
    """Read the request, then send nothing for `seconds` (or until the server stops), then close."""

    seconds: float = 30.0


@dataclass(frozen=True)
class Huge:
    """Reply 200 with a valid completion whose body is about `n_bytes` long; `announce=False` sends no
    Content-Length (the body ends when the connection closes), so only counting what arrives catches it."""

    n_bytes: int = 8 * 1024 * 1024
    announce: bool = True


Action = Answer | Slow | Status | Malformed | Partial | Drop | Trickle | Hang | Huge


@dataclass
class Recorded:
    """One request the server received."""

    index: int
    path: str
    body: dict[str, Any] | None
    auth_ok: bool
    action: str
    at: float
    authorization: str | None = None  # the Authorization header as sent (None: absent)


def completion_json(content: str, model: str = "fake-model") -> bytes:
    """An OpenAI chat.completion response body carrying `content`."""
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return

    def do_POST(self) -> None:  # http.server naming
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        auth_ok = fake.api_key is None or self.headers.get("Authorization") == f"Bearer {fake.api_key}"
        if not auth_ok:
            action: Action = Status(401, message="invalid api key")
        elif not self.path.endswith("/chat/completions"):
            action = Status(404, message=f"no route {self.path}")
        elif body is None:
            action = Status(400, message="request body is not JSON")
        else:
            action = fake._next_action(body)
        fake._record(self.path, body, auth_ok, action, self.headers.get("Authorization"))
        self._perform(action, body or {})

    def _perform(self, action: Action, body: dict[str, Any]) -> None:
        if isinstance(action, Slow):
            time.sleep(action.seconds)
            action = action.then
        if isinstance(action, Answer) and action.content is None:
            action = self.server.fake._respond(body)
            if isinstance(action, Slow):
                time.sleep(action.seconds)
                unset = isinstance(action.then, Answer) and action.then.content is None
                action = Answer("") if unset else action.then
        if isinstance(action, Answer):
            self._send(200, completion_json(action.content or "", str(body.get("model", "fake-model"))))
        elif isinstance(action, Status):
            payload = json.dumps({"error": {"message": action.message, "type": "fake", "code": action.code}}).encode()
            extra = {"Retry-After": action.retry_after} if action.retry_after is not None else {}
            self._send(action.code, payload, extra)
        elif isinstance(action, Malformed):
            self._send(200, action.body)
        elif isinstance(action, Partial):
            full = completion_json("this reply is cut short in the middle")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(full)))
            self.end_headers()
            self.wfile.write(full[: len(full) // 2])
            self.wfile.flush()
            self._hang_up()
        elif isinstance(action, Drop):
            self._hang_up()
        elif isinstance(action, Trickle):
            payload = completion_json(action.content)
            raw = (
                f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                f"Connection: close\r\n\r\n"
            ).encode() + payload
            start = len(raw) - len(payload) if action.headers_first else 0
            try:
                if start:
                    self.wfile.write(raw[:start])
                    self.wfile.flush()
                for i in range(start, len(raw)):
                    if self.server.fake._stopping.wait(action.interval):
                        break
                    self.wfile.write(raw[i : i + 1])
                    self.wfile.flush()
            except OSError:
                pass  # the client gave up
            self._hang_up()
        elif isinstance(action, Hang):
            self.server.fake._stopping.wait(action.seconds)
            self._hang_up()
        elif isinstance(action, Huge):
            pad = max(0, action.n_bytes - len(completion_json("")))
            payload = completion_json("x" * pad)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if action.announce:
                    self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(0, len(payload), 1 << 16):
                    self.wfile.write(payload[i : i + (1 << 16)])
            except OSError:
                pass  # the client stopped reading
            self._hang_up()
        else:  # pragma: no cover - a test wrote an unknown behaviour
            raise TypeError(f"unknown fake behaviour {action!r}")

    def _send(self, code: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client gave up (timeout) before we answered

    def _hang_up(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 512  # 64+ concurrent clients must not overflow the accept backlog
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # broken pipes from clients that timed out are expected here


class FakeOpenAI:
    """Context manager running the scripted server; see the module docstring."""

    def __init__(
        self, api_key: str | None = "sk-fake-test-key", responder: Callable[[dict[str, Any]], Any] | None = None
    ) -> None:
        self.api_key = api_key
        self.responder: Callable[[dict[str, Any]], Any] = responder or (lambda body: "ok")
        self.requests: list[Recorded] = []
        self._script: deque[Action] = deque()
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self._timers: list[threading.Timer] = []
        self._stopping = threading.Event()  # wakes Hang / Trickle handlers when the server closes

    # -- lifecycle ---------------------------------------------------------------------------------
    def start_listening(self) -> None:
        """Bind (first time: a free port; later: the same port again) and serve in a thread."""
        if self._httpd is not None:
            return
        self._stopping.clear()
        deadline = time.monotonic() + 5.0
        while True:
            try:
                httpd = _Server(("127.0.0.1", self.port), _Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        httpd.fake = self
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop_listening(self) -> None:
        """Close the listening socket: new connections are refused until `start_listening`."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def down_for(self, seconds: float) -> None:
        """Refuse connections now and come back on the same port after `seconds`."""
        self.stop_listening()
        timer = threading.Timer(seconds, self.start_listening)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def down_until(self, condition: Callable[[], bool], give_up_s: float = 60.0) -> threading.Thread:
        """Refuse connections now and come back on the same port once `condition()` holds (or after
        `give_up_s`): an outage bounded by counted events, such as the client's refused connections, which a
        loaded machine cannot stretch past a client's retries the way it can a timed one. Returns the thread
        that brings the server back."""
        self.stop_listening()

        def come_back() -> None:
            wait_until(condition, give_up_s)
            self.start_listening()

        thread = threading.Thread(target=come_back, daemon=True)
        thread.start()
        return thread

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.start_listening()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self._timers:
            t.cancel()
        self._stopping.set()
        self.stop_listening()

    # -- scripting ---------------------------------------------------------------------------------
    def queue(self, *actions: Action) -> None:
        """The next requests get these behaviours, in order; after them, the `responder` answers."""
        with self._lock:
            self._script.extend(actions)

    def _next_action(self, body: dict[str, Any]) -> Action:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self._respond(body)

    def _respond(self, body: dict[str, Any]) -> Action:
        out = self.responder(body)
        return out if not isinstance(out, str) else Answer(out)

    def _record(
        self, path: str, body: dict[str, Any] | None, auth_ok: bool, action: Action, authorization: str | None = None
    ) -> None:
        with self._lock:
            rec = Recorded(
                len(self.requests), path, body, auth_ok, type(action).__name__, time.monotonic(), authorization
            )
            self.requests.append(rec)

    @property
    def n_requests(self) -> int:
        with self._lock:
            return len(self.requests)


def wait_until(condition: Callable[[], bool], give_up_s: float = 60.0) -> bool:
    """Poll `condition` every 5 ms until it holds (True) or `give_up_s` pass (False)."""
    deadline = time.monotonic() + give_up_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def last_user_message(body: dict[str, Any]) -> str:
    """The content of the last user message of a request body (what a responder usually reads)."""
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""

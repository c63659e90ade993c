"""No attempt of a call reaches the server after the call has returned: a loopback HTTP/1.1 server (keep-alive,
so connections are reused) counts every request it receives, and after each call (answered, failed or cut by
its deadline) the count settles at exactly the attempts the client made, and stays there. Also: a reused
keep-alive connection is held to the same deadline, and a forked child uses its own connections.

Asserted are events (requests arrived, replies the server finished sending), never elapsed times."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from regroup.net import ChatClient

MSG = [{"role": "user", "content": "hello"}]
SETTLE_S = 1.5  # longer than any reply the scripts below could still be sending when a call returns


def completion(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class Counting(ThreadingHTTPServer):
    """Counts each request when it has arrived whole (request line, headers, body), then lets `script(n, port)`
    (n: 0-based count of this request) answer it: a callable writing on the handler."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, script: Callable[[int, int], Callable[[BaseHTTPRequestHandler], None]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.lock = threading.Lock()
        self.arrived: list[tuple[float, int]] = []  # (monotonic time, client port)
        self.finished = 0  # trickled replies sent to their last byte
        self.hung_up = 0  # hanging replies the server ended itself
        self.stop = threading.Event()

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.arrived)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool reuses connections
    server: Counting

    def log_message(self, *args: object) -> None:
        return

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            n = len(self.server.arrived)
            self.server.arrived.append((time.monotonic(), self.client_address[1]))
        try:
            self.server.script(n, self.client_address[1])(self)
        except OSError:
            self.close_connection = True  # the client gave up


def answer(content: str = "ok", status: int = 200) -> Callable[[BaseHTTPRequestHandler], None]:
    def send(h: BaseHTTPRequestHandler) -> None:
        body = completion(content)
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return send


def slow(seconds: float) -> Callable[[BaseHTTPRequestHandler], None]:
    def send(h: BaseHTTPRequestHandler) -> None:
        if not h.server.stop.wait(seconds):  # type: ignore[attr-defined]
            answer("late")(h)

    return send


def trickle(interval: float) -> Callable[[BaseHTTPRequestHandler], None]:
    """The whole reply, status line and headers too, one byte every `interval` seconds."""

    def send(h: BaseHTTPRequestHandler) -> None:
        body = completion("trickled")
        raw = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        for i in range(len(raw)):
            if h.server.stop.wait(interval):  # type: ignore[attr-defined]
                break
            h.wfile.write(raw[i : i + 1])
            h.wfile.flush()
        else:
            with h.server.lock:  # type: ignore[attr-defined]
                h.server.finished += 1  # type: ignore[attr-defined]
        h.close_connection = True

    return send


def hang(seconds: float, head_first: bool) -> Callable[[BaseHTTPRequestHandler], None]:
    """Send nothing (or only the status line and headers) for `seconds`, then close the connection."""

    def send(h: BaseHTTPRequestHandler) -> None:
        if head_first:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            h.wfile.flush()
        if not h.server.stop.wait(seconds):  # type: ignore[attr-defined]
            with h.server.lock:  # type: ignore[attr-defined]
                h.server.hung_up += 1  # type: ignore[attr-defined]
        h.close_connection = True

    return send


@pytest.fixture()
def serve() -> Iterator[Callable[..., Counting]]:
    servers: list[Counting] = []

    def start(script: Callable[[int, int], Callable[[BaseHTTPRequestHandler], None]]) -> Counting:
        srv = Counting(script)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()


def settled(srv: Counting, client: ChatClient) -> int:
    """The server's count once everything sent before now has arrived; it must equal the client's attempts
    and must not grow afterwards (a late attempt would arrive in the second wait)."""
    time.sleep(SETTLE_S)
    first = srv.count
    time.sleep(SETTLE_S)
    assert srv.count == first, "a request reached the server well after its call had returned"
    assert first == client.stats["requests"], (first, client.stats)
    return first


def test_a_server_failing_the_first_attempts_sees_exactly_the_attempts(serve):
    srv = serve(lambda n, port: answer(status=500) if n < 3 else answer("fourth"))
    client = ChatClient(srv.url, "m", api_key_env=None, timeout_s=10.0, max_retries=5, backoff_s=0.01)
    r = client.complete(MSG)
    assert (r.ok, r.text, r.attempts) == (True, "fourth", 4)
    assert settled(srv, client) == 4


def test_attempts_cut_by_their_own_limit_are_not_resent_later(serve):
    """Every attempt outlives its 0.2 s limit (the server answers after 0.6 s); the call ends at its 1 s
    deadline, and the server has seen only the attempts the client counted."""
    srv = serve(lambda n, port: slow(0.6))
    client = ChatClient(
        srv.url, "m", api_key_env=None, timeout_s=1.0, attempt_timeout_s=0.2, max_retries=50, backoff_s=0.01
    )
    r = client.complete(MSG)
    assert (r.ok, r.error_kind) == (False, "deadline") and r.attempts >= 2
    assert settled(srv, client) == r.attempts


@pytest.mark.parametrize("attempt_timeout_s", [None, 0.3])
def test_a_trickling_server_cannot_hold_a_call_past_its_deadline(serve, attempt_timeout_s):
    """One byte every 0.1 s (a reply of ~100 bytes would take ~10 s): the call ends at its 1 s deadline, with
    one attempt or several, before the server has sent any reply whole, and no attempt follows it."""
    srv = serve(lambda n, port: trickle(0.1))
    client = ChatClient(
        srv.url, "m", api_key_env=None, timeout_s=1.0, attempt_timeout_s=attempt_timeout_s, backoff_s=0.01
    )
    r = client.complete(MSG)
    assert (r.ok, r.error_kind) == (False, "deadline") and srv.finished == 0
    assert settled(srv, client) == r.attempts


@pytest.mark.parametrize("head_first", [False, True], ids=["no_reply", "headers_only"])
def test_a_single_read_cannot_outlast_the_deadline(serve, head_first):
    """A server that goes silent (before its reply, or after its headers) for 20 s, 20x the deadline: the call
    ends at its deadline while the server still holds the connection open, not when the server closes it."""
    srv = serve(lambda n, port: hang(20.0, head_first))
    client = ChatClient(srv.url, "m", api_key_env=None, timeout_s=1.0, max_retries=0)
    r = client.complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "deadline", 1)
    assert srv.hung_up == 0  # the server had not given up yet: the client's own deadline ended the read


def test_a_batch_under_faults_sends_nothing_after_it_returns(serve):
    """24 calls at concurrency 8 over reused connections: each request fails (500), stalls past the attempt
    limit or trickles in turn; every call ends (answered or at its deadline) and the server's count settles
    at the client's."""
    faults = [answer(status=500), slow(0.5), trickle(0.05), answer("ok")]
    srv = serve(lambda n, port: faults[n % len(faults)])
    client = ChatClient(
        srv.url, "m", api_key_env=None, timeout_s=1.5, attempt_timeout_s=0.25, max_retries=8, backoff_s=0.01,
        concurrency=8,
    )  # fmt: skip
    results = client.complete_many([[{"role": "user", "content": str(i)}] for i in range(24)])
    assert sum(r.attempts for r in results) == client.stats["requests"]
    assert all(r.ok or r.error_kind == "deadline" for r in results)
    assert settled(srv, client) == client.stats["requests"]


def test_a_reused_keep_alive_connection_is_held_to_the_same_deadline(serve):
    """The pool keeps a connection open between calls; the deadline holds on a reused one too."""
    srv = serve(lambda n, port: answer("first") if n == 0 else trickle(0.5))
    client = ChatClient(srv.url, "m", api_key_env=None, timeout_s=1.0, max_retries=0)
    assert client.complete(MSG).text == "first"
    r = client.complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "deadline", 1) and srv.finished == 0
    ports = [port for _, port in srv.arrived]
    assert len(ports) == 2 and ports[0] == ports[1]  # the second call went over the first call's connection
    assert settled(srv, client) == 2


def test_a_forked_child_uses_its_own_connections(serve):
    """A forked child does not use its parent's pooled sockets: it opens its own, and the parent's still work."""
    srv = serve(lambda n, port: answer("answer"))
    client = ChatClient(srv.url, "m", api_key_env=None, timeout_s=5.0)
    assert client.complete(MSG).text == "answer"  # the parent's pool holds a kept-alive connection
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only for a right answer
        try:
            os._exit(0 if client.complete(MSG).text == "answer" else 1)
        except BaseException:
            os._exit(2)
    for _ in range(300):  # 30 s at most
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's call never returned")
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.complete(MSG).text == "answer"
    ports = [port for _, port in srv.arrived]
    assert len(ports) == 3 and ports[0] == ports[2] != ports[1]  # the child had a connection of its own


@pytest.mark.parametrize(
    "key, problem",
    [
        ("sk-test-KEY-4711\r\n", "has a line break"),  # a .env file saved with Windows line endings
        ("sk-test-KEY-4711é", "has a non-ASCII character"),
        ("sk-test-KEY-4711 ", "has a space or a control character"),
    ],
)
def test_a_key_no_header_can_carry_is_a_setup_error_before_any_request(serve, monkeypatch, key, problem):
    """Such a key was a connection failure (httpcore refuses the header) retried with back-off on every call, where
    a missing key is one setup error; now it is that error, and neither the client nor the server counts a request.
    The line names the variable and what is wrong, never the key."""
    from regroup.net import MissingAPIKeyError
    from regroup.net.client import RequestError, request_json

    srv = serve(lambda n, port: answer("never"))
    monkeypatch.setenv("REGROUP_TEST_BAD_KEY", key)
    client = ChatClient(srv.url, "m", api_key_env="REGROUP_TEST_BAD_KEY", timeout_s=5.0, max_retries=3, backoff_s=0.01)
    for call in (lambda: client.complete(MSG), lambda: client.complete_many([MSG, MSG])):
        with pytest.raises(MissingAPIKeyError) as e:
            call()
        line = str(e.value)
        assert line.startswith(f"environment variable REGROUP_TEST_BAD_KEY {problem} (the value is not shown;")
        assert "\n" not in line and "4711" not in line
    with pytest.raises(RequestError) as e:
        request_json(srv.url + "/models", api_key=key)
    assert f"the API key {problem}" in str(e.value) and "4711" not in str(e.value)
    assert client.stats["requests"] == 0 and settled(srv, client) == 0

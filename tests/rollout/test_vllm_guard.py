"""The key guard `regroup vllm-serve` puts in front of every route of a keyed vLLM server (pure ASGI, driven
here with hand-made requests; no vLLM). The real server behind it: tests/real_engine/test_server_guard.py."""

from __future__ import annotations

import asyncio

import pytest

from regroup.rollout.vllm_guard import KeyOnEveryRoute

KEY = "sk-guard-test-0123456789"


class App:
    """The server behind the guard: records the paths that reached it and answers 200."""

    def __init__(self):
        self.reached = []

    async def __call__(self, scope, receive, send):
        self.reached.append(scope.get("path"))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})


def call(guard, path, headers=(), kind="http", method="POST"):
    """(status or close code, body) of one request through `guard`."""
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": kind, "path": path, "method": method, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(guard(scope, receive, send))
    start = sent[0]
    if start["type"] == "websocket.close":
        return start["code"], b""
    return start["status"], b"".join(m.get("body", b"") for m in sent[1:])


# the routes VLLM_SERVER_DEV_MODE=1 adds (vLLM 0.32), the OpenAI ones, and one that does not exist
PATHS = ["/collective_rpc", "/sleep", "/wake_up", "/save_sharded_state", "/reset_prefix_cache", "/update_weights"]
PATHS += ["/health", "/metrics", "/docs", "/openapi.json", "/v1/models", "/v1/completions", "/no/such/route"]


@pytest.mark.parametrize("path", PATHS)
def test_with_a_key_every_route_refuses_a_request_without_it(path):
    app = App()
    guard = KeyOnEveryRoute(app, api_key=KEY)
    for headers in ([], [("authorization", "Bearer wrong")], [("authorization", KEY)], [("x-api-key", KEY)]):
        status, body = call(guard, path, headers)
        assert status == 401 and b"Unauthorized" in body, headers
    assert call(guard, path, [("authorization", f"Bearer {KEY}")]) == (200, b"{}")
    assert call(guard, path, [("Authorization", f"bearer {KEY}")], method="GET") == (200, b"{}")  # any case
    assert app.reached == [path, path]


def test_two_authorization_headers_are_refused():
    guard = KeyOnEveryRoute(App(), api_key=KEY)
    headers = [("authorization", "Bearer wrong"), ("authorization", f"Bearer {KEY}")]
    assert call(guard, "/collective_rpc", headers)[0] == 401


def test_a_websocket_without_the_key_is_closed_before_it_opens():
    app = App()
    guard = KeyOnEveryRoute(app, api_key=KEY)
    assert call(guard, "/v1/realtime", kind="websocket") == (1008, b"")
    assert app.reached == []


def test_the_key_comes_from_the_servers_environment_and_no_key_lets_everything_through(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert call(KeyOnEveryRoute(App()), "/sleep")[0] == 401
    assert call(KeyOnEveryRoute(App()), "/sleep", [("authorization", f"Bearer {KEY}")])[0] == 200
    monkeypatch.delenv("VLLM_API_KEY")
    assert call(KeyOnEveryRoute(App()), "/sleep")[0] == 200  # a keyless server: as vLLM itself


def test_lifespan_events_pass_through():
    app = App()
    guard = KeyOnEveryRoute(app, api_key=KEY)

    async def run():
        await guard({"type": "lifespan"}, None, None)

    asyncio.run(run())
    assert app.reached == [None]

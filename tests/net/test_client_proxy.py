"""Proxies from the environment, as the standard-library client honoured them: http_proxy / https_proxy (either
case) carry the request, a user and password in the proxy's address become Basic Proxy-Authorization, no_proxy
(a host or a domain suffix, or *) sends it direct; both for `ChatClient` and for `request_json`. A loopback
proxy records what reaches it; the target host `api.invalid` cannot be resolved, so a request that went
direct fails instead of being answered."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from regroup.net import ChatClient
from regroup.net.client import RequestError, request_json

MSG = [{"role": "user", "content": "hello"}]
TARGET = "http://api.invalid:8000/v1"
KEY_ENV = "REGROUP_TEST_PROXY_KEY"
KEY = "sk-proxy-test-0123456789"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Proxy(BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself: records (method, target, Proxy-Authorization,
    Authorization); refuses a CONNECT tunnel with 403."""

    seen: list[tuple[str, str, str | None, str | None]] = []

    def log_message(self, *args: object) -> None:
        return

    def _record(self) -> None:
        headers = self.headers
        Proxy.seen.append((self.command, self.path, headers.get("Proxy-Authorization"), headers.get("Authorization")))

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record()
        body = json.dumps({"choices": [{"message": {"content": "via the proxy"}}], "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST  # http.server's name

    def do_CONNECT(self) -> None:  # http.server's name
        self._record()
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture()
def proxy(monkeypatch) -> Iterator[str]:
    """The proxy's address (host:port); every proxy variable unset, in both cases, until a test sets one."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Proxy.seen = []
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def chat(url: str = TARGET):
    return ChatClient(url, "m", api_key_env=KEY_ENV, timeout_s=5.0, max_retries=0).complete(MSG)


@pytest.mark.parametrize("name", ["http_proxy", "HTTP_PROXY"])
def test_http_proxy_carries_the_request_with_its_credentials(proxy, monkeypatch, name):
    monkeypatch.setenv(name, f"http://user:p%40ss@{proxy}")
    r = chat()
    assert (r.ok, r.text) == (True, "via the proxy")
    basic = "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert Proxy.seen == [("POST", f"{TARGET}/chat/completions", basic, f"Bearer {KEY}")]


def test_a_proxy_without_scheme_or_credentials(proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", proxy)
    assert chat().ok
    assert Proxy.seen == [("POST", f"{TARGET}/chat/completions", None, f"Bearer {KEY}")]


@pytest.mark.parametrize("no_proxy", ["api.invalid", ".invalid", "invalid", "other.example, api.invalid:8000", "*"])
def test_no_proxy_sends_the_request_direct(proxy, monkeypatch, no_proxy):
    monkeypatch.setenv("http_proxy", f"http://{proxy}")
    monkeypatch.setenv("no_proxy", no_proxy)
    assert urllib.request.proxy_bypass("api.invalid:8000")  # what the standard-library client decided
    r = chat()
    assert (r.ok, r.error_kind) == (False, "connection")  # api.invalid does not resolve
    assert Proxy.seen == []


@pytest.mark.parametrize("no_proxy", ["other.invalid", "pi.invalid", "api.invalid.example"])
def test_no_proxy_naming_other_hosts_keeps_the_proxy(proxy, monkeypatch, no_proxy):
    monkeypatch.setenv("http_proxy", f"http://{proxy}")
    monkeypatch.setenv("no_proxy", no_proxy)
    assert not urllib.request.proxy_bypass("api.invalid:8000")
    assert chat().ok and len(Proxy.seen) == 1


def test_only_the_scheme_s_own_variable_counts(proxy, monkeypatch):
    """https_proxy and all_proxy do not carry an http:// request (nor did they for urllib)."""
    monkeypatch.setenv("https_proxy", f"http://{proxy}")
    monkeypatch.setenv("all_proxy", f"http://{proxy}")
    assert (chat().ok, Proxy.seen) == (False, [])


def test_https_goes_through_a_connect_tunnel(proxy, monkeypatch):
    monkeypatch.setenv("https_proxy", f"http://user:pw@{proxy}")
    r = chat("https://api.invalid/v1")
    assert (r.ok, r.error_kind) == (False, "connection")  # the proxy refused the tunnel
    basic = "Basic " + base64.b64encode(b"user:pw").decode()
    assert Proxy.seen == [("CONNECT", "api.invalid:443", basic, None)]  # the API key never reaches the proxy


def test_the_environment_is_read_when_the_client_is_made(proxy, monkeypatch):
    client = ChatClient(TARGET, "m", api_key_env=KEY_ENV, timeout_s=5.0, max_retries=0)
    monkeypatch.setenv("http_proxy", f"http://{proxy}")
    assert not client.complete(MSG).ok and Proxy.seen == []
    assert chat().ok and len(Proxy.seen) == 1


def test_request_json_uses_the_proxy_and_no_proxy(proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", f"http://{proxy}")
    assert request_json("http://api.invalid:8000/v1/models", None, api_key=KEY, timeout_s=5.0)["data"] == []
    assert Proxy.seen == [("GET", "http://api.invalid:8000/v1/models", None, f"Bearer {KEY}")]
    monkeypatch.setenv("no_proxy", "api.invalid")
    with pytest.raises(RequestError, match="connection failed"):
        request_json("http://api.invalid:8000/v1/models", {"x": 1}, api_key=KEY, timeout_s=5.0)
    assert len(Proxy.seen) == 1

"""A judge that answers 302 fails that call with a message naming the new address (no AttributeError
traceback), and a client with api_key_env None or "" sends no Authorization header."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from regroup.net import ChatClient

MSG = [{"role": "user", "content": "hello"}]


class Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):
        return

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Recorder.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.invalid/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"choices": [{"message": {"content": "7"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    Recorder.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_302_is_a_failed_call_naming_the_new_address(server):
    client = ChatClient(server + "/moved/v1", "m", api_key_env=None, max_retries=2, backoff_s=0.0, timeout_s=5.0)
    result = client.complete(MSG)
    assert not result.ok and result.attempts == 1  # not retried, not followed
    assert "HTTP 302 redirect to http://elsewhere.invalid/v1/chat/completions" in result.error
    assert "set base_url" in result.error
    assert len(Recorder.seen) == 1


@pytest.mark.parametrize("key_env", [None, ""])
def test_no_key_variable_sends_no_authorization_header(server, key_env):
    client = ChatClient(server + "/v1", "m", api_key_env=key_env, timeout_s=5.0)
    result = client.complete(MSG)
    assert result.ok and result.text == "7"
    assert Recorder.seen == [("/v1/chat/completions", None)]


class MovedJSON(BaseHTTPRequestHandler):
    """Answers every GET and POST with a 302 to `target` (set per test); records what reached it."""

    target = ""
    seen: list = []

    def log_message(self, *args):
        return

    def _moved(self):
        MovedJSON.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(302)
        self.send_header("Location", MovedJSON.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _moved  # http.server's name
    do_POST = _moved  # http.server's name


@pytest.mark.parametrize("body", [None, {"prompt": [1, 2]}], ids=["GET", "POST"])
def test_request_json_refuses_a_redirect_and_never_sends_the_key_on(server, body):
    """`request_json` (the vLLM server backend's client) refuses redirects as ChatClient does: before, urllib
    followed a 302 with the Authorization header copied, and only an unrelated AttributeError (the copied
    request had no deadline watch) stopped it."""
    from regroup.net.client import RequestError, request_json

    MovedJSON.target, MovedJSON.seen = server, []  # `server` (the Recorder) stands for the other host
    moved = ThreadingHTTPServer(("127.0.0.1", 0), MovedJSON)
    threading.Thread(target=moved.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{moved.server_address[1]}/v1/models"
    try:
        with pytest.raises(RequestError) as err:
            request_json(url, body, api_key="sk-redirect-test-0123456789", timeout_s=5.0)
    finally:
        moved.shutdown()
        moved.server_close()
    assert str(err.value) == (
        f"{url}: HTTP 302 redirect to {server}/v1/models: redirects are not followed (the API key would go along); "
        "use the final address"
    )
    assert len(MovedJSON.seen) == 1 and Recorder.seen == []  # asked once; the other host heard nothing

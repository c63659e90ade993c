"""A judge that answers 302 fails that call with a message naming the new address (no AttributeError
traceback), and a client with api_key_env None or "" sends no Authorization header (issue 24, item 5)."""

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

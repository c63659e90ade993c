"""A scripted stand-in for vLLM's OpenAI server (real HTTP on loopback, standard library only), for the
`rollout.backend=vllm_server` tests: tests/rollout/test_vllm_server.py and
tests/reliability/test_misbehaving_vllm_server.py.

It answers `/v1/models`, `/v1/completions` (token i of a completion = 10 + i, log-prob -0.1·(i+1)),
`/collective_rpc` and `/reset_prefix_cache`, and records (path, body, Authorization) of every request.
`/collective_rpc regroup_reload_weights` loads the folder's tensors into `weights` (in place: names the
folder lacks keep their tensors, as vLLM's reload does) and answers the worker extension's fingerprints
(sha256 of each tensor here) before and after; `foreign_reload(name, tensor)` is another client's reload.

- `mode`: ok | eos (stop on EOS, which vLLM leaves in) | stop (stopped, EOS left out) | 500 | hang;
- `completion_reply`: None, or `fn(body) -> payload` replacing the whole `/v1/completions` reply (a
  misbehaving server: a list, strings, ids out of the vocabulary, NaN log-probs, ...);
- `redirect_to`: None, or a URL every request is sent to with a 302 (a server that moved, or a trap).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EOS = 2


def ok_choices(body: dict, mode: str = "ok") -> list[dict]:
    """The choices a well-behaved server sends for `body` (out of index order, as vLLM may)."""
    n, k = body["n"], body["max_tokens"]
    choices = []
    for c in range(n):
        ids = [10 + i for i in range(k)]
        finish = "length"
        if mode in ("eos", "stop"):
            ids = ids[:2] + ([EOS] if mode == "eos" else [])
            finish = "stop"
        lps = [-0.1 * (i + 1) for i in range(len(ids))]
        choices.append(
            {"index": n - 1 - c, "token_ids": ids, "finish_reason": finish, "logprobs": {"token_logprobs": lps}}
        )
    return choices


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the sampler sends up to 64 requests at once; socketserver's default backlog is 5


class FakeVLLM:
    def __init__(self, api_key=None):
        self.api_key = api_key
        self.mode = "ok"
        self.completion_reply = None
        self.redirect_to = None
        self.requests = []
        self.reload_saw = []  # (folder, its files at the time of the reload call)
        self.weights = {}  # name -> tensor: what the server "computes with"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, payload, headers=()):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, body):
                fake.requests.append((self.path, body, self.headers.get("Authorization")))
                if fake.redirect_to is not None:
                    return self._reply(302, {}, [("Location", fake.redirect_to + self.path)])
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    return self._reply(401, {"error": "bad key"})
                if self.path == "/v1/models":
                    return self._reply(200, {"data": [{"id": "served-model"}]})
                if self.path == "/collective_rpc":
                    folder = Path(body["kwargs"]["weights_path"])
                    fake.reload_saw.append((folder, sorted(p.name for p in folder.iterdir())))
                    before = fake.fingerprints()
                    fake.load_folder(folder)
                    if not body["kwargs"].get("fingerprint"):
                        return self._reply(200, {"results": [0]})
                    after = fake.fingerprints()
                    return self._reply(200, {"results": [{"refreshed": 0, "before": before, "after": after}]})
                if self.path == "/reset_prefix_cache":
                    return self._reply(200, {})
                if fake.mode == "500":
                    return self._reply(500, {"error": "EngineDeadError: the engine died"})
                if fake.mode == "hang":
                    time.sleep(3.0)
                    return
                if fake.completion_reply is not None:
                    return self._reply(200, fake.completion_reply(body))
                return self._reply(200, {"choices": ok_choices(body, fake.mode)})

            def do_GET(self):  # http.server's name
                self._handle(None)

            def do_POST(self):  # http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                self._handle(json.loads(self.rfile.read(length) or b"null"))

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def load_folder(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.weights.update(load_file(str(folder / "model.safetensors")))

    def fingerprints(self) -> dict[str, str]:
        import torch

        return {
            name: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()[:16]
            for name, t in self.weights.items()
        }

    def foreign_reload(self, name: str, tensor) -> None:
        """Another client reloads one weight of this server."""
        self.weights[name] = tensor

    def completions(self) -> list[dict]:
        """The bodies of the `/v1/completions` requests received so far."""
        return [b for p, b, _ in self.requests if p == "/v1/completions"]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

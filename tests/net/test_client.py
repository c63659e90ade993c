"""ChatClient retries / failure records / ordering / secrecy, and DiskCache persistence."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from fake_openai import (
    Answer,
    Drop,
    FakeOpenAI,
    Malformed,
    Partial,
    RateLimit,
    Slow,
    Status,
    last_user_message,
)

from regroup.net import ChatClient, DiskCache, MissingAPIKeyError, cache_key
from regroup.net.client import backoff_delay, parse_retry_after

KEY = "sk-fake-test-key"
ENV = "REGROUP_TEST_HTTP_KEY"


@pytest.fixture()
def server(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with FakeOpenAI(api_key=KEY) as srv:
        yield srv


def make_client(srv: FakeOpenAI, **kw) -> ChatClient:
    opts = dict(api_key_env=ENV, timeout_s=2.0, max_retries=3, backoff_s=0.01, max_backoff_s=0.05, concurrency=4)
    opts.update(kw)
    return ChatClient(srv.base_url, "fake-model", **opts)


MSG = [{"role": "user", "content": "hello"}]


def test_success_sends_openai_request_with_bearer_key(server):
    server.responder = lambda body: "reply to " + last_user_message(body)
    r = make_client(server, temperature=0.3, max_tokens=77).complete(MSG)
    assert (r.ok, r.text, r.error, r.attempts) == (True, "reply to hello", None, 1)
    (req,) = server.requests
    assert req.auth_ok and req.path == "/v1/chat/completions"
    assert req.body == {"model": "fake-model", "messages": MSG, "temperature": 0.3, "max_tokens": 77}


@pytest.mark.parametrize(
    "fault, kind",
    [
        (Status(500), "http_5xx"),
        (Status(503), "http_5xx"),
        (Status(408), "http_408"),
        (RateLimit(0), "http_429"),
        (Malformed(), "malformed"),
        (Malformed(b'{"choices": []}'), "malformed"),
        (Partial(), "partial"),
        (Drop(), "connection"),
    ],
)
def test_each_transient_fault_is_retried_then_succeeds(server, fault, kind):
    server.queue(fault, fault)
    server.responder = lambda body: "fine"
    client = make_client(server)
    r = client.complete(MSG)
    assert (r.ok, r.text, r.attempts) == (True, "fine", 3)
    st = client.stats
    assert st["errors"] == {kind: 2}
    assert (st["calls"], st["ok"], st["requests"], st["retries"], st["failures"]) == (1, 1, 3, 2, 0)


def test_timeout_is_retried(server):
    server.queue(Slow(1.0, Answer("late")))
    server.responder = lambda body: "on time"
    client = make_client(server, timeout_s=10.0, attempt_timeout_s=0.3)  # one attempt times out, the call goes on
    r = client.complete(MSG)
    assert (r.ok, r.text, r.attempts) == (True, "on time", 2)
    assert client.stats["errors"] == {"timeout": 1}
    assert client.stats["deadline_hits"] == 0


def test_gives_up_after_max_retries_with_a_failure_record(server):
    server.queue(*[Status(500)] * 10)
    client = make_client(server, max_retries=2)
    r = client.complete(MSG)
    assert (r.ok, r.text, r.attempts, r.error_kind) == (False, None, 3, "http_5xx")
    assert r.error.startswith("HTTP 500")
    assert server.n_requests == 3
    st = client.stats
    assert (st["failures"], st["failures_by_kind"], st["failure_rate"]) == (1, {"http_5xx": 1}, 1.0)


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(server, code):
    server.queue(Status(code, message="bad request body"))
    r = make_client(server).complete(MSG)
    assert (r.ok, r.attempts, r.error_kind) == (False, 1, "http_4xx")
    assert f"HTTP {code}" in r.error and "bad request body" in r.error
    assert server.n_requests == 1


def test_wrong_key_is_a_401_failure_and_the_key_is_not_in_the_message(server, monkeypatch):
    monkeypatch.setenv(ENV, "sk-wrong-key-999")
    r = make_client(server).complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "http_4xx", 1)
    assert not server.requests[0].auth_ok
    assert "sk-wrong-key-999" not in r.error


def test_missing_key_variable_raises_naming_the_variable(server, monkeypatch):
    monkeypatch.delenv(ENV)
    with pytest.raises(MissingAPIKeyError, match=ENV):
        make_client(server).complete_many([MSG])
    assert server.n_requests == 0


def test_no_key_env_sends_no_authorization(monkeypatch):
    with FakeOpenAI(api_key=None) as srv:
        srv.responder = lambda body: "x"
        client = ChatClient(srv.base_url, "m", api_key_env=None, timeout_s=2)
        assert client.complete(MSG).text == "x"


def test_retry_after_is_honoured_and_capped(server):
    server.queue(RateLimit(0.4))
    client = make_client(server, max_backoff_s=5.0)
    r = client.complete(MSG)
    assert r.ok and r.attempts == 2
    gap = server.requests[1].at - server.requests[0].at
    assert gap >= 0.38  # it waited what the server asked (a lower bound: a sleep is never shorter)
    assert client.pop_counts() == {
        "requests": 2,
        "calls": 1,
        "ok": 1,
        "failures": 0,
        "retries": 1,
        "retry_after_waits": 1,
        "retry_after_capped": 0,
        "deadline_hits": 0,
        "oversize": 0,
    }

    # A huge Retry-After is capped at max_backoff_s (here 0.2 s), not obeyed for an hour, and reported.
    server.queue(RateLimit(3600))
    client = make_client(server, max_backoff_s=0.2, timeout_s=60.0)
    assert client.complete(MSG).ok
    assert (client.stats["retry_after_waits"], client.stats["retry_after_capped"]) == (1, 1)
    assert client.pop_counts()["retry_after_capped"] == 1 and client.pop_counts()["retry_after_capped"] == 0


def test_parse_retry_after_and_backoff():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after(None) is None
    import random

    rng = random.Random(0)
    # nominal delays 0.5, 1, 2, 4, then the cap 5: each jittered into [d/2, d]
    for attempt, nominal in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (9, 5.0)]:
        d = backoff_delay(attempt, 0.5, 5.0, rng)
        assert nominal / 2 <= d <= nominal


def test_server_down_then_back_up(server):
    server.responder = lambda body: "back"
    client = make_client(server, max_retries=20, backoff_s=0.05, max_backoff_s=0.3)
    # back after the client's 2nd refused connection: counted, not timed
    back_up = server.down_until(lambda: client.stats["errors"].get("connection", 0) >= 2)
    r = client.complete(MSG)
    back_up.join()
    assert (r.ok, r.text) == (True, "back")
    assert r.attempts >= 2
    assert client.stats["errors"]["connection"] == r.attempts - 1


def test_server_down_for_good_ends_as_connection_failure(server):
    server.stop_listening()
    r = make_client(server, max_retries=1).complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "connection", 2)


def test_complete_many_preserves_order_under_concurrency(server):
    import random

    rnd = random.Random(1)
    lock = threading.Lock()
    active = {"now": 0, "max": 0}

    def responder(body):
        # random delays make requests finish out of order
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(rnd.uniform(0, 0.03))
        with lock:
            active["now"] -= 1
        return "echo:" + last_user_message(body)

    server.responder = responder
    client = make_client(server, concurrency=8)
    reqs = [[{"role": "user", "content": str(i)}] for i in range(60)]
    seen = []
    results = client.complete_many(reqs, on_result=lambda i, r: seen.append(i))
    assert [r.text for r in results] == [f"echo:{i}" for i in range(60)]
    assert sorted(seen) == list(range(60))
    assert 2 <= active["max"] <= 8
    assert client.stats["calls"] == 60


def test_complete_many_mixes_failures_and_answers_in_order(server):
    server.responder = lambda body: "ok:" + last_user_message(body)
    client = make_client(server, concurrency=1, max_retries=0)
    server.queue(Answer(None), Status(400))  # request 0 answered, request 1 rejected
    results = client.complete_many([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    assert results[0].text == "ok:a"
    assert (results[1].ok, results[1].error_kind) == (False, "http_4xx")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="base_url"):
        ChatClient("api.openai.com", "m")
    with pytest.raises(ValueError, match="concurrency"):
        ChatClient("http://x", "m", concurrency=0)
    with pytest.raises(ValueError, match="message 0"):
        ChatClient("http://x", "m", api_key_env=None).complete([{"role": "user"}])


@pytest.mark.parametrize(
    "base_url, words",
    [
        ("https://user:hunter2@api.example.com/v1", "a user name or password in the address ('...@') is never sent"),
        ("https://api.example.com/v1?api-version=hunter2", "has a query ('?...', not shown)"),
        ("https://api.example.com/v1#hunter2", "has a fragment ('#...')"),
    ],
)
def test_a_base_url_with_a_password_query_or_fragment_is_refused_unprinted(base_url, words):
    """A query got /chat/completions appended after it (POST /v1?api-version=X/chat/completions); `user:pass@` was
    not sent, yet kept in repr(), to_dict() and the lines naming the host. Refused when the client is made, in one
    line that shows the address without the secret."""
    from regroup.errors import ConfigError
    from regroup.net.client import RequestError, request_json

    with pytest.raises(ConfigError) as e:
        ChatClient(base_url, "m", api_key_env=None)
    line = str(e.value)
    assert line.startswith("base_url: ") and words in line and "(https://api.example.com/v1)" in line, line
    assert "hunter2" not in line and "user" not in line.split("(")[-1]
    with pytest.raises(RequestError) as e:
        request_json(base_url + "/models")
    assert "hunter2" not in str(e.value) and words in str(e.value)


def test_repr_to_dict_and_pickle_never_hold_the_key(monkeypatch):
    secret = "sk-test-SECRET-repr-42"
    monkeypatch.setenv(ENV, secret)
    client = ChatClient("http://127.0.0.1:9/v1", "m", api_key_env=ENV)
    client._api_key()  # reading the key must not store it
    blob = pickle.dumps(client)
    assert secret not in repr(client)
    assert secret not in json.dumps(client.to_dict())
    assert secret.encode() not in blob
    assert secret not in repr(vars(client))
    clone = pickle.loads(blob)
    assert clone.to_dict() == client.to_dict() and clone.to_dict()["api_key_env"] == ENV


# --------------------------------------------------------------------------------------------------
# DiskCache


def test_cache_key_is_canonical_and_sensitive():
    assert cache_key("a", {"x": 1, "y": 2}) == cache_key("a", {"y": 2, "x": 1})
    assert cache_key("a", "b") != cache_key("ab")
    assert cache_key("q", None) != cache_key("q", "")
    assert len(cache_key("x")) == 64
    # pinned: canonical JSON of ["x"] is '["x"]'
    import hashlib

    assert cache_key("x") == hashlib.sha256(b'["x"]').hexdigest()


def test_cache_put_get_persist_and_failures_not_answers(tmp_path):
    path = tmp_path / "c" / "cache.sqlite"
    with DiskCache(path) as c:
        c.put("k1", {"score": 7, "reply": "SCORE: 7"})
        c.record_failure("k2", "HTTP 500")
        c.record_failure("k2", "timeout")
        assert c.get("k2") is None and "k2" not in c
        assert c.failures() == {"k2": ("timeout", 2)}
    with DiskCache(path) as c:
        assert c.get("k1") == {"score": 7, "reply": "SCORE: 7"}
        assert len(c) == 1 and "k1" in c
        c.put("k2", 3)  # a later success clears the failure
        assert c.failures() == {} and c.get("k2") == 3
    dir_cache = DiskCache(f"{tmp_path}/d/")
    assert dir_cache.path == tmp_path / "d" / "cache.sqlite"
    clone = pickle.loads(pickle.dumps(dir_cache))
    assert clone.path == dir_cache.path


def test_cache_is_thread_safe(tmp_path):
    c = DiskCache(tmp_path / "t.sqlite")

    def work(t):
        for i in range(50):
            c.put(f"{t}-{i}", [t, i])
            assert c.get(f"{t}-{i}") == [t, i]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(c) == 400
    assert all(v == [int(k.split("-")[0]), int(k.split("-")[1])] for k, v in c.items())


WRITER = textwrap.dedent(
    """
    import sys
    from regroup.net import DiskCache
    c = DiskCache(sys.argv[1])
    i = 0
    while True:
        # big values make each transaction span many pages, so the kill lands mid-write
        c.put(f"k{i}", {"i": i, "pad": "x" * (5000 + i % 7000), "check": i * 7})
        if i == 20:
            print("ready", flush=True)
        i += 1
    """
)


def test_cache_survives_sigkill_mid_write(tmp_path):
    path = tmp_path / "killed.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    c = DiskCache(path)
    items = c.items()
    assert len(items) > 20
    for key, value in items:
        i = int(key[1:])
        assert value == {"i": i, "pad": "x" * (5000 + i % 7000), "check": i * 7}
    # keys are a gap-free prefix: a committed row never disappears behind a later one
    assert sorted(int(k[1:]) for k, _ in items) == list(range(len(items)))
    import sqlite3

    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    c.put("after", 1)  # and it is still writable
    assert c.get("after") == 1


# --------------------------------------------------------------------------------------------------
# redaction (regroup.net.redact): hand-written cases


def test_redact_removes_keys_tokens_and_key_pieces():
    from regroup.net.redact import clip, redact

    key = "sk-QzXv9WkPq7JmRt2LbYn8HcFd"
    assert redact(f"bad key {key}!", [key]) == "bad key ***!"
    assert redact("Authorization: Bearer abc.def-123 sent", []) == "Authorization: Bearer *** sent"
    assert redact("use sk-live1234567890abc here", []) == "use *** here"  # any sk- token, known or not
    assert redact("a task-based, risk-free plan", []) == "a task-based, risk-free plan"  # not tokens
    # only its last four characters quoted back (as some APIs do): a piece of the key, removed
    assert (
        redact("Incorrect API key: sk-Qz*****HcFd.", [key]) == "Incorrect API key: " + "*" * 11 + "."
    )  # sk-Qz, stars, HcFd
    # a body cut by a read limit in the middle of the key: the trailing start of the key goes
    assert redact("error: " + key[:7], [key]) == "error: ***"
    assert redact("error:" + key[:4], [key]) == "error:***"
    assert redact("ends with sk-", [key]) == "ends with sk-"  # 3 characters are not a piece
    # lowercase words a test key may contain are not touched; words shaped like key material are
    assert redact("rewrite the fake text", ["sk-fake-rewriter-key"]) == "rewrite the fake text"
    # redact first, then cut: a cut through the key cannot leave its first characters behind
    text = "x" * 290 + key + " tail"
    assert clip(text, 300, [key]) == "x" * 290 + "***" + " tail"
    assert text[:300].endswith(key[:10])  # what cutting first would have kept


def test_redact_uses_every_key_the_client_has_read(monkeypatch):
    from regroup.net.redact import redact

    key = "sk-Remembered7Key9ForRedaction"
    monkeypatch.setenv(ENV, key)
    ChatClient("http://127.0.0.1:9/v1", "m", api_key_env=ENV)._api_key()
    assert redact(f"quoted: {key[3:]}") == "quoted: ***"  # no sk- prefix left to match: known value

"""A remote service cannot hold a request past its deadline nor flood memory: a server trickling one
byte every 0.5 s, one that never answers, replies of 8 MB (announced or not), and a Retry-After of
100 s. Each ends in a counted, typed failure; retries and capped waits are reported, in the client,
the judge's stats and the `regroup rephrase` summary.

Elapsed times are only bounded by wide margins (a trickled reply would take minutes): what is
asserted exactly are the counts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import FakeOpenAI, Hang, Huge, RateLimit, Status, Trickle

from regroup.net import ChatClient
from regroup.rephrase import OpenAIRephraser
from regroup.scorers import JudgeScorer, ScoreItem

pytestmark = pytest.mark.reliability

ENV = "REGROUP_TEST_BOUNDS_KEY"
KEY = "sk-fake-bounds-key"
MSG = [{"role": "user", "content": "hello"}]
WIDE = 45.0  # seconds: 30x and more the deadlines below (a loaded CI machine), far below what the faulty
#               servers would take (a trickle ~150 s, a hang 300 s); the counted events carry the rest


@pytest.fixture()
def server(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with FakeOpenAI(api_key=KEY) as srv:
        yield srv


def client_for(srv, **kw) -> ChatClient:
    opts = dict(api_key_env=ENV, timeout_s=1.0, max_retries=3, backoff_s=0.01, max_backoff_s=0.05, concurrency=4)
    opts.update(kw)
    return ChatClient(srv.base_url, "m", **opts)


@pytest.mark.parametrize("headers_first", [False, True], ids=["all_trickled", "body_trickled"])
def test_a_trickling_server_costs_one_deadline(server, headers_first):
    # ~300 bytes at one byte per 0.5 s: every read succeeds, the reply would take ~150 s.
    server.responder = lambda body: Trickle(0.5, headers_first=headers_first)
    client = client_for(server, timeout_s=1.0)
    t0 = time.monotonic()
    r = client.complete(MSG)
    elapsed = time.monotonic() - t0
    assert (r.ok, r.error_kind, r.attempts) == (False, "deadline", 1)
    assert "1 s deadline" in r.error
    assert elapsed < WIDE
    assert client.pop_counts() == {
        "requests": 1,
        "calls": 1,
        "ok": 0,
        "failures": 1,
        "retries": 0,
        "retry_after_waits": 0,
        "retry_after_capped": 0,
        "deadline_hits": 1,
        "oversize": 0,
    }


def test_trickling_attempts_are_retried_within_the_one_deadline(server):
    server.responder = lambda body: Trickle(0.2)
    client = client_for(server, timeout_s=1.5, attempt_timeout_s=0.4, max_retries=50)
    t0 = time.monotonic()
    r = client.complete(MSG)
    elapsed = time.monotonic() - t0
    assert (r.ok, r.error_kind) == (False, "deadline")
    # attempts of 0.4 s (+ tiny backoffs) in a 1.5 s deadline: at least 2, never the 51 allowed
    assert 2 <= r.attempts <= 5 and server.n_requests == r.attempts
    st = client.stats
    assert st["errors"]["timeout"] == r.attempts - 1 and st["deadline_hits"] == 1
    assert elapsed < WIDE


def test_a_hung_server_costs_one_deadline_per_request_in_a_batch(server):
    server.responder = lambda body: Hang(300)
    client = client_for(server, timeout_s=1.0, concurrency=8)
    t0 = time.monotonic()
    results = client.complete_many([[{"role": "user", "content": str(i)}] for i in range(8)])
    elapsed = time.monotonic() - t0
    assert [r.error_kind for r in results] == ["deadline"] * 8
    assert client.stats["deadline_hits"] == 8 and client.stats["requests"] == 8
    assert elapsed < WIDE  # ~1 s concurrently; never the 300 s the server hangs


@pytest.mark.parametrize("announce", [True, False])
def test_an_oversized_reply_is_refused_and_not_retried(server, announce):
    server.queue(Huge(8 * 1024 * 1024, announce=announce))
    client = client_for(server, timeout_s=30.0, max_response_bytes=1024 * 1024)
    r = client.complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "oversize", 1)
    assert "1048576-byte limit" in r.error
    assert server.n_requests == 1
    assert client.pop_counts()["oversize"] == 1


def test_a_reply_under_the_size_cap_is_read_whole(server):
    server.queue(Huge(512 * 1024, announce=False))
    r = client_for(server, timeout_s=30.0, max_response_bytes=1024 * 1024).complete(MSG)
    assert r.ok and len(r.text) > 500_000 and set(r.text) == {"x"}


def test_retry_after_100_is_capped_counted_and_reported(server):
    server.queue(RateLimit(100))
    server.responder = lambda body: "SCORE: 4"
    client = client_for(server, timeout_s=30.0, max_backoff_s=0.1)
    r = client.complete(MSG)
    assert r.ok and r.attempts == 2
    counts = client.pop_counts()
    assert (counts["retries"], counts["retry_after_waits"], counts["retry_after_capped"]) == (1, 1, 1)


def test_a_retry_after_past_the_deadline_ends_the_call_at_once(server, monkeypatch):
    server.queue(RateLimit(100))
    client = client_for(server, timeout_s=1.0, max_backoff_s=20.0)  # a 20 s wait cannot fit in 1 s
    slept: list[float] = []  # every sleep the client asks for: the event, not the wall clock
    real_sleep = time.sleep
    monkeypatch.setattr("regroup.net.client.time.sleep", lambda s: (slept.append(s), real_sleep(min(s, 0.01))))
    r = client.complete(MSG)
    assert (r.ok, r.error_kind, r.attempts) == (False, "deadline", 1)
    assert r.error.startswith("HTTP 429") and "no time left to retry" in r.error
    # one request, and the client never waits for the 100 s (nor for its 20 s backoff)
    assert server.n_requests == 1 and all(s < 1.0 for s in slept), slept
    st = client.stats
    assert (st["retry_after_waits"], st["retry_after_capped"], st["deadline_hits"], st["retries"]) == (1, 1, 1, 0)


def test_judge_stats_and_pop_counts_report_network_events(server):
    server.queue(Status(503), RateLimit(100), Trickle(0.5))
    server.responder = lambda body: "fine\nSCORE: 6"
    judge = JudgeScorer(client_for(server, timeout_s=30.0, attempt_timeout_s=0.5, max_backoff_s=0.05))
    assert judge.score_batch([ScoreItem("q", "r", "ref")]) == [6.0]
    st = judge.stats
    assert (st["scored"], st["retries"], st["retry_after_waits"], st["retry_after_capped"]) == (1, 3, 1, 1)
    counts = judge.pop_counts()
    assert counts["retries"] == 3 and counts["requests"] == 4
    assert judge.pop_counts()["retries"] == 0  # popped
    assert judge.stats["retries"] == 3  # stats stay cumulative


def test_rephrase_cli_timeout_bounds_a_trickling_server_and_reports_retries(server, tmp_path, capsys):
    from regroup.cli import main
    from regroup.data.load import save_problems
    from regroup.tasks.arithmetic import generate

    server.queue(RateLimit(0.1))  # one Retry-After wait, then every request trickles
    server.responder = lambda body: Trickle(0.5)
    save_problems(generate(2, seed=0), tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    t0 = time.monotonic()
    code = main(
        [
            "rephrase",
            "--data",
            str(tmp_path / "in.jsonl"),
            "--out",
            str(out),
            "--n",
            "1",
            "--rewriter",
            "openai",
            "--base-url",
            server.base_url,
            "--model",
            "m",
            "--api-key-env",
            ENV,
            "--timeout",
            "1",
            "--concurrency",
            "2",
        ]
    )
    elapsed = time.monotonic() - t0
    assert code == 0
    assert elapsed < 2 * WIDE  # 2 requests of 1 s each (a trickled reply would take ~150 s)
    totals = json.loads(capsys.readouterr().out)
    assert totals["request_failures"] == 2 and totals["deadline_hits"] == 2
    assert totals["retries"] == 1 and totals["retry_after_waits"] == 1 and totals["retry_after_capped"] == 0
    summary = json.loads(Path(str(out) + ".summary.json").read_text())
    assert summary["totals"] == totals and summary["client"]["deadline_hits"] == 2


def test_rewriter_pop_counts(server):
    server.queue(Status(500))
    server.responder = lambda body: "<rewrite>Add 4 and 2, please.</rewrite>"
    rw = OpenAIRephraser(client_for(server))
    (outcome,) = rw.rephrase_many([SimpleNamespace(id="a", question="Add 2 and 4.")], 1)
    assert outcome.accepted == 1
    assert rw.pop_counts()["retries"] == 1 and rw.pop_counts()["retries"] == 0

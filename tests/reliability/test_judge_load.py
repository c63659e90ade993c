"""Load: 2,000 judge requests at 64 concurrency against the fake server — no lost or duplicated
scores, every score the right one, bounded memory, and a second pass served wholly from the cache."""

from __future__ import annotations

import hashlib
import re
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import FakeOpenAI, last_user_message

from regroup.net import ChatClient, DiskCache
from regroup.scorers import JudgeScorer, ScoreItem

pytestmark = pytest.mark.reliability

N = 2000
CONCURRENCY = 64
# Peak of Python allocations (client, 64 worker threads, SQLite cache calls *and* the in-process fake
# server with its 2,000 recorded requests). Measured ~10-15 MiB; the bound leaves room for platform
# differences while still catching anything that grows per request beyond a few KiB.
PEAK_BOUND_MIB = 48
KEY = "sk-fake-load-key"
ENV = "REGROUP_TEST_LOAD_KEY"


def expected_score(i: int) -> int:
    return int(hashlib.sha256(str(i).encode()).hexdigest(), 16) % 10 + 1


def responder(body):
    text = last_user_message(body)
    i = int(re.search(r"<response>\nresponse #(\d+)", text).group(1))
    return f"Checked response {i}.\nSCORE: {expected_score(i)}"


def test_two_thousand_judge_requests_at_64_concurrency(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    items = [
        ScoreItem(f"question {i % 50}", f"response #{i} with some reasoning text", f"reference {i % 50}")
        for i in range(N)
    ]
    with FakeOpenAI(api_key=KEY, responder=responder) as srv:
        client = ChatClient(
            srv.base_url,
            "judge",
            api_key_env=ENV,
            timeout_s=20.0,
            max_retries=3,
            backoff_s=0.05,
            concurrency=CONCURRENCY,
        )
        judge = JudgeScorer(client, DiskCache(tmp_path / "load.sqlite"))
        tracemalloc.start()
        t0 = time.monotonic()
        scores = judge.score_batch(items)
        wall = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

        assert scores == [float(expected_score(i)) for i in range(N)]
        assert judge.stats["scored"] == N and judge.stats["failed"] == 0
        # no lost, no duplicated request: each response was judged exactly once
        seen = Counter(int(re.search(r"response #(\d+)", last_user_message(r.body)).group(1)) for r in srv.requests)
        assert len(srv.requests) == N and set(seen) == set(range(N)) and max(seen.values()) == 1
        assert all(r.auth_ok for r in srv.requests)
        st = client.stats
        assert (st["calls"], st["ok"], st["failures"], st["requests"]) == (N, N, 0, N)
        assert peak / 2**20 < PEAK_BOUND_MIB, f"peak {peak / 2**20:.1f} MiB"
        print(f"\n{N} judge requests at concurrency {CONCURRENCY}: {wall:.1f} s, peak {peak / 2**20:.1f} MiB")

        # second pass: everything from the cache, nothing sent
        again = JudgeScorer(client, DiskCache(tmp_path / "load.sqlite"))
        assert again.score_batch(items) == scores
        assert len(srv.requests) == N and again.stats["cached"] == N

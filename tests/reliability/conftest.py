"""The figures RELIABILITY.md quotes, collected while the reliability suite runs and printed at the end
of the session under "reliability figures":

- every `ChatClient` a test creates in this process: calls, ok, failures, retries, failed attempts by kind;
- every `FakeOpenAI` server a test opens: requests received, by behaviour (Answer, Status, Slow, ...);
- whatever a test reports through the `figures` fixture (kills survived and where they landed, ...).

It also holds the fixtures several reliability files share: a finished run to copy, a folder of hostile user
rewards, and guards that fail a test whose run got as far as building its parts or loading weights.

Counting only observes: the client's `__init__` and the server's `__enter__` are wrapped to remember the
instance, nothing else changes.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/fake_openai.py

FIGURES: dict[str, list[str]] = {}


@pytest.fixture(scope="session")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-step run (a checkpoint each step), made in this process through the CLI."""
    import reliability_helpers as h

    from regroup.cli import main

    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(h.train_args(tiny_model_dir, run, "grpo.yaml", "train.steps=2")) == 0
    return run


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of `finished_run` a test may change."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    return run


@pytest.fixture
def figures(request) -> Callable[[str], None]:
    """`figures(line)` adds a line to this test's entry in the session's "reliability figures"."""
    return lambda line: FIGURES.setdefault(request.node.nodeid, []).append(line)


@pytest.fixture(autouse=True)
def _count_remote_traffic(request, monkeypatch):
    import fake_openai

    from regroup.net import client as client_mod

    clients, servers = [], []
    init, enter = client_mod.ChatClient.__init__, fake_openai.FakeOpenAI.__enter__

    def counting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        clients.append(self)

    def counting_enter(self):
        servers.append(self)
        return enter(self)

    monkeypatch.setattr(client_mod.ChatClient, "__init__", counting_init)
    monkeypatch.setattr(fake_openai.FakeOpenAI, "__enter__", counting_enter)
    yield
    lines = FIGURES.setdefault(request.node.nodeid, [])
    if servers:
        actions = Counter(r.action for s in servers for r in s.requests)
        lines.append(
            f"fake server: {sum(actions.values())} requests received, by behaviour {dict(sorted(actions.items()))}"
        )
    if clients:
        total: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        for c in clients:
            st = c.stats
            total.update({k: st[k] for k in ("calls", "ok", "failures", "requests", "retries")})
            errors.update(st["errors"])
        lines.append(f"clients (this process): {dict(total)}; failed attempts by kind {dict(sorted(errors.items()))}")
    if not lines:
        del FIGURES[request.node.nodeid]


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for nodeid, lines in FIGURES.items():
        terminalreporter.write_line(nodeid)
        for line in lines:
            terminalreporter.write_line(f"    {line}")


@pytest.fixture
def no_compute(monkeypatch):
    """Fail the test if a run gets as far as building its parts (data, model)."""
    import regroup.train.build

    def boom(*a, **k):
        raise AssertionError("the run was built: the error came after compute started")

    monkeypatch.setattr(regroup.train.build, "build_parts", boom)


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if the policy's weights load: the pre-load checks (inside build_parts) still run."""
    import regroup.models.load
    import regroup.train.build

    def refuse(*a, **k):
        raise AssertionError("the weights were loaded: the error came after the pre-load checks")

    monkeypatch.setattr(regroup.models.load, "load_policy", refuse)
    monkeypatch.setattr(regroup.train.build, "load_policy", refuse)


@pytest.fixture(scope="session")
def reward_dir(tmp_path_factory):
    """A folder (not the current one) holding hostile_rewards.py (`reliability_helpers.HOSTILE_REWARDS`), put on
    sys.path."""
    import reliability_helpers as h

    folder = tmp_path_factory.mktemp("hostile-rewards")
    (folder / "hostile_rewards.py").write_text(h.HOSTILE_REWARDS)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))

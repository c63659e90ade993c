"""A `rollout.backend=vllm_server` run leaves no weight folders behind, however it ends: exit 0 (sync and
async), a server fault (exit 2), an exception out of the trainer, and a real Ctrl-C (SIGINT to a `regroup
train` process). Each run gets a TMPDIR of its own, which must be empty afterwards; before, every run left
`regroup-vllm-sync-*/weights-vN` there (540 MB for SmolLM2 in fp32). The scripted server of
tests/fake_vllm.py stands in for vLLM; the same against the real server: tests/real_engine/test_server_guard.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import reliability_helpers as h
from fake_openai import wait_until
from fake_vllm import FakeVLLM, ok_choices

from regroup.cli import main

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def own_tmpdir(tmp_path, monkeypatch):
    """A TMPDIR for this test alone (tempfile reads it once: its cache is reset too)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def _train(model_dir, run, url, *extra) -> int:
    args = ["rollout.backend=vllm_server", f"rollout.vllm_server_url={url}", "rollout.max_new_tokens=8"]
    return main(h.train_args(model_dir, run, "grpo.yaml", *args, "train.steps=2", *extra))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_run_that_finishes_leaves_nothing_in_tmpdir(tiny_model_dir, tmp_path, own_tmpdir, asynchronous):
    extra = ["rollout.async_steps=1"] if asynchronous else []
    with FakeVLLM() as srv:
        assert _train(tiny_model_dir, tmp_path / "run", srv.url, *extra) == 0
    assert [p for p, _, _ in srv.requests].count("/collective_rpc") >= 1  # it did write weight folders
    assert list(own_tmpdir.iterdir()) == []


def test_a_run_stopped_by_a_server_fault_leaves_nothing(tiny_model_dir, tmp_path, own_tmpdir, capsys):
    with FakeVLLM() as srv:
        served = []

        def reply(body):  # answers the first step's rows, then a list where an object belongs
            served.append(body)
            return {"choices": ok_choices(body)} if len(served) <= 4 else [ok_choices(body)]

        srv.completion_reply = reply
        assert _train(tiny_model_dir, tmp_path / "run", srv.url) == 2
    assert "error: vLLM server:" in capsys.readouterr().err
    assert list(own_tmpdir.iterdir()) == []


def test_an_exception_out_of_the_trainer_leaves_nothing(tiny_model_dir, tmp_path, own_tmpdir, monkeypatch):
    from regroup.train.trainer import Trainer

    def interrupted(self, batch):
        raise KeyboardInterrupt  # what Ctrl-C raises in the middle of an update

    monkeypatch.setattr(Trainer, "update", interrupted)
    with FakeVLLM() as srv:
        assert _train(tiny_model_dir, tmp_path / "run", srv.url) == 130  # Ctrl-C: one line, exit 130
    assert list(own_tmpdir.iterdir()) == []


@pytest.mark.parametrize("asynchronous", [False, True])
def test_ctrl_c_in_a_real_process_leaves_nothing(tiny_model_dir, tmp_path, own_tmpdir, asynchronous):
    run = tmp_path / "run"
    extra = ["rollout.async_steps=1"] if asynchronous else []
    with FakeVLLM() as srv:
        args = h.train_args(
            tiny_model_dir, run, "grpo.yaml", "rollout.backend=vllm_server", f"rollout.vllm_server_url={srv.url}",
            "rollout.max_new_tokens=8", "train.steps=100000", *extra,
        )  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TMPDIR": str(own_tmpdir)}
        proc = subprocess.Popen([sys.executable, "-m", "regroup", *args], env=env, cwd=ROOT, stderr=subprocess.PIPE)
        try:
            metrics = run / "metrics.jsonl"
            assert wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, 300)
            assert any(own_tmpdir.iterdir())  # its sync folder, while it runs
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode != 0, err.decode()[-2000:]
    assert list(own_tmpdir.iterdir()) == []

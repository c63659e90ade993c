"""A `rollout.backend=vllm_server` run leaves no weight folders behind, however it ends: exit 0 (sync and
async), a server fault (exit 2), an exception out of the trainer, and a real Ctrl-C (SIGINT to a `regroup
train` process). Each run gets a TMPDIR of its own, which must be empty afterwards; before, every run left
`regroup-vllm-sync-*/weights-vN` there (540 MB for SmolLM2 in fp32). A run ended by SIGKILL or SIGTERM cannot
remove its own: the next run on the host does (the folder's `owner.json` names a process that has ended). The
scripted server of tests/fake_vllm.py stands in for vLLM; the same against the real server:
tests/real_engine/test_server_guard.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import reliability_helpers as h
from fake_openai import wait_until
from fake_vllm import FakeVLLM, ok_choices

from regroup.cli import main
from regroup.rollout.vllm_server import make_sync_dir, process_start_time, remove_orphan_sync_dirs

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


def _start_run(tiny_model_dir, run, url, own_tmpdir, *extra) -> subprocess.Popen:
    """`regroup train` in a process of its own, TMPDIR = `own_tmpdir`, for as many steps as it is given time."""
    args = h.train_args(
        tiny_model_dir, run, "grpo.yaml", "rollout.backend=vllm_server", f"rollout.vllm_server_url={url}",
        "rollout.max_new_tokens=8", "train.steps=100000", *extra,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TMPDIR": str(own_tmpdir)}
    return subprocess.Popen([sys.executable, "-m", "regroup", *args], env=env, cwd=ROOT, stderr=subprocess.PIPE)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_runs_sync_folder_goes_when_the_next_run_starts(tiny_model_dir, tmp_path, own_tmpdir, capsys, sig):
    with FakeVLLM() as srv:
        proc = _start_run(tiny_model_dir, tmp_path / "killed", srv.url, own_tmpdir)
        try:
            metrics = tmp_path / "killed" / "metrics.jsonl"
            assert wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, 300)
            proc.send_signal(sig)
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -sig
        left = sorted(own_tmpdir.iterdir())
        assert [p.name.startswith("regroup-vllm-sync-") for p in left] == [True]  # it could not remove its own
        assert json.loads((left[0] / "owner.json").read_text())["pid"] == proc.pid
        assert any(p.name.startswith("weights-v") for p in left[0].iterdir())
        assert _train(tiny_model_dir, tmp_path / "next", srv.url) == 0
    assert list(own_tmpdir.iterdir()) == []  # the next run removed the killed run's folder, then its own
    out = capsys.readouterr()
    assert (out.out + out.err).count("removed 1 weight-sync folder(s)") == 1


def _orphan(parent, name, **owner):
    folder = parent / f"regroup-vllm-sync-{name}"
    (folder / "weights-v1").mkdir(parents=True)
    (folder / "weights-v1" / "model.safetensors").write_bytes(b"x" * 1000)
    if owner:
        (folder / "owner.json").write_text(json.dumps(owner))
    return folder


def test_only_folders_whose_owner_on_this_host_has_ended_are_removed(tmp_path, own_tmpdir):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a pid that no longer runs
    host, me, my_start = socket.gethostname(), os.getpid(), process_start_time(os.getpid())
    gone = [
        _orphan(own_tmpdir, "dead", pid=ended.pid, host=host, start=None),
        _orphan(own_tmpdir, "reused", pid=me, host=host, start="1"),  # this pid, but another process's start
    ]
    kept = [
        _orphan(own_tmpdir, "alive", pid=me, host=host, start=my_start),
        _orphan(own_tmpdir, "other-host", pid=ended.pid, host=host + "-elsewhere", start=None),
        _orphan(own_tmpdir, "no-owner"),  # being made right now, or by an older regroup
        _orphan(own_tmpdir, "bad-owner", pid="12", host=host),
        make_sync_dir(),  # a live sampler's, in this process
    ]
    outside = _orphan(tmp_path, "outside", pid=ended.pid, host=host, start=None)
    link = own_tmpdir / "regroup-vllm-sync-link"
    link.symlink_to(outside, target_is_directory=True)
    size = sum(f.stat().st_size for folder in gone for f in folder.rglob("*") if f.is_file())
    assert remove_orphan_sync_dirs() == (2, size)
    assert [f.exists() for f in gone] == [False, False]
    assert [f.exists() for f in kept] == [True] * len(kept)
    assert outside.is_dir() and link.is_symlink()  # a link is not followed

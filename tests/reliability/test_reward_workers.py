"""A user reward runs in worker processes: a worker never imports from the current folder, has a memory limit,
runs alongside the others up to `rewards.workers`, and leaves no process behind when its call times out or the
training process is killed. Each case runs the real workers on a hostile reward
(`reliability_helpers.HOSTILE_REWARDS`) and failed before its fix."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import reliability_helpers as h

from regroup.errors import ConfigError

pytestmark = pytest.mark.reliability

problem = h.problem


@pytest.fixture
def hostile_cwd(tmp_path, monkeypatch):
    """The current folder holds a json.py that leaves a marker file when imported (and would break json)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "JSON_PY_RAN"
    (cwd / "json.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(cwd)
    return marker


# -- workers never import from the current folder -----------------------------------------------------


def test_a_json_py_in_the_current_folder_never_runs_in_a_user_reward_worker(reward_dir, hostile_cwd, tmp_path):
    from regroup.rewards.deadline import DeadlineReward

    out = tmp_path / "regroup_file"
    fn = DeadlineReward("hostile_rewards:where_regroup", timeout_s=30.0)
    try:
        assert fn("r", problem(out=str(out))) == 1.0
    finally:
        fn.close()
    assert not hostile_cwd.exists(), "the worker imported ./json.py"
    import regroup

    assert out.read_text() == regroup.__file__  # the worker runs the parent's regroup (a worktree's, here)


def test_a_json_py_in_the_current_folder_never_runs_in_a_math_verify_worker(hostile_cwd):
    pytest.importorskip("math_verify")
    from regroup.rewards.math_verify import MathAnswerChecker

    with MathAnswerChecker(timeout_s=10.0) as check:
        assert check(r"so \boxed{1}", problem()) == 1.0
    assert not hostile_cwd.exists(), "the math-verify worker imported ./json.py"


def test_a_reward_module_in_the_current_folder_still_loads_from_its_file(tmp_path, monkeypatch, hostile_cwd):
    """`python -m regroup` puts the current folder on the parent's path; the worker loads the reward the
    parent imported from that very file, and still never ./json.py."""
    from regroup.rewards.deadline import DeadlineReward

    cwd = Path.cwd()
    (cwd / "reward_in_cwd.py").write_text("def fn(response, problem):\n    return 7.0\n")
    monkeypatch.syspath_prepend(str(cwd))
    fn = DeadlineReward("reward_in_cwd:fn", timeout_s=30.0)
    try:
        assert fn("r", problem()) == 7.0
    finally:
        fn.close()
    assert not hostile_cwd.exists()


# -- a timeout kills the reward's own processes --------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def test_a_timed_out_reward_leaves_no_orphans(reward_dir, tmp_path, figures):
    from regroup.rewards.deadline import DeadlineReward

    pids = []
    fn = DeadlineReward("hostile_rewards:spawns_then_hangs", timeout_s=1.0)
    try:
        for i in range(3):
            out = tmp_path / f"child-{i}"
            assert fn("r", problem(out=str(out))) is None
            pids.append(int(out.read_text()))
    finally:
        fn.close()
        left = [pid for pid in pids if _alive(pid)]
        for pid in left:  # a failing run must not leave them behind either
            os.kill(pid, 9)
    assert left == [], f"{len(left)} of {len(pids)} processes a timed-out reward started are still running"
    figures(f"orphans after 3 timed-out calls that each started a 300 s child: {len(left)} of {len(pids)}")


# -- a memory limit per reward worker -------------------------------------------------------------------


def test_a_reward_worker_has_a_memory_limit(reward_dir):
    from regroup.rewards.deadline import DeadlineReward, UserRewardError

    fn = DeadlineReward("hostile_rewards:allocates", timeout_s=30.0, memory_mb=512)
    try:
        assert fn("r", problem(mb=16)) == 1.0
        with pytest.raises(UserRewardError, match="raised MemoryError"):
            fn("r", problem(mb=2048))
    finally:
        fn.close()


def test_the_memory_limit_is_a_config_key_with_a_default():
    from regroup.train.run_config import load_config

    assert load_config("grpo", []).rewards.worker_memory_mb == 4096
    assert load_config("grpo", ["rewards.worker_memory_mb=0"]).rewards.worker_memory_mb == 0
    with pytest.raises(ConfigError, match="rewards.worker_memory_mb"):
        load_config("grpo", ["rewards.worker_memory_mb=-1"])


# -- calls run concurrently, up to rewards.workers -----------------------------------------------------


def test_reward_calls_run_concurrently_up_to_the_configured_width(reward_dir, tmp_path):
    from regroup.rewards import score_many
    from regroup.rewards.build import build_reward_fn

    fn = build_reward_fn(["hostile_rewards:together"], None, workers=4, timeout_s=30.0)
    try:
        p = problem(dir=str(tmp_path), n=4)
        assert score_many(fn, ["a", "b", "c", "d"], [p] * 4) == [1.0] * 4
    finally:
        fn.close()
    assert len({name.name.split("-")[0] for name in tmp_path.iterdir()}) == 4  # four worker processes


# -- a killed trainer leaves no worker behind -----------------------------------------------------------


def test_a_killed_parent_leaves_no_reward_worker_behind(reward_dir, tmp_path):
    """SIGKILL of the training process while a reward hangs: the worker and what it started go too."""
    import signal
    import subprocess

    out = tmp_path / "grandchild"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from regroup.rewards.deadline import DeadlineReward; "
            "from regroup.tasks.base import Problem; "
            "fn = DeadlineReward('hostile_rewards:spawns_then_hangs', timeout_s=300); "
            "fn('r', Problem('q', '?', '1', meta={'out': sys.argv[2]}))",
            str(reward_dir),
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        for _ in range(1200):  # the reward has started its child (60 s at most, on a loaded machine)
            if out.exists() and out.read_text():
                break
            time.sleep(0.05)
        grandchild = int(out.read_text())
        workers = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert workers and _alive(grandchild)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(600):  # within 60 s (the worker checks once a second)
            if not any(_alive(pid) for pid in (*workers, grandchild)):
                break
            time.sleep(0.1)
        left = [pid for pid in (*workers, grandchild) if _alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
    for pid in left:
        os.kill(pid, 9)
    assert left == []

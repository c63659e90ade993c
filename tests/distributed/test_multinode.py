"""Two "machines" on loopback, launched as a multi-node user launches them: one `accelerate launch` per machine,
`--num_machines 2 --machine_rank 0|1 --main_process_ip 127.0.0.1 --main_process_port P --num_processes 2`, one
process each, gloo on CPU (`Accelerator(cpu=True)`, `--multi_gpu`: see `regroup.runtime.agreement` for why),
running `python -m regroup train`. Each machine has its own copy of `data.train_file`, at its own path.

- the copies hold the same questions: the two processes train together and both exit 0;
- they differ: every rank prints the same one line before step 1, both exit non-zero, nothing is trained.

The first runs of regroup's multi-node path; docs/scaling.md ("Several machines") quotes them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import CONFIGS, accelerate_exe, free_port

import regroup

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two launches of two processes: minutes here

SRC = Path(regroup.__file__).resolve().parents[1]  # the regroup under test, also in the launched processes
TESTS = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 420  # a generous bound for a 2-step run on a loaded 2-core machine (seen: 1-3 min)


def _write_problems(path: Path, seed: int) -> Path:
    from regroup.tasks import get_task

    rows = [{"id": p.id, "question": p.question, "answer": p.answer} for p in get_task("arithmetic").generate(16, seed)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _launch(model_dir: str, run_dir: Path, train_files: list[Path], cwd: Path) -> list[dict]:
    """Both machines' `accelerate launch`, started together; their exit codes and output."""
    port = free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # the regroup under test, and tests/ for the reward `_dist_worker:digit_reward`
        "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    procs = []
    for rank, train_file in enumerate(train_files):
        cmd = [
            accelerate_exe(),
            "launch",
            "--multi_gpu",
            "--num_machines",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "-m",
            "regroup",
            "train",
            "--config",
            str(CONFIGS / "grpo.yaml"),
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            f"data.train_file={train_file}",
            "rewards=[_dist_worker:digit_reward]",  # mixed groups from a random model: real updates
            "grpo.prompts_per_step=2",
            "grpo.num_generations=4",
            "rollout.max_new_tokens=8",
            "train.steps=2",
            "train.checkpoint_every=0",
            "train.progress=false",
            "train.threads=1",
            "train.collective_timeout_s=120",
            "diagnostics.diversity_every=0",
            "diagnostics.grad_conflict_every=0",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    out = []
    for rank, proc in enumerate(procs):
        try:
            text, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"machine {rank} did not finish within {LAUNCH_TIMEOUT_S} s")
        (cwd / f"machine{rank}.log").write_text(text)
        out.append({"rc": proc.returncode, "output": text})
    return out


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_machines_with_equal_copies_of_the_data_train_together(tiny_model_dir, tmp_path):
    (tmp_path / "machine0").mkdir()
    (tmp_path / "machine1").mkdir()
    mine = _write_problems(tmp_path / "machine0" / "train.jsonl", seed=0)
    theirs = tmp_path / "machine1" / "train.jsonl"
    theirs.write_bytes(mine.read_bytes())  # the other machine's own copy, at its own path
    run_dir = tmp_path / "run"
    machines = _launch(tiny_model_dir, run_dir, [mine, theirs], tmp_path)
    print("\n" + "\n".join(f"machine {r}: exit {m['rc']}" for r, m in enumerate(machines)))
    assert [m["rc"] for m in machines] == [0, 0], machines[0]["output"][-3000:] + machines[1]["output"][-3000:]
    assert not any("disagree" in m["output"] for m in machines)
    assert [m["step"] for m in _metrics(run_dir)] == [1, 2]  # one record per step: rank 0 wrote, rank 1 did not
    assert f"run folder: {run_dir}" in machines[0]["output"] and "run folder:" not in machines[1]["output"]


def test_two_machines_with_different_data_stop_before_step_1_in_one_line_each(tiny_model_dir, tmp_path):
    (tmp_path / "machine0").mkdir()
    (tmp_path / "machine1").mkdir()
    files = [_write_problems(tmp_path / f"machine{r}" / "train.jsonl", seed=r) for r in (0, 1)]
    run_dir = tmp_path / "run"
    machines = _launch(tiny_model_dir, run_dir, files, tmp_path)
    print("\n" + "\n".join(f"machine {r}: exit {m['rc']}" for r, m in enumerate(machines)))
    lines = []
    for rank, m in enumerate(machines):
        ours = [line for line in m["output"].splitlines() if "disagree on what to train" in line]
        assert len(ours) == 1, (rank, m["output"][-3000:])
        lines.append(ours[0])
        print(f"machine {rank}: {ours[0]}")
        assert m["rc"] != 0
        assert "Traceback" not in m["output"].split(ours[0])[0]  # nothing of ours before the line
    assert lines[0] == lines[1]  # the same line on every rank
    assert lines[0].startswith("config error: the 2 processes disagree on what to train: the training data differs")
    assert "rank 0: 16 problems, sha256 " in lines[0] and "rank 1: 16 problems, sha256 " in lines[0]
    assert _metrics(run_dir) == [] and not (run_dir / "checkpoints").exists()  # nothing trained
    assert not (run_dir / "config.yaml").exists()  # stopped before the trainer started

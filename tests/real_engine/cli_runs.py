"""The CLI commands the real-engine tests run, each in a subprocess of this interpreter (the way a user
runs them), with the tree's `src` first on the path and one thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def regroup(*args: str, timeout: int = 1200) -> tuple[subprocess.CompletedProcess, float]:
    """(finished process, wall seconds) of `python -m regroup ARGS`."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "regroup", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )
    return proc, time.perf_counter() - start


def write_problems(path: Path, question_key: str = "question") -> Path:
    rows = [
        {question_key: "What is 2 + 3? Put the final answer in \\boxed{}.", "answer": "5"},
        {question_key: "What is 7 - 4? Put the final answer in \\boxed{}.", "answer": "3"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tail(proc: subprocess.CompletedProcess, lines: int = 15) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])

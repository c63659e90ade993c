"""`regroup eval --backend vllm` on the real engine (named benchmark from a local file), and the CUDA-only
engine settings refused on CPU in one line before any model loads."""

from __future__ import annotations

import json

import pytest
from cli_runs import regroup, tail, write_problems

pytestmark = pytest.mark.slow  # the real engine: minutes on 2 cores


def test_eval_bench_with_the_vllm_backend(smollm2_dir, tmp_path, figures):
    bench = write_problems(tmp_path / "math500.jsonl", question_key="problem")
    proc, seconds = regroup(
        "eval",
        "--model",
        smollm2_dir,
        "--bench",
        "math500",
        "--bench-file",
        f"math500={bench}",
        "--n",
        "2",
        "--k",
        "1",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--no-greedy",
        "--backend",
        "vllm",
        "--out",
        str(tmp_path / "out"),
    )
    assert proc.returncode == 0, tail(proc)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    figures["eval --bench math500 --backend vllm: 2 problems x 2 samples x 8 tokens, s (engine start included)"] = (
        round(seconds, 1)
    )
    assert "math500" in json.dumps(summary)


def test_sleep_mode_is_refused_on_cpu_in_one_line(smollm2_dir, tmp_path):
    proc, _ = regroup(
        "train",
        f"model.path={smollm2_dir}",
        "rollout.backend=vllm",
        "rollout.vllm_enable_sleep_mode=true",
        f"run_dir={tmp_path / 'run'}",
        "train.steps=1",
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, tail(proc)
    assert len(lines) == 1 and "vllm_enable_sleep_mode=true needs CUDA" in lines[0], lines
    assert not (tmp_path / "run" / "checkpoints").exists()

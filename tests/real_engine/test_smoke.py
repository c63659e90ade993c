"""CI's real-engine smoke test (`make vllm-smoke`, run by .ci/run after `make test`): on SmolLM2 fetched
into .cache/, one colocated vLLM training step through `regroup train`, then `regroup eval --backend vllm`
on the checkpoint it wrote; then two asynchronous steps (`rollout.async_steps=1`) against a vLLM server. A few
samples of a few tokens: minutes on a loaded 2-core machine."""

from __future__ import annotations

import json

import pytest
from cli_runs import ROOT, regroup, tail, write_problems

pytestmark = pytest.mark.slow  # the real engine: minutes on 2 cores


def test_a_colocated_vllm_step_and_a_vllm_eval(smollm2_dir, tmp_path, figures):
    run = tmp_path / "run"
    proc, seconds = regroup(
        "train",
        "--config",
        str(ROOT / "examples" / "smollm2_grpo.yaml"),
        f"model.path={smollm2_dir}",
        "rollout.backend=vllm",
        "rollout.vllm_max_model_len=256",
        "rollout.max_new_tokens=8",
        "rollout.tis_cap=2",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=2",
        "train.steps=1",
        "data.num_train=8",
        "diagnostics.grad_conflict_every=0",
        f"run_dir={run}",
    )
    assert proc.returncode == 0, tail(proc)
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 1 and record["tokens/generated"] > 0, record
    figures["smoke: regroup train, 1 vLLM step (2 x 2 samples x 8 tokens), s"] = round(seconds, 1)

    checkpoint = next((run / "checkpoints").glob("step-*"))
    problems = write_problems(tmp_path / "problems.jsonl")
    proc, seconds = regroup(
        "eval",
        "--model",
        str(checkpoint),
        "--data",
        str(problems),
        "--n",
        "2",
        "--k",
        "1",
        "--max-new-tokens",
        "8",
        "--no-greedy",
        "--backend",
        "vllm",
        "--out",
        str(tmp_path / "eval"),
    )
    assert proc.returncode == 0, tail(proc)
    assert (tmp_path / "eval" / "summary.json").is_file()
    figures["smoke: regroup eval --backend vllm, 2 problems x 2 samples x 8 tokens, s"] = round(seconds, 1)


def test_one_async_step_on_a_vllm_server(smollm2_dir, tmp_path, figures):
    """`rollout.async_steps=1` through `regroup train` against `regroup vllm-serve`'s server: step 2 is drawn
    by version 0 while the learner trains step 1 (policy lag 1), each step's batch stamped with its version."""
    import sys

    from regroup.rollout.vllm_server import LocalServer

    run = tmp_path / "run"
    with LocalServer(smollm2_dir, python=sys.executable, max_model_len=256, dtype="float32") as server:
        proc, seconds = regroup(
            "train",
            "--config",
            str(ROOT / "examples" / "smollm2_grpo.yaml"),
            f"model.path={smollm2_dir}",
            "rollout.backend=vllm_server",
            f"rollout.vllm_server_url={server.url}",
            "rollout.async_steps=1",
            "rollout.max_new_tokens=8",
            "grpo.prompts_per_step=2",
            "grpo.num_generations=2",
            "train.steps=2",
            "data.num_train=8",
            f"run_dir={run}",
        )
    assert proc.returncode == 0, tail(proc)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/policy_lag"] for r in records] == [0.0, 1.0], records
    assert all(r["tokens/generated"] > 0 and "rollout/logprob_gap_mean" in r for r in records)
    figures["smoke: regroup train, 2 async steps on a vLLM server (2 x 2 samples x 8 tokens), s"] = round(seconds, 1)

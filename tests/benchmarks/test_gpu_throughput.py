"""benchmarks/gpu_throughput.py in its CPU size: the report's counts and FLOP arithmetic, and the table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_throughput.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_throughput"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_run_reports_tokens_flops_and_mfu(tmp_path, capsys):
    bench = load_benchmark()
    out = tmp_path / "bench.json"
    bench.main(["--size", "tiny", "--out", str(out), "--steps", "1", "--warmup-steps", "0", "--peak-tflops", "0.5"])
    report = json.loads(out.read_text())
    # tiny shape, by hand: embed 512·64 (tied, once) + 2 layers · (q 64·64 + k 64·32 + v 64·32 + o 64·64
    # + q/k norms 2·16 + MLP 3·64·128 + 2 layer norms 2·64) + final norm 64
    layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 2 * 16 + 3 * 64 * 128 + 2 * 64
    assert report["params"] == 512 * 64 + 2 * layer + 64 == 106880
    assert report["peak_tflops"] == 0.5
    assert [r["recipe"] for r in report["results"]] == ["grpo", "ta_grpo"]
    p = report["params"]
    for r in report["results"]:
        assert r["samples_per_step"] == 16  # grpo: 4 questions x 4; ta_grpo: 1 question x 4 variants x 4
        assert 16 <= r["generated"] <= 16 * 16 and r["rollout_s"] > 0 and r["update_s"] > 0
        assert r["update_tokens"] > r["generated"]  # prompts are fed to the update too
        assert r["rollout_tokens_per_s"] == pytest.approx(r["generated"] / r["rollout_s"])
        assert r["rollout_tflops"] == pytest.approx(
            2 * p * (r["prompt_tokens"] + r["generated"]) / r["rollout_s"] / 1e12
        )
        factor = 8 if r["beta"] > 0 else 6  # + the frozen reference's forward
        assert r["train_tflops"] == pytest.approx(factor * p * r["update_tokens"] / r["update_s"] / 1e12)
        assert r["train_mfu"] == pytest.approx(r["train_tflops"] / 0.5)
        assert r["rollout_mfu"] == pytest.approx(r["rollout_tflops"] / 0.5)
    assert report["results"][0]["beta"] == 0.0 and report["results"][1]["beta"] == 0.001
    table = capsys.readouterr().out
    assert "train MFU" in table and "ta_grpo" in table and "peak of 0.5 TFLOP/s" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_full_size_refuses_to_run_on_a_cpu(tmp_path):
    bench = load_benchmark()
    with pytest.raises(SystemExit) as e:
        bench.main(["--size", "full", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert not (tmp_path / "x.json").exists()

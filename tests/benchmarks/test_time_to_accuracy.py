"""benchmarks/time_to_accuracy.py's reading of its runs: the time to the target at the first save that reaches
it, on the save steps every side has (no side timed on a finer grid), by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_accuracy.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("time_to_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(side, seed, seconds_and_pass, rewards=(0.0, 1.0)):
    saves = {str(step): {"path": "", "seconds": s, "eval": {"pass@1": p}} for step, (s, p) in seconds_and_pass.items()}
    steps = max(seconds_and_pass)
    return {"side": side, "seed": seed, "steps": steps, "train_seconds": seconds_and_pass[steps][0],
            "reward_per_step": list(rewards), "saves": saves}  # fmt: skip


def test_time_to_target_reads_the_first_save_that_reaches_it_on_the_common_grid():
    tta = load_benchmark()
    fast = run("regroup", 0, {20: (100.0, 0.30), 30: (150.0, 0.31)})
    trl = run("TRL", 0, {10: (200.0, 0.27), 20: (400.0, 0.25), 30: (600.0, 0.28)})
    assert tta.time_to_target(trl, 0.26) == 200.0  # all of TRL's saves: step 10
    record = {"target_pass@1": 0.26, "runs": [fast, trl]}
    summary = tta.summarize(record)
    assert summary["common_save_steps"] == [20, 30]
    assert summary["regroup"]["time_to_target_s"] == [100.0]
    assert summary["TRL"]["time_to_target_s"] == [600.0]  # step 10 is not on regroup's grid; step 20 missed it
    assert summary["TRL"]["seconds_per_step"] == [20.0]
    assert summary["regroup"]["final_pass@1"] == [0.31] and summary["regroup"]["mean_reward_per_run"] == [0.5]
    never = run("regroup", 1, {20: (90.0, 0.1), 30: (140.0, 0.2)})
    summary = tta.summarize({"target_pass@1": 0.26, "runs": [fast, never, trl]})
    assert summary["regroup"]["reached_target"] == "1 of 2" and summary["regroup"]["time_to_target_median_s"] == 100.0

"""Two real processes (accelerate launch, gloo on CPU) train exactly what one process trains.

The 2-process side runs `tests/_dist_worker.py` under `accelerate launch --multi_gpu --num_processes 2`
with `Accelerator(cpu=True)` (what `setup.build_parts` picks without CUDA); `--cpu` alone would silently
start one process, so the world size each rank saw is read back from the file it wrote. The
1-process side runs the same config in this process. Both start from the same tiny random model.
"""

from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path

import pytest
import torch
from helpers import accelerate_exe, free_port

from regroup.runtime.checkpoint import list_checkpoints

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).resolve().parents[1] / "_dist_worker.py"
ACCELERATE_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
STEPS = 3


def _launch_two(model_dir: str, run_dir: Path, out_dir: Path, recipe: str, config_file: bool) -> None:
    """Explicit flags, or the shipped configs/accelerate/cpu_2proc.yaml: both must give 2 processes."""
    how = (
        ["--config_file", str(ACCELERATE_CONFIGS / "cpu_2proc.yaml")]
        if config_file
        else [
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ]
    )
    cmd = [
        accelerate_exe(),
        "launch",
        *how,
        "--main_process_port",
        str(free_port()),
        str(WORKER),
        model_dir,
        str(run_dir),
        str(out_dir),
        recipe,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    if proc.returncode != 0:
        (out_dir.parent / "launch.log").write_text(proc.stdout + proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if "rror" in line or "terminate" in line]
        pytest.fail(
            f"accelerate launch failed ({proc.returncode}); full log in {out_dir.parent / 'launch.log'}:\n"
            + "\n".join(errors[:40])
        )


def _train_one(model_dir: str, run_dir: Path, recipe: str) -> list[dict]:
    import _dist_worker

    from regroup.train.build import build_trainer

    trainer = build_trainer(_dist_worker.make_config(model_dir, str(run_dir), recipe), run_dir, log=lambda m: None)
    assert trainer.world == 1
    trainer.train()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    ckpts = list_checkpoints(run_dir)
    assert [p.name for p in ckpts] == [f"step-{STEPS:06d}"]
    return load_file(ckpts[-1] / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The GRPO and TA-GRPO runs on 2 processes and on 1, shared by the tests below."""
    out = {}
    for recipe, config_file in (("grpo.yaml", False), ("ta_grpo.yaml", True)):
        root = tmp_path_factory.mktemp(recipe.split(".")[0])
        _launch_two(tiny_model_dir, root / "two", root / "ranks", recipe, config_file)
        one = _train_one(tiny_model_dir, root / "one", recipe)
        ranks = [json.loads((root / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
        out[recipe] = {"root": root, "one": one, "ranks": ranks}
    return out


@pytest.mark.parametrize("recipe", ["grpo.yaml", "ta_grpo.yaml"])
def test_two_processes_match_one(runs, tiny_model_dir, recipe):
    run = runs[recipe]
    for r, record in enumerate(run["ranks"]):
        assert (record["rank"], record["world"]) == (r, 2), "accelerate did not start 2 processes"
        assert record["backend"] == "gloo" and record["distributed_type"].endswith("MULTI_CPU")
    two, one = _final_weights(run["root"] / "two"), _final_weights(run["root"] / "one")
    from safetensors.torch import load_file

    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    moved = max(float((one[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3, "the run made no update, so the comparison would prove nothing"
    assert two.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("recipe", ["grpo.yaml", "ta_grpo.yaml"])
def test_metrics_are_reduced_and_written_once(runs, recipe):
    run = runs[recipe]
    rank0, rank1 = run["ranks"]
    assert rank0["logger_enabled"] and not rank1["logger_enabled"]
    logged = [json.loads(line) for line in (run["root"] / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))  # one line per step: rank 1 wrote nothing
    assert not list((run["root"] / "two" / "checkpoints").glob(".tmp-*"))
    for step in range(STEPS):
        a, b, reduced = rank0["local"][step], rank1["local"][step], rank0["reduced"][step]
        assert reduced == rank1["reduced"][step]  # every rank holds the same record
        # the ranks really differ (each sampled its own groups) and the record is their mean ...
        assert a["tokens/generated"] != b["tokens/generated"] or a["reward/mean"] != b["reward/mean"]
        assert reduced["reward/mean"] == pytest.approx((a["reward/mean"] + b["reward/mean"]) / 2, abs=1e-12)
        assert reduced["tokens/generated"] == pytest.approx((a["tokens/generated"] + b["tokens/generated"]) / 2)
        # ... except the loss, a share of a globally normalised loss: summed, it is the 1-process loss
        assert reduced["loss"] == pytest.approx(a["loss"] + b["loss"], abs=1e-9)
        assert reduced["loss"] == pytest.approx(run["one"][step]["loss"], abs=1e-6)
        # equal halves of the same samples: the mean reward is the 1-process one
        assert reduced["reward/mean"] == pytest.approx(run["one"][step]["reward/mean"], abs=1e-6)  # float32 means
        assert reduced["grad_norm"] == pytest.approx(run["one"][step]["grad_norm"], rel=1e-4)
        assert logged[step]["reward/mean"] == pytest.approx(reduced["reward/mean"], abs=1e-12)


def test_a_metric_on_one_rank_only_is_reduced_without_hanging(runs):
    """Keys that differ between ranks used to make the ranks reduce tensors of different lengths (a hang)."""
    for record in runs["grpo.yaml"]["ranks"]:
        assert record["probe"] == {"shared": 1.5, "last_rank_only": 7.0}


# ------------------------------------------------------------------------------ launch configurations
@pytest.mark.parametrize(
    "name, kind, processes",
    [
        ("ddp", "MULTI_GPU", 8),
        ("fsdp", "FSDP", 8),
        ("zero2", "DEEPSPEED", 8),
        ("zero3", "DEEPSPEED", 8),
        ("cpu_2proc", "MULTI_GPU", 2),  # MULTI_GPU on purpose: `use_cpu` would start one process
    ],
)
def test_shipped_accelerate_configs_load(name, kind, processes):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
    assert str(cfg.distributed_type).endswith(kind) and cfg.num_processes == processes and not cfg.use_cpu
    if name == "fsdp":
        assert cfg.fsdp_config["fsdp_version"] == 2
    if name.startswith("zero"):
        assert cfg.deepspeed_config["zero_stage"] == int(name[-1]) and cfg.deepspeed_config["zero3_init_flag"] is False


class _DeepSpeedAccelerator:
    """Just enough of an Accelerator running DeepSpeed for build_parts (prepare returns its inputs)."""

    num_processes, process_index, is_main_process, device = 2, 0, True, torch.device("cpu")

    def __init__(self):
        self.state = types.SimpleNamespace(
            deepspeed_plugin=types.SimpleNamespace(deepspeed_config={"train_micro_batch_size_per_gpu": "auto"})
        )

    def prepare(self, *objects):
        return objects

    def unwrap_model(self, model):
        return model


@pytest.mark.parametrize(
    "recipe, micro, per_rank",
    [
        ("grpo.yaml", 8, 8),  # 4 questions / 2 ranks x G 4
        ("ta_grpo.yaml", 32, 32),  # 2 questions x (1 + 3 variants) x 4
        ("grpo.yaml", 7, 8),  # too small: DeepSpeed would step once per micro-batch
    ],
)
def test_deepspeed_gets_one_micro_batch_per_step(tiny_model_dir, tmp_path, recipe, micro, per_rank):
    import _dist_worker

    from regroup.train.build import build_parts

    cfg = _dist_worker.make_config(tiny_model_dir, str(tmp_path), recipe, (f"grpo.micro_batch_size={micro}",))
    acc = _DeepSpeedAccelerator()
    if micro < per_rank:
        with pytest.raises(ValueError, match=f"micro_batch_size \\({micro}\\) must be >= the {per_rank} samples"):
            build_parts(cfg, tmp_path, accelerator=acc, log=lambda m: None)
        return
    build_parts(cfg, tmp_path, accelerator=acc, log=lambda m: None)
    assert acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == micro


def test_frozen_rank_stops_the_other_within_the_collective_timeout(tiny_model_dir, tmp_path):
    """Rank 1 freezes (SIGSTOP) after a step; rank 0 must stop with one clear line within
    train.collective_timeout_s (bounded generously: 5 s asked, well under torch's 30 min), not hang.
    12 s in all on a loaded 2-core machine (load average ~15), so not marked slow."""
    import signal
    import time

    out = tmp_path / "out"
    out.mkdir()
    timeout_s = 5
    cmd = [
        accelerate_exe(),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(Path(__file__).resolve().parents[1] / "_freeze_worker.py"),
        tiny_model_dir,
        str(tmp_path / "run"),
        str(out),
        str(timeout_s),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    log = open(tmp_path / "launch.log", "w")
    launcher = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not (out / "rank0.json").exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (out / "rank0.json").exists(), (tmp_path / "launch.log").read_text()[-3000:]
        record = json.loads((out / "rank0.json").read_text())
    finally:
        pid_file = out / "rank1.pid"
        if pid_file.exists():  # the frozen rank this test started: kill it by its id
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
        log.close()
    assert "line" in record, record
    assert record["line"] is not None and "train.collective_timeout_s" in record["line"], record
    assert "\n" not in record["line"]
    assert record["waited_s"] < 120, record  # generous: the timeout is 5 s, torch's default 1800 s

"""Whole weights out of sharded models (regroup.runtime.sharded): FSDP2 in 2 processes over gloo on CPU, and the
1-process paths.

The 2-process side runs `tests/_sharded_worker.py` under `accelerate launch --multi_gpu --num_processes 2`:
the tiny model is sharded with torch's `fully_shard` (accelerate itself runs FSDP only on accelerators,
so the worker tells the Accelerator it runs FSDP2), then the worker gathers, pushes, saves and resumes.
"""

from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path

import pytest
import torch
from helpers import accelerate_exe as _accelerate
from helpers import free_port as _free_port

from regroup.runtime.sharded import full_parameters, is_sharded, load_training_state, save_model_weights

WORKER = Path(__file__).resolve().parents[1] / "_sharded_worker.py"
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    # In the full suite a worker has twice aborted at start-up or exit ("terminate called without an active
    # exception", SIGABRT inside torch's gloo process group) where it passes alone: one fresh launch on a new
    # port is allowed; a second failure fails the test with the worker's output.
    for _attempt in range(2):
        out = tmp_path_factory.mktemp("fsdp2")
        cmd = [
            _accelerate(),
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
            str(_free_port()),
            str(WORKER),
            str(out),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode == 0:
            return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    pytest.fail(f"accelerate launch failed twice ({proc.returncode}):\n" + proc.stderr[-4000:])


@pytest.mark.distributed
def test_fsdp2_weight_push_gathers_whole_parameters(fsdp_run):
    _, reports = fsdp_run
    for report in reports:
        assert report["sharded"] and report["local_rows"] == 16  # each rank holds half of q_proj's 32 rows
        assert report["push_equals_full"]  # the vLLM push got whole tensors, equal to the gathered ones
        assert set(map(tuple, report["push_shapes"].values())) == {(32, 32)}


@pytest.mark.distributed
def test_fsdp2_checkpoint_writes_full_hf_weights(fsdp_run):
    from transformers import AutoModelForCausalLM

    out, _ = fsdp_run
    full0, full1 = torch.load(out / "full0.pt"), torch.load(out / "full1.pt")
    assert full0.keys() == full1.keys() and all(torch.equal(full0[n], full1[n]) for n in full0)
    loaded = AutoModelForCausalLM.from_pretrained(out / "weights")  # plain HF, no accelerate
    params = dict(loaded.named_parameters())
    assert params.keys() == full0.keys()
    for name, tensor in full0.items():
        assert torch.equal(params[name].detach(), tensor), name


@pytest.mark.distributed
def test_fsdp2_sharded_optimizer_state_resumes(fsdp_run):
    out, reports = fsdp_run
    for report in reports:
        assert {"optimizer_0", "pytorch_model_fsdp_0"} <= set(report["state_files"])
        assert report["moved"] and report["restored"]
        # Adam's moments came back: the step after resuming is the step the run took the first time
        assert report["resumed_step_equals_uninterrupted"]


def test_is_sharded_only_for_fsdp_and_zero3():
    def acc(kind, stage=None):
        plugin = None if stage is None else types.SimpleNamespace(zero_stage=stage)
        return types.SimpleNamespace(distributed_type=kind, state=types.SimpleNamespace(deepspeed_plugin=plugin))

    from accelerate.utils import DistributedType

    assert is_sharded(acc(DistributedType.FSDP))
    assert is_sharded(acc(DistributedType.DEEPSPEED, 3))
    assert not is_sharded(acc(DistributedType.DEEPSPEED, 2))
    assert not is_sharded(acc(DistributedType.MULTI_GPU))
    assert not is_sharded(acc(DistributedType.NO))


def test_unsharded_paths_save_and_iterate_plainly(tiny_model_dir, tmp_path):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    acc = Accelerator(cpu=True)
    assert dict(full_parameters(model)).keys() == dict(model.named_parameters()).keys()
    save_model_weights(acc, model, load_tokenizer(tiny_model_dir), tmp_path / "w")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "w")
    for (name, a), b in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(FileNotFoundError, match="accelerate_state"):
        load_training_state(acc, tmp_path / "w")

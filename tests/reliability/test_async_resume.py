"""Resuming an asynchronous run (`rollout.async_steps`, the built-in `hf` engine on the tiny model): a resume
with more steps from a checkpoint at, or within k of, the end trains every step; the wait for the engine
(`rollout.async_timeout_s`) may change at a resume; a resume to fewer steps than trained is one line and
rewrites nothing; hand-edited in-flight batches (the manifest re-hashed) are one line before any model loads.
The runs are real `regroup train` processes, or `regroup.cli.main` in this process where only its exit and
its line are checked."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.runtime.checkpoint import MANIFEST, STATE, list_checkpoints

pytestmark = pytest.mark.reliability

ASYNC = ("rollout.backend=hf", "rollout.async_steps=2", "rollout.async_timeout_s=120")
"""k = 2 with the built-in engine; a stall would end in 120 s (the test fails then), never a hang."""


def steps_logged(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def rehash(checkpoint: Path, name: str) -> None:
    """Re-sign the manifest after editing `name`: what anyone who can write the folder can do."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"][name] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    (checkpoint / MANIFEST).write_text(json.dumps(manifest, indent=1))


@pytest.fixture(scope="module")
def async_run(tiny_model_dir, tmp_path_factory):
    """A finished 3-step async run (k = 2, a checkpoint each step), made by a real `regroup train` process."""
    out = tmp_path_factory.mktemp("async")
    run = out / "run"
    argv = h.train_args(tiny_model_dir, run, "grpo.yaml", "train.steps=3", *ASYNC)
    done = h.run(argv, out, "first")
    assert done.returncode == 0, done.stderr[-2000:]
    assert steps_logged(run) == [1, 2, 3]
    return run


@pytest.fixture
def async_copy(async_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(async_run, run)
    return run


@pytest.mark.slow  # two `regroup train` processes (~40 s on one loaded core)
@pytest.mark.parametrize("end", ["at_the_end", "one_step_before_the_end"])
def test_an_async_run_resumed_with_more_steps_trains_every_step(async_copy, tmp_path, end):
    """The checkpoint at step 3 of 3 holds no batch, the one at step 2 holds batch 3 only; versions 1 and 2
    that batches 4 (and 5) would be drawn by at lag 2 are gone after the resume. Before, the producer waited
    for them and the learner blamed a stalled engine after rollout.async_timeout_s (exit 2)."""
    if end == "one_step_before_the_end":  # killed before its last checkpoint was written
        shutil.rmtree(list_checkpoints(async_copy)[-1])
    resumed = h.run(["train", "--resume", str(async_copy), "train.steps=6"], tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    at = h.resumed_at(resumed.stderr)
    assert at is not None and at[1] == (3 if end == "at_the_end" else 2)
    assert steps_logged(async_copy) == [1, 2, 3, 4, 5, 6]  # every step, counted
    metrics = [json.loads(line) for line in (async_copy / "metrics.jsonl").read_text().splitlines()]
    lags = {m["step"]: m["rollout/policy_lag"] for m in metrics}
    assert lags[6] == 2  # past the batches the checkpoint lacked, the lag is k again
    assert [p.name for p in list_checkpoints(async_copy)][-1] == "step-000006"


def test_an_async_run_resumed_at_its_end_with_more_steps_trains_every_step_in_process(async_copy, capsys):
    """The same resume through `regroup.cli.main` in this process (not slow): it goes on to the new end."""
    assert main(["train", "--resume", str(async_copy), "train.steps=5", "train.progress=false"]) == 0
    assert steps_logged(async_copy) == [1, 2, 3, 4, 5]


def test_the_async_wait_may_change_at_a_resume(async_copy, tmp_path, monkeypatch):
    """rollout.async_timeout_s is a deadline, no part of the saved batches: a resume may set it, and the
    resumed run's producer waits that long."""
    import regroup.rollout.producer as producer_mod

    seen = []
    real = producer_mod.AsyncProducer.__init__

    def record(self, *args, **kwargs):
        real(self, *args, **kwargs)
        seen.append(self.timeout_s)

    monkeypatch.setattr(producer_mod.AsyncProducer, "__init__", record)
    assert main(["train", "--resume", str(async_copy), "train.steps=4", "rollout.async_timeout_s=77"]) == 0
    assert seen == [77.0]
    assert steps_logged(async_copy) == [1, 2, 3, 4]


def test_a_resume_to_fewer_steps_than_trained_is_one_line_and_rewrites_nothing(async_copy, capsys, no_compute):
    before = {p.name: p.read_bytes() for p in async_copy.iterdir() if p.is_file() and p.name != ".lock"}
    assert main(["train", "--resume", str(async_copy), "train.steps=2"]) == 2
    line = h.one_line(capsys)
    assert line == (
        "config error: train.steps ends the run at step 2, but it has trained 3 steps (step-000003); a resume goes "
        "on from there: give train.steps at least 3 to train more, or start a new run"
    )
    after = {p.name: p.read_bytes() for p in async_copy.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before  # config.yaml still says 3 steps, metrics.jsonl still holds them


def _edit_inflight(run: Path, edit) -> None:
    """Edit the in-flight batches of the run's checkpoint at step 2 (it holds batch 3), drop the later one,
    and re-sign the manifest."""
    shutil.rmtree(list_checkpoints(run)[-1])
    checkpoint = list_checkpoints(run)[-1]
    state = torch.load(checkpoint / STATE, weights_only=True)
    edit(state["async"])
    torch.save(state, checkpoint / STATE)
    rehash(checkpoint, STATE)


def _token_5000(inflight):
    inflight["batches"][0]["batch"]["samples"][0]["response_ids"][0] = 5000


def _no_batches(inflight):
    del inflight["batches"]


def _step_off_by_5(inflight):
    inflight["batches"][0]["batch"]["step"] += 5


def _version_from_the_future(inflight):
    inflight["batches"][0]["version"] = 2


def _wrong_ids_type(inflight):
    inflight["batches"][0]["batch"]["samples"][0]["prompt_ids"] = "abc"


def _advantages_short(inflight):
    inflight["batches"][0]["batch"]["advantages"] = inflight["batches"][0]["batch"]["advantages"][:-1]


@pytest.mark.parametrize(
    "edit, words",
    [
        (_token_5000, "samples[0].response_ids holds token id 5000, outside the model's vocabulary of"),
        (_no_batches, "the state has no list of batches"),
        (_step_off_by_5, "batches[0] is of step 8, not 3 (the batches run 3..3)"),
        (_version_from_the_future, "batches[0] was drawn by version 2, not 0..1"),
        (_wrong_ids_type, "samples[0].prompt_ids is not a 1-D tensor of token ids"),
        (_advantages_short, "batches[0].batch.advantages is not a tensor of one value per sample"),
    ],
)
def test_hand_edited_inflight_batches_are_one_line_before_any_model_loads(async_copy, capsys, no_compute, edit, words):
    """Before: a RuntimeError traceback (token id 5000), a KeyError (no batches), or a wait of
    rollout.async_timeout_s blamed on the engine (a step off by 5)."""
    _edit_inflight(async_copy, edit)
    before = (async_copy / "config.yaml").read_bytes()
    assert main(["train", "--resume", str(async_copy)]) == 2
    line = h.one_line(capsys)
    assert line.startswith(f"checkpoint error: {list_checkpoints(async_copy)[-1]}: the checkpoint's in-flight batches:")
    assert words in line, line
    assert (async_copy / "config.yaml").read_bytes() == before


def test_hand_edited_inflight_batches_are_refused_by_the_trainer_too(async_copy, tiny_model_dir):
    """A library resume (`build_trainer(..., resume=True)`) meets the same check, after the model loads."""
    from regroup.runtime.checkpoint import CheckpointError
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    _edit_inflight(async_copy, _token_5000)
    cfg = load_config(str(async_copy / "config.yaml"), [])
    with pytest.raises(CheckpointError, match="holds token id 5000, outside the model's vocabulary"):
        build_trainer(cfg, async_copy, resume=True, log=lambda line: None)


def test_a_library_resume_to_fewer_steps_is_refused_before_config_yaml_is_rewritten(async_copy):
    """`build_trainer(..., resume=True)` meets the same refusal; config.yaml is written after the checks."""
    from regroup.errors import ConfigError
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    before = (async_copy / "config.yaml").read_bytes()
    cfg = load_config(str(async_copy / "config.yaml"), ["train.steps=2"])
    with pytest.raises(ConfigError, match="train.steps ends the run at step 2, but it has trained 3 steps"):
        build_trainer(cfg, async_copy, resume=True, log=lambda line: None)
    assert (async_copy / "config.yaml").read_bytes() == before


def test_a_trainer_state_of_another_step_than_its_folder_is_one_line(run_copy, capsys):
    """A synchronous run's trainer state edited to say step 1 in step-000002 (the manifest re-hashed): the
    resume would go on from step 1 with the weights of step 2; it is refused, naming both."""
    checkpoint = list_checkpoints(run_copy)[-1]
    state = torch.load(checkpoint / STATE, weights_only=True)
    state["step"] = 1
    torch.save(state, checkpoint / STATE)
    rehash(checkpoint, STATE)
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("checkpoint error")]
    assert line == [f"checkpoint error: {checkpoint}: its trainer state is of step 1, not 2"]

"""Crash anywhere, resume exactly: `regroup train` processes are SIGKILLed at random moments and at
chosen phases (rollout, update, the metrics write, the checkpoint write — including the instant its
`.tmp-step-*` folder appears — and the resume itself), each resumed with `--resume RUN_DIR` until the
run finishes. The final weights must be bit-identical to an uninterrupted run's, metrics.jsonl must
hold steps 1..6 exactly once with the same values, and every resume must have loaded the newest
checkpoint that was complete before it started. Corrupt checkpoints (truncated weights, flipped bytes
in the trainer state, no manifest) are detected, named, and skipped for the previous one.

The quick test kills 3 times; the slow one 20 times (`pytest -m slow`). Where each kill landed (the
last phase the child's probe recorded, see `reliability_helpers.install_probe`) is listed under
"reliability figures" at the end of the session.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.runtime.checkpoint import (
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_model_weights,
    load_trainer_state,
    save_checkpoint,
    verify_checkpoint,
)

pytestmark = pytest.mark.reliability

STEPS = 6
COMPARED = ("loss", "reward/mean", "grad_norm", "lr", "entropy", "adv/abs_mean", "length/mean")

RANDOM_WINDOW_S = 7.0
"""Random kills come uniformly within this many seconds of a process's start (a whole run takes ~5 s on
an idle CPU, most of it imports and model loading)."""


@dataclass
class Reference:
    run_dir: Path
    weights: dict[str, torch.Tensor]
    metrics: list[dict]


class PendingReference:
    """The uninterrupted run, started in the background (it runs alongside the first kill chain)."""

    def __init__(self, model_dir, root: Path):
        self.run_dir = root / "run"
        self.argv = h.train_args(model_dir, self.run_dir)
        self._proc = h.start(self.argv, root, "reference")
        self._done: Reference | None = None

    def get(self) -> Reference:
        if self._done is None:
            proc = h.finish(self._proc, self.argv)
            assert proc.returncode == 0, proc.stderr[-3000:]
            final = self.run_dir / "checkpoints" / f"step-{STEPS:06d}"
            self._done = Reference(self.run_dir, load_file(final / "model.safetensors"), read_metrics(self.run_dir))
        return self._done

    def close(self) -> None:
        if self._done is None and self._proc.poll() is None:  # a test failed before it needed the result
            self._proc.kill()
            self._proc.wait()


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """One uninterrupted `python -m regroup train` run of STEPS steps, a checkpoint every step."""
    pending = PendingReference(tiny_model_dir, tmp_path_factory.mktemp("reference"))
    yield pending
    pending.close()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_as_reference(run_dir: Path, ref: Reference) -> None:
    """Bit-identical final weights, steps 1..STEPS exactly once, identical logged values."""
    final = run_dir / "checkpoints" / f"step-{STEPS:06d}"
    verify_checkpoint(final)
    weights = load_file(final / "model.safetensors")
    assert weights.keys() == ref.weights.keys()
    different = [k for k in weights if not torch.equal(weights[k], ref.weights[k])]
    assert not different, f"final weights differ from the uninterrupted run in {different[:5]}"
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, ref.metrics):
        for key in COMPARED:
            assert got.get(key) == want.get(key), (got["step"], key, got.get(key), want.get(key))
    assert h.tmp_folders(run_dir) == [], "a crashed writer's temporary folder was never cleaned up"


def checkpoint_snapshot(run_dir: Path) -> list[tuple[str, int | None]]:
    """(folder name, manifest step or None when it does not verify) of every final-named checkpoint."""
    out = []
    for path in list_checkpoints(run_dir):
        try:
            verify_checkpoint(path)
        except CheckpointError:
            out.append((path.name, None))
            continue
        step = json.loads((path / "manifest.json").read_text())["step"]
        assert load_trainer_state(path)["step"] == step, f"{path}: trainer_state step differs from the manifest's"
        out.append((path.name, step))
    return out


@dataclass
class Kill:
    how: str
    landed: str
    tmp_at_kill: list[str]


def on_phase(target: str):
    return lambda phases, tmps, elapsed: any(p == target for _, _, p in phases)


def choose_trigger(rng: random.Random, kind: str, done: int, resuming: bool):
    """(trigger, delay after it, description, phase the child freezes at or None) for one kill of `kind`
    (`kind@step` pins the step; else a random step not yet done)."""
    kind, _, pinned = kind.partition("@")
    step = int(pinned) if pinned else rng.randint(min(done + 1, STEPS), STEPS)
    if kind.startswith("stop:"):  # deterministic: the child freezes on entering the phase
        target = f"{kind[5:]} {step}"
        return on_phase(target), 0.0, f"frozen at {target}", target
    if kind == "random" or (kind == "resume" and not resuming):
        at = rng.uniform(0.0, RANDOM_WINDOW_S)
        return (lambda phases, tmps, elapsed: elapsed >= at), 0.0, f"random t={at:.2f}s", None
    if kind == "tmp":
        prefix = f".tmp-step-{step:06d}"
        appeared = lambda phases, tmps, elapsed: any(t.startswith(prefix) for t in tmps)
        return appeared, 0.0, f"tmp folder of step {step}", None
    target = "resume" if kind == "resume" else f"{kind} {step}"
    delay = rng.uniform(0.0, {"rollout": 0.03, "update": 0.03, "log": 0.002, "checkpoint": 0.05, "resume": 0.05}[kind])
    return on_phase(target), delay, f"{target} +{delay * 1000:.0f}ms", None


def kill_until_done(model_dir, root: Path, kinds: list[str], seed: int, report=print) -> list[Kill]:
    """One run, killed once per entry of `kinds` (when the run is not already over), then resumed to the end.
    Checks every resume against the checkpoints that were on disk before it started."""
    rng = random.Random(seed)
    run_dir, logs, probe = root / "run", root / "logs", root / "phases.txt"
    kills: list[Kill] = []
    n = 0
    queue = list(kinds)
    while True:
        resuming = (run_dir / "config.yaml").exists()
        argv = ["train", "--resume", str(run_dir)] if resuming else h.train_args(model_dir, run_dir)
        before = checkpoint_snapshot(run_dir)
        # Atomic writes: no final-named checkpoint is ever incomplete, whatever moment the kill hit.
        assert all(step is not None for _, step in before), f"half checkpoint under a final name: {before}"
        assert all(name == f"step-{step:06d}" for name, step in before)
        done = before[-1][1] if before else 0
        if queue:
            trigger, delay, how, stop_at = choose_trigger(rng, queue.pop(0), done, resuming)
            proc = h.run_and_kill(argv, logs, f"p{n}", run_dir, probe, trigger, delay, stop_at=stop_at)
        else:
            how = "-"
            proc = h.finish(h.start(argv, logs, f"p{n}", probe=probe), argv)
        n += 1
        check_resume_line(proc, run_dir, before, resuming)
        if proc.killed:
            kills.append(Kill(how, h.landing(proc.landed), proc.tmp_at_kill))
            report(
                f"kill {len(kills)}: {how} -> landed in '{proc.landed or 'startup (before the probe)'}'"
                f"{' with ' + ','.join(proc.tmp_at_kill) + ' on disk' if proc.tmp_at_kill else ''}"
            )
            continue
        assert proc.returncode == 0, f"process {n} failed:\n{proc.stderr[-3000:]}"
        return kills


def check_resume_line(proc: h.Proc, run_dir: Path, before, resuming: bool) -> None:
    """A resumed process must have loaded the newest checkpoint that verified before it started."""
    if not resuming:
        return
    got = h.resumed_at(proc.stderr)
    if before:
        name, step = before[-1]
        if got is None:  # killed before it got that far
            assert proc.killed, f"resumed process never said where it resumed:\n{proc.stderr[-2000:]}"
            return
        assert Path(got[0]).name == name and got[1] == step, f"resumed from {got}, newest complete was {before[-1]}"
    else:
        assert got is None
        if not proc.killed:
            assert "no checkpoint in" in proc.stderr


def test_three_kills_resume_bit_identical(reference, tiny_model_dir, tmp_path, figures):
    """Killed with the first checkpoint written to its temporary folder but not renamed (step 1 already
    logged, no checkpoint yet: the resume starts from scratch), then in the middle of an update, then at
    a random moment."""
    plan = ["stop:checkpoint-fsync@1", "stop:update", "random"]
    kills = kill_until_done(tiny_model_dir, tmp_path, plan, seed=1, report=figures)
    assert [k.landed for k in kills[:2]] == ["checkpoint-fsync", "update"]
    assert kills[0].tmp_at_kill and kills[0].tmp_at_kill[0].startswith(".tmp-step-000001")
    assert len(kills) >= 2  # the random one may come after the run ended; the two frozen ones cannot
    assert_same_as_reference(tmp_path / "run", reference.get())
    figures(f"{len(kills)} kills survived; final weights bit-identical, metrics steps 1..{STEPS} once")


@pytest.mark.slow
def test_twenty_kills_resume_bit_identical(reference, tiny_model_dir, tmp_path, figures):
    kinds = [
        "random",
        "random",
        "tmp",
        "update",
        "rollout",
        "checkpoint",
        "resume",
        "log",
        "stop:checkpoint-fsync",
        "stop:log",
    ]
    rng = random.Random(20)
    kills: list[Kill] = []
    chain = 0
    while len(kills) < 20:
        plan = [rng.choice(kinds) for _ in range(6)]
        kills += kill_until_done(tiny_model_dir, tmp_path / f"chain{chain}", plan, seed=100 + chain, report=figures)
        assert_same_as_reference(tmp_path / f"chain{chain}" / "run", reference.get())
        chain += 1
    where: dict[str, int] = {}
    for k in kills:
        label = k.landed + (" (temporary folder on disk)" if k.tmp_at_kill else "")
        where[label] = where.get(label, 0) + 1
    figures(
        f"{len(kills)} kills survived over {chain} runs, each bit-identical to the uninterrupted run; "
        f"landed in: {json.dumps(where, sort_keys=True)}"
    )


# ------------------------------------------------------------------------------- corrupt checkpoints


def truncate_weights(path: Path) -> str:
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "model.safetensors"


def flip_state_bytes(path: Path) -> str:
    f = path / "trainer_state.pt"
    data = bytearray(f.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 8):
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))
    return "trainer_state.pt"


def delete_manifest(path: Path) -> str:
    (path / "manifest.json").unlink()
    return "manifest.json"


CORRUPTIONS = [truncate_weights, flip_state_bytes, delete_manifest]


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corrupt_latest_checkpoint_is_named_and_skipped(tiny_model, tmp_path, corrupt):
    model = tiny_model
    first = {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint(tmp_path, 1, model, None, {"step": 1}, keep=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    try:
        latest = save_checkpoint(tmp_path, 2, model, None, {"step": 2}, keep=3)
    finally:
        model.load_state_dict(first)
    name = corrupt(latest)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")) as err:
        verify_checkpoint(latest)
    assert "step-000002" in str(err.value)
    warnings: list[str] = []
    chosen = latest_valid_checkpoint(tmp_path, warn=warnings.append)
    assert chosen is not None and chosen.name == "step-000001"
    assert len(warnings) == 1 and name in warnings[0] and "step-000002" in warnings[0]
    assert load_trainer_state(chosen)["step"] == 1
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.0)
    load_model_weights(model, chosen)
    assert all(torch.equal(v, first[k]) for k, v in model.state_dict().items())
    model.load_state_dict(first)


def test_every_checkpoint_corrupt_means_none(tiny_model, tmp_path):
    save_checkpoint(tmp_path, 1, tiny_model, None, {"step": 1})
    save_checkpoint(tmp_path, 2, tiny_model, None, {"step": 2})
    truncate_weights(tmp_path / "checkpoints" / "step-000001")
    delete_manifest(tmp_path / "checkpoints" / "step-000002")
    warnings: list[str] = []
    assert latest_valid_checkpoint(tmp_path, warn=warnings.append) is None
    assert len(warnings) == 2


def test_leftovers_of_a_crashed_writer_are_removed_and_never_loaded(tiny_model, tmp_path):
    """A `.tmp-step-*` (killed mid-write) or `.trash-*` (killed mid-delete) folder is never a checkpoint,
    and the next save removes it."""
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-000003-99999").mkdir(parents=True)
    (root / ".tmp-step-000003-99999" / "model.safetensors").write_bytes(b"half")
    (root / ".trash-step-000001-99999").mkdir()
    save_checkpoint(tmp_path, 2, tiny_model, None, {"step": 2})
    assert sorted(os.listdir(root)) == ["step-000002"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002"]


@pytest.mark.parametrize("torn, resumed", [(["step-000002"], 1), (["step-000001", "step-000002"], 0)])
def test_the_lr_schedule_note_names_the_step_the_resume_really_loaded(run_copy, capsys, torn, resumed):
    """A resume that changes train.steps says what that does to the cosine lr from the checkpoint it loads;
    once it named the newest checkpoint's step even when that one failed its sha256 check and the run went on
    from an older one, or from step 0 (where the schedule simply starts afresh: no note)."""
    for name in torn:
        truncate_weights(run_copy / "checkpoints" / name)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 0
    err = capsys.readouterr().err
    assert err.count("checkpoint skipped") == len(torn)
    notes = [line for line in err.splitlines() if "keeps its course" in line]
    if resumed:
        assert len(notes) == 1 and notes[0].startswith("train.steps 2 -> 3") and f"(step {resumed})" in notes[0]
    else:
        assert notes == [] and "starting from step 0" in err


@pytest.mark.parametrize(
    "corrupt",
    [
        truncate_weights,
        pytest.param(flip_state_bytes, marks=pytest.mark.slow),
        pytest.param(delete_manifest, marks=pytest.mark.slow),
    ],
    ids=lambda f: f.__name__,
)
def test_resume_cli_skips_a_corrupt_latest_checkpoint(reference, tmp_path, corrupt, figures):
    ref = reference.get()
    run_dir = tmp_path / "run"
    shutil.copytree(ref.run_dir, run_dir)
    latest = run_dir / "checkpoints" / f"step-{STEPS:06d}"
    name = corrupt(latest)
    proc = h.run(["train", "--resume", str(run_dir)], tmp_path, "resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("checkpoint skipped")]
    assert len(skipped) == 1 and name in skipped[0] and f"step-{STEPS:06d}" in skipped[0], proc.stderr[-2000:]
    got = h.resumed_at(proc.stderr)
    assert got is not None and Path(got[0]).name == f"step-{STEPS - 1:06d}" and got[1] == STEPS - 1
    assert_same_as_reference(run_dir, ref)
    figures(f"{skipped[0]} | then {Path(got[0]).name} loaded, final weights bit-identical")

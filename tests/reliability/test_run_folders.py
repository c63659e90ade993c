"""Nothing lost to the run folder itself: a fresh run is refused over an old one
unless --resume or --overwrite; one writer at a time (a lock naming its holder); checkpoint retention by
step number that never deletes the newest valid checkpoint nor the one just written, also after every
checkpoint was corrupt; demo run names that cannot collide; a metrics.jsonl deleted or replaced mid-run
is written back, and a corrupt one is reported, skipped by the report and repaired by --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.runtime.checkpoint import latest_valid_checkpoint, list_checkpoints, save_checkpoint, verify_checkpoint
from regroup.runtime.metrics import MetricsFileWarning, MetricsLogger
from regroup.runtime.rundir import RunDirError, RunDirLock, claim_run_dir, first_missing_folder, new_run_dir

pytestmark = pytest.mark.reliability


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def folder_state(run_dir: Path) -> dict[str, int]:
    """Every file under the run folder (the lock file aside) with its size."""
    return {
        p.relative_to(run_dir).as_posix(): p.stat().st_size
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# --------------------------------------------------------------------------------- fresh over old


def test_a_fresh_run_into_a_used_folder_is_refused_and_overwrite_discards_it(tiny_model_dir, run_copy, capsys):
    before = folder_state(run_copy)
    capsys.readouterr()
    assert main(h.train_args(tiny_model_dir, run_copy, "grpo.yaml", "train.steps=3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0] and "--resume" in err[0] and "--overwrite" in err[0]
    assert folder_state(run_copy) == before, "a refused run must not touch the folder"

    assert main([*h.train_args(tiny_model_dir, run_copy, "grpo.yaml", "train.steps=1"), "--overwrite"]) == 0
    assert "--overwrite: discarded" in capsys.readouterr().err
    assert steps_logged(run_copy) == [1]  # not 1, 2 followed by 1
    assert [p.name for p in list_checkpoints(run_copy)] == ["step-000001"]


def test_resume_of_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such run folder" in err[0]  # the folder itself is missing
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no config.yaml" in err[0]


# ------------------------------------------------------------------------------------------- lock


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    code = (
        "import sys, time; from regroup.runtime.rundir import RunDirLock; RunDirLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True, env=h.child_env()
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(run_copy, capsys):
    holder = _hold_lock(run_copy)
    try:
        capsys.readouterr()
        assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by another run (pid {holder.pid})" in err[0], err
        with pytest.raises(RunDirError, match=f"pid {holder.pid}"):
            claim_run_dir(run_copy, "resume")
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the dead holder's lock: no stale lock after a crash
    with claim_run_dir(run_copy, "resume"):
        assert (run_copy / ".lock").read_text().strip() == str(os.getpid())
    assert (run_copy / ".lock").read_text() == ""  # released: no PID of a finished run left behind


@pytest.mark.slow  # two training processes: ~15 s on an idle 2-core machine
def test_two_runs_started_together_on_one_folder(tiny_model_dir, tmp_path):
    """Two `regroup train` processes on one run_dir at once: exactly one trains, the other stops with one
    line (the folder is locked, or already holds the winner's run); metrics hold each step once."""
    run = tmp_path / "run"
    argv = h.train_args(tiny_model_dir, run, "grpo.yaml", "train.steps=2")
    procs = [h.start(argv, tmp_path, f"p{i}") for i in range(2)]
    done = [h.finish(p, argv) for p in procs]
    assert sorted(p.returncode for p in done) == [0, 2], [p.stderr[-2000:] for p in done]
    loser = next(p for p in done if p.returncode == 2)
    lines = [line for line in loser.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("in use by another run (pid" in lines[0] or "already holds a run" in lines[0]), lines
    assert "Traceback" not in loser.stderr
    assert steps_logged(run) == [1, 2]
    assert h.tmp_folders(run) == []
    for path in list_checkpoints(run):
        verify_checkpoint(path)


def test_demo_run_names_cannot_collide(tmp_path):
    first = new_run_dir(tmp_path, "demo", stamp="20261130-120000")
    second = new_run_dir(tmp_path, "demo", stamp="20261130-120000")
    third = new_run_dir(tmp_path, "demo", stamp="20261130-120000")
    assert [first.name, second.name, third.name] == [
        "demo-20261130-120000",
        "demo-20261130-120000-2",
        "demo-20261130-120000-3",
    ]
    assert all(p.is_dir() for p in (first, second, third))


def test_lock_is_exclusive_within_one_process_too(tmp_path):
    with RunDirLock(tmp_path).acquire():
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path).acquire()
    RunDirLock(tmp_path).acquire().release()


# ------------------------------------------------------------------------------------ retention


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_retention_orders_by_step_number_not_name(tiny_model, tmp_path):
    save_checkpoint(tmp_path, 999_999, tiny_model, None, {"step": 999_999}, keep=1)
    save_checkpoint(tmp_path, 1_000_000, tiny_model, None, {"step": 1_000_000}, keep=1)
    # by name "step-1000000" < "step-999999": name order would have deleted the one just written
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-1000000"]


def test_after_every_checkpoint_was_corrupt_new_ones_are_kept(tiny_model, tmp_path):
    for step in (5, 6):
        save_checkpoint(tmp_path, step, tiny_model, None, {"step": step}, keep=2)
    for step in (5, 6):
        (tmp_path / "checkpoints" / f"step-{step:06d}" / "manifest.json").unlink()
    assert latest_valid_checkpoint(tmp_path, warn=lambda m: None) is None  # the run restarts from 0
    save_checkpoint(tmp_path, 1, tiny_model, None, {"step": 1}, keep=2)
    save_checkpoint(tmp_path, 2, tiny_model, None, {"step": 2}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001", "step-000002", "step-000005", "step-000006"]
    save_checkpoint(tmp_path, 3, tiny_model, None, {"step": 3}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003", "step-000005", "step-000006"]
    assert latest_valid_checkpoint(tmp_path, warn=lambda m: None).name == "step-000003"  # a kill now resumes at 3
    save_checkpoint(tmp_path, 5, tiny_model, None, {"step": 5}, keep=2)  # the re-save replaces the corrupt one
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003", "step-000005", "step-000006"]
    verify_checkpoint(tmp_path / "checkpoints" / "step-000005")


def test_cli_resume_after_every_checkpoint_was_corrupt_keeps_its_new_checkpoints(run_copy, capsys):
    for path in list_checkpoints(run_copy):
        (path / "model.safetensors").write_bytes(b"torn")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=1"]) == 0
    err = capsys.readouterr().err
    assert "no checkpoint in" in err and err.count("checkpoint skipped") == 2
    assert "step-000001" in [p.name for p in list_checkpoints(run_copy)]
    verify_checkpoint(run_copy / "checkpoints" / "step-000001")
    # a later crash (here: the next resume) starts from the new checkpoint, not from 0 again
    assert main(["train", "--resume", str(run_copy), "train.steps=2"]) == 0
    got = h.resumed_at(capsys.readouterr().err)
    assert got is not None and Path(got[0]).name == "step-000001" and got[1] == 1
    assert steps_logged(run_copy) == [1, 2]


def test_first_missing_folder_by_hand(tmp_path):
    assert first_missing_folder(tmp_path) is None
    assert first_missing_folder(tmp_path / "a" / "b" / "run") == tmp_path / "a"
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert first_missing_folder(tmp_path / "link") is None  # a dangling link is there: nothing to make


@pytest.mark.parametrize("run_dir", [None, "a/b/run"], ids=["default", "nested"])
def test_a_run_refused_before_the_weights_load_leaves_no_folder_behind(
    tiny_model_dir, tmp_path, capsys, monkeypatch, run_dir
):
    """A user reward the preflight refuses (it returns a string): one line, exit 2, and no folder the command
    made is left: not the run folder, nor `runs/` (the default run folder's parent), nor a run_dir's parents."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    overrides = [o for o in h.small_overrides(tiny_model_dir, "-") if not o.startswith("run_dir=")]
    overrides += [f"run_dir={run_dir}"] if run_dir else []
    argv = ["train", "--config", str(h.CONFIGS / "grpo.yaml"), *overrides, "rewards=[_user_rewards:says_yes]"]
    assert main(argv) == 2
    assert "returned str 'yes'" in h.one_line(capsys)
    assert os.listdir(work) == []


# -------------------------------------------------------------------------------------- metrics


def test_metrics_file_deleted_or_replaced_mid_run_is_written_back(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log(step, {"loss": float(step)})
    (tmp_path / "metrics.jsonl").unlink()
    with pytest.warns(MetricsFileWarning, match="vanished"):
        logger.log(4, {"loss": 4.0})
    assert steps_logged(tmp_path) == [1, 2, 3, 4]
    (tmp_path / "other.jsonl").write_text('{"step": 1, "loss": 9}\n')
    os.replace(tmp_path / "other.jsonl", tmp_path / "metrics.jsonl")  # replaced by another file
    with pytest.warns(MetricsFileWarning, match="was replaced"):
        logger.log(5, {"loss": 5.0})
    (tmp_path / "metrics.jsonl").write_text("")  # truncated in place
    with pytest.warns(MetricsFileWarning, match="changed size"):
        logger.log(6, {"loss": 6.0})
    assert steps_logged(tmp_path) == [1, 2, 3, 4, 5, 6]
    assert [json.loads(x)["loss"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


CORRUPT_LINES = [b'{"step": 2, "loss": 0.5, "note": "\xff"}', b'{"step": "4", "loss": 0.1}']


def test_report_skips_corrupt_metrics_lines_with_one_warning_each(tmp_path):
    from regroup.report.runs import load_run

    (tmp_path / "config.yaml").write_text("recipe: grpo\nseed: 0\n")
    good = [json.dumps({"step": s, "loss": 1.0 / s}).encode() for s in (1, 3)]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([good[0], *CORRUPT_LINES, good[1]]) + b"\n")
    with pytest.warns(MetricsFileWarning) as caught:
        run = load_run(str(tmp_path))
    messages = [str(w.message) for w in caught]
    assert [r["step"] for r in run.metrics] == [1, 3] and run.bad_metric_lines == 2
    assert len(messages) == 2
    assert "metrics.jsonl line 2: invalid UTF-8" in messages[0] and "metrics.jsonl line 3: 'step'" in messages[1]


def test_report_command_warns_in_one_line_per_bad_line(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("recipe: grpo\nseed: 0\n")
    good = [json.dumps({"step": s, "loss": 1.0 / s, "reward/mean": 0.1 * s}).encode() for s in (1, 3)]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([good[0], *CORRUPT_LINES, good[1]]) + b"\n")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warned) >= 2 and all("metrics.jsonl line" in w for w in warned)


def test_resume_repairs_a_corrupt_metrics_file(run_copy, capsys):
    path = run_copy / "metrics.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], *CORRUPT_LINES, lines[1]]) + b"\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl line 2: invalid UTF-8" in err and "metrics.jsonl line 3: 'step'" in err
    assert steps_logged(run_copy) == [1, 2, 3]  # every line valid again, each step once

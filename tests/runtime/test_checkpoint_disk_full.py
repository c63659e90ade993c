"""A disk that fills while a checkpoint's trainer_state.pt is written: the save ends in a DiskFullError (the
CLI's one "no space left on device" line, exit 2), its half-written folder is removed, and the previous
checkpoint still verifies and loads. torch reported the full disk of a write to a path as
`RuntimeError: basic_ios::clear: iostream error` when it came at the end of the file, which named nothing."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from regroup.cli import user_error
from regroup.runtime.checkpoint import (
    DiskFullError,
    list_checkpoints,
    load_trainer_state,
    save_checkpoint,
    verify_checkpoint,
)

STATE = {"step": 2, "async": {"batches": [{"ids": torch.arange(64)}]}, "rng": torch.zeros(100)}
"""A small trainer state: on a full device torch's write of a small file fails at its end."""


def weights_file(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"w" * 100)  # stands for the model (only its size matters)


def check_refused_and_previous_intact(run: Path, save) -> None:
    with pytest.raises(DiskFullError) as info:
        save()
    final = run / "checkpoints" / "step-000002"
    assert user_error(info.value) == f"error: no space left on device while writing {final}"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000001"]  # no half checkpoint left
    (previous,) = list_checkpoints(run)
    verify_checkpoint(previous)
    assert load_trainer_state(previous)["step"] == 1


def test_a_trainer_state_written_to_a_full_device_is_named(tmp_path):
    """/dev/full fails every write with ENOSPC; the state file of the second checkpoint is put there."""
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("no /dev/full device here")
    run = tmp_path / "run"
    save_checkpoint(run, 1, None, None, {**STATE, "step": 1}, write_weights=weights_file)

    def onto_full_device(folder: Path) -> None:
        weights_file(folder)
        (folder / "trainer_state.pt").symlink_to("/dev/full")

    check_refused_and_previous_intact(
        run, lambda: save_checkpoint(run, 2, None, None, STATE, write_weights=onto_full_device)
    )


@contextlib.contextmanager
def small_filesystem(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` (root only; skipped elsewhere)."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_filesystem_that_fills_at_the_end_of_the_trainer_state_is_named(tmp_path):
    """A real full file system: the space left runs out in the last page of the second trainer_state.pt."""
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        page = os.statvfs(disk).f_frsize
        run = disk / "run"
        save_checkpoint(run, 1, None, None, {**STATE, "step": 1}, write_weights=weights_file)
        state_pages = -(-(run / "checkpoints" / "step-000001" / "trainer_state.pt").stat().st_size // page)
        fs = os.statvfs(disk)
        filler = (
            fs.f_bavail * fs.f_frsize - (1 + state_pages - 1) * page
        )  # the weights' page, all but one of the state's
        (disk / "filler").write_bytes(b"\0" * filler)
        check_refused_and_previous_intact(
            run, lambda: save_checkpoint(run, 2, None, None, STATE, write_weights=weights_file)
        )

"""Atomic checkpoints and exact resume.

A checkpoint is a folder `RUN_DIR/checkpoints/step-000123/` holding the model in HF format
(`save_pretrained`, loadable without regroup), the tokenizer, `trainer_state.pt` (optimizer,
scheduler, every RNG state, data position, step, stage states) and `manifest.json` with the sha256 of
every file. It is written under a temporary name, fsynced and renamed, so a crash never leaves a half
checkpoint under a final name; on load the manifest is verified and a corrupt latest checkpoint
(truncated file, wrong hash) is reported and the previous one used.

Folders are only ever removed after being renamed out of the `step-*` namespace (to `.trash-*`), so a
crash in the middle of a deletion cannot leave a half-deleted folder under a final name either; the
temporary and trash folders a crashed writer left behind are removed by the next save.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

MANIFEST = "manifest.json"
STATE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    """Remove a checkpoint folder: first rename it out of the `step-*` namespace (atomic), then delete."""
    trash = path.parent / f".trash-{path.name}-{os.getpid()}"
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_leftovers(root: Path) -> None:
    """Delete `.tmp-*` / `.trash-*` folders of a writer that crashed (one process writes a run's checkpoints:
    rank 0; so any such folder found before a save is a leftover, and can hold a whole model)."""
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith((".tmp-step-", ".trash-")):
            shutil.rmtree(p, ignore_errors=True)


class DiskFullError(OSError):
    """No space left on the device while a run wrote a file; the message names the path."""


def is_disk_full(exc: BaseException) -> bool:
    """True for the ways a full disk reaches Python: ENOSPC / EDQUOT, torch's `[enforce fail at
    inline_container.cc...]` (its zip writer) and safetensors' `StorageFull` / `os error 28`."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return any(s in text for s in ("enforce fail at inline_container", "No space left", "StorageFull",
                                   "os error 28", "Errno 28"))


def save_checkpoint(run_dir, step: int, model, tokenizer, trainer_state: dict, keep: int = 2,
                    write_weights=None) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` (see `_retain`).

    `write_weights(folder)` replaces `model.save_pretrained` + tokenizer (sharded runs write gathered
    weights and move their sharded training state in; see `regroup.sharded`)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    tmp.mkdir()
    try:
        if write_weights is not None:
            write_weights(tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / STATE)
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))
        _fsync_tree(tmp)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a half checkpoint is no use and holds the space a retry needs
        if is_disk_full(e):
            raise DiskFullError(errno.ENOSPC, f"no space left on device while writing {final}") from e
        raise
    if final.exists():  # a re-save of the same step (after resuming past a corrupt one): replace it
        _discard(final)
    os.replace(tmp, final)
    _fsync_dir(root)  # the rename itself must survive a power loss
    for old in _retain(list_checkpoints(run_dir), step, keep):
        _discard(old)
    return final


def checkpoint_step(path: Path) -> int | None:
    """The step number of a `step-N` folder name (None for any other name)."""
    number = path.name.removeprefix("step-")
    return int(number) if path.name.startswith("step-") and number.isdigit() else None


def _retain(checkpoints: list[Path], written: int, keep: int) -> list[Path]:
    """The checkpoints to delete after step `written` was saved: all but the newest `keep` at or below it.

    Folders of a step above `written` are never deleted here: the run resumed below them because none
    of them verified (the newest valid checkpoint is always the one resumed from), and each is replaced
    by the re-save of its step. Counting them would delete the just-written checkpoint at once.
    """
    older = [p for p in checkpoints if checkpoint_step(p) <= written]
    return older[:-keep] if keep > 0 else []


def list_checkpoints(run_dir) -> list[Path]:
    """Final-named checkpoint folders, oldest first by step number (temporary ones are ignored)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless every file listed in the manifest is there with its hash."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST} (incomplete checkpoint)")
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {e}") from None
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: missing file {name}")
        if _sha256(f) != digest:
            raise CheckpointError(f"{path}: file {name} does not match its sha256 (truncated or corrupted)")


def latest_valid_checkpoint(run_dir, warn=print) -> Path | None:
    """The newest checkpoint that verifies; corrupt newer ones are reported through `warn` and skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as e:
            warn(f"checkpoint skipped: {e}; falling back to the previous one")
    return None


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / STATE, map_location="cpu", weights_only=False)


def load_model_weights(model, path: Path) -> None:
    """Load the saved weights into an existing (possibly LoRA-wrapped) model, exactly."""
    from safetensors.torch import load_file

    state = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(f))
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is an error.
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")

"""Atomic checkpoints and exact resume.

A checkpoint is a folder `RUN_DIR/checkpoints/step-000123/` holding the model in HF format
(`save_pretrained`, loadable without regroup), the tokenizer, `trainer_state.pt` (optimizer,
scheduler, every RNG state, data position, step, stage states), `run_config.json` (the resolved config
the run trained with) and `manifest.json` with the sha256 of every file. It is written under a temporary
name, fsynced and renamed, so a crash never leaves a half checkpoint under a final name; on load the
manifest is verified and a corrupt latest checkpoint (truncated file, wrong hash) is reported and the
previous one used.

Nothing in a checkpoint can run code (the manifest is a checksum, not a signature: whoever can write the
folder can re-hash a file):
- `trainer_state.pt` holds only tensors and plain values (the python and numpy RNG states are stored as
  ints and lists, `rng_state`), and is read with `torch.load(weights_only=True)`: a pickled
  object of any other type is refused (`CheckpointRefused`), never constructed;
- a checkpoint of the older format (`FORMAT` absent from its manifest: a trainer state pickled with
  numpy objects) is refused in one line, not unpickled;
- only the files the manifest lists are read; any other file in the folder (a planted `*.safetensors`)
  and any symbolic link refuse the checkpoint, naming the file.
A refused checkpoint stops the resume (it is not skipped like a corrupt one: falling back would quietly
train from an older state while the folder holds planted files).

Folders are only ever removed after being renamed out of the `step-*` namespace (to `.trash-*`), so a
crash in the middle of a deletion cannot leave a half-deleted folder under a final name either; the
temporary and trash folders a crashed writer left behind are removed by the next save.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from regroup.config.schema import RESUME_OVERRIDABLE
from regroup.errors import ConfigError
from regroup.io import SymlinkError, open_nofollow
from regroup.runtime.rundir import flatten

MANIFEST = "manifest.json"
STATE = "trainer_state.pt"
RUN_CONFIG = "run_config.json"
FORMAT = 2
"""Checkpoint format in the manifest: 2 = trainer state of tensors and plain values, run_config.json."""


class CheckpointError(RuntimeError):
    pass


class CheckpointRefused(CheckpointError):
    """A checkpoint that is not loaded because it could run code or carries files it does not list
    (an older pickled format, an unlisted file, a symbolic link): the resume stops, naming it."""


def _open_file(path: Path):
    """A checkpoint file opened for reading, never through a link."""
    try:
        return os.fdopen(open_nofollow(path, os.O_RDONLY), "rb")
    except SymlinkError as e:
        raise CheckpointRefused(e.strerror) from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with _open_file(path) as f:
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
    """Every RNG state as tensors and plain values (what `torch.load(weights_only=True)` reads back)."""
    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=False)
    state = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "bit_generator": legacy["bit_generator"],
            "key": legacy["state"]["key"].tolist(),
            "pos": int(legacy["state"]["pos"]),
            "has_gauss": int(legacy["has_gauss"]),
            "gauss": float(legacy["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    np.random.set_state(
        {
            "bit_generator": npy["bit_generator"],
            "state": {"key": np.asarray(npy["key"], dtype=np.uint32), "pos": npy["pos"]},
            "has_gauss": npy["has_gauss"],
            "gauss": npy["gauss"],
        }
    )
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
    """True for the ways a full disk reaches Python: ENOSPC / EDQUOT (also as the cause or context of
    another error: torch's zip writer re-raises the OSError of a Python file it writes to), torch's
    `[enforce fail at inline_container.cc...]` and safetensors' `StorageFull` / `os error 28`."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: an error raised while handling another
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return any(
        s in text
        for s in ("enforce fail at inline_container", "No space left", "StorageFull", "os error 28", "Errno 28")
    )


PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.Size, torch.dtype)


def _check_plain(value, where: str = "trainer state") -> None:
    """Raise CheckpointError naming the first value `torch.load(weights_only=True)` would refuse (anything
    but tensors, plain scalars and dicts / lists / tuples of them): a checkpoint that cannot be resumed is
    refused when written, not discovered at the resume."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise CheckpointError(
                    f"{where} has a key of type {type(key).__name__}: checkpoints hold only tensors and plain values"
                )
            _check_plain(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, PLAIN):
        raise CheckpointError(
            f"{where} is a {type(value).__module__}.{type(value).__name__}: checkpoints hold only "
            "tensors and plain values (a stage's state_dict must return those)"
        )


def save_checkpoint(
    run_dir,
    step: int,
    model,
    tokenizer,
    trainer_state: dict,
    keep: int = 2,
    write_weights=None,
    config: dict | None = None,
) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` (see `_retain`).

    `config`: the resolved run config (`RunConfig.to_dict()`), kept as run_config.json so a resume can
    tell a hand-edited config.yaml from the one the run trained with.
    `write_weights(folder)` replaces `model.save_pretrained` + tokenizer (sharded runs write gathered
    weights and move their sharded training state in; see `regroup.runtime.sharded`)."""
    _check_plain(trainer_state)
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
        with open(tmp / STATE, "wb") as f:  # a Python file: a full disk is an OSError (ENOSPC), not torch's
            torch.save(trainer_state, f)  # "basic_ios::clear: iostream error" of a write to a path
        if config is not None:
            (tmp / RUN_CONFIG).write_text(json.dumps(config, indent=1, default=list))
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "format": FORMAT, "files": files}, indent=1))
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
    older = [p for p in checkpoints if (checkpoint_step(p) or 0) <= written]  # every listed one has a step
    return older[:-keep] if keep > 0 else []


def list_checkpoints(run_dir) -> list[Path]:
    """Final-named checkpoint folders, oldest first by step number (temporary ones are ignored)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)  # each has one: filtered above


def read_manifest(path: Path, any_format: bool = False) -> dict:
    """The checkpoint's manifest ({"step", "format", "files": {relative name: sha256}}); CheckpointError
    when absent or unreadable (an incomplete checkpoint), CheckpointRefused for a link or, unless `any_format`
    (a reader of the weights alone, which are plain safetensors in every format), an older or newer format."""
    manifest = path / MANIFEST
    if not os.path.lexists(manifest):
        raise CheckpointError(f"{path}: no {MANIFEST} (incomplete checkpoint)")
    try:
        with _open_file(manifest) as f:
            data = json.loads(f.read().decode("utf-8"))
        files = data["files"]
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise KeyError("files")
    except (ValueError, RecursionError, UnicodeDecodeError, KeyError, TypeError) as e:  # JSONDecodeError: a ValueError
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {type(e).__name__}: {str(e)[:200]}") from None
    written = data.get("format")
    if any_format:
        written = FORMAT  # the format tells how trainer_state.pt was written, which such a reader never opens
    if isinstance(written, int) and not isinstance(written, bool) and written > FORMAT:
        raise CheckpointRefused(
            f"{path} was written by a newer regroup (checkpoint format {written}; this version reads format "
            f"{FORMAT}): resume it with that version (upgrade regroup). Its weights are plain safetensors "
            "(regroup eval --model PATH, or a new run with model.path=PATH)"
        )
    if written != FORMAT:
        raise CheckpointRefused(
            f"{path} was written by an older regroup, whose {STATE} is a pickle that could run code when loaded; "
            "it is not loaded. Its weights are safe to use (regroup eval --model PATH, or a new run with "
            "model.path=PATH); a resume needs a checkpoint written by this version"
        )
    for name in files:
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts or not parts:
            raise CheckpointRefused(f"{path}: {MANIFEST} lists a file outside the checkpoint: {name!r}")
    return data


def _unlisted(path: Path, listed: set[str]) -> list[str]:
    """Files (and links of any kind) in the folder that the manifest does not list."""
    found = []
    for p in sorted(path.rglob("*")):
        name = p.relative_to(path).as_posix()
        if p.is_symlink():
            raise CheckpointRefused(
                f"{path}: {name} is a symbolic link; a checkpoint holds only the files it lists (remove it)"
            )
        if not p.is_dir() and name != MANIFEST and name not in listed:
            found.append(name)
    return found


def check_listing(path: Path, any_format: bool = False) -> dict[str, str]:
    """The manifest's {file: sha256}, after refusing (CheckpointRefused) a checkpoint that is a link, holds
    a link or a file the manifest does not list, or is of the older format. Reads no file but the manifest."""
    if path.is_symlink():
        raise CheckpointRefused(f"{path} is a symbolic link; regroup does not follow links inside a run folder")
    files = read_manifest(path, any_format)["files"]
    extra = _unlisted(path, set(files))
    if extra:
        raise CheckpointRefused(
            f"{path}: file {extra[0]} is not listed in its {MANIFEST}; a checkpoint loads only "
            f"the files it lists, so this one is refused (remove the file if you put it there)"
        )
    return files


def verify_checkpoint(path: Path, any_format: bool = False) -> None:
    """Raise CheckpointError unless every file listed in the manifest is there with its hash;
    CheckpointRefused (the subclass) when the folder holds a file the manifest does not list, a link,
    or (unless `any_format`: `regroup eval` reads only the weights) is of the older pickled format."""
    files = check_listing(path, any_format)
    for name, digest in files.items():
        f = path / name
        if not os.path.lexists(f) or (f.is_dir() and not f.is_symlink()):
            raise CheckpointError(f"{path}: missing file {name}")
        if _sha256(f) != digest:
            raise CheckpointError(f"{path}: file {name} does not match its sha256 (truncated or corrupted)")


def latest_valid_checkpoint(run_dir, warn=print) -> Path | None:
    """The newest checkpoint that verifies; corrupt newer ones are reported through `warn` and skipped.
    A refused one (CheckpointRefused: planted files, older format) raises: the resume stops there."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointRefused:
            raise
        except CheckpointError as e:
            warn(f"checkpoint skipped: {e}; falling back to the previous one")
    return None


def load_trainer_state(path: Path, mmap: bool = False) -> dict:
    """The trainer state of a verified checkpoint, read with `weights_only=True`: tensors and plain values
    only; anything else (a pickled object, whatever its `__reduce__`) is refused before it is built.
    `mmap`: tensors stay in the file until read (a check that reads a small part of a large state)."""
    with _open_file(path / STATE) as f:  # refuses a link
        try:
            source = str(path / STATE) if mmap else f  # torch maps a file by its name only
            state = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()
            why = next((line.strip() for line in first if "Unsupported" in line or "global" in line.lower()), "")
            raise CheckpointRefused(
                f"{path / STATE} holds objects other than tensors and plain values, which are "
                f"not loaded (it could run code){': ' + why[:200] if why else ''}"
            ) from None
    if not isinstance(state, dict):
        raise CheckpointRefused(f"{path / STATE} is not a trainer state (a {type(state).__name__})")
    return state


def matching_trainer_state(path: Path) -> dict | None:
    """The trainer state of checkpoint `path` (its tensors mapped, not read) when trainer_state.pt matches
    the manifest, else None (the resume reports a corrupt checkpoint and falls back): a check before any
    model loads."""
    try:
        digest = check_listing(path).get(STATE)
        if digest is None or _sha256(path / STATE) != digest:
            return None
        return load_trainer_state(path, mmap=True)
    except CheckpointRefused:
        raise
    except (CheckpointError, OSError, RuntimeError):  # RuntimeError: torch's reader on a damaged zip
        return None


def load_run_config(path: Path) -> dict | None:
    """The resolved config a checkpoint was trained with (run_config.json; None when it has none)."""
    if not os.path.lexists(path / RUN_CONFIG):
        return None
    with _open_file(path / RUN_CONFIG) as f:
        try:
            data = json.loads(f.read().decode("utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError) as e:  # too deep, or an int of > 4300 digits
            raise CheckpointError(f"{path / RUN_CONFIG}: not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path / RUN_CONFIG}: not a mapping")
    return data


def newest_run_config(run_dir) -> tuple[Path, dict | None] | None:
    """(checkpoint, its run config) of the newest checkpoint whose run_config.json matches its manifest;
    reads and hashes only that small file (a check before any model loads; the resume verifies the rest)."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            digest = check_listing(path).get(RUN_CONFIG)
            if digest is not None and _sha256(path / RUN_CONFIG) == digest:
                return path, load_run_config(path)
        except CheckpointRefused:
            raise
        except (CheckpointError, OSError):
            continue
    return None


def config_differences(saved: dict, current: dict, allowed=()) -> list[tuple[str, object, object]]:
    """(dotted key, saved value, current value) for every key both configs have whose values differ, keys in
    `allowed` (or under them) aside. A key only one side has is a field added or removed between regroup
    versions, not an edit."""

    # through JSON, so tuples and lists compare alike (run_config.json is JSON)
    a = flatten(json.loads(json.dumps(saved, default=list)))
    b = flatten(json.loads(json.dumps(current, default=list)))
    skip = tuple(allowed)
    return [
        (key, a[key], b[key])
        for key in sorted(set(a) & set(b))
        if a[key] != b[key] and not any(key == k or key.startswith(k + ".") for k in skip)
    ]


def check_resume_config(checkpoint: Path, saved: dict | None, current: dict, where: str) -> None:
    """Refuse (ConfigError naming the key) a resume whose config differs from the one `checkpoint` was
    trained with outside the keys a resume may change (`config.RESUME_OVERRIDABLE`)."""
    if saved is None:
        return
    # run_dir names the folder, which a resume takes from --resume (a moved folder keeps its old name here)
    diffs = config_differences(saved, current, (*RESUME_OVERRIDABLE, "run_dir"))
    if diffs:
        key, old, new = diffs[0]
        more = f" (and {len(diffs) - 1} more: {', '.join(k for k, _, _ in diffs[1:4])})" if len(diffs) > 1 else ""
        raise ConfigError(
            f"{where}: {key} is {new!r} but {checkpoint.name} was trained with {old!r}{more}; the "
            f"restored optimizer, scheduler, data and RNG states go on with the saved value, so a "
            f"resume may change only {', '.join(RESUME_OVERRIDABLE)}: put it back, or start a new run"
        )


def check_resume_steps(checkpoint: Path, total_steps: int, key: str = "train.steps") -> None:
    """Refuse (ConfigError) a resume to fewer steps than `checkpoint` has trained: nothing would train, and
    config.yaml would claim a shorter run than its metrics.jsonl records. `key`: what set the length."""
    step = checkpoint_step(checkpoint)
    if step is not None and total_steps < step:
        raise ConfigError(
            f"{key} ends the run at step {total_steps}, but it has trained {step} steps ({checkpoint.name}); a resume "
            f"goes on from there: give {key} at least {step} to train more, or start a new run"
        )


def check_resume_length(run_dir, total_steps: int, key: str = "train.steps") -> None:
    """`check_resume_steps` before any model loads, on the checkpoint the resume will load: only when the
    newest one is past `total_steps` are the checkpoints verified (hashed) to find it, as the resume does
    (every one corrupt: it starts from step 0, and any length will do)."""
    found = list_checkpoints(run_dir)
    newest = checkpoint_step(found[-1]) if found else None
    if newest is None or newest <= total_steps:
        return
    path = latest_valid_checkpoint(run_dir, warn=lambda line: None)  # the resume reports the skipped ones
    if path is not None:
        check_resume_steps(path, total_steps, key)


def _listed_weight_files(path: Path) -> list[Path]:
    """The `*.safetensors` files of the checkpoint's manifest (never a file it does not list)."""
    files = read_manifest(path)["files"]
    return [path / name for name in sorted(files) if name.endswith(".safetensors") and "/" not in name]


def _check_shapes(model, state: dict, path: Path) -> None:
    """A CheckpointError naming the first tensor whose saved shape differs from the model's (a resume onto
    a differently shaped model), instead of torch's size-mismatch traceback."""
    own = model.state_dict()
    for key, tensor in state.items():
        if key in own and tuple(own[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{path}: weights do not fit the model: {key} is {tuple(tensor.shape)} in the "
                f"checkpoint and {tuple(own[key].shape)} in the model (a different model.path or "
                f"model config than the run trained)"
            )


def load_model_weights(model, path: Path) -> None:
    """Load the saved weights into an existing (possibly LoRA-wrapped) model, exactly; only the weight
    files the manifest lists are read."""
    from safetensors.torch import load_file  # only a weights file is read with it

    state = {}
    for f in _listed_weight_files(path):
        with _open_file(f):  # refuses a link swapped in since verification
            pass
        state.update(load_file(f))
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict  # optional (peft): LoRA checkpoints only

        try:
            set_peft_model_state_dict(model, state)
        except RuntimeError as e:
            raise CheckpointError(
                f"{path}: weights do not fit the model: {str(e).strip().splitlines()[-1][:300]}"
            ) from None
        return
    _check_shapes(model, state, path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings are saved once; anything else missing is an error.
    missing = [
        k for k in missing if not (k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))
    ]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )

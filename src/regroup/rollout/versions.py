"""Policy versions for asynchronous rollouts (`rollout.async_steps`): the learner's weights as numbered
snapshots, and an engine that switches between them only between requests.

Version v is the policy after v updates (version 0: the weights the run starts or resumes from at step 0).
The learner takes a snapshot right after an update (`EngineWeights.snapshot`: a copy in memory, cheap,
on the learner's thread); the producer's thread later loads it into the engine (`EngineWeights.load`:
the slow part, a folder write and server reload, off the learner's critical path). `VersionedEngine`
holds one lock around every `generate` and every `load`, so a load waits for the requests in flight to
finish and no response mixes two versions; each completion is stamped with the version that drew it.

Backends:

| backend        | snapshot (learner thread)                 | load (producer thread)                         |
|----------------|-------------------------------------------|------------------------------------------------|
| `vllm_server`  | weights in vLLM's names, LoRA merged      | reload: write the folder, `/collective_rpc`;   |
|                | (`VLLMServerSampler.snapshot_weights`)    | nccl: send the snapshot (`load_snapshot`)      |
| `hf`           | the trainable parameters, copied          | copied into the sampler's own model copy       |
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from regroup.rollout.base import Completion, SamplingParams


class AsyncRolloutError(OSError):
    """Asynchronous rollouts cannot go on: the engine died, stalled past its deadline or returned a batch
    we cannot train on. An OSError, so the CLI prints it as one line (`cli.user_error`) and exits 2."""


@dataclass
class WeightSnapshot:
    """The learner's weights at one policy version, in the form the engine loads (`EngineWeights`)."""

    version: int
    payload: Any


class OwnCopyWeights:
    """The built-in HF sampler under async: it samples from its own copy of the model, so the learner can
    update its weights meanwhile. A snapshot is the trainable parameters (the rest never changes)."""

    def __init__(self, sampler):
        self.sampler = sampler

    @staticmethod
    def snapshot(model) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    def load(self, payload: dict[str, torch.Tensor], version: int) -> None:
        params = dict(self.sampler.model.named_parameters())
        missing = sorted(set(payload) - set(params))
        if missing:
            raise AsyncRolloutError(f"the sampler's model copy has no parameter {missing[0]} (of {len(missing)})")
        with torch.no_grad():
            for name, tensor in payload.items():
                params[name].copy_(tensor)
        self.sampler.sync_weights(self.sampler.model)  # copied in place: the same object, its decoder kept


class ServerWeights:
    """`rollout.backend=vllm_server`: the snapshot is taken from the learner, the server loads it."""

    def __init__(self, sampler):
        self.sampler = sampler

    def snapshot(self, model):
        return self.sampler.snapshot_weights(model)

    def load(self, payload, version: int) -> None:
        self.sampler.load_snapshot(payload, version)


def engine_weights(sampler) -> OwnCopyWeights | ServerWeights:
    """How `sampler`'s engine takes a snapshot and loads one (the backends async supports)."""
    if hasattr(sampler, "snapshot_weights") and hasattr(sampler, "load_snapshot"):
        return ServerWeights(sampler)
    if getattr(sampler, "owns_weights", False):
        return OwnCopyWeights(sampler)
    raise AsyncRolloutError(
        f"{type(sampler).__name__} shares the learner's weights: asynchronous rollouts need an engine with its own "
        "copy (rollout.backend=vllm_server or hf)"
    )


class VersionedEngine:
    """The Sampler seam over an engine whose weights are numbered versions: `generate` stamps every
    completion with `loaded_version` and checks the reply's shape; `load(snapshot)` switches versions,
    never while a `generate` runs (one lock). `switches` lists the versions in the order they were loaded."""

    def __init__(self, sampler, weights=None):
        self.sampler = sampler
        self.weights = weights if weights is not None else engine_weights(sampler)
        self.loaded_version: int | None = None
        self.switches: list[int] = []
        self.load_seconds: list[float] = []
        self._lock = threading.Lock()  # held by one request batch or one load at a time
        self._waiting = threading.Condition()
        self._pending_loads = 0  # a requested switch goes before the next request (a lock is not fair)

    def snapshot(self, model, version: int) -> WeightSnapshot:
        """The learner's weights now, as version `version` (on the learner's thread, between updates)."""
        return WeightSnapshot(version, self.weights.snapshot(model))

    def load(self, snapshot: WeightSnapshot) -> None:
        with self._waiting:
            self._pending_loads += 1
        try:
            with self._lock:
                t0 = time.perf_counter()
                self.weights.load(snapshot.payload, snapshot.version)
                self.load_seconds.append(time.perf_counter() - t0)
                self.loaded_version = snapshot.version
                self.switches.append(snapshot.version)
        finally:
            with self._waiting:
                self._pending_loads -= 1
                self._waiting.notify_all()

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | list[int] | None = None
    ) -> list[Completion]:
        with self._waiting:
            while self._pending_loads:
                self._waiting.wait()
        with self._lock:
            version = self.loaded_version
            completions = self.sampler.generate(prompts, params, seed=seed)
        check_completions(completions, len(prompts), params)
        for c in completions:
            c.policy_version = version
        return completions

    def sync_weights(self, model) -> None:
        raise AsyncRolloutError("under rollout.async_steps the engine loads numbered snapshots, not live weights")

    def __getattr__(self, name):  # the wrapped sampler's other attributes (close, sync_times, ...)
        return getattr(self.sampler, name)


def check_completions(completions: list, num_prompts: int, params: SamplingParams) -> None:
    """Refuse, in one line, a reply the producer must not hand to the learner: the wrong number of
    completions, token ids that are not ints, more tokens than asked (+1 for an EOS the engine left out),
    or log-probs of another length. A batch with one bad completion is dropped whole."""
    expected = num_prompts * params.n
    if len(completions) != expected:
        raise AsyncRolloutError(f"the engine returned {len(completions)} completions for {expected} requested")
    for i, c in enumerate(completions):
        ids = getattr(c, "token_ids", None)
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise AsyncRolloutError(f"completion {i}: token_ids is not a list of ints")
        if len(ids) > params.max_new_tokens + 1:
            raise AsyncRolloutError(
                f"completion {i}: {len(ids)} tokens for rollout.max_new_tokens={params.max_new_tokens}"
            )
        logps = getattr(c, "logps", None)
        if logps is not None and len(logps) != len(ids):
            raise AsyncRolloutError(f"completion {i}: {len(logps)} log-probs for {len(ids)} tokens")
        if logps is not None and any(isinstance(v, float) and math.isinf(v) and v > 0 for v in logps):
            raise AsyncRolloutError(f"completion {i}: a log-prob of +inf")

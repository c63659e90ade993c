"""The asynchronous rollout producer (`rollout.async_steps = k`): the engine draws batch t + 1 while the
learner trains on batch t. A producer, not a second trainer: it runs the recipe's stages (variants,
anchor slots, sampling, rewards, anchors, filters, advantages, masks: the trainer's own `collect`) on
its thread and hands complete `StepBatch`es, each stamped with the policy version that drew it, to the
same trainer loop, which only updates.

Schedule (verl's one-step-off, NeMo-RL's `max_trajectory_age_steps`): batch t is drawn by policy version
`max(r, t − k)` EXACTLY, version v being the weights after v updates and r the step the process started
from (0, or the checkpoint's step at a resume). The lag is fixed, not "whatever is newest", so a run is
deterministic given its seeds however fast the engine or the learner is:

```
learner   update(0)      update(1)      update(2) ...        k = 1
            │ snapshot v1   │ snapshot v2
producer  draw(1) by v0 │ load v1, draw(2) │ load v2, draw(3) ...
```

- The learner takes a snapshot right after each update (`publish`, cheap: a copy in memory); the
  producer loads version t − k into the engine just before drawing batch t (a folder write and a
  server reload for `vllm_server`: off the learner's critical path). Versions are loaded only between
  batches, under the engine's lock (`rollout.versions.VersionedEngine`), so no response mixes two.
- Stage state (anchor buffers, the question stream) is touched only by the producer's thread, batch
  after batch in order, so it is the same sequence of states as in a synchronous run.
- Checkpoints (`paused` + `state_dict`): the producer is held at a batch boundary once it has drawn every
  batch whose version is older than the checkpoint's, so the resumed run needs no weights but the
  checkpoint's; the drawn batches not yet trained on are saved whole (`rollout.inflight`). A checkpoint
  within k steps of the run's end holds no batch past the end, so a resume with more `train.steps` draws
  the batches up to step r + k − 1 it lacks with the checkpoint's weights (version r, a lag under k): the
  versions older than r are gone, and r is the floor of the schedule for that reason.
- Faults: an engine error, a malformed reply or no batch within `rollout.async_timeout_s` is one line
  (`AsyncRolloutError`, exit 2) on the learner's thread; a failed batch is never handed over, so nothing
  partial is trained on and no checkpoint is written after it.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

from regroup.config.schema import RunConfig
from regroup.errors import ConfigError
from regroup.rollout.inflight import inflight_state, load_inflight
from regroup.rollout.versions import AsyncRolloutError, VersionedEngine, WeightSnapshot

BACKENDS = ("vllm_server", "hf")
"""Backends with an engine that samples while the learner trains (their own weights)."""


def check_async_config(cfg: RunConfig, *, ratio_on_original: bool) -> None:
    """The async settings that cannot work, each as one line naming the key (before any model loads)."""
    r = cfg.rollout
    if not r.async_steps:
        return
    if r.backend == "vllm":
        raise ConfigError(
            "rollout.async_steps needs an engine that samples while the learner trains: the colocated vllm engine "
            "shares the learner's process, its cores and (on a GPU) its memory; use rollout.backend=vllm_server "
            "(a second engine process, `regroup vllm-serve`) or rollout.backend=hf"
        )
    if r.backend == "hf_generate":
        raise ConfigError(
            "rollout.async_steps with rollout.backend=hf_generate: `model.generate` samples from the global RNG, "
            "which the learner's thread shares; use rollout.backend=hf (per-row generators)"
        )
    if r.async_correction == "behaviour" and r.tis_cap > 0:
        raise ConfigError(
            "rollout.async_correction=behaviour makes pi_old the sampler's own log-probs, so rollout.tis_cap has "
            "nothing left to correct; set rollout.tis_cap=0, or rollout.async_correction=decoupled to weigh "
            "pi_prox/pi_behaviour with it"
        )
    if r.async_correction == "behaviour" and ratio_on_original:  # TA-GRPO ratios on q0 (the recipe's answer)
        raise ConfigError(
            "rollout.async_correction=behaviour with ta.ratio_anchor=original would divide pi(o|q0) by the "
            "sampler's pi(o|q_n), two different prompts; use rollout.async_correction=decoupled"
        )


def batch_version(step: int, lag: int, start: int = 0) -> int:
    """The policy version that draws batch `step` under a lag of `lag` updates, in a process that started
    (or resumed) at step `start`: no version older than `start` exists there."""
    return max(start, step - lag)


class AsyncProducer:
    """Draws batch t with policy version t − k on its own thread; `take(t)` hands it to the learner.

    `collect(step) -> (StepBatch, metrics)` runs the stages (on this thread only); `engine` is the
    VersionedEngine the stages sample through; `total_steps` bounds what is drawn."""

    def __init__(
        self,
        collect,
        engine: VersionedEngine,
        lag: int,
        total_steps: int,
        *,
        timeout_s: float = 1800.0,
        log=print,
    ):
        if lag < 1:
            raise ValueError("AsyncProducer needs a lag of at least 1 update (rollout.async_steps >= 1)")
        self.collect = collect
        self.engine = engine
        self.lag = lag
        self.total_steps = total_steps
        self.timeout_s = timeout_s
        self.log = log
        self._cv = threading.Condition()
        self._snapshots: dict[int, WeightSnapshot] = {}
        self._ready: dict[int, tuple] = {}  # step -> (batch, metrics, version)
        self._next = 0
        self._start = 0
        """The step this process started from: the oldest version it ever publishes (`batch_version`)."""
        self._allowed = -1
        """The last batch the producer may draw: the step last taken + k (see `take`)."""
        self._busy = False
        self._paused = 0
        self._error: tuple[int, BaseException] | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self.latest_version = -1
        """The newest version the learner published (its current weights)."""
        self.drawn: list[tuple[int, int]] = []
        """(step, version) of every batch drawn, in order (tests and benchmarks read it)."""

    # ---------------------------------------------------------------------------------- learner side
    def publish(self, version: int, model) -> None:
        """The learner's weights after `version` updates (called right after each update, on its thread)."""
        snapshot = self.engine.snapshot(model, version)
        with self._cv:
            self._snapshots[version] = snapshot
            self.latest_version = max(self.latest_version, version)
            self._cv.notify_all()

    def start(self, step: int, model) -> None:
        """Publish the current weights as version `step` and start drawing (a no-op once running)."""
        if self._thread is not None:
            return
        self.publish(step, model)
        with self._cv:
            self._start = step
            self._next = max(self._next, step)
        self._thread = threading.Thread(target=self._run, name="regroup-rollout-producer", daemon=True)
        self._thread.start()

    def take(self, step: int, model) -> tuple:
        """(batch, metrics) of `step`, waiting for the producer at most `timeout_s` seconds."""
        self.start(step, model)
        t0 = time.monotonic()
        with self._cv:
            # Batch step + k may be drawn from now on (its version, step, is published). Not before: a
            # checkpoint at `step` must hold exactly batches step .. step + k - 1, and a batch begun before
            # it would have moved the stage state past what the checkpoint saves.
            self._allowed = max(self._allowed, step + self.lag)
            self._cv.notify_all()
            while step not in self._ready:
                self._raise_if_failed()
                if step < self._next:  # drawn and handed over already, or never held: waiting cannot help
                    raise AsyncRolloutError(
                        f"no rollout batch for step {step + 1}: the producer is past it (at step {self._next + 1})"
                    )
                waited = time.monotonic() - t0
                if waited >= self.timeout_s:
                    raise AsyncRolloutError(
                        f"no rollout batch for step {step + 1} within {self.timeout_s:g} s "
                        f"(rollout.async_timeout_s): the engine is stalled or far slower than the learner "
                        f"(the producer is {'drawing' if self._busy else 'waiting at'} step {self._next + 1})"
                    )
                self._cv.wait(min(self.timeout_s - waited, 1.0))
            batch, metrics, _ = self._ready.pop(step)
        metrics = dict(metrics)
        metrics["time/wait_batch"] = time.monotonic() - t0  # the learner idle, waiting for the engine
        return batch, metrics

    def _raise_if_failed(self) -> None:
        if self._error is None:
            return
        step, exc = self._error
        if isinstance(exc, (OSError, ConfigError)):
            raise exc  # already one line (ServerError, AsyncRolloutError, a config or data problem)
        raise AsyncRolloutError(
            f"the rollout engine failed while drawing step {step + 1}: {type(exc).__name__}: {exc}"
        ) from exc

    @contextmanager
    def paused(self, step: int):
        """Hold the producer at a batch boundary with every batch a version older than `step` needs drawn
        (batches step .. step + k − 1): what a checkpoint at `step` saves (`state_dict`) is then complete."""
        with self._cv:
            if self._thread is not None:
                target = min(step + self.lag, self.total_steps)
                t0 = time.monotonic()
                while self._next < target or self._busy:
                    self._raise_if_failed()
                    if time.monotonic() - t0 >= self.timeout_s:
                        raise AsyncRolloutError(
                            f"the checkpoint of step {step} waited {self.timeout_s:g} s (rollout.async_timeout_s) "
                            f"for the producer to draw step {target}: the engine is stalled"
                        )
                    self._cv.wait(1.0)
            self._paused += 1
        try:
            yield
        finally:
            with self._cv:
                self._paused -= 1
                self._cv.notify_all()

    @contextmanager
    def engine_at(self, model, version: int):
        """The engine, holding the learner's current weights, for a held-out evaluation: the producer waits
        meanwhile, then loads the version its next batch needs again."""
        with self._cv:
            while self._busy and self._thread is not None:
                self._raise_if_failed()
                self._cv.wait(1.0)
            self._paused += 1
        try:
            if self.engine.loaded_version != version:
                self.engine.load(self.engine.snapshot(model, version))
            yield self.engine
        finally:
            with self._cv:
                self._paused -= 1
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)  # a thread stuck in a stalled engine call is a daemon: left behind

    # ---------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """The batches drawn and not yet trained on (call it inside `paused`)."""
        with self._cv:
            ready = [self._ready[s] for s in sorted(self._ready)]
            return inflight_state(self.lag, self._next, ready)

    def load_state_dict(self, state: dict | None, step: int, vocab_size: int | None = None) -> None:
        """The in-flight batches of a checkpoint at `step` (checked: `rollout.inflight.load_inflight`)."""
        if state is None:
            return
        next_step, ready = load_inflight(state, step=step, lag=self.lag, vocab_size=vocab_size)
        with self._cv:
            self._next = next_step
            self._ready = {batch.step: (batch, metrics, version) for batch, metrics, version in ready}

    # --------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        while True:
            with self._cv:
                t0 = time.monotonic()
                while True:
                    if self._stop:
                        return
                    if self._next < self.total_steps and self._next <= self._allowed and not self._paused:
                        need = batch_version(self._next, self.lag, self._start)
                        if need in self._snapshots:
                            break
                    self._cv.wait()
                waited = time.monotonic() - t0
                step, snapshot = self._next, self._snapshots[need]
                for old in [v for v in self._snapshots if v < need]:
                    del self._snapshots[old]  # batches are drawn in order: never needed again
                self._busy = True
            try:
                t1 = time.perf_counter()
                if self.engine.loaded_version != need:
                    self.engine.load(snapshot)
                load_s = time.perf_counter() - t1
                batch, metrics = self.collect(step)
                drawn_by = {s.policy_version for s in batch.samples if not s.is_anchor}
                if drawn_by - {need, None}:
                    raise AsyncRolloutError(
                        f"step {step + 1}: samples drawn by versions {sorted(drawn_by - {None})}, expected {need} only"
                    )
            except BaseException as exc:  # handed to the learner's thread, which raises it
                with self._cv:
                    self._error = (step, exc)
                    self._busy = False
                    self._cv.notify_all()
                return
            metrics = dict(metrics)
            metrics["rollout/policy_version"] = float(need)
            metrics["rollout/policy_lag"] = float(step - need)
            metrics["time/weight_load"] = load_s  # the engine taking version `need` (producer's thread)
            metrics["time/producer_wait"] = waited  # the engine idle, waiting for a version or a checkpoint
            with self._cv:
                self._ready[step] = (batch, metrics, need)
                self.drawn.append((step, need))
                self._next = step + 1
                self._busy = False
                self._cv.notify_all()


class CurrentPolicySampler:
    """The Sampler seam for sampling from the learner's current weights while the producer runs (held-out
    evaluation during training): each `generate` holds the producer at a batch boundary and loads the
    newest published version into the engine if it holds another (`AsyncProducer.engine_at`)."""

    def __init__(self, producer: AsyncProducer, model):
        self.producer, self.model = producer, model

    def generate(self, prompts, params, seed=None):
        version = max(self.producer.latest_version, 0)
        with self.producer.engine_at(self.model, version) as engine:
            return engine.generate(prompts, params, seed=seed)

    def sync_weights(self, model) -> None:
        self.model = model  # loaded at the next generate

    def __getattr__(self, name):  # the engine's other attributes (close, sync_times, ...)
        return getattr(self.producer.engine.sampler, name)


def build_producer(trainer) -> AsyncProducer:
    """The producer of a trainer whose config sets `rollout.async_steps`: its stages sample through a
    VersionedEngine over the trainer's sampler (which must own its weights: `rollout.factory`); the
    trainer's own sampler (evaluation) becomes a `CurrentPolicySampler`."""
    cfg = trainer.cfg
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if trainer.world > 1 or world > 1:
        raise ConfigError(f"rollout.async_steps runs with one learner process (here {max(trainer.world, world)})")
    engine = VersionedEngine(trainer.sampler)
    trainer.ctx.sampler = engine
    if cfg.rollout.async_correction == "decoupled" and cfg.rollout.tis_cap == 0:
        k = cfg.rollout.async_steps
        trainer.log(
            f"note: rollout.async_steps={k} with rollout.tis_cap=0: samples {k} update(s) old are not "
            "reweighted by pi_prox/pi_behaviour (set e.g. rollout.tis_cap=2)"
        )
    producer = AsyncProducer(
        trainer.collect,
        engine,
        cfg.rollout.async_steps,
        trainer.total_steps,
        timeout_s=cfg.rollout.async_timeout_s,
        log=trainer.log,
    )
    trainer.sampler = CurrentPolicySampler(producer, trainer.acc.unwrap_model(trainer.model))
    if getattr(trainer, "parts", None) is not None:
        trainer.parts.sampler = trainer.sampler  # hooks that sample (held-out evaluation) read it there
    return producer

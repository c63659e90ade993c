"""Diagnostics around the update, behind one seam: the trainer calls every `UpdateHook` it was given at
three points of a step and merges their metrics, without knowing which diagnostics run. `build_update_hooks`
picks them from the `diagnostics` config (`regroup.train.build.build_parts` calls it); the builder adds the
held-out evaluation (`regroup.eval.during_training`) and the signal watch (`WatchSignals`); a front-end or a
test may hand the trainer its own list.

- `after_collect(batch)`: the step's samples, after the recipe's stages ran (rewards, masks set).
- `before_update(model, batch, advantages, step)`: the collated rows and their advantages [B], before
  the first backward (the training gradients are not touched yet); `regroup.diagnostics.grad_conflict.
  GradientConflict` is one.
- `after_step(step, metrics)`: the step's metrics, reduced over the processes, after the update and the
  weight push; what it returns joins them (a hook later in the list sees it).

A hook whose state must survive a resume has `state_dict()` / `load_state_dict(state)`; the trainer saves
those by hook `name` (`hook_states`).

A hook that leaves a method as `UpdateHook`'s no-op is not called there (a diagnostic that is off costs
no call). Each cadence follows the step being trained (`StepBatch.step`), never a loop counter: a caller that drives
`Trainer.train_step(step)` itself measures on the same steps as `Trainer.train`.
"""

from __future__ import annotations

import re

import torch

from regroup.batch import RolloutBatch
from regroup.config.schema import RunConfig
from regroup.diagnostics.grad_conflict import GradientConflict
from regroup.diagnostics.signals import build_embedder, group_diversity, reward_diagnostics
from regroup.stages.base import StepBatch


class UpdateHook:
    """A diagnostic the trainer runs around each update; both methods return metrics (floats by name)."""

    name = "update_hook"

    def after_collect(self, batch: StepBatch) -> dict[str, float]:
        return {}

    def before_update(self, model, batch: RolloutBatch, advantages: torch.Tensor, step: int) -> dict[str, float]:
        return {}

    def after_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return {}


def hook_states(hooks: list) -> dict:
    """The checkpointed state of every stateful hook, by name."""
    return {h.name: h.state_dict() for h in hooks if hasattr(h, "state_dict")}


def load_hook_states(hooks: list, states: dict) -> None:
    for h in hooks:
        if hasattr(h, "load_state_dict") and states.get(h.name) is not None:
            h.load_state_dict(states[h.name])


class WatchHook(UpdateHook):
    """A watch (`observe(step, metrics)` -> lines, `state_dict`, `load_state_dict`) as an update hook over each
    step's reduced metrics: its lines go to `log` (rank 0's log, a no-op on the others); a watch that stops
    the run raises from `observe`. Checkpointed: the watch's state, so a resumed run warns (or stops) when
    the straight one would have."""

    def __init__(self, watch, log=print):
        self.watch, self.log = watch, log

    def after_step(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        for line in self.watch.observe(step + 1, metrics):  # warnings name the 1-based step, as the logs do
            self.log(line)
        return {}

    def state_dict(self) -> dict:
        return self.watch.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.watch.load_state_dict(state)


class WatchSignals(WatchHook):
    """`SignalWatch` (training signal vanishing) as an update hook."""

    name = "signal_watch"


class RewardDiagnostics(UpdateHook):
    """Reward, group-uniformity, per-variant accuracy and length metrics, every step (SPEC §3.6)."""

    name = "reward_diagnostics"

    def after_collect(self, batch: StepBatch) -> dict[str, float]:
        return reward_diagnostics(batch.samples)


class GroupDiversity(UpdateHook):
    """`diversity`: response diversity within a group, on logged steps K, 2K, ... (`diagnostics.diversity_every`)."""

    name = "diversity"

    def __init__(self, every: int, embedder):
        self.every, self.embedder = every, embedder

    def after_collect(self, batch: StepBatch) -> dict[str, float]:
        if (batch.step + 1) % self.every:  # logged steps K, 2K, ...
            return {}
        return {"diversity": group_diversity(batch.samples, self.embedder)}


GRAD_CONFLICT_AUTO_LIMIT = 5_000_000
"""`diagnostics.grad_conflict_every=None` measures every 10 steps only when the measured parameters hold
at most this many elements: the diagnostic copies their gradients twice (gigabytes on a 7B lm_head)."""


def default_conflict_every(model, param_pattern: str) -> int:
    pattern = re.compile(param_pattern)
    size = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and pattern.search(n))
    return 10 if size <= GRAD_CONFLICT_AUTO_LIMIT else 0


def build_update_hooks(cfg: RunConfig, model) -> list:
    """The diagnostics `cfg.diagnostics` switches on, for `model` (unwrapped); one switched off is left out."""
    d = cfg.diagnostics
    hooks: list = [RewardDiagnostics()]  # UpdateHooks, and GradientConflict (the same seam, no base class)
    if d.diversity_every:
        hooks.append(GroupDiversity(d.diversity_every, build_embedder(d.embedder)))
    conflict_every = (
        d.grad_conflict_every
        if d.grad_conflict_every is not None
        else default_conflict_every(model, d.grad_conflict_params)
    )
    if conflict_every:
        hooks.append(
            GradientConflict(conflict_every, d.grad_conflict_params, d.grad_conflict_samples, cfg.rollout.temperature)
        )
    return hooks

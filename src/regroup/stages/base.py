"""The stage interface: one step of training is an ordered list of stages over one `StepBatch`.

```
questions ─► [variants] ─► sample ─► reward ─► [anchors] ─► [filters] ─► advantages ─► [masks] ─► loss(spec)
             TA-GRPO                          DaGRPO       DAPO                      DaGRPO
```

A stage is any object with `__call__(batch, ctx) -> metrics` (a dict of floats). It reads and writes the
step batch: pre-sampling stages fill `variants` / `reserved`; sampling fills `samples`; rewarding fills
their rewards; anchors add samples; filters drop or resample groups; the advantage stage fills
`advantages`; masks multiply into `weights`. A stage whose state must survive a resume (anchor buffers,
filter carry-over) also has `state_dict()` / `load_state_dict(state)`; the trainer saves those by stage
`name`. Every front-end — the native trainer, the TRL adapter, the verl plug-in — runs stages on this batch.

A filter that refills (dynamic sampling) runs the stages before it again on newly drawn questions. What
each such round cost is the stage's to say: `round_totals` names its metrics that count work done (tokens,
seconds, references checked), summed over the rounds, and `round_rates` its rates recomputed from those
sums (`merge_rounds`); the front-end aggregates without knowing any metric's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from regroup.batch import Sample

FIXED_SHAPE_FRONT_ENDS = ("trl", "verl")
"""Front-ends whose batch has a fixed number of rows per question (`Recipe.check_front_end`): a stage that
adds or refills samples says so in `unsupported_by`."""


@dataclass
class StepBatch:
    """Everything one optimizer step knows about its samples, on this process."""

    step: int
    problems: list = field(default_factory=list)
    """This process's original questions q0 (Problem objects)."""
    group_ids: list[int] = field(default_factory=list)
    """The group id of each problem (parallel to `problems`)."""
    variants: list[list[str]] | None = None
    """TA-GRPO: the rephrasings of each problem ([] = none: it trains with its original alone)."""
    reserved: list[int] | None = None
    """On-policy samples of q0 to leave out per problem for anchors that replace them (7 + 1)."""
    samples: list[Sample] = field(default_factory=list)
    advantages: torch.Tensor | None = None
    """[B] per sample, computed over the whole (all-process) batch."""
    weights: torch.Tensor | None = None
    """[B] per-sample loss weight; masks multiply into it (None = all ones)."""

    def multiply_weights(self, factor: torch.Tensor) -> None:
        """Fold a per-sample mask or weight [B] into `weights` (masks compose by multiplication)."""
        factor = factor.to(torch.float32)
        self.weights = factor if self.weights is None else self.weights * factor  # [B]

    def keep_groups(self, keep: set[int]) -> None:
        """Drop every sample (and problem) whose group id is not in `keep`; advantages must not exist yet."""
        if self.advantages is not None or self.weights is not None:
            raise RuntimeError("groups can only be dropped before advantages and masks are computed")
        self.samples = [s for s in self.samples if s.group_id in keep]
        pairs = [(p, g) for p, g in zip(self.problems, self.group_ids) if g in keep]
        self.problems = [p for p, _ in pairs]
        self.group_ids = [g for _, g in pairs]

    def extend(self, other: StepBatch) -> None:
        """Append another round's problems and samples (dynamic sampling refills)."""
        self.problems += other.problems
        self.group_ids += other.group_ids
        self.samples += other.samples


@dataclass
class StepContext:
    """What stages may use besides the batch: the world, the sampler and encoders, and the recipe's rules.

    Built once by the front-end. Collective helpers are identity functions on one process.
    """

    seed: int
    num_generations: int
    samples_multiplier: int = 1
    n_variants: int = 0
    world: int = 1
    rank: int = 0
    sampler: Any = None
    sampling_params: Any = None
    encode_prompt: Callable[[str], list[int]] | None = None
    """Question text -> prompt token ids (chat template, system prompt, template applied)."""
    encode_response: Callable[[str], list[int]] | None = None
    """Response text -> token ids (ending like a generated turn)."""
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    """Concatenate a 1-D tensor over processes in rank order (variable lengths allowed)."""
    gather_objects: Callable[[list], list] = lambda xs: list(xs)
    """Concatenate a Python list over processes in rank order."""
    global_sum: Callable[[float], float] = lambda v: v
    draw_questions: Callable[[int], list] | None = None
    """Draw the next `n` GLOBAL questions from the stream (the same on every process)."""
    refill: Callable[[int], StepBatch] | None = None
    """Dynamic sampling: round -> a newly drawn batch run through the collect stages (set per step by the
    front-end that can refill; None where the batch has a fixed size)."""
    warn: Callable[[str], None] = print


class Stage(Protocol):
    name: str

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]: ...


def run_stages(stages: list, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
    """Run `stages` in order on `batch`; the union of their metrics."""
    metrics: dict[str, float] = {}
    for stage in stages:
        metrics.update(stage(batch, ctx) or {})
    return metrics


def merge_rounds(stages: list, metrics: dict[str, float], rounds: list[dict[str, float]]) -> dict[str, float]:
    """`metrics` (the step's, from its first round) with the refill `rounds`' metrics folded in: each stage's
    `round_totals` summed over every round, then each of its `round_rates` (name -> (numerator, denominator))
    recomputed from the sums. Every other metric is the first round's run of the whole stage list."""
    for stage in stages:
        for key in getattr(stage, "round_totals", ()):
            if key in metrics or any(key in m for m in rounds):
                metrics[key] = metrics.get(key, 0.0) + sum(m.get(key, 0.0) for m in rounds)
    for stage in stages:
        for key, (numerator, denominator) in getattr(stage, "round_rates", {}).items():
            if numerator in metrics and metrics.get(denominator):
                metrics[key] = metrics[numerator] / max(metrics[denominator], 1e-9)
    return metrics


def stage_states(stages: list) -> dict[str, Any]:
    """The checkpointed state of every stateful stage, by name."""
    return {s.name: s.state_dict() for s in stages if hasattr(s, "state_dict")}


def load_stage_states(stages: list, states: dict[str, Any] | None) -> None:
    for s in stages:
        if hasattr(s, "load_state_dict") and states and states.get(s.name) is not None:
            s.load_state_dict(states[s.name])

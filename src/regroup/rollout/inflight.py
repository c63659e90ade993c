"""In-flight batches as checkpoint state: complete `StepBatch`es the producer drew but the learner has not
trained on yet, written as tensors and plain values (read back with `torch.load(weights_only=True)`).

A batch is stored whole, as the stages left it: its problems (`Problem.to_dict`), group ids, TA-GRPO
variants, DaGRPO reserved slots, every sample (ids and behaviour log-probs as tensors, the policy version
that drew it, rewards, scores, anchor flags), advantages and mask weights; plus the version that drew the
batch and the metrics the producer measured for it. Nothing is recomputed at the resume, so the resumed
run trains on exactly the tokens, pools, anchors and masks the uninterrupted one does.
"""

from __future__ import annotations

import dataclasses
import typing

import torch

from regroup.batch import Sample
from regroup.runtime.checkpoint import CheckpointError
from regroup.stages.base import StepBatch
from regroup.tasks.base import Problem

FORMAT = 1
_HINTS = typing.get_type_hints(Sample)
_ID_FIELDS = {f.name for f in dataclasses.fields(Sample) if _HINTS[f.name] == list[int]}
"""Token-id lists, stored as int64 tensors."""
_FLOAT_FIELDS = {f.name for f in dataclasses.fields(Sample) if _HINTS[f.name] in (list[float], list[float] | None)}
"""Float lists (behaviour log-probs), stored as float64 tensors: the sampler's values exactly, NaN included."""


def _problem_index(problem, table: list, rows: list[dict]) -> int | None:
    """The index of `problem` in the batch's problem table (added when the batch does not list it)."""
    if problem is None:
        return None
    for i, known in enumerate(table):
        if known is problem:
            return i
    table.append(problem)
    rows.append(problem.to_dict())
    return len(table) - 1


def sample_state(sample: Sample, table: list, rows: list[dict]) -> dict:
    out: dict = {}
    for f in dataclasses.fields(Sample):
        value = getattr(sample, f.name)
        if f.name == "problem":
            out[f.name] = _problem_index(value, table, rows)
        elif f.name in _ID_FIELDS:
            out[f.name] = torch.tensor(value, dtype=torch.long)
        elif f.name in _FLOAT_FIELDS and value is not None:
            out[f.name] = torch.tensor(value, dtype=torch.float64)
        else:
            out[f.name] = value
    return out


def load_sample(state: dict, problems: list) -> Sample:
    values = {}
    for f in dataclasses.fields(Sample):
        if f.name not in state:
            continue  # a field added since the checkpoint was written keeps its default
        value = state[f.name]
        if f.name == "problem":
            value = None if value is None else problems[value]
        elif isinstance(value, torch.Tensor):
            value = value.tolist()
        values[f.name] = value
    return Sample(**values)


def batch_state(batch: StepBatch) -> dict:
    """`batch` as tensors and plain values."""
    table = list(batch.problems)
    rows = [p.to_dict() for p in table]
    samples = [sample_state(s, table, rows) for s in batch.samples]
    out: dict = {"problems": rows, "samples": samples}
    for f in dataclasses.fields(StepBatch):
        if f.name in ("problems", "samples"):
            continue
        value = getattr(batch, f.name)
        out[f.name] = value.clone() if isinstance(value, torch.Tensor) else value
    out["num_problems"] = len(batch.problems)
    return out


def load_batch(state: dict) -> StepBatch:
    try:
        table = [Problem.from_dict(d) for d in state["problems"]]
        batch = StepBatch(step=int(state["step"]))
        for f in dataclasses.fields(StepBatch):
            if f.name in ("step", "problems", "samples") or f.name not in state:
                continue
            setattr(batch, f.name, state[f.name])
        batch.problems = table[: int(state["num_problems"])]
        batch.samples = [load_sample(s, table) for s in state["samples"]]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CheckpointError(f"the checkpoint's in-flight batches cannot be read ({type(e).__name__}: {e})") from None
    return batch


def inflight_state(lag: int, next_step: int, ready: list[tuple[StepBatch, dict, int]]) -> dict:
    """The producer's resume state: the lag, the next batch to draw, and each drawn batch not yet trained
    on as (batch, its metrics, the policy version that drew it)."""
    return {
        "format": FORMAT,
        "lag": lag,
        "next_step": next_step,
        "batches": [
            {"version": version, "metrics": {k: float(v) for k, v in metrics.items()}, "batch": batch_state(batch)}
            for batch, metrics, version in ready
        ],
    }


def load_inflight(state: dict) -> tuple[int, int, list[tuple[StepBatch, dict, int]]]:
    """(lag, next_step, [(batch, metrics, version)]) from `inflight_state`'s output."""
    if state.get("format") != FORMAT:
        raise CheckpointError(f"the checkpoint's in-flight batches have format {state.get('format')!r}, not {FORMAT}")
    ready = [(load_batch(b["batch"]), dict(b["metrics"]), int(b["version"])) for b in state["batches"]]
    return int(state["lag"]), int(state["next_step"]), ready

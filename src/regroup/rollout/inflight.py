"""In-flight batches as checkpoint state: complete `StepBatch`es the producer drew but the learner has not
trained on yet, written as tensors and plain values (read back with `torch.load(weights_only=True)`).

A batch is stored whole, as the stages left it: its problems (`Problem.to_dict`), group ids, TA-GRPO
variants, DaGRPO reserved slots, every sample (ids and behaviour log-probs as tensors, the policy version
that drew it, rewards, scores, anchor flags), advantages and mask weights; plus the version that drew the
batch and the metrics the producer measured for it. Nothing is recomputed at the resume, so the resumed
run trains on exactly the tokens, pools, anchors and masks the uninterrupted one does.

Whoever can write the run folder can re-hash a checkpoint (its manifest is a checksum), so reading the
state back checks it (`load_inflight`): the steps and versions a checkpoint at its step can hold, the
type of every field, token ids within the vocabulary; anything else is one line, not a traceback later.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path

import torch

from regroup.batch import Sample
from regroup.errors import ConfigError
from regroup.runtime.checkpoint import CheckpointError, matching_trainer_state
from regroup.stages.base import StepBatch
from regroup.tasks.base import Problem

FORMAT = 1
_HINTS = typing.get_type_hints(Sample)
_STEP_HINTS = typing.get_type_hints(StepBatch)
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


def _refuse(where: str, why: str) -> CheckpointError:
    return CheckpointError(f"the checkpoint's in-flight batches: {where} {why}")


def _is_int(value) -> typing.TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(value, hint) -> bool:
    """Whether a plain `value` has the type `hint` names (int, float, bool, str, X | None, list[X])."""
    if hint is typing.Any:
        return True
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return _is_int(value)
    return isinstance(value, hint)


def _ids(value, where: str, vocab_size: int | None) -> list[int]:
    """A token-id tensor as a list, refused unless a 1-D integer tensor of ids the model has."""
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype != torch.long:
        raise _refuse(where, "is not a 1-D tensor of token ids")
    if value.numel() and int(value.min()) < 0:
        raise _refuse(where, f"holds token id {int(value.min())}")
    if value.numel() and vocab_size is not None and int(value.max()) >= vocab_size:
        raise _refuse(where, f"holds token id {int(value.max())}, outside the model's vocabulary of {vocab_size}")
    return value.tolist()


def load_sample(state, problems: list, where: str, vocab_size: int | None = None) -> Sample:
    if not isinstance(state, dict):
        raise _refuse(where, f"is a {type(state).__name__}, not a sample")
    values = {}
    for f in dataclasses.fields(Sample):
        if f.name not in state:
            continue  # a field added since the checkpoint was written keeps its default
        value, at = state[f.name], f"{where}.{f.name}"
        if f.name == "problem":
            if value is not None and not (_is_int(value) and 0 <= value < len(problems)):
                raise _refuse(at, f"is {value!r}, not an index into the batch's {len(problems)} problems")
            value = None if value is None else problems[value]
        elif f.name in _ID_FIELDS:
            value = _ids(value, at, vocab_size)
        elif f.name in _FLOAT_FIELDS and value is not None:
            if not isinstance(value, torch.Tensor) or value.dim() != 1 or not value.is_floating_point():
                raise _refuse(at, "is not a 1-D tensor of log-probs")
            if bool((value == math.inf).any()):
                raise _refuse(at, "holds a log-prob of +inf")
            value = value.tolist()
        elif not _fits(value, _HINTS[f.name]):
            raise _refuse(at, f"is a {type(value).__name__}, not {_HINTS[f.name]}")
        values[f.name] = value
    for f in dataclasses.fields(Sample):
        if f.name not in values and f.default is dataclasses.MISSING:
            raise _refuse(where, f"has no {f.name}")
    sample = Sample(**values)
    if sample.behaviour_logps is not None and len(sample.behaviour_logps) != len(sample.response_ids):
        raise _refuse(where, f"has {len(sample.behaviour_logps)} log-probs for {len(sample.response_ids)} tokens")
    return sample


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


def load_batch(state, where: str = "batch", vocab_size: int | None = None) -> StepBatch:
    """The StepBatch `batch_state` wrote, refused (CheckpointError, one line naming the value) unless every
    field has the type the trainer reads, every token id is in the vocabulary (`vocab_size`; None: not
    checked) and the per-sample tensors have one entry per sample."""
    if not isinstance(state, dict):
        raise _refuse(where, f"is a {type(state).__name__}, not a batch")
    rows, count = state.get("problems"), state.get("num_problems")
    if not isinstance(rows, list) or not _is_int(count) or not 0 <= count <= len(rows):
        raise _refuse(where, "has no problem table")
    try:
        table = [Problem.from_dict(d) for d in rows]
    except (ValueError, TypeError) as e:
        raise _refuse(f"{where}.problems", str(e)) from None
    if not _is_int(state.get("step")):
        raise _refuse(where, "has no step")
    batch = StepBatch(step=state["step"], problems=table[:count])
    samples = state.get("samples")
    if not isinstance(samples, list):
        raise _refuse(where, "has no samples")
    batch.samples = [load_sample(s, table, f"{where}.samples[{i}]", vocab_size) for i, s in enumerate(samples)]
    for f in dataclasses.fields(StepBatch):
        if f.name in ("step", "problems", "samples") or f.name not in state:
            continue
        value, at = state[f.name], f"{where}.{f.name}"
        if f.name in ("advantages", "weights"):
            if value is not None and not (
                isinstance(value, torch.Tensor) and value.is_floating_point() and tuple(value.shape) == (len(samples),)
            ):
                raise _refuse(at, f"is not a tensor of one value per sample ({len(samples)})")
        elif not _fits(value, _STEP_HINTS[f.name]):
            raise _refuse(at, f"is a {type(value).__name__}, not {_STEP_HINTS[f.name]}")
        setattr(batch, f.name, value)
    if len(batch.group_ids) != len(batch.problems):
        raise _refuse(where, f"has {len(batch.group_ids)} group ids for {len(batch.problems)} problems")
    if batch.samples and batch.advantages is None:
        raise _refuse(where, "has samples but no advantages")
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


def load_inflight(
    state, *, step: int, lag: int, vocab_size: int | None = None
) -> tuple[int, list[tuple[StepBatch, dict, int]]]:
    """(next_step, [(batch, metrics, version)]) from `inflight_state`'s output, for a checkpoint at `step`
    of a run with `rollout.async_steps=lag`.

    Refused in one line (CheckpointError) unless it is what such a checkpoint holds: the batches drawn
    and not trained on are exactly steps `step` .. next_step − 1, with step <= next_step <= step + lag;
    batch t was drawn by a version in [t − lag, step − 1] (the weights of `step` did not exist yet), and
    every sample carries that version or none; everything else as `load_batch` checks. A hand-edited state
    would otherwise end in a traceback, or in a learner waiting `rollout.async_timeout_s` for a batch the
    producer never draws."""
    if not isinstance(state, dict):
        raise _refuse("the state", f"is a {type(state).__name__}, not a mapping")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"the checkpoint's in-flight batches have format {state.get('format')!r}, not {FORMAT}")
    if state.get("lag") != lag or not _is_int(state.get("lag")):
        raise ConfigError(
            f"the checkpoint's in-flight batches were drawn with rollout.async_steps={state.get('lag')!r}, not {lag}"
        )
    next_step, batches = state.get("next_step"), state.get("batches")
    if not _is_int(next_step) or not step <= next_step <= step + lag:
        raise _refuse("next_step", f"is {next_step!r}, not {step}..{step + lag} (a checkpoint at step {step})")
    if not isinstance(batches, list):
        raise _refuse("the state", "has no list of batches")
    if len(batches) != next_step - step:
        raise _refuse(
            "the state", f"holds {len(batches)} batches, not the {next_step - step} its next_step ({next_step}) says"
        )
    ready = []
    for i, entry in enumerate(batches):
        where, t = f"batches[{i}]", step + i
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise _refuse(where, "has no metrics")
        version = entry.get("version")
        if not _is_int(version) or not max(0, t - lag) <= version <= max(step - 1, 0):
            raise _refuse(where, f"was drawn by version {version!r}, not {max(0, t - lag)}..{max(step - 1, 0)}")
        metrics = entry["metrics"]
        if not all(isinstance(k, str) and _fits(v, float) for k, v in metrics.items()):
            raise _refuse(f"{where}.metrics", "are not numbers by name")
        batch = load_batch(entry.get("batch"), f"{where}.batch", vocab_size)
        if batch.step != t:
            raise _refuse(where, f"is of step {batch.step + 1}, not {t + 1} (the batches run {step + 1}..{next_step})")
        drawn_by = {s.policy_version for s in batch.samples if s.policy_version is not None} - {version}
        if drawn_by:
            raise _refuse(where, f"holds samples drawn by version {min(drawn_by)}, not {version}")
        ready.append((batch, {k: float(v) for k, v in metrics.items()}, version))
    return next_step, ready


def _vocab_size(checkpoint: Path) -> int | None:
    """The model's vocabulary size from the checkpoint's config.json (None: no such file, e.g. a LoRA one)."""
    try:
        value = json.loads((checkpoint / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if _is_int(value) and value > 0 else None


def check_checkpoint_inflight(checkpoint: Path, lag: int) -> None:
    """The in-flight batches of `checkpoint` checked as the resume checks them (`load_inflight`), before any
    model loads (the vocabulary from its config.json). A trainer state that does not match the manifest
    is left to the resume, which reports it and falls back to an older checkpoint."""
    state = matching_trainer_state(checkpoint)
    if state is None or state.get("async") is None or not _is_int(state.get("step")):
        return
    try:
        load_inflight(state["async"], step=state["step"], lag=lag, vocab_size=_vocab_size(checkpoint))
    except CheckpointError as e:
        raise CheckpointError(f"{checkpoint}: {e}") from None

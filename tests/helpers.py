"""Helpers shared by several test modules: a small training config on the tiny model, weight snapshots, a
hand-made `Sample`, and the accelerate launcher for real multi-process runs."""

from __future__ import annotations

import shutil
import socket
import sys
import types
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from regroup.batch import Sample
from regroup.config import fields
from regroup.config.schema import RunConfig
from regroup.train.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def small_config(model_dir, run_dir, recipe="grpo.yaml", *extra):
    return load_config(
        CONFIGS / recipe,
        [
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            "data.num_train=64",
            "grpo.prompts_per_step=4",
            "grpo.num_generations=4",
            "rollout.max_new_tokens=12",
            "train.steps=4",
            "train.checkpoint_every=2",
            "train.progress=false",
            "diagnostics.diversity_every=2",
            "diagnostics.embedder=char-ngram",
            "optim.warmup_steps=1",
            "optim.lr=1e-3",
            *extra,
        ],
    )


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def stage_sample(group, reward, *, variant=0, anchor=False, length=3, truncated=False, text="x"):
    """A `Sample` of question `q{group}` with `length` response tokens, as a stage sees it after rewarding."""
    problem = SimpleNamespace(id=f"q{group}", question=f"question {group}", solution="ref", answer="1")
    return Sample(
        group_id=group,
        question_id=problem.id,
        variant=variant,
        is_anchor=anchor,
        prompt_ids=[1],
        ratio_prompt_ids=[1],
        response_ids=[5] * length,
        response_text=text,
        reward=reward,
        truncated=truncated,
        problem=problem,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_exe() -> str:
    exe = Path(sys.executable).parent / "accelerate"
    if exe.exists():
        return str(exe)
    found = shutil.which("accelerate")
    if not found:
        pytest.skip("the accelerate launcher is not installed")
    return found


class Rewritten:
    """The real sampler, its log-probs rewritten by `fn` (a stale server, NaN, missing)."""

    def __init__(self, sampler, fn):
        self.sampler, self.fn = sampler, fn

    def generate(self, prompts, params, seed=None):
        out = self.sampler.generate(prompts, params, seed=seed)
        for c in out:
            c.logps = self.fn(c.logps)
        return out

    def sync_weights(self, model):
        self.sampler.sync_weights(model)


# -- the run config's numeric settings, for the tests that every one is bounded and refuses its bad values --------


def numeric_keys(cls=RunConfig) -> list[str]:
    """Dotted keys of every int / float (optional or not) leaf setting of `cls`."""

    def members(hint):  # an Optional's or a Union's alternatives, else the hint itself
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return [m for a in typing.get_args(hint) for m in members(a)]
        return [hint]

    return [key for key, _, hint in fields.leaves(cls) if {int, float} & set(members(hint))]


def bounds(field) -> dict[str, float]:
    """{"ge" / "gt" / "le" / "lt": value} of a setting's bounds."""
    return {op: getattr(m, op) for op in fields.BOUNDS for m in field.metadata if getattr(m, op, None) is not None}


def numeric_rules(cls=RunConfig) -> dict[str, dict[str, float]]:
    """The bounds of every leaf setting of `cls` that declares some (or `finite`), by dotted key."""
    return {key: bounds(f) for key, f, _ in fields.leaves(cls) if fields.describe(f)}

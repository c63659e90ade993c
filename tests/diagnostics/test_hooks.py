"""The diagnostics as update hooks: which ones the config switches on, their cadences on the step being
trained, and the trainer running a hook it does not know through the one seam."""

from __future__ import annotations

import torch

from regroup.batch import Sample
from regroup.diagnostics.grad_conflict import GradientConflict
from regroup.diagnostics.hooks import (
    GroupDiversity,
    RewardDiagnostics,
    UpdateHook,
    build_update_hooks,
)
from regroup.stages.base import StepBatch
from regroup.train.run_config import load_config


def _sample(group: int, reward: float, text: str) -> Sample:
    return Sample(group, "q", 0, False, [1, 2], [1, 2], [3, 4, 5], text, reward=reward)


class _Explodes:
    """A model that fails the test if a diagnostic touches it on a step it should skip."""

    def named_parameters(self):
        raise AssertionError("measured on a skipped step")


def test_gradient_conflict_measures_on_steps_0_k_2k_only():
    hook = GradientConflict(every=3, param_pattern=".", max_samples=4, temperature=1.0)
    for step in (1, 2, 4, 5):
        assert hook.before_update(_Explodes(), None, torch.tensor([1.0, -1.0]), step) == {}
    # step 3: measured; with no negative advantage the measure itself returns {} before touching the model
    assert hook.before_update(_Explodes(), None, torch.tensor([1.0, 0.0]), 3) == {}


def test_diversity_on_logged_steps_k_2k():
    seen = []

    def embedder(texts):  # two orthogonal unit rows: distance 1 within the group
        seen.append(len(texts))
        return torch.eye(len(texts))

    hook = GroupDiversity(every=2, embedder=embedder)
    samples = [_sample(0, 1.0, "a"), _sample(0, 0.0, "b")]
    got = [hook.after_collect(StepBatch(step=s, samples=samples)) for s in range(4)]
    assert got == [{}, {"diversity": 1.0}, {}, {"diversity": 1.0}]  # logged steps 2 and 4
    assert seen == [2, 2]


def test_reward_diagnostics_hook_is_the_reward_metrics():
    out = RewardDiagnostics().after_collect(StepBatch(step=0, samples=[_sample(0, 1.0, "a"), _sample(0, 0.0, "b")]))
    assert out["reward/mean"] == 0.5 and out["groups/uniform_frac"] == 0.0


def test_the_config_switches_hooks_on_and_off(tmp_path):
    model = torch.nn.Linear(2, 2)  # no parameter matches the default pattern: 0 elements, under the limit
    cfg = load_config(None, ["diagnostics.diversity_every=0", "diagnostics.grad_conflict_every=0"])
    assert [type(h) for h in build_update_hooks(cfg, model)] == [RewardDiagnostics]
    cfg = load_config(
        None, ["diagnostics.diversity_every=5", "diagnostics.embedder=char-ngram", "diagnostics.grad_conflict_every=7"]
    )
    hooks = build_update_hooks(cfg, model)
    assert [type(h) for h in hooks] == [RewardDiagnostics, GroupDiversity, GradientConflict]
    assert hooks[1].every == 5 and hooks[2].every == 7


def test_the_trainer_runs_a_hook_it_does_not_know(tiny_model_dir, tmp_path):
    from helpers import small_config

    from regroup.train.build import build_trainer

    class Recorder(UpdateHook):
        name = "recorder"

        def __init__(self):
            self.calls = []

        def after_collect(self, batch):
            self.calls.append(("collect", batch.step, len(batch.samples)))
            return {"recorder/collected": float(len(batch.samples))}

        def before_update(self, model, batch, advantages, step):
            self.calls.append(("update", step, tuple(advantages.shape)))
            return {"recorder/rows": float(len(batch))}

    cfg = small_config(tiny_model_dir, tmp_path / "run", "grpo.yaml", "diagnostics.grad_conflict_every=0")
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda m: None)
    recorder = Recorder()
    trainer.update_hooks.append(recorder)
    metrics = trainer.train_step(5)
    assert recorder.calls == [("collect", 5, 16), ("update", 5, (16,))]  # 4 questions x G = 4
    assert metrics["recorder/collected"] == 16.0 and metrics["recorder/rows"] == 16.0
    assert "reward/mean" in metrics  # the built-in hooks still ran

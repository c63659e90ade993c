"""One step of a library recipe, captured through its public seams, for the examples to be compared with.

`library_step` builds the recipe's trainer on the tiny random model (`load_config` + `build_trainer`), collects
one step batch (`trainer.collect`), keeps a copy of the starting weights, and runs `trainer.update` with
`trainer.optimizer.step` wrapped so that every optimizer step records the weights its gradients were taken
at and the gradients themselves (before the step changes the weights). Two passes over the batch
(`grpo.num_iterations=2`): in the first the policy is pi_old and pi_ref, so the ratio is 1 and the KL is 0
and neither the clip nor the KL changes a number; the second, after a large first step, is where they do.
The gradient clip is lifted (`optim.max_grad_norm`) so the recorded gradients are the loss's own. The largest
relative error seen is 2e-7 (REL_TOL 1e-6).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from regroup.stages.base import StepBatch
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config

ROOT = Path(__file__).resolve().parents[2]

REL_TOL = 1e-6


@dataclass
class LibraryStep:
    cfg: object
    batch: StepBatch
    """The collected step batch: samples, rewards, advantages, weights."""
    start: torch.nn.Module
    """A copy of the policy before the update (pi_old, and pi_ref when beta > 0)."""
    weights: list[dict[str, torch.Tensor]]
    """Per optimizer step: the parameters the gradients were taken at."""
    grads: list[dict[str, torch.Tensor]]
    """Per optimizer step: every parameter's gradient."""
    loss: float
    """The last optimizer step's loss (the update's metrics)."""
    pad_id: int


def run_library_step(model_dir: str, run_dir: Path, recipe: str, overrides: list[str]) -> LibraryStep:
    cfg = load_config(
        ROOT / "configs" / f"{recipe}.yaml",
        [
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            "seed=3",
            "data.num_train=16",
            "grpo.num_generations=4",
            "grpo.num_iterations=2",
            "grpo.mini_batches=1",
            "rollout.max_new_tokens=8",
            "rewards=[plugins:graded_or_parity]",
            "optim.lr=0.02",
            "optim.warmup_steps=0",
            "optim.max_grad_norm=1e9",
            # the padded forward, as the examples take it (the shared-prefix forward gives the same log-probs
            # within float32 rounding, tests/models/test_logprobs.py, but by another sum: 4e-7 here, not 2e-7)
            "grpo.shared_prefix=false",
            "train.steps=1",
            "train.progress=false",
            *overrides,
        ],
    )
    trainer = build_trainer(cfg, run_dir, log=lambda line: None)
    batch, _ = trainer.collect(0)
    start = copy.deepcopy(trainer.model)
    weights, grads = [], []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        params = dict(trainer.model.named_parameters())
        weights.append({n: p.detach().clone() for n, p in params.items()})
        grads.append({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    metrics = trainer.update(batch)
    assert len(grads) == cfg.grpo.num_iterations, "one optimizer step per pass"
    return LibraryStep(cfg, batch, start, weights, grads, metrics["loss"], trainer.tokenizer.pad_token_id)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def assert_same_step(lib: LibraryStep, loss_of) -> None:
    """`loss_of(model)` (the example's loss of the captured batch) gives the library's gradients at every
    optimizer step and its loss at the last, within REL_TOL."""
    loss = None
    for k, (weights, grads) in enumerate(zip(lib.weights, lib.grads)):
        policy = copy.deepcopy(lib.start).train()
        policy.load_state_dict(weights, strict=False)
        loss = loss_of(policy)
        loss.backward()
        mine = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert mine.keys() == grads.keys(), f"step {k + 1}: gradients of other parameters"
        for name, grad in grads.items():
            err = rel_err(mine[name], grad)
            assert err <= REL_TOL, f"step {k + 1}: gradient of {name} differs by {err:.2e}"
    value = float(loss.detach())
    assert abs(value - lib.loss) <= REL_TOL * max(abs(lib.loss), 1e-12), (value, lib.loss)


def clipped_tokens(logps, old_logps, advantages, mask, eps_low: float, eps_high: float) -> tuple[int, int]:
    """Loss tokens whose gradient the clip removes: (r < 1 - eps_low with A < 0, r > 1 + eps_high with A > 0)."""
    ratio = torch.exp(logps - old_logps)  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]
    on = mask.bool()
    low = on & (ratio < 1 - eps_low) & (adv < 0)
    high = on & (ratio > 1 + eps_high) & (adv > 0)
    return int(low.sum()), int(high.sum())

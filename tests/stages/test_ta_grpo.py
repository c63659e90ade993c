"""TA-GRPO: expanded groups, pooled advantages, and the importance ratio anchored on q0 (SPEC §3)."""

from __future__ import annotations

from pathlib import Path

import torch

from regroup.algo.advantages import group_advantages
from regroup.batch import collate
from regroup.models.logprobs import response_logps
from regroup.stages.groups import expand_groups
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_expand_groups_pools_variants_under_one_id():
    slots = expand_groups(["q0a", "q0b"], [["a1", "a2"], []], group_ids=[7, 3], num_generations=4)
    assert [(s.group_id, s.variant, s.text, s.num_samples) for s in slots] == [
        (7, 0, "q0a", 4),
        (7, 1, "a1", 4),
        (7, 2, "a2", 4),  # (N+1)·G = 12 samples share group 7
        (3, 0, "q0b", 4),  # all rephrasings failed: trains with its original alone
    ]
    matched = expand_groups(["q"], None, [0], num_generations=4, samples_multiplier=3, reserved=[1])
    assert [(s.variant, s.num_samples) for s in matched] == [(0, 11)]


def test_pooled_advantage_uses_all_variants_together():
    # one pool: q0 rewards [1, 0], variant rewards [0, 0] -> mean 0.25, std (unbiased) 0.5
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    pooled = group_advantages(rewards, torch.tensor([5, 5, 5, 5]), "group", 0.0)
    torch.testing.assert_close(pooled, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # per-variant groups would have given the variant samples 0 (all equal) instead
    separate = group_advantages(rewards, torch.tensor([1, 1, 2, 2]), "group", 0.0)
    assert separate[2:].abs().sum() == 0


def _trainer(tiny_model_dir, tmp_path, anchor):
    cfg = load_config(
        CONFIGS / "ta_grpo.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={tmp_path}",
            "data.num_train=32",
            "grpo.prompts_per_step=2",
            "grpo.num_generations=3",
            "rollout.max_new_tokens=10",
            "train.steps=1",
            "grpo.beta=0.0",
            "diagnostics.diversity_every=0",
            f"ta.ratio_anchor={anchor}",
            "optim.max_grad_norm=1e9",
        ],
    )
    return build_trainer(cfg, tmp_path, log=lambda m: None)


def _collect_with_rewards(trainer):
    """Step 0's batch with mixed rewards set by hand, advantages recomputed by the recipe's own stage."""
    batch, _ = trainer.collect(0)
    _set_rewards(batch.samples)
    batch.advantages = None
    next(s for s in trainer.recipe.stages if s.name == "advantages")(batch, trainer.ctx)
    return batch


def _trainer_gradient(trainer, batch):
    grads = {}

    def capture(loss_total):
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        trainer.optimizer.zero_grad(set_to_none=True)
        return {}

    trainer._optimizer_step = capture
    trainer.update(batch)
    return grads


def _reference_gradient(trainer, samples, prompts):
    """Gradient of token_mean over all tokens of −A·log π(o | prompt)."""
    for s, prompt in zip(samples, prompts):
        s.ratio_prompt_ids = prompt
    batch = collate(samples, trainer.pad_id)
    adv = group_advantages(batch.rewards, batch.group_ids, "group", trainer.cfg.grpo.adv_eps)
    trainer.model.zero_grad(set_to_none=True)
    logps, _ = response_logps(trainer.model, batch, trainer.cfg.rollout.temperature)
    mask = batch.completion_mask
    loss = -(adv[:, None] * logps * mask).sum() / mask.sum()  # [B, T] -> scalar
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return grads


def _set_rewards(samples):
    # mixed rewards inside each pool, so every advantage is non-zero somewhere
    for i, s in enumerate(samples):
        s.reward = float((i * 7 + s.variant) % 3 == 0)


def test_original_ratio_gradient_is_minus_A_logp_of_q0(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, "original")
    batch = _collect_with_rewards(trainer)
    samples = batch.samples
    assert {s.variant for s in samples} == {0, 1, 2, 3}
    q0 = {s.question_id: trainer._encode(s.problem.question) for s in samples}
    # every sample, whichever variant produced it, is scored on q0's prompt
    assert all(s.ratio_prompt_ids == q0[s.question_id] for s in samples)
    assert any(s.prompt_ids != s.ratio_prompt_ids for s in samples)
    ours = _trainer_gradient(trainer, batch)
    expected = _reference_gradient(trainer, [s for s in samples], [q0[s.question_id] for s in samples])
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], atol=1e-6, rtol=1e-4)


def test_own_ratio_reproduces_per_prompt_ratios(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, "own")
    batch = _collect_with_rewards(trainer)
    samples = batch.samples
    assert all(s.ratio_prompt_ids == s.prompt_ids for s in samples)
    ours = _trainer_gradient(trainer, batch)
    expected = _reference_gradient(trainer, samples, [s.prompt_ids for s in samples])
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], atol=1e-6, rtol=1e-4)
    # and it differs from the q0-anchored gradient
    q0 = _reference_gradient(trainer, samples, [trainer._encode(s.problem.question) for s in samples])
    assert any(not torch.allclose(q0[n], expected[n], atol=1e-6) for n in expected)

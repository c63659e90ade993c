"""The verl plug-in against regroup's own trainer, on a batch captured inside verl.

`data/verl_dagrpo_ta.pt` was written by the verl CPU harness (`tests/verl_cpu/harness.py --recipe dagrpo_ta
--fixture ...`): one step of DaGRPO + TA-GRPO run by verl 0.9.1 with the plug-in — the rows after the
recipe's stages (rewards, fine-grained scores, anchors, advantages, weights) and the loss micro-batch verl
handed the plug-in (π_θ's log-probs, verl's padded fields and normalisers, the loss and its gradient).

Here regroup's own code recomputes both from the captured rows, as the native trainer does: the recipe's
`advantages` and `mask` stages on the step's samples, `regroup.batch.collate` for the padded batch and the
anchor tokens, and `policy_loss` with the native trainer's totals. Needs torch only (no verl).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from regroup.algo.loss_config import resolve_loss
from regroup.algo.loss_inputs import LossInputs
from regroup.algo.losses import LossTotals, policy_loss
from regroup.batch import Sample, collate
from regroup.stages.base import StepBatch, StepContext, run_stages
from regroup.tasks import get_task
from regroup.train.recipes import build_recipe
from regroup.train.run_config import load_config

FIXTURE = Path(__file__).parent / "data" / "verl_dagrpo_ta.pt"


@pytest.fixture(scope="module")
def captured():
    data = torch.load(FIXTURE, weights_only=True)
    cfg = load_config(data["recipe"], data["overrides"])
    return cfg, json.loads(data["step"]), data["loss"]


def native_step(cfg, record, tmp_path):
    """The captured rows as the native trainer's samples, with the recipe's advantages and masks recomputed
    by its own stages (rewards as captured; scores recomputed by the recipe's scorer); also the advantages
    before the mask."""
    task = get_task(cfg.data.task)
    recipe = build_recipe(cfg, task, lambda text: list(text.encode()), tmp_path, loss=resolve_loss(cfg))
    problems = {p.id: p for p in task.generate(cfg.data.num_train, seed=cfg.data.seed)}
    samples = [
        Sample(
            group_id=s["group_id"],
            question_id=s["question_id"],
            variant=s["variant"],
            is_anchor=s["is_anchor"],
            prompt_ids=s["prompt_ids"],
            ratio_prompt_ids=s["ratio_prompt_ids"],
            response_ids=s["response_ids"],
            response_text=s["response_text"],
            truncated=s["truncated"],
            reward=s["reward"],
            problem=problems[s["question_id"]],
        )
        for s in record["samples"]
    ]
    groups: dict[int, object] = {}
    for s in samples:
        groups.setdefault(s.group_id, s.problem)
    batch = StepBatch(step=record["step"], problems=list(groups.values()), group_ids=list(groups), samples=samples)
    ctx = StepContext(seed=cfg.seed, num_generations=cfg.grpo.num_generations, n_variants=cfg.ta.n_variants)
    run_stages([s for s in recipe.stages if s.name == "advantages"], batch, ctx)
    plain = batch.advantages.clone()  # [B] before the mask
    run_stages([s for s in recipe.stages if s.name == "mask"], batch, ctx)
    return recipe, batch, plain


def test_advantages_masks_and_scores_equal_the_recipes_stages(captured, tmp_path):
    cfg, record, _ = captured
    _, batch, plain = native_step(cfg, record, tmp_path)
    assert torch.allclose(batch.advantages, torch.tensor(record["advantages"]), atol=1e-6)
    assert [s.score for s in batch.samples] == [s["score"] for s in record["samples"]]
    anchors = torch.tensor([s.is_anchor for s in batch.samples])
    assert bool(batch.advantages[anchors].ne(0).any())  # the batch exercises anchors that train ...
    assert bool((plain - batch.advantages).abs().gt(1e-6).any())  # ... and pair masks that act


def test_loss_value_and_gradient_equal_the_native_trainers(captured, tmp_path):
    cfg, record, cap = captured
    recipe, batch, _ = native_step(cfg, record, tmp_path)
    # the loss's rows are verl's micro-batch; find each one's sample by its tokens (verl may reorder rows)
    index = {(tuple(s.ratio_prompt_ids), tuple(s.response_ids), s.is_anchor): k for k, s in enumerate(batch.samples)}
    f = cap["fields"]
    rows = [
        index[(tuple(p), tuple(r), bool(a))]
        for p, r, a in zip(cap["prompts"], cap["responses"], f["regroup_is_anchor"].tolist(), strict=True)
    ]
    samples = [batch.samples[k] for k in rows]
    width = cap["logps"].shape[1]
    native = collate(samples, pad_id=0, completion_length=width)
    mask = native.completion_mask  # [B, T]
    anchors = mask.bool() & ~native.sampled_mask  # [B, T]
    assert torch.equal(mask, f["response_mask"].float())

    logps = cap["logps"].clone().requires_grad_(True)  # [B, T] the leaf both losses differentiate
    inputs = LossInputs(
        advantages=batch.advantages[rows],
        loss_mask=mask,
        ref_logps=f["ref_log_prob"] if cfg.grpo.beta > 0 else None,
        sample_weight=None if batch.weights is None else batch.weights[rows],
        anchor_token_mask=anchors if bool(anchors.any()) else None,
    )
    totals = LossTotals(  # the native trainer's: the whole batch's loss tokens and sequences
        total_tokens=float(mask.sum()), total_sequences=len(samples), max_completion_length=cfg.rollout.max_new_tokens
    )
    old = torch.where(native.sampled_mask, f["old_log_probs"], logps.detach())  # [B, T]
    loss, _ = policy_loss(logps, old, inputs, recipe.loss, totals)
    (grad,) = torch.autograd.grad(loss, logps)
    assert cap["global_batch_size"] == len(samples)  # one micro-batch was the whole step
    assert torch.allclose(loss, cap["loss"], atol=1e-6, rtol=0), (loss.item(), cap["loss"].item())
    assert torch.allclose(grad, cap["grad"], atol=1e-6, rtol=0), (grad - cap["grad"]).abs().max()

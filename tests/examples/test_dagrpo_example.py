"""examples/dagrpo.py against the library's `dagrpo` recipe on one captured step batch that holds anchors and
masked samples: the same advantages and keep mask, and the same loss and gradients at both optimizer steps
(tests/examples/library_step.py)."""

from __future__ import annotations

import copy

import dagrpo
import grpo
import pytest
import torch
from library_step import REL_TOL, assert_same_step, clipped_tokens, rel_err

from regroup.tasks import get_task

EPS_LOW, EPS_HIGH = 0.1, 0.15


def test_one_step_equals_the_dagrpo_recipe(capture_step):
    # anchors.max_tokens: the references are up to 44 tokens, longer than the 8 sampled ones. Seed 0 gives groups
    # whose only positive is the anchor: their negatives stand apart from it, so sampled rows keep a gradient.
    lib = capture_step(
        "dagrpo", "seed=0", f"grpo.eps_low={EPS_LOW}", f"grpo.eps_high={EPS_HIGH}", "anchors.max_tokens=64"
    )
    G, cfg = lib.cfg.grpo.num_generations, lib.cfg
    # The library appends each group's anchor after every sampled row; the example keeps groups of G in a row,
    # anchor last: the same rows, ordered by group (a stable sort keeps the anchor last).
    order = sorted(range(len(lib.batch.samples)), key=lambda i: lib.batch.samples[i].group_id)
    samples = [lib.batch.samples[i] for i in order]
    is_anchor = torch.tensor([s.is_anchor for s in samples])  # [B]
    assert is_anchor.tolist() == [j == G - 1 for _ in range(len(samples) // G) for j in range(G)], "G - 1 + anchor"

    rewards = torch.tensor([s.reward for s in samples])  # [B]
    advantages = dagrpo.dr_grpo_advantages(rewards, G)  # [B]
    assert rel_err(advantages, lib.batch.advantages[order]) <= REL_TOL
    task = get_task("arithmetic")
    scores = torch.tensor([task.step_score(s.response_text, s.problem) for s in samples])  # [B]
    keep = dagrpo.distinctiveness_keep(advantages, scores, G, cfg.mask.delta)  # [B]
    assert keep.float().tolist() == lib.batch.weights[order].tolist()
    assert (~keep).any() and (keep & is_anchor & (advantages > 0)).any(), "a masked sample and a kept anchor"
    assert (keep & ~is_anchor & (advantages != 0)).any(), "a kept sampled row with a gradient"

    batch = grpo.pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], lib.pad_id)
    mask = batch["completion_mask"]  # [B, T]
    with torch.no_grad():
        old_logps = grpo.token_logps(lib.start, batch)  # [B, T]

    def loss_of(policy):
        logps = grpo.token_logps(policy, batch)
        return dagrpo.dagrpo_loss(
            logps, old_logps, advantages, mask, is_anchor, keep, EPS_LOW, EPS_HIGH, cfg.anchors.gamma,
            cfg.rollout.max_new_tokens,
        )  # fmt: skip

    assert_same_step(lib, loss_of)

    policy = copy.deepcopy(lib.start)
    policy.load_state_dict(lib.weights[1], strict=False)
    sampled_kept = (keep & ~is_anchor).float().unsqueeze(1) * mask  # [B, T]
    with torch.no_grad():
        logps = grpo.token_logps(policy, batch)
    low, high = clipped_tokens(logps, old_logps, advantages, sampled_kept, EPS_LOW, EPS_HIGH)
    assert low + high > 0, "the second step clips some kept sampled token"


def test_distinctiveness_keep_by_hand():
    # one group: A = [+, +, -, -], scores [9, 5, 4, 2]: +9 beats the best negative (4) by 5 -> keep; +5 by 1 -> drop;
    # -4 is beaten by the worst positive (5) by 1 -> drop; -2 by 3 -> keep (a gap of exactly delta keeps)
    keep = dagrpo.distinctiveness_keep(torch.tensor([0.5, 0.5, -0.5, -0.5]), torch.tensor([9.0, 5.0, 4.0, 2.0]), 4, 3.0)
    assert keep.tolist() == [True, False, False, True]


def test_anchor_tokens_get_the_shaped_objective():
    """On an anchor row the loss is -A * p / (p + gamma) whatever pi_old says (no ratio)."""
    logps = torch.log(torch.tensor([[0.1, 0.3]]))
    loss = dagrpo.dagrpo_loss(
        logps, torch.zeros(1, 2), torch.tensor([2.0]), torch.ones(1, 2), torch.tensor([True]), torch.tensor([True]),
        0.2, 0.2, 0.1, 4,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-2.0 * (0.1 / 0.2 + 0.3 / 0.4) / 4)

"""examples/grpo.py against the library's `grpo` recipe on one captured step batch: the same advantages, and
the same loss and gradients at both optimizer steps of a two-pass update (tests/examples/library_step.py)."""

from __future__ import annotations

import copy

import grpo
import pytest
import torch
from library_step import REL_TOL, assert_same_step, clipped_tokens, rel_err

EPS_LOW, EPS_HIGH = 0.1, 0.15  # unequal, so a clip with the two swapped gives other gradients


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_one_step_equals_the_grpo_recipe(capture_step, beta):
    lib = capture_step("grpo", f"grpo.beta={beta}", f"grpo.eps_low={EPS_LOW}", f"grpo.eps_high={EPS_HIGH}")
    samples, G = lib.batch.samples, lib.cfg.grpo.num_generations
    assert [s.group_id for s in samples] == [s.group_id for s in samples[::G] for _ in range(G)], "groups of G in a row"

    rewards = torch.tensor([s.reward for s in samples])  # [B]
    advantages = grpo.group_advantages(rewards, G)  # [B]
    assert rel_err(advantages, lib.batch.advantages) <= REL_TOL
    assert (advantages != 0).any() and (advantages == 0).any(), "mixed groups and a uniform one"

    batch = grpo.pad_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], lib.pad_id)
    mask = batch["completion_mask"]  # [B, T]
    with torch.no_grad():
        old_logps = grpo.token_logps(lib.start, batch)  # [B, T]
        reference = copy.deepcopy(lib.start).requires_grad_(False)
        ref_logps = grpo.token_logps(reference, batch) if beta > 0 else None

    def loss_of(policy):
        logps = grpo.token_logps(policy, batch)
        return grpo.grpo_loss(logps, old_logps, ref_logps, advantages, mask, EPS_LOW, EPS_HIGH, beta)

    assert_same_step(lib, loss_of)

    # The second step is where the clip and the KL act: some tokens are clipped on each side.
    policy = copy.deepcopy(lib.start)
    policy.load_state_dict(lib.weights[1], strict=False)
    with torch.no_grad():
        low, high = clipped_tokens(grpo.token_logps(policy, batch), old_logps, advantages, mask, EPS_LOW, EPS_HIGH)
    assert low > 0 and high > 0, (low, high)


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # [2 groups x 4]
    # group 1: mean 0.25, unbiased std sqrt((0.75² + 3 · 0.25²) / 3) = 0.5; group 2 is uniform: exactly 0
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0])
    expected[:4] /= 0.5 + 1e-4
    assert torch.allclose(grpo.group_advantages(rewards, 4), expected)


def test_token_mean_counts_every_response_token_of_the_batch():
    """At ratio 1 the loss is -sum(A over tokens) / tokens: a 3-token response with A = 1 and a 1-token one
    with A = -1 give -(3 - 1) / 4, not the mean of the two responses' means (0)."""
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss = grpo.grpo_loss(logps, logps, None, torch.tensor([1.0, -1.0]), mask, 0.2, 0.2, 0.0)
    assert loss.item() == pytest.approx(-0.5)

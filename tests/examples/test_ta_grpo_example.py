"""examples/ta_grpo.py against the library's `ta_grpo` recipe on one captured step batch: the same pooled
advantages, and the same loss and gradients (ratios and the KL on q0) at both optimizer steps
(tests/examples/library_step.py)."""

from __future__ import annotations

import copy

import grpo
import pytest
import ta_grpo
import torch
from library_step import REL_TOL, assert_same_step, rel_err

EPS_LOW, EPS_HIGH = 0.1, 0.15


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_one_step_equals_the_ta_grpo_recipe(capture_step, beta):
    lib = capture_step("ta_grpo", f"grpo.beta={beta}", f"grpo.eps_low={EPS_LOW}", f"grpo.eps_high={EPS_HIGH}")
    samples, cfg = lib.batch.samples, lib.cfg
    K = (cfg.ta.n_variants + 1) * cfg.grpo.num_generations  # a question's pooled group
    assert len(samples) % K == 0
    assert [s.group_id for s in samples] == [s.group_id for s in samples[::K] for _ in range(K)], "pooled groups"
    assert {s.variant for s in samples} == set(range(cfg.ta.n_variants + 1)), "responses to q0 and each variant"

    rewards = torch.tensor([s.reward for s in samples])  # [B]
    advantages = grpo.group_advantages(rewards, K)  # [B]
    assert rel_err(advantages, lib.batch.advantages) <= REL_TOL
    assert (advantages != 0).any()

    q0_prompts = [s.prompt_ids for s in samples[::K]]  # each group opens with its q0's responses
    assert all(s.variant == 0 for s in samples[::K])
    batch = grpo.pad_batch(ta_grpo.ratio_prompts(q0_prompts, K), [s.response_ids for s in samples], lib.pad_id)
    mask = batch["completion_mask"]  # [B, T]
    with torch.no_grad():
        old_logps = grpo.token_logps(lib.start, batch)  # [B, T]
        ref_logps = grpo.token_logps(copy.deepcopy(lib.start), batch) if beta > 0 else None

    def loss_of(policy):
        logps = grpo.token_logps(policy, batch)
        return grpo.grpo_loss(logps, old_logps, ref_logps, advantages, mask, EPS_LOW, EPS_HIGH, beta)

    assert_same_step(lib, loss_of)


def test_ratio_prompts_put_every_response_of_a_group_on_q0():
    assert ta_grpo.ratio_prompts([[1, 2], [3]], 3) == [[1, 2], [1, 2], [1, 2], [3], [3], [3]]

"""`regroup.algo.loss_inputs.build_loss_inputs` on hand-computed cases: pi_old, the behaviour log-probs, the
sampler IS weight per row, OPSM's sampler log-probs (an unscored token counts 0, as TRL) and the anchors.
Against TRL through a real `Trainer.update`: tests/equality/test_trl.py and tests/train/test_trainer.py."""

from __future__ import annotations

import math

import pytest
import torch
from loss_call import call_policy_loss, loss_spec

from regroup.algo.loss_inputs import build_loss_inputs, sampler_is_weight

NAN = math.nan


def _log(rows) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_pi_old_is_the_recomputed_one_or_pi_theta_detached():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    old, inputs = build_loss_inputs(loss_spec(), logps, torch.ones(1), mask)
    assert old.tolist() == [[-1.0, -2.0]] and not old.requires_grad  # one pass, one mini-batch: ratio 1 (TRL)
    given = torch.tensor([[-0.5, -0.5]])
    old, _ = build_loss_inputs(loss_spec(), logps, torch.ones(1), mask, old_logps=given)
    assert old.tolist() == [[-0.5, -0.5]]
    assert inputs.is_weight is None and inputs.sampler_logps is None and inputs.anchor_token_mask is None


def test_the_is_weight_is_per_row_and_1_on_rows_the_sampler_did_not_score():
    """Row 0 was sampled (pi_old 0.5, the sampler 0.25 and 0.5), row 1 has no sampler log-probs (an anchor)."""
    old = _log([[0.5, 0.5], [0.5, 0.5]])
    sampler = _log([[0.25, 0.5], [1.0, 1.0]])
    rows = torch.tensor([True, False])
    mask = torch.ones(2, 2)

    def weight(**spec):
        _, inputs = build_loss_inputs(
            loss_spec(**spec), old, torch.ones(2), mask, old_logps=old, sampler_logps=sampler, sampler_rows=rows
        )
        return inputs.is_weight.tolist()

    assert weight(is_cap=1.5) == [[1.5, 1.0], [1.0, 1.0]]  # min(0.5/0.25, 1.5), 1; row 1: 1
    assert weight(is_cap=3.0, is_mode="sequence_truncate") == [[pytest.approx(2.0)], [1.0]]  # 2 · 1
    assert weight(is_cap=1.5, is_mode="sequence_mask") == [[0.0], [1.0]]  # 2 > 1.5: the response is dropped
    assert weight(is_cap=3.0, is_mode="token_mask", is_min=1.5) == [[2.0, 0.0], [1.0, 1.0]]  # 1 < 1.5: 0
    # off (cap 0), or no row the sampler scored: no weight at all
    _, off = build_loss_inputs(loss_spec(), old, torch.ones(2), mask, old_logps=old, sampler_logps=sampler)
    assert off.is_weight is None
    _, none = build_loss_inputs(
        loss_spec(is_cap=1.5),
        old,
        torch.ones(2),
        mask,
        sampler_logps=sampler,
        sampler_rows=torch.tensor([False, False]),
    )
    assert none.is_weight is None


def test_an_unscored_token_has_is_weight_1():
    """TRL: a NaN sampler log-prob contributes ratio 1 (token modes) and factor 1 to the product (sequence)."""
    old = _log([[0.5, 0.5]])
    sampler = torch.tensor([[math.log(0.25), NAN]])
    mask = torch.ones(1, 2)
    _, tok = build_loss_inputs(loss_spec(is_cap=3.0), old, torch.ones(1), mask, sampler_logps=sampler)
    assert tok.is_weight.tolist() == [[pytest.approx(2.0), 1.0]]
    _, seq = build_loss_inputs(
        loss_spec(is_cap=3.0, is_mode="sequence_truncate"), old, torch.ones(1), mask, sampler_logps=sampler
    )
    assert seq.is_weight.tolist() == [[pytest.approx(2.0)]]
    assert sampler_is_weight(old, sampler, mask, "token_mask", 1.5).tolist() == [[0.0, 1.0]]  # 2 > 1.5


def test_pi_old_from_the_sampler_where_it_drew_and_scored():
    """`old_from_sampler` (the async behaviour correction): the sampler's log-prob on tokens it drew with a
    finite value on a row it scored on the learner's prompt; pi_old on a NaN, an anchor token, another row."""
    old = torch.full((2, 3), -9.0)
    sampler = torch.tensor([[-0.5, NAN, -0.7], [-1.0, -1.0, -1.0]])
    sampled = torch.tensor([[True, True, False], [True, True, True]])  # row 0's last token was forced
    rows = torch.tensor([True, False])  # row 1 is scored on another prompt (TA-GRPO, ratios on q0)
    mask = torch.ones(2, 3)
    spec = loss_spec()
    got, inputs = build_loss_inputs(
        spec, old, torch.ones(2), mask, old_logps=old, sampler_logps=sampler, sampler_rows=rows, sampled_mask=sampled
    )
    assert got.tolist() == [[-9.0] * 3] * 2  # off: pi_old as given
    got, inputs = build_loss_inputs(
        spec, old, torch.ones(2), mask, old_logps=old, sampler_logps=sampler, sampler_rows=rows,
        sampled_mask=sampled, old_from_sampler=True,
    )  # fmt: skip
    assert got.tolist() == [[-0.5, -9.0, -9.0], [-9.0, -9.0, -9.0]]
    assert inputs.anchor_token_mask.tolist() == [[False, False, True], [False, False, False]]


def test_opsm_reads_the_samplers_log_probs_nan_included_on_the_rows_it_scored():
    old = torch.full((2, 2), -2.0)
    sampler = torch.tensor([[-1.0, NAN], [-3.0, -3.0]])
    rows = torch.tensor([True, False])
    _, inputs = build_loss_inputs(
        loss_spec(off_policy_mask=0.5), old, torch.ones(2), torch.ones(2, 2), old_logps=old, sampler_logps=sampler,
        sampler_rows=rows,
    )  # fmt: skip
    got = inputs.sampler_logps
    assert got[0, 0].item() == -1.0 and math.isnan(got[0, 1].item())  # the NaN is kept: no KL evidence
    assert got[1].tolist() == [-2.0, -2.0]  # a row the sampler did not score: pi_old (TRL without vLLM)
    _, off = build_loss_inputs(loss_spec(), old, torch.ones(2), torch.ones(2, 2), sampler_logps=sampler)
    assert off.sampler_logps is None


def test_opsm_keeps_the_trial_response_that_pi_old_in_the_nans_place_would_drop():
    """The trial: delta = 0.5, A < 0, the sampler scored 1 token of 4. pi_theta = -2 on every token, pi_old = -1.8,
    the sampler's one score -0.4 (KL 1.6 on that token). TRL: mean KL = (1.6 + 0 + 0 + 0) / 4 = 0.4 <= 0.5: kept.
    pi_old in the NaN's place: (1.6 + 3 · 0.2) / 4 = 0.55 > 0.5: dropped."""
    logps = torch.full((1, 4), -2.0, requires_grad=True)
    old = torch.full((1, 4), -1.8)
    sampler = torch.tensor([[-0.4, NAN, NAN, NAN]])
    mask = torch.ones(1, 4)
    spec = loss_spec(off_policy_mask=0.5)
    pi_old, inputs = build_loss_inputs(spec, logps, torch.tensor([-1.0]), mask, old_logps=old, sampler_logps=sampler)
    totals = {"total_tokens": 4.0, "total_sequences": 1, "max_completion_length": 4}
    _, met = call_policy_loss(
        logps, pi_old, torch.tensor([-1.0]), mask, off_policy_mask=0.5, sampler_logps=inputs.sampler_logps, **totals
    )
    assert met["off_policy/masked_frac"].item() == 0.0  # kept
    substituted = torch.where(sampler.isfinite(), sampler, old)
    _, met = call_policy_loss(
        logps, pi_old, torch.tensor([-1.0]), mask, off_policy_mask=0.5, sampler_logps=substituted, **totals
    )
    assert met["off_policy/masked_frac"].item() == 1.0  # what the substitution did: dropped


def test_anchors_entropy_and_the_passed_through_tensors():
    logps = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    sampled = torch.tensor([[True, True], [False, False]])  # row 1 is an anchor (its padding is not a token)
    entropy, ref, weight = torch.ones(2, 2), torch.full((2, 2), -1.0), torch.tensor([1.0, 0.0])
    _, inputs = build_loss_inputs(
        loss_spec(), logps, torch.ones(2), mask, sampled_mask=sampled, entropy=entropy, ref_logps=ref,
        sample_weight=weight,
    )  # fmt: skip
    assert inputs.anchor_token_mask.tolist() == [[False, False], [True, False]]
    assert inputs.entropy is entropy  # the loss's entropy metric reads it; a term may read it too
    assert inputs.ref_logps is ref and inputs.sample_weight is weight
    _, inputs = build_loss_inputs(loss_spec(terms=(("entropy", 0.01),)), logps, torch.ones(2), mask, entropy=entropy)
    assert inputs.entropy is entropy and inputs.anchor_token_mask is None
    _, none = build_loss_inputs(
        loss_spec(), logps, torch.ones(2), mask, sampled_mask=torch.ones(2, 2, dtype=torch.bool)
    )
    assert none.anchor_token_mask is None  # every loss token was sampled

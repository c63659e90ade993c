"""Tests write hand-computed loss cases as keywords; this maps them onto `policy_loss`'s three dataclasses."""

from __future__ import annotations

from regroup.algo.losses import LossInputs, LossSpec, LossTotals, policy_loss

_INPUTS = {"ref_logps", "sample_weight", "anchor_token_mask", "is_weight", "entropy", "sampler_logps"}
_TOTALS = {"total_tokens", "total_sequences", "max_completion_length"}


def call_policy_loss(logps, old_logps, advantages, loss_mask, **kw):
    inputs = LossInputs(advantages=advantages, loss_mask=loss_mask, **{k: kw.pop(k) for k in list(kw) if k in _INPUTS})
    totals = LossTotals(**{k: kw.pop(k) for k in list(kw) if k in _TOTALS})
    return policy_loss(logps, old_logps, inputs, LossSpec(**kw), totals)

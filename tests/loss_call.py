"""Tests write hand-computed loss cases as keywords; this maps them onto the run config and `policy_loss`.

`loss_spec(**keywords)` builds the `LossSpec` of a run config whose loss settings are the keywords (short names
below, e.g. `agg="seq_sum_constant"`, `is_cap=2.0`), resolved as a run resolves it; `call_policy_loss` also builds
the `LossInputs` and `LossTotals` from keywords.
"""

from __future__ import annotations

from typing import Any

from regroup.algo.loss_config import resolve_loss
from regroup.algo.loss_inputs import LossInputs
from regroup.algo.loss_spec import LossSpec
from regroup.algo.losses import LossTotals, policy_loss
from regroup.config.fields import check
from regroup.config.schema import RunConfig

_INPUTS = {"ref_logps", "sample_weight", "anchor_token_mask", "is_weight", "entropy", "sampler_logps"}
_TOTALS = {"total_tokens", "total_sequences", "max_completion_length"}
KEYS = {
    "eps_low": "grpo.eps_low",
    "eps_high": "grpo.eps_high",
    "beta": "grpo.beta",
    "kl_ratio_correction": "grpo.kl_ratio_correction",
    "agg": "grpo.loss_agg",
    "policy": "grpo.policy_loss",
    "policy_args": "grpo.policy_loss_args",
    "kl": "grpo.kl_estimator",
    "kl_args": "grpo.kl_estimator_args",
    "terms": "grpo.loss_terms",
    "term_args": "grpo.loss_term_args",
    "off_policy_mask": "grpo.off_policy_mask_threshold",
    "anchor_ratio": "anchors.ratio",
    "shaping_gamma": "anchors.gamma",
    "is_mode": "rollout.is_mode",
    "is_cap": "rollout.tis_cap",
    "is_min": "rollout.is_min",
}
"""Short keyword -> the run config key it sets."""


def _plain(value: Any) -> Any:
    """A knobs model as the mapping a config holds; (name, coef) term pairs as 'name*coef' entries."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


def loss_spec(**keywords: Any) -> LossSpec:
    data: dict[str, Any] = {}
    for short, value in keywords.items():
        section, key = KEYS[short].split(".")
        if short == "terms":
            value = [f"{name}*{coef!r}" for name, coef in value]
        elif short == "term_args":
            value = {name: _plain(args) for name, args in dict(value).items()}
        data.setdefault(section, {})[key] = _plain(value)
    return resolve_loss(check(RunConfig, data))[0]


def call_policy_loss(logps, old_logps, advantages, loss_mask, **kw):
    inputs = LossInputs(advantages=advantages, loss_mask=loss_mask, **{k: kw.pop(k) for k in list(kw) if k in _INPUTS})
    totals = LossTotals(**{k: kw.pop(k) for k in list(kw) if k in _TOTALS})
    return policy_loss(logps, old_logps, inputs, loss_spec(**kw), totals)

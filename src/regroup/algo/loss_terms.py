"""Extra loss terms (`grpo.loss_terms`, `grpo.entropy_coef`): `Σ_k c_k · term_k`, each a registered `LOSS_TERMS`
piece (the entropy bonus, `regroup.algo.entropy`, or a user's `pkg.mod:obj`) read from `TermInputs`.

A term returns a per-token value [B, T], aggregated over the loss tokens with the policy's `grpo.loss_agg` (or the
term's own `agg` attribute) and times the sample weight, or a 0-d tensor it normalised itself (with
`TermInputs.totals`). `needs_entropy = True` on a term makes the front-end compute a differentiable entropy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from regroup.algo.loss_inputs import Mean
from regroup.algo.loss_spec import LossSpec


@dataclass(frozen=True)
class TermInputs:
    """What an extra loss term may read for one micro-batch."""

    logps: Tensor  # [B, T] differentiable
    old_logps: Tensor  # [B, T] π_old (π_θ, detached, on anchor and padding tokens)
    advantages: Tensor  # [B] or [B, T]
    loss_mask: Tensor  # [B, T] bool
    on_policy: Tensor  # [B, T] bool: loss tokens sampled from π_old (not anchors)
    entropy: Tensor | None  # [B, T] differentiable when the term needs_entropy
    ref_logps: Tensor | None  # [B, T]
    totals: object  # regroup.algo.losses.LossTotals: the whole optimizer batch's normalisers


def extra_terms(
    t_in: TermInputs, spec: LossSpec, weight: Tensor | None, reduce: Callable[[Tensor, str], Tensor]
) -> tuple[Tensor | float, dict[str, Mean]]:
    """`Σ c · term` over the spec's terms (0.0 when there are none), per-token terms times the sample `weight` [B, 1]
    and reduced by `reduce(values, agg)`. Metrics `term/<name>`: each term's value before its coefficient."""
    added: Tensor | float = 0.0
    metrics: dict[str, Mean] = {}
    for term, coef in spec.terms:
        value = term.fn(t_in, **term.kwargs)
        if not isinstance(value, Tensor) or (value.dim() != 0 and value.shape != t_in.loss_mask.shape):
            raise ValueError(
                f"loss term {term.name!r} must return a [B, T] = {tuple(t_in.loss_mask.shape)} or a 0-d tensor"
            )
        if value.dim() != 0:
            if weight is not None:
                value = value * weight  # [B, T]
            value = reduce(value, getattr(term.fn, "agg", spec.grpo.loss_agg))
        added = added + coef * value
        metrics[f"term/{term.name}"] = Mean(value.detach(), value.new_ones(()))
    return added, metrics

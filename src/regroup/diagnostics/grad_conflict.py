"""Gradient conflict between the positive and the negative samples of a batch — the quantity the DaGRPO
paper argues about: when a wrong response is as good as a right one by fine-grained score, the two
sides push the shared parameters in opposite directions. Measured as the cosine between
∇(−Σ A·log π) over positive-advantage samples and the same over negative-advantage samples.
`GradientConflict` runs it as an update hook (`regroup.diagnostics.hooks`)."""

from __future__ import annotations

import math
import re

import torch

from regroup.batch import RolloutBatch
from regroup.models.logprobs import response_logps


def gradient_conflict(
    model, batch: RolloutBatch, advantages: torch.Tensor, *, param_pattern: str, max_samples: int, temperature: float
) -> dict[str, float]:
    """cos(g⁺, g⁻) on a sub-batch of at most `max_samples` (half positive, half negative); parameters whose
    name matches `param_pattern`. Uses autograd.grad, so the training gradients are untouched."""
    pos = torch.nonzero(advantages > 0).flatten()[: max_samples // 2]
    neg = torch.nonzero(advantages < 0).flatten()[: max_samples // 2]
    if len(pos) == 0 or len(neg) == 0:
        return {}
    params = [p for n, p in model.named_parameters() if p.requires_grad and re.search(param_pattern, n)]
    if not params:
        raise ValueError(f"diagnostics.grad_conflict_params={param_pattern!r} matches no trainable parameter")
    index = torch.cat([pos, neg])
    sub = batch.select(index)
    adv = advantages[index].to(sub.completion_mask.device)  # [b]
    logps, _ = response_logps(model, sub, temperature)  # [b, T], one forward for both sides
    grads = []
    for side, retain in ((adv > 0, True), (adv < 0, False)):
        mask = sub.completion_mask * side[:, None]  # [b, T]
        loss = -(adv[:, None] * logps * mask).sum() / mask.sum().clamp(min=1)
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=retain)]))
    g_pos, g_neg = grads
    norm = float(g_pos.norm() * g_neg.norm())
    cosine = float(g_pos @ g_neg) / norm if norm > 0 else math.nan
    return {
        "grad_conflict/cosine": cosine,
        "grad_conflict/pos_norm": float(g_pos.norm()),
        "grad_conflict/neg_norm": float(g_neg.norm()),
    }


class GradientConflict:
    """`grad_conflict/*`: cos(g⁺, g⁻) on training steps 0, K, 2K, ... (`diagnostics.grad_conflict_every`): an
    update hook (`regroup.diagnostics.hooks.UpdateHook`'s seam) with only `before_update`."""

    name = "grad_conflict"

    def __init__(self, every: int, param_pattern: str, max_samples: int, temperature: float):
        self.every, self.param_pattern, self.max_samples, self.temperature = (
            every,
            param_pattern,
            max_samples,
            temperature,
        )

    def before_update(self, model, batch: RolloutBatch, advantages: torch.Tensor, step: int) -> dict[str, float]:
        if step % self.every:
            return {}
        return gradient_conflict(
            model,
            batch,
            advantages,
            param_pattern=self.param_pattern,
            max_samples=self.max_samples,
            temperature=self.temperature,
        )

"""Per-token log-probs (and entropy) of responses under a model, in one forward pass."""

from __future__ import annotations

import torch

from regroup.batch import RolloutBatch


def response_logps(model, batch: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False,
                   shared_prefix: bool = False):
    """log pi(o_t | prompt, o_<t) for every response token, from logits divided by the sampling
    temperature (as TRL scores them). Returns (logps [B, T], entropy [B, T] or None)."""
    t = batch.completion_length
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=t + 1,
        use_cache=False,
    ).logits[:, :-1, :]  # [B, T, V]: position k predicts response token k
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.log_softmax(-1)  # [B, T, V]
    targets = batch.input_ids[:, -t:]  # [B, T]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, T]
    return logps, entropy

"""Per-token log-probs (and entropy) of responses under a model.

Two ways to get the same numbers:

- the padded forward: every row is its prompt followed by its response, one forward over [B, P+T];
- the shared-prefix forward (default): a group's G responses (TA-GRPO's (N+1)·G under q0 ratios, a
  DaGRPO group's anchor too) answer one prompt, so the padded forward computes that prompt's
  positions G times forward and G times backward. Here each *distinct* prompt of the micro-batch
  (by token content, not by group id) is forwarded once with a KV cache that keeps its gradient; the
  cache is expanded to the prompt's rows (an index, whose backward sums the rows' gradients into the
  one prompt computation) and the responses run on it. The last prompt position's logits predict the
  first response token; the last response token is never fed (it predicts nothing the loss uses).

Both paths also drop the columns that are padding in every row of the micro-batch (collate pads to
the whole batch's longest prompt and response, a micro-batch may need less); the log-probs of dropped
response columns are 0, like every padded position, which the loss masks.

`tests/test_logprobs.py` checks that log-probs and parameter gradients equal the padded forward's
within 1e-5 (fp32) for GRPO, TA-GRPO q0 ratios and anchors, on Qwen3 (sdpa) and Llama / Qwen2 (eager).
"""

from __future__ import annotations

import inspect

import torch

from regroup.batch import RolloutBatch

# Architectures whose HF forward with a DynamicCache of full-attention layers is the padded forward
# (tested). Others (sliding-window / hybrid / recurrent caches, encoder-decoders) take the padded path.
SHARED_PREFIX_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}


def response_logps(model, batch: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False,
                   shared_prefix: bool = True):
    """log pi(o_t | prompt, o_<t) for every response token, from logits divided by the sampling
    temperature (as TRL scores them). Returns (logps [B, T], entropy [B, T] or None); both are 0 on
    response columns that are padding in every row.

    `shared_prefix` (cfg.grpo.shared_prefix) forwards each distinct prompt once (module docstring). It
    falls back to the padded forward, with the same result, where the cache path is not known to be
    exact or cannot run: a model type outside SHARED_PREFIX_MODEL_TYPES, a sliding window in use,
    gradient checkpointing while training (HF turns the cache off there), or no prompt repeated in
    the micro-batch (nothing to share).
    """
    p_all, t_all = batch.input_ids.shape[1] - batch.completion_length, batch.completion_length
    ids, attention, positions, p, t = _trim_padding(batch, p_all, t_all)
    logits = None
    if shared_prefix and t > 0 and shared_prefix_supported(model):
        logits = _shared_prefix_logits(model, ids, attention, positions, p, t)
    if logits is None:
        logits = _padded_logits(model, ids, attention, positions, t)
    logits = logits.float()  # [B, t, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.log_softmax(-1)  # [B, t, V]
    targets = ids[:, p : p + t]  # [B, t]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, t]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, t]
    if t < t_all:  # dropped all-padding response columns: 0, as on any padded position
        logps = torch.nn.functional.pad(logps, (0, t_all - t))  # [B, T]
        entropy = None if entropy is None else torch.nn.functional.pad(entropy, (0, t_all - t))
    return logps, entropy


def _trim_padding(batch: RolloutBatch, p: int, t: int):
    """(input_ids, attention, positions, P', T') without the leading prompt columns and trailing response
    columns that are padding in every row. Positions come from the attention cumsum, so they do not change."""
    attention = batch.attention_mask
    real_prompt_cols = attention[:, :p].any(0).nonzero()
    start = int(real_prompt_cols[0]) if len(real_prompt_cols) else p
    real_resp_cols = batch.completion_mask.any(0).nonzero()
    # keep at least one column, so the log-probs stay a function of the weights (backward needs a graph)
    t_kept = min(t, int(real_resp_cols[-1]) + 1 if len(real_resp_cols) else 1)
    end = p + t_kept
    return (batch.input_ids[:, start:end], attention[:, start:end], batch.position_ids[:, start:end],
            p - start, t_kept)


def _padded_logits(model, ids, attention, positions, t: int) -> torch.Tensor:
    """Logits [B, t, V] at the positions that predict the t response tokens, from one padded forward."""
    if t == 0:
        return torch.zeros((ids.shape[0], 0, 1), device=ids.device)
    return model(
        input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=t + 1, use_cache=False,
    ).logits[:, :-1, :]  # [B, t, V]: position k predicts response token k


def _base_model(model):
    """The HF model under DDP / accelerate / peft wrappers (for its config and forward signature)."""
    inner = getattr(model, "module", model)  # DDP
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def shared_prefix_supported(model) -> bool:
    """True when the shared-prefix forward of this model equals its padded forward (see response_logps)."""
    base = _base_model(model)
    cfg = getattr(base, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SHARED_PREFIX_MODEL_TYPES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", cfg.model_type == "mistral"):
        return False
    checkpointing = getattr(type(base), "is_activation_checkpointing", None)  # transformers >= 5.x name
    checkpointing = base.is_activation_checkpointing if checkpointing is not None else getattr(base, "is_gradient_checkpointing", False)
    if checkpointing and base.training:
        return False
    return cache_kwarg(base) is not None


def cache_kwarg(base) -> str | None:
    """The forward's KV-cache argument: `cache` in transformers >= 5.x, `past_key_values` before."""
    params = inspect.signature(type(base).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def distinct_prompts(ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row of each distinct prompt [U], prompt index of every row [B]) for left-padded prompts
    ids/attention [B, P]; rows are the same prompt when their tokens and padding are the same."""
    key = torch.cat([ids * attention, attention], dim=1)  # [B, 2P] pad token ids do not matter
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # [B]
    rows = torch.arange(len(ids), device=ids.device)
    first = torch.full((int(inverse.max()) + 1,), len(ids), device=ids.device, dtype=rows.dtype)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # [U]
    order = first.argsort()  # number prompts by first appearance
    remap = torch.empty_like(order)
    remap[order] = torch.arange(len(order), device=ids.device)
    return first[order], remap[inverse]


def _shared_prefix_logits(model, ids, attention, positions, p: int, t: int) -> torch.Tensor | None:
    """Logits [B, t, V] from one forward per distinct prompt and the responses on its expanded cache;
    None when no prompt repeats (the padded forward then costs the same or less)."""
    from transformers import DynamicCache

    if p == 0:
        return None
    first, prompt_of_row = distinct_prompts(ids[:, :p], attention[:, :p])  # [U], [B]
    if len(first) == len(ids):
        return None
    kw = cache_kwarg(_base_model(model))
    cache = DynamicCache()
    prompt_logits = model(
        input_ids=ids[first, :p], attention_mask=attention[first, :p], position_ids=positions[first, :p],
        use_cache=True, logits_to_keep=1, **{kw: cache},
    ).logits  # [U, 1, V]: predicts response token 0
    first_logits = prompt_logits[prompt_of_row]  # [B, 1, V]
    if t == 1:
        return first_logits
    cache.batch_select_indices(prompt_of_row)  # every layer's K/V [U, ...] -> [B, ...], differentiable
    response_logits = model(
        input_ids=ids[:, p : p + t - 1], attention_mask=attention[:, : p + t - 1],
        position_ids=positions[:, p : p + t - 1], use_cache=True, **{kw: cache},
    ).logits  # [B, t-1, V]: response position k predicts response token k+1
    return torch.cat([first_logits, response_logits], dim=1)  # [B, t, V]

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
  Responses run in up to two length buckets (`length_buckets`), so a few long rows — a DaGRPO anchor
  is a full reference solution — do not pad every sampled response to their length.

Both paths also drop the columns that are padding in every row of the micro-batch (collate pads to
the whole batch's longest prompt and response, a micro-batch may need less); the log-probs of dropped
response columns are 0, like every padded position, which the loss masks.

`tests/test_logprobs.py` checks that log-probs and parameter gradients equal the padded forward's
within 1e-5 (fp32) for GRPO, TA-GRPO q0 ratios and anchors (short and long), on Qwen3 (sdpa), Llama
(eager) and Qwen2 (sdpa, q/k/v bias).
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
    rows_all = torch.arange(len(ids), device=ids.device)
    pieces = None
    if shared_prefix and t > 0 and shared_prefix_supported(model):
        lengths = batch.completion_mask[:, :t].sum(1).long().clamp(min=1)  # [B]
        pieces = _shared_prefix_logits(model, ids, attention, positions, p, t, lengths)
    if pieces is None:
        pieces = [(rows_all, _padded_logits(model, ids, attention, positions, t))]
    logps_parts, entropy_parts = [], []
    for rows, logits in pieces:  # logits [n, t_b, V] for rows [n]
        t_b = logits.shape[1]
        logits = logits.float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        log_probs = logits.log_softmax(-1)  # [n, t_b, V]
        targets = ids[rows, p : p + t_b]  # [n, t_b]
        logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n, t_b]
        # columns past t_b (all-padding in this piece or micro-batch): 0, as on any padded position
        logps_parts.append(torch.nn.functional.pad(logps, (0, t_all - t_b)))  # [n, T]
        if with_entropy:
            with torch.no_grad():
                entropy = -(log_probs.exp() * log_probs).sum(-1)  # [n, t_b]
                entropy_parts.append(torch.nn.functional.pad(entropy, (0, t_all - t_b)))
    order = torch.cat([rows for rows, _ in pieces])  # [B]: row of each assembled line
    inverse = torch.empty_like(order)
    inverse[order] = rows_all
    logps = torch.cat(logps_parts)[inverse]  # [B, T]
    entropy = torch.cat(entropy_parts)[inverse] if with_entropy else None
    return logps, entropy


def prompt_order(samples: list) -> list[int]:
    """Indices that put rows of the same ratio prompt next to each other (stable: prompts in order of
    first appearance, rows in their order), so a micro-batch holds few distinct prompts for the shared
    prefix to share. DaGRPO appends each group's anchor after all sampled rows; without this, a
    micro-batch boundary splits groups from their anchors and the last micro-batch holds one row of
    every prompt. Nothing downstream depends on a sample's position (regroup.batch)."""
    first_seen: dict[tuple[int, ...], int] = {}
    for s in samples:
        first_seen.setdefault(tuple(s.ratio_prompt_ids), len(first_seen))
    return sorted(range(len(samples)), key=lambda i: first_seen[tuple(samples[i].ratio_prompt_ids)])


def order_by_prompt(samples: list) -> list:
    """The samples in `prompt_order`."""
    return [samples[i] for i in prompt_order(samples)]


def use_shared_prefix(setting: bool | str, device: torch.device | str) -> bool:
    """grpo.shared_prefix resolved for the device the update runs on. "auto" is on only on a CPU. On an
    H200 (bf16, Qwen3-0.6B shape, 16 prompts x 8 responses of 256 tokens, benchmarks/update_prefix.py)
    the shared forward took 1.73x the padded one's time at micro-batch 16, 1.27x at 32 and 0.99x at 64:
    its second forward call doubles the kernel launches, and a GPU at these sizes waits on launches,
    not on the prompt positions saved. On a CPU it is the faster path (BENCHMARKS.md)."""
    if setting == "auto":
        return torch.device(device).type == "cpu"
    return bool(setting)


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


def length_buckets(lengths: torch.Tensor, min_saving: float = 0.25) -> list[torch.Tensor]:
    """Rows [n] of each response-length bucket. One bucket pads every response to the longest; two
    (the shortest k rows, the rest) are used when that cuts the padded positions by at least
    `min_saving` — e.g. a DaGRPO anchor much longer than its group's sampled responses."""
    sorted_lengths, order = lengths.sort()  # [B]
    b, longest = len(lengths), int(sorted_lengths[-1])
    k = torch.arange(1, b, device=lengths.device)  # split after the k shortest rows
    split_cost = k * sorted_lengths[:-1] + (b - k) * longest  # [B-1] padded positions of the two buckets
    if b < 2 or float(split_cost.min()) > (1 - min_saving) * b * longest:
        return [torch.arange(b, device=lengths.device)]
    cut = int(k[split_cost.argmin()])
    return [order[:cut].sort().values, order[cut:].sort().values]


class _SelectRows(torch.autograd.Function):
    """`x.index_select(0, index)` whose backward makes the incoming gradient contiguous before its
    index_add. The cache's gradient arrives as a slice of the attention's (keys of the prompt, then of
    the response, in one tensor), and an index_add over that strided view was the update's third
    largest CPU cost: 72 ms of a 0.65 s GRPO update (built-in task, tiny model, 2 threads, torch
    profiler over 4 steps); advanced indexing `x[index]` (an accumulating index_put) cost 64 ms."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)  # [n, ...]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        summed = grad.new_zeros((ctx.rows, *grad.shape[1:]))  # [U, ...]
        return summed.index_add_(0, index, grad.contiguous()), None


def _expanded_cache(layers_kv: list[tuple[torch.Tensor, torch.Tensor]], index: torch.Tensor):
    """A DynamicCache whose every layer holds the K/V rows `index` of `layers_kv` ([U, ...] -> [n, ...]);
    the selection is differentiable, so each row's gradient flows back into its prompt's one computation."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(_SelectRows.apply(k, index), _SelectRows.apply(v, index)) for k, v in layers_kv])


def _shared_prefix_logits(model, ids, attention, positions, p: int, t: int, lengths: torch.Tensor):
    """[(rows [n], logits [n, t_b, V])] per response-length bucket, from one forward per distinct prompt
    and each bucket's responses on the expanded cache; None when no prompt repeats (the padded forward
    then costs the same or less)."""
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
    layers_kv = [(layer.keys, layer.values) for layer in cache.layers]  # per layer [U, kv, P, D]
    pieces = []
    for rows in length_buckets(lengths):
        t_b = int(lengths[rows].max())
        first_logits = prompt_logits.index_select(0, prompt_of_row[rows])  # [n, 1, V]
        if t_b == 1:
            pieces.append((rows, first_logits))
            continue
        response_logits = model(
            input_ids=ids[rows, p : p + t_b - 1], attention_mask=attention[rows, : p + t_b - 1],
            position_ids=positions[rows, p : p + t_b - 1], use_cache=True,
            **{kw: _expanded_cache(layers_kv, prompt_of_row[rows])},
        ).logits  # [n, t_b-1, V]: response position k predicts response token k+1
        pieces.append((rows, torch.cat([first_logits, response_logits], dim=1)))  # [n, t_b, V]
    return pieces

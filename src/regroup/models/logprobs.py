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
  The responses are *packed* (`pack_rows`): rows of one prompt share lines as wide as the longest
  response, first-fit in decreasing length, with a block-causal 4-D mask (a position sees its prompt
  and the earlier positions of its own row; each row keeps its own position ids). Short sampled
  responses then fill the line beside a long DaGRPO anchor instead of each being padded to its length.
  Needs an attention that takes a 4-D mask (sdpa, eager); flash-attention kernels take the padded path.

Both paths also drop the columns that are padding in every row of the micro-batch (collate pads to
the whole batch's longest prompt and response, a micro-batch may need less); the log-probs of dropped
response columns are 0, like every padded position, which the loss masks.

`tests/models/test_logprobs.py` checks that log-probs and parameter gradients equal the padded forward's
within 1e-5 (fp32) for GRPO, TA-GRPO q0 ratios and anchors (short and long), on Qwen3 (sdpa), Llama
(eager) and Qwen2 (sdpa, q/k/v bias). Packing against the two length buckets it replaced: forward +
backward over the micro-batches of 6 steps 0.905-0.986x on the built-in task (BENCHMARKS.md).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from regroup.batch import RolloutBatch

if TYPE_CHECKING:
    from transformers import DynamicCache

# Architectures whose HF forward with a DynamicCache of full-attention layers is the padded forward
# (tested). Others (sliding-window / hybrid / recurrent caches, encoder-decoders) take the padded path.
SHARED_PREFIX_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}
# Attention implementations that take the packed lines' 4-D block mask (flash-attention kernels take none).
PACKED_MASK_ATTENTION = {"sdpa", "eager"}


def response_logps(
    model,
    batch: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    shared_prefix: bool = True,
    entropy_grad: bool = False,
):
    """log pi(o_t | prompt, o_<t) for every response token, from logits divided by the sampling
    temperature (as TRL scores them). Returns (logps [B, T], entropy [B, T] or None); both are 0 on
    response columns that are padding in every row. The entropy is detached (a metric) unless
    `entropy_grad`, for a loss term that differentiates it (the entropy bonus); then it is returned
    whether or not `with_entropy` is set.

    `shared_prefix` (cfg.grpo.shared_prefix) forwards each distinct prompt once (module docstring). It
    falls back to the padded forward, with the same result, where the cache path is not known to be
    exact or cannot run: a model type outside SHARED_PREFIX_MODEL_TYPES, a sliding window in use,
    gradient checkpointing while training (HF turns the cache off there), an attention that takes no
    4-D mask (outside PACKED_MASK_ATTENTION), or no prompt repeated in the micro-batch (nothing to share).
    """
    p_all, t_all = batch.input_ids.shape[1] - batch.completion_length, batch.completion_length
    entropy_mode: bool | str = "grad" if entropy_grad else with_entropy  # _token_logps: "grad" keeps the graph
    ids, attention, positions, p, t = _trim_padding(batch, p_all, t_all)
    result = None
    if shared_prefix and t > 0 and shared_prefix_supported(model):
        lengths = batch.completion_mask[:, :t].sum(1).long().clamp(min=1)  # [B]
        result = _shared_prefix_logps(model, ids, attention, positions, p, lengths, temperature, entropy_mode)
    if result is None:
        logits = _padded_logits(model, ids, attention, positions, t)  # [B, t, V]
        result = _token_logps(logits, ids[:, p : p + t], temperature, entropy_mode)
    logps, entropy = result  # [B, t_b] each, t_b <= t
    # columns past t_b (padding in every row of the micro-batch): 0, as on any padded position
    logps = torch.nn.functional.pad(logps, (0, t_all - logps.shape[1]))  # [B, T]
    if entropy is not None:
        entropy = torch.nn.functional.pad(entropy, (0, t_all - entropy.shape[1]))  # [B, T]
    return logps, entropy


def _token_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool | str):
    """(log pi(target) [m, w], entropy [m, w] or None) from logits [m, w, V] divided by the temperature;
    `with_entropy="grad"` returns a differentiable entropy, True a detached one."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.log_softmax(-1)  # [m, w, V]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [m, w]
    if not with_entropy:
        return logps, None
    if with_entropy == "grad":
        return logps, -(log_probs.exp() * log_probs).sum(-1)  # [m, w]
    with torch.no_grad():
        return logps, -(log_probs.exp() * log_probs).sum(-1)  # [m, w]


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
    return (batch.input_ids[:, start:end], attention[:, start:end], batch.position_ids[:, start:end], p - start, t_kept)


def _padded_logits(model, ids, attention, positions, t: int) -> torch.Tensor:
    """Logits [B, t, V] at the positions that predict the t response tokens, from one padded forward."""
    if t == 0:
        return torch.zeros((ids.shape[0], 0, 1), device=ids.device)
    return model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        logits_to_keep=t + 1,
        use_cache=False,
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
    checkpointing = (
        base.is_activation_checkpointing
        if checkpointing is not None
        else getattr(base, "is_gradient_checkpointing", False)
    )
    if checkpointing and base.training:
        return False
    if getattr(cfg, "_attn_implementation", None) not in PACKED_MASK_ATTENTION:
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


def pack_rows(lengths: list[int], prompt_of_row: list[int], width: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Place each row's `lengths[i]` response positions in packed lines of `width` slots, first-fit in
    decreasing length, only beside rows of the same prompt (a line runs on one prompt's KV cache).
    Returns ((line, offset) per row, (-1, 0) for a row of length 0; the prompt of every line)."""
    place: list[tuple[int, int]] = [(-1, 0)] * len(lengths)
    line_prompt: list[int] = []
    free: list[int] = []  # open slots left in each line
    lines_of: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: (prompt_of_row[i], -lengths[i], i)):
        n = lengths[i]
        if n == 0:
            continue
        if n > width:
            raise ValueError(f"row {i} has {n} positions, more than the line width {width}")
        lines = lines_of.setdefault(prompt_of_row[i], [])
        line = next((j for j in lines if free[j] >= n), None)
        if line is None:
            line = len(free)
            free.append(width)
            line_prompt.append(prompt_of_row[i])
            lines.append(line)
        place[i] = (line, width - free[line])
        free[line] -= n
    return place, line_prompt


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
    from transformers import DynamicCache  # heavy (transformers): only the shared-prefix path builds a cache

    return DynamicCache(
        ddp_cache_data=[(_SelectRows.apply(k, index), _SelectRows.apply(v, index)) for k, v in layers_kv]
    )


def _prompt_kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) from `cache` after the prompt forward. The shared-prefix models are
    full attention (SHARED_PREFIX_MODEL_TYPES): every layer is a key/value layer that forward filled."""
    from transformers.cache_utils import CacheLayerMixin  # heavy (transformers): only the shared-prefix path

    layers_kv = []
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
            raise RuntimeError(f"shared-prefix forward: cache layer {i} ({type(layer).__name__}) holds no keys/values")
        layers_kv.append((layer.keys, layer.values))
    return layers_kv


def _shared_prefix_logps(
    model, ids, attention, positions, p: int, lengths: torch.Tensor, temperature: float, with_entropy: bool | str
):
    """(logps [B, t_b], entropy [B, t_b] or None) from one forward per distinct prompt, then the responses
    packed into lines on the expanded cache; None when no prompt repeats (the padded forward then costs
    the same or less). t_b is the longest response of the micro-batch."""
    from transformers import DynamicCache  # heavy (transformers): only the shared-prefix path builds a cache

    if p == 0:
        return None
    first, prompt_of_row = distinct_prompts(ids[:, :p], attention[:, :p])  # [U], [B]
    if len(first) == len(ids):
        return None
    kw = cache_kwarg(_base_model(model))
    if kw is None:  # no KV-cache argument (shared_prefix_supported says False): the padded forward
        return None
    cache = DynamicCache()
    prompt_logits = model(
        input_ids=ids[first, :p],
        attention_mask=attention[first, :p],
        position_ids=positions[first, :p],
        use_cache=True,
        logits_to_keep=1,
        **{kw: cache},
    ).logits  # [U, 1, V]: predicts response token 0
    # Response token 0 of every row is predicted by its prompt's last position.
    head = _token_logps(prompt_logits.index_select(0, prompt_of_row), ids[:, p : p + 1], temperature, with_entropy)
    fed = lengths - 1  # [B] response positions a row feeds: its last token predicts nothing the loss uses
    width = int(fed.max())
    if width == 0:
        return head
    layers_kv = _prompt_kv(cache)  # per layer [U, kv, P, D]

    # Pack: rows of one prompt share lines of `width` slots, so padding is what first-fit leaves over.
    place, line_prompt = pack_rows(fed.tolist(), prompt_of_row.tolist(), width)
    n_lines, device = len(line_prompt), ids.device
    k = torch.arange(width, device=device)  # [W]
    fed_here = k[None, :] < fed[:, None]  # [B, W] row i feeds its positions k < fed_i
    start = torch.tensor([line * width + offset for line, offset in place], device=device)  # [B]
    slot = torch.where(fed_here, start[:, None] + k[None, :], 0)  # [B, W] flat slot of each fed position
    dest = slot[fed_here]  # [F]
    line_ids = torch.zeros(n_lines * width, dtype=ids.dtype, device=device)  # [L*W]; empty slots: outputs unread
    line_ids[dest] = ids[:, p : p + width][fed_here]
    line_targets = torch.zeros_like(line_ids)  # [L*W] position k predicts response token k+1
    line_targets[dest] = ids[:, p + 1 : p + 1 + width][fed_here]
    line_pos = torch.zeros_like(line_ids)  # [L*W] each row keeps its own positions
    line_pos[dest] = positions[:, p : p + width][fed_here]
    segment = torch.full((n_lines * width,), -1, device=device)  # [L*W] row that fed each slot
    segment[dest] = torch.arange(len(ids), device=device)[:, None].expand_as(fed_here)[fed_here]
    segment = segment.view(n_lines, width)  # [L, W]
    line_prompt_t = torch.tensor(line_prompt, device=device)  # [L]
    # A query sees its prompt's real positions and the earlier positions of its own row (block-causal).
    own_row = (segment[:, :, None] == segment[:, None, :]) & (segment[:, None, :] >= 0)  # [L, W, W]
    own_row &= torch.ones(width, width, dtype=torch.bool, device=device).tril()
    prompt_keys = attention[first[line_prompt_t], :p].bool()[:, None, :].expand(n_lines, width, p)  # [L, W, P]
    allowed = torch.cat([prompt_keys, own_row], dim=2)[:, None]  # [L, 1, W, P+W]; empty slots see the prompt
    logits = model(
        input_ids=line_ids.view(n_lines, width),
        attention_mask=_attention_bias(model, allowed),
        position_ids=line_pos.view(n_lines, width),
        use_cache=True,
        **{kw: _expanded_cache(layers_kv, line_prompt_t)},
    ).logits  # [L, W, V]
    line_logps, line_entropy = _token_logps(logits, line_targets.view(n_lines, width), temperature, with_entropy)
    logps = torch.where(fed_here, line_logps.reshape(-1)[slot], 0.0)  # [B, W] unpacked, 0 where not fed
    entropy = None if line_entropy is None else torch.where(fed_here, line_entropy.reshape(-1)[slot], 0.0)
    return (
        torch.cat([head[0], logps], dim=1),  # [B, 1+W]
        None if entropy is None else torch.cat([head[1], entropy], dim=1),
    )


def _attention_bias(model, allowed: torch.Tensor) -> torch.Tensor:
    """The 4-D mask as the model's attention takes it: boolean for SDPA, additive float for eager."""
    if _base_model(model).config._attn_implementation == "eager":
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return allowed

"""Pure helpers of the TRL adapter (no TRL trainer state): the TA-GRPO dataset expansion and the sampler
that keeps a question's N+1 rows together, anchor slot choice, and TRL's loss normalisers expressed as
regroup's aggregation totals. Tested without building a trainer; `regroup.integrations.trl` re-exports
them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Sampler

# Dataset columns the TA expansion adds (one row per (question, variant)).
GROUP_ID, VARIANT, Q0_PROMPT = "regroup_group_id", "regroup_variant", "regroup_q0_prompt"
# Batch keys the adapter adds to TRL's generation batch (all [B] or [B, T], so TRL shuffles / splits them).
SAMPLE_WEIGHT, ANCHOR_MASK, IS_ANCHOR = "regroup_sample_weight", "regroup_anchor_mask", "regroup_is_anchor"

ANCHOR_WHEN = ("always", "no_correct")
ANCHOR_MODES = ("replace",)
RATIO_ANCHORS = ("original", "own")
# TRL loss_type -> regroup aggregation mode computing the same loss (see `loss_totals`).
LOSS_AGG = {"dapo": "token_mean", "grpo": "seq_mean_token_mean", "dr_grpo": "seq_sum_constant", "bnpo": "token_mean"}

# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


def _with_variant(prompt: Any, variant: Any) -> Any:
    """The q0 prompt with its question replaced by `variant` (a string), or `variant` itself if it is a prompt."""
    if isinstance(prompt, str):
        if not isinstance(variant, str):
            kind = type(variant).__name__
            raise ValueError(f"the prompt is plain text, so each variant must be a string, got {kind}")
        return variant
    if isinstance(variant, list):  # a full conversation, used as given
        return variant
    if not isinstance(variant, str):
        raise ValueError(f"a variant must be a string or a message list, got {type(variant).__name__}")
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise ValueError("a conversational prompt needs a user message to put the variant question into")
    messages[users[-1]]["content"] = variant  # the question is the last user turn; system turns stay
    return messages


def prompt_question(prompt: Any) -> str:
    """The question text of a prompt: the string itself, or the last user message's text."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content blocks: keep the text parts
                return "".join(p.get("text", "") for p in content if p.get("type") == "text")
            return str(content)
    return ""


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: the string, or the content of its last (assistant) message."""
    if isinstance(completion, str):
        return completion
    if completion and isinstance(completion, list):
        return str(completion[-1].get("content", ""))
    return ""


def expand_variants(
    dataset: Any, variants_column: str = "variants", num_variants: int | None = None
) -> tuple[Any, int]:
    """The TA-GRPO dataset (SPEC §3.1–2): every row becomes N+1 consecutive rows q0, q1..qN.

    Each output row keeps all columns, has `prompt` set to its variant's prompt, and gains `regroup_group_id`
    (the source row index), `regroup_variant` (0 = q0) and `regroup_q0_prompt`. Row `q·(N+1)+k` is variant
    k of question q. Returns `(dataset, N)`. Needs a map-style `datasets.Dataset` with a `prompt` column.
    """
    if not hasattr(dataset, "map") or not hasattr(dataset, "__len__") or not hasattr(dataset, "column_names"):
        raise TypeError(
            f"TA pooling needs a map-style datasets.Dataset (it expands and samples rows by index), got "
            f"{type(dataset).__name__}"
        )
    columns = list(dataset.column_names)
    for needed in ("prompt", variants_column):
        if needed not in columns:
            raise ValueError(f"TA pooling: the training dataset has no {needed!r} column (columns: {columns})")
    for taken in (GROUP_ID, VARIANT, Q0_PROMPT):
        if taken in columns:
            raise ValueError(f"TA pooling: the dataset already has a column {taken!r}, which the adapter adds")
    if len(dataset) == 0:
        raise ValueError("TA pooling: the training dataset is empty")
    counts = [len(v) if v is not None else 0 for v in dataset[variants_column]]
    if num_variants is None:
        n = counts[0]
        bad = next((i for i, c in enumerate(counts) if c != n), None)
        if bad is not None:
            raise ValueError(
                f"TA pooling: rows have different numbers of variants (row 0: {n}, row {bad}: {counts[bad]}); "
                f"set num_variants to cut them to a common N"
            )
    else:
        n = num_variants
        bad = next((i for i, c in enumerate(counts) if c < n), None)
        if bad is not None:
            raise ValueError(f"TA pooling: row {bad} has {counts[bad]} variants, fewer than num_variants={n}")
    if n < 1:
        raise ValueError(f"TA pooling: rows need at least one variant in column {variants_column!r}, got {n}")

    def expand(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out: dict[str, list] = {key: [] for key in batch}
        out.update({GROUP_ID: [], VARIANT: [], Q0_PROMPT: []})
        for j, index in enumerate(indices):
            q0 = batch["prompt"][j]
            prompts = [q0] + [_with_variant(q0, v) for v in list(batch[variants_column][j])[:n]]
            for k, prompt in enumerate(prompts):
                for key in batch:
                    out[key].append(prompt if key == "prompt" else batch[key][j])
                out[GROUP_ID].append(index)
                out[VARIANT].append(k)
                out[Q0_PROMPT].append(q0)
        return out

    expanded = dataset.map(expand, batched=True, with_indices=True, remove_columns=columns)
    return expanded, n


class PooledRepeatSampler(Sampler[int]):
    """TRL's `RepeatSampler` over whole TA pools: shuffles questions, not rows, so that a question's
    `pool_size` consecutive rows (q0..qN) always fall in the same chunk of `batch_size` unique rows, i.e.
    the same generation batch. Yields each row `mini_repeat_count` times (TRL's G), each chunk
    `repeat_count` times (TRL's num_iterations × steps_per_generation), and drops a final partial chunk.
    """

    def __init__(
        self,
        num_rows: int,
        pool_size: int,
        mini_repeat_count: int,
        batch_size: int,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> None:
        if pool_size < 1 or num_rows % pool_size != 0:
            raise ValueError(f"num_rows ({num_rows}) must be a multiple of pool_size ({pool_size})")
        if batch_size % pool_size != 0:
            raise ValueError(
                f"the unique prompts per generation batch ({batch_size}) must be a multiple of the pool size "
                f"N+1 = {pool_size}, so that a question and all its variants are generated together"
            )
        self.num_rows, self.pool_size, self.batch_size = num_rows, pool_size, batch_size
        self.mini_repeat_count, self.repeat_count, self.shuffle = mini_repeat_count, repeat_count, shuffle
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        num_questions = self.num_rows // self.pool_size
        if self.shuffle:
            order = torch.randperm(num_questions, generator=self.generator).tolist()
        else:
            order = list(range(num_questions))
        rows = [q * self.pool_size + k for q in order for k in range(self.pool_size)]
        for start in range(0, len(rows) - self.batch_size + 1, self.batch_size):
            chunk = rows[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return (self.num_rows // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count


def anchor_slots(
    group_ids: Tensor,
    variants: Tensor,
    rewards: Tensor,
    *,
    when: str = "always",
    correct_reward: float = 1.0,
) -> Tensor:
    """Which samples an anchor replaces (SPEC §2b.2, replace mode): bool [B].

    One slot per group: its last sample (in batch order) with `variants == 0` (a q0 sample, so the
    anchor answers q0). With `when="no_correct"` a group gets a slot only if none of its rewards is
    `>= correct_reward` (NaN = unscored counts as not correct).
    """
    if when not in ANCHOR_WHEN:
        raise ValueError(f"when must be one of {ANCHOR_WHEN}, got {when!r}")
    if not (group_ids.shape == variants.shape == rewards.shape) or group_ids.dim() != 1:
        raise ValueError(
            f"group_ids {tuple(group_ids.shape)}, variants {tuple(variants.shape)} and rewards "
            f"{tuple(rewards.shape)} must all be 1-D of the same length"
        )
    gids, var = group_ids.tolist(), variants.tolist()
    correct = (torch.isfinite(rewards) & (rewards >= correct_reward)).tolist()  # NaN, inf: not correct
    last: dict[Any, int] = {}
    has_correct: dict[Any, bool] = {}
    for i, g in enumerate(gids):
        if var[i] == 0:
            last[g] = i
        has_correct[g] = has_correct.get(g, False) or correct[i]
    slots = torch.zeros(len(gids), dtype=torch.bool, device=group_ids.device)
    for g, i in last.items():
        if when == "always" or not has_correct[g]:
            slots[i] = True
    return slots


def loss_totals(
    loss_type: str,
    *,
    loss_mask: Tensor,
    num_items_in_batch: float,
    num_processes: int,
    grad_accum: int,
    steps_per_generation: int,
    max_completion_length: int,
) -> tuple[str, dict[str, Any]]:
    """regroup aggregation mode + whole-batch totals that reproduce TRL 1.16's normaliser for `loss_type`.

    TRL (`_compute_loss`) divides one micro-batch [B, T] by: dapo — `max(num_items, 1) / num_processes ·
    grad_accum / steps_per_generation` tokens; bnpo — its own loss tokens · grad_accum; grpo — `B ·
    grad_accum` sequences (token mean per sequence first); dr_grpo — `B · grad_accum · max_completion_length`.
    Returns `(agg, totals)` for `regroup.algo.losses.policy_loss(..., agg=agg, **totals)`.
    """
    if loss_type not in LOSS_AGG:
        raise ValueError(
            f"loss_type {loss_type!r} is not supported by the regroup adapter; use one of {sorted(LOSS_AGG)}"
        )
    batch = int(loss_mask.shape[0])
    if loss_type == "dapo":
        total_tokens = max(float(num_items_in_batch), 1.0) / num_processes * grad_accum / steps_per_generation
    elif loss_type == "bnpo":
        total_tokens = max(float(loss_mask.sum()), 1.0) * grad_accum
    else:  # unused by the sequence modes; any valid value
        total_tokens = float(loss_mask.sum())
    totals = dict(
        total_tokens=total_tokens,
        total_sequences=max(batch * grad_accum, 1),
        max_completion_length=max_completion_length,
    )
    return LOSS_AGG[loss_type], totals


def _pad_right(t: Tensor, width: int, value: float) -> Tensor:
    """`t` [B, T, ...] right-padded with `value` to [B, width, ...]."""
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    filler = torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, filler], dim=1)

"""Samples and the tensor batch the update consumes.

Every sample carries its own `group_id`, `question_id`, `variant` and `is_anchor`: the variants add,
pool and drop samples, so nothing downstream may depend on a sample's position in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Sample:
    """One response in a group."""

    group_id: int
    """Samples whose rewards are compared with each other share it (TA-GRPO: all N+1 variants)."""
    question_id: str
    """Id of the original question q0."""
    variant: int
    """0 = the original question; k > 0 = the k-th rephrasing."""
    is_anchor: bool
    """An off-policy solution (DaGRPO anchor), not sampled from pi_old."""
    prompt_ids: list[int]
    """The prompt the response answered (its own variant's prompt)."""
    ratio_prompt_ids: list[int]
    """The prompt log-probs are computed on: q0's for TA-GRPO ratio_anchor=original, else prompt_ids."""
    response_ids: list[int]
    """Response tokens (ending with EOS unless truncated)."""
    response_text: str
    behaviour_logps: list[float] | None = None
    """The sampler's per-token log-probs (None for anchors and backends that give none)."""
    truncated: bool = False
    reward: float | None = None
    """Verifiable reward; None = could not be scored."""
    score: float | None = None
    """Fine-grained score in [1, 10] for DaGRPO masking; None = not scored."""
    problem: Any = field(default=None, repr=False)
    """The original Problem (grading and scoring go against q0's answer and reference)."""
    question_text: str | None = None
    """The question this response answered (q0 or a rephrasing); None = the problem's own question."""
    policy_version: int | None = None
    """The policy version that drew it (async rollouts); None: the live weights, or an anchor."""


@dataclass
class RolloutBatch:
    """Tensors of a list of samples, prompts left-padded and responses right-padded."""

    input_ids: torch.Tensor  # [B, P+T] ratio prompt then response
    attention_mask: torch.Tensor  # [B, P+T]
    position_ids: torch.Tensor  # [B, P+T]
    completion_mask: torch.Tensor  # [B, T] 1 on response tokens (the loss mask)
    sampled_mask: torch.Tensor  # [B, T] bool: token sampled from pi_old (False for anchor / forced tokens)
    behaviour_logps: torch.Tensor  # [B, T] sampler log-probs (0 where unknown)
    has_behaviour_logps: torch.Tensor  # [B] bool
    on_sampled_prompt: torch.Tensor  # [B] bool: scored on the prompt that drew it (False: a TA-GRPO rephrasing
    # whose ratio is on q0, ratio_anchor=original: its behaviour log-probs belong to another prompt)
    rewards: torch.Tensor  # [B] float, NaN = unscored
    group_ids: torch.Tensor  # [B] long
    is_anchor: torch.Tensor  # [B] bool

    @property
    def completion_length(self) -> int:
        return self.completion_mask.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def behaviour_rows(self) -> torch.Tensor:
        """[B] bool: rows whose behaviour log-probs compare with the learner's: sampled by the engine, on
        the prompt the learner scores."""
        return self.has_behaviour_logps & self.on_sampled_prompt  # [B]

    @property
    def behaviour_usable(self) -> torch.Tensor:
        """[B, T] bool: tokens whose behaviour log-prob compares with the learner's: sampled by the engine,
        in a `behaviour_rows` row, with a finite value."""
        return self.sampled_mask & self.behaviour_rows[:, None] & self.behaviour_logps.isfinite()  # [B, T]

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        """Rows `index` of every tensor (used for micro-batches)."""
        return RolloutBatch(**{k: v[index] for k, v in self.__dict__.items()})


def collate(samples: list[Sample], pad_id: int, completion_length: int | None = None) -> RolloutBatch:
    """Stack samples into a RolloutBatch. `completion_length` pads responses to a fixed T (else the max)."""
    b = len(samples)
    p = max(len(s.ratio_prompt_ids) for s in samples)
    t = completion_length or max(max(len(s.response_ids) for s in samples), 1)
    input_ids = torch.full((b, p + t), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p + t), dtype=torch.long)
    sampled = torch.zeros((b, t), dtype=torch.bool)
    behaviour = torch.zeros((b, t), dtype=torch.float32)
    for row, s in enumerate(samples):
        prompt, resp = s.ratio_prompt_ids, s.response_ids[:t]
        input_ids[row, p - len(prompt) : p] = torch.tensor(prompt, dtype=torch.long)
        attention[row, p - len(prompt) : p] = 1
        if resp:
            input_ids[row, p : p + len(resp)] = torch.tensor(resp, dtype=torch.long)
            attention[row, p : p + len(resp)] = 1
            sampled[row, : len(resp)] = not s.is_anchor
        if s.behaviour_logps is not None and len(resp):
            behaviour[row, : len(resp)] = torch.tensor(s.behaviour_logps[: len(resp)], dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    nan = float("nan")
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        completion_mask=attention[:, p:].float(),
        sampled_mask=sampled,
        behaviour_logps=behaviour,
        has_behaviour_logps=torch.tensor([s.behaviour_logps is not None for s in samples]),
        on_sampled_prompt=torch.tensor([s.ratio_prompt_ids == s.prompt_ids for s in samples]),
        rewards=torch.tensor(
            [nan if s.reward is None or not math.isfinite(s.reward) else s.reward for s in samples], dtype=torch.float32
        ),
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
        is_anchor=torch.tensor([s.is_anchor for s in samples], dtype=torch.bool),
    )

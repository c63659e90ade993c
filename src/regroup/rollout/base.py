"""The seam every rollout backend (HF loop, vLLM) fits: sampling settings in, completions out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    n: int = 1


@dataclass
class Completion:
    """One sampled response. `logps` are the sampler's per-token log-probs of the temperature-scaled
    distribution (behaviour log-probs), or None when the backend does not give them."""

    prompt_index: int
    token_ids: list[int]
    text: str
    logps: list[float] | None
    truncated: bool
    policy_version: int | None = None
    """The policy version that drew it (async rollouts, `rollout.versions`); None: the live weights."""


class Sampler(Protocol):
    """A rollout backend. `generate` returns n completions per prompt, prompt-major order."""

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[Completion]: ...

    def sync_weights(self, model) -> None:
        """Make the backend sample from `model`'s current weights (no-op when it shares the model)."""
        ...

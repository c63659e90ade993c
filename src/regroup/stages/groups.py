"""Group construction: which prompts are sampled how often, and which group each sample joins.

GRPO: G samples of q0 per group. Matched control: multiplier·G samples of q0. TA-GRPO (SPEC §3.2):
G samples of q0 and G of each rephrasing q1..qN, all sharing ONE group id. Anchors that replace an
on-policy sample (SPEC §2b.2) reserve a slot, so q0 gets G − reserved samples.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSlot:
    """One prompt to sample `num_samples` times; its responses join group `group_id`."""

    group_id: int
    question_index: int
    """Index of the original question in the step's question list."""
    variant: int
    """0 = the original question q0, k = the k-th rephrasing."""
    text: str
    num_samples: int


def expand_groups(
    questions: list[str],
    variants: list[list[str]] | None,
    group_ids: list[int],
    num_generations: int,
    samples_multiplier: int = 1,
    reserved: list[int] | None = None,
) -> list[PromptSlot]:
    """The step's prompt slots, question-major: q0 first, then its variants.

    questions[i] gets group id group_ids[i]; variants[i] (may be empty: a question whose rephrasings
    all failed trains with its original alone) adds G samples each; reserved[i] slots of q0 are left for
    anchors.
    """
    if len(group_ids) != len(questions):
        raise ValueError(f"{len(group_ids)} group ids for {len(questions)} questions")
    slots: list[PromptSlot] = []
    for i, question in enumerate(questions):
        own = num_generations * samples_multiplier - (reserved[i] if reserved else 0)
        if own > 0:
            slots.append(PromptSlot(group_ids[i], i, 0, question, own))
        for k, text in enumerate(variants[i] if variants else [], start=1):
            slots.append(PromptSlot(group_ids[i], i, k, text, num_generations))
    return slots


def sampling_seed(run_seed: int, step: int, group_id: int, variant: int) -> int:
    """A prompt's sampling seed, a function of what it is and not of where it sits in the batch or on
    which process it is sampled (so 1- and 2-process runs draw the same responses)."""
    return (run_seed * 1_000_003 + step * 10_007 + group_id * 101 + variant) % (2**62)

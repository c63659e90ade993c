"""Group construction: which prompts are sampled how often, which group each sample joins, and its seed.

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


def samples_per_question(
    num_generations: int, samples_multiplier: int = 1, n_variants: int = 0, anchors_added: int = 0
) -> int:
    """Responses in one question's group: multiplier·G of q0, G per rephrasing, plus anchors in `add` mode.

    The one definition used by the trainer, the demo's equal-sample budgets and DeepSpeed's batch check.
    """
    return num_generations * samples_multiplier + num_generations * n_variants + anchors_added


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


# Radices of the per-sample seed. With at most 100 rephrasings and 64 samples per prompt they give the
# seeds regroup has always used; larger G or N widen them, so no two samples of a step share a seed.
_MIN_VARIANT_RADIX = 101
_MIN_SAMPLE_RADIX = 64


def sample_seed(
    run_seed: int, step: int, group_id: int, variant: int, index: int, *, max_variants: int = 0, max_samples: int = 1
) -> int:
    """The sampling seed of the `index`-th sample of (group, variant), a function of what the sample is and
    not of where it sits in the batch or on which process it is sampled (so 1- and 2-process runs draw the
    same responses).

    Injective within a step: group ids are unique in a step, `variant < variant_radix` and
    `index < sample_radix`, so (group, variant, index) is a mixed-radix number. `max_variants` (N) and
    `max_samples` (samples per prompt) size the radices.
    """
    variant_radix = max(_MIN_VARIANT_RADIX, max_variants + 1)
    sample_radix = max(_MIN_SAMPLE_RADIX, max_samples)
    if not 0 <= variant < variant_radix or not 0 <= index < sample_radix:
        raise ValueError(f"variant {variant} / sample index {index} out of range ({variant_radix}, {sample_radix})")
    prompt_key = (
        run_seed * 1_000_003
        + step * 10_007 * (variant_radix // _MIN_VARIANT_RADIX)
        + group_id * variant_radix
        + variant
    )
    return (prompt_key * sample_radix + index) % (2**62)

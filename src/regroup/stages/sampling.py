"""The sampling stage: expand this process's questions into prompt slots, sample, and make `Sample`s."""

from __future__ import annotations

import time

from regroup.batch import Sample
from regroup.config.registry import STAGES
from regroup.stages.base import StepBatch, StepContext
from regroup.stages.groups import expand_groups, sample_seed


class SampleResponses:
    """G samples of q0 (multiplier·G for the matched control) and G of each variant, one group id per question.

    `ratio_on_original` (TA-GRPO, SPEC §3.4): every response's log-probs are taken on (q0, o).
    """

    name = "sample"
    round_totals = ("time/rollout", "tokens/generated")  # summed over refill rounds (`stages.base.merge_rounds`)
    round_rates = {"tokens_per_s": ("tokens/generated", "time/rollout")}

    def __init__(self, ratio_on_original: bool = False):
        self.ratio_on_original = ratio_on_original

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        slots = expand_groups(
            [p.question for p in batch.problems],
            batch.variants,
            batch.group_ids,
            ctx.num_generations,
            ctx.samples_multiplier,
            batch.reserved,
        )
        rows = [(slot, j) for slot in slots for j in range(slot.num_samples)]
        per_prompt = max([s.num_samples for s in slots], default=1)
        seeds = [
            sample_seed(
                ctx.seed, batch.step, s.group_id, s.variant, j, max_variants=ctx.n_variants, max_samples=per_prompt
            )
            for s, j in rows
        ]
        encode = ctx.encode_prompt
        if encode is None:
            raise RuntimeError("SampleResponses needs StepContext.encode_prompt (the front-end's prompt encoder)")
        t0 = time.perf_counter()
        completions = ctx.sampler.generate([encode(s.text) for s, _ in rows], ctx.sampling_params, seed=seeds)
        elapsed = time.perf_counter() - t0
        for (slot, _), c in zip(rows, completions):
            problem = batch.problems[slot.question_index]
            own_prompt = encode(slot.text)
            batch.samples.append(
                Sample(
                    group_id=slot.group_id,
                    question_id=problem.id,
                    variant=slot.variant,
                    is_anchor=False,
                    prompt_ids=own_prompt,
                    ratio_prompt_ids=encode(problem.question) if self.ratio_on_original else own_prompt,
                    response_ids=c.token_ids,
                    response_text=c.text,
                    behaviour_logps=c.logps,
                    truncated=c.truncated,
                    problem=problem,
                    question_text=slot.text,
                    policy_version=getattr(c, "policy_version", None),
                )
            )
        generated = sum(len(c.token_ids) for c in completions)
        return {
            "time/rollout": elapsed,
            "tokens/generated": float(generated),
            "tokens_per_s": generated / max(elapsed, 1e-9),
        }


STAGES.register(SampleResponses.name, SampleResponses)

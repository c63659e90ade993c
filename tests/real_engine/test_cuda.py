"""The colocated engine's CUDA-only checks, for a lent GPU with vLLM installed (benchmarks/gpu_session.sh):
a bf16 weight push read back from the engine, sleep mode (level 2: wake, push, sample, sleep), tokens/s.
Skipped without CUDA. Model: $REGROUP_SMOLLM2 / .cache/smollm2 when there, else a random-weight
Qwen3-shaped model built here (a GPU machine that cannot install packages cannot fetch SmolLM2)."""

from __future__ import annotations

import time

import pytest
import torch
from real_vllm import close_engine, learner_state, logp_differences, max_weight_difference, sample, start_engine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-only checks of the colocated vLLM engine"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import os

    from real_vllm import ROOT

    for path in (os.environ.get("REGROUP_SMOLLM2"), str(ROOT / ".cache" / "smollm2")):
        if path and os.path.isfile(os.path.join(path, "config.json")):
            return path
    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("qwen3-random")
    tokenizer = build_tokenizer()
    build_model(
        tokenizer, TinyModelConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1536), seed=0
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def perturb(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.02 * float(p.float().std())).to(p.device, p.dtype))


def prompts_of(tokenizer, count: int) -> list[list[int]]:
    return [tokenizer.encode(f"What is {i} + {i + 3}?") for i in range(count)]


def test_bf16_push_tokens_per_s_and_sleep_mode(model_dir, figures):
    sampler, model, tokenizer = start_engine(
        model_dir, torch.bfloat16, figures, "bf16, CUDA", device="cuda", vllm_gpu_memory_utilization=0.3
    )
    try:
        perturb(model, 0)
        sampler.sync_weights(model)
        worst, where = max_weight_difference(sampler.llm, learner_state(model))
        figures["CUDA bf16 push: max |engine - learner|"] = worst
        assert worst == 0.0, where
        prompts = prompts_of(tokenizer, 32)
        start = time.perf_counter()
        out = sample(sampler, prompts, n=8, max_new_tokens=128, seed=1)
        seconds = time.perf_counter() - start
        figures["CUDA bf16 tokens/s (32 prompts x 8 x <=128 tokens)"] = round(
            sum(len(c.token_ids) for c in out) / seconds
        )
        diff = logp_differences(model, prompts[:4], [c for c in out if c.prompt_index < 4])
        figures["CUDA bf16 |logp vLLM - learner|"] = {"max": float(diff.max()), "mean": float(diff.mean())}
    finally:
        close_engine(sampler)
    # sleep mode: asleep between rollouts, weights pushed again at each wake-up
    sampler, model, tokenizer = start_engine(
        model_dir, torch.bfloat16, None, device="cuda", vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=True
    )
    try:
        assert sampler._asleep
        perturb(model, 1)
        sampler.sync_weights(model)  # asleep: pushed at the next wake-up
        prompts = prompts_of(tokenizer, 4)
        out = sample(sampler, prompts, n=2, max_new_tokens=16, seed=2)
        assert sampler._asleep
        diff = logp_differences(model, prompts, out)
        figures["CUDA sleep mode: |logp vLLM - learner| after wake + push"] = float(diff.max())
        assert float(diff.mean()) < 0.1
    finally:
        close_engine(sampler)

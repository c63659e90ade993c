"""The sampler factory: the rollout backend `rollout.backend` names (hf, hf_generate, vllm, vllm_server)."""

from __future__ import annotations

from regroup.rollout.hf import HFGenerateSampler, HFSampler
from regroup.rollout.vllm import VLLMSampler  # the vllm package itself is imported only when it starts
from regroup.rollout.vllm_server import VLLMServerSampler


def build_sampler(rollout_cfg, model, tokenizer, max_prompt_tokens: int | None = None):
    if rollout_cfg.backend == "hf":
        return HFSampler(model, tokenizer, batch_size=rollout_cfg.batch_size)
    if rollout_cfg.backend == "hf_generate":
        return HFGenerateSampler(model, tokenizer, batch_size=rollout_cfg.batch_size)
    if rollout_cfg.backend == "vllm_server":
        return VLLMServerSampler(model, tokenizer, rollout_cfg)
    return VLLMSampler(model, tokenizer, rollout_cfg, max_prompt_tokens=max_prompt_tokens)

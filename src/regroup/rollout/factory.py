"""The sampler factory: the rollout backend `rollout.backend` names (hf, hf_generate, vllm, vllm_server).

Under `rollout.async_steps` the engine samples while the learner trains, so it must hold its own weights:
the vLLM server does (another process); the HF loop gets its own copy of the model
(`owns_weights`), loaded with numbered snapshots by `rollout.versions`."""

from __future__ import annotations

import copy

from regroup.config.schema import RolloutConfig
from regroup.rollout.hf import HFGenerateSampler, HFSampler
from regroup.rollout.vllm import VLLMSampler  # the vllm package itself is imported only when it starts
from regroup.rollout.vllm_server import VLLMServerSampler


def own_copy(model):
    """A frozen copy of `model` for a sampler that must not see the learner's updates as they happen."""
    twin = copy.deepcopy(model)
    twin.requires_grad_(False)
    twin.eval()
    return twin


def build_sampler(rollout_cfg: RolloutConfig, model, tokenizer, max_prompt_tokens: int | None = None, log=None):
    """The sampler `rollout_cfg.backend` names; `log(line)` takes the warnings a backend gives while it runs
    (the vLLM server's: weights it did not load, `VLLMServerSampler`)."""
    asynchronous = getattr(rollout_cfg, "async_steps", 0) > 0
    if rollout_cfg.backend == "hf":
        if asynchronous:
            sampler = HFSampler(own_copy(model), tokenizer, batch_size=rollout_cfg.batch_size)
            sampler.owns_weights = True
            return sampler
        return HFSampler(model, tokenizer, batch_size=rollout_cfg.batch_size)
    if rollout_cfg.backend == "hf_generate":
        return HFGenerateSampler(model, tokenizer, batch_size=rollout_cfg.batch_size)
    if rollout_cfg.backend == "vllm_server":
        # async: the producer loads version 0 itself before the first batch
        return VLLMServerSampler(model, tokenizer, rollout_cfg, sync_on_start=not asynchronous, log=log)
    return VLLMSampler(model, tokenizer, rollout_cfg, max_prompt_tokens=max_prompt_tokens)

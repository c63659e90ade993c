"""Loading the policy (and, when beta > 0, the frozen reference) from any local HF causal-LM folder."""

from __future__ import annotations

import copy

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:  # many base models ship without a pad token
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(path: str, model_cfg, device: torch.device | str = "cpu"):
    """The trainable policy: dtype, gradient checkpointing and LoRA (peft) as configured."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[model_cfg.dtype])
    model.to(device)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if model_cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = model_cfg.lora
        model = get_peft_model(model, LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
        ))
    return model


class ReferenceModel:
    """The frozen reference for the k3 KL term. With LoRA it is the base model with adapters disabled
    (no second copy of the weights); otherwise a frozen copy of the starting policy."""

    def __init__(self, policy):
        self._uses_adapter = hasattr(policy, "disable_adapter")
        if self._uses_adapter:
            self._policy = policy
            self.model = None
        else:
            self.model = copy.deepcopy(policy).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)

    def __call__(self, fn):
        """Run `fn(model)` with the reference weights, without gradients."""
        with torch.no_grad():
            if self._uses_adapter:
                with self._policy.disable_adapter():
                    return fn(self._policy)
            return fn(self.model)

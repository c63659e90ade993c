"""LoRA end to end on the tiny random model: only adapters train, the KL reference is the base model
(adapters disabled, no second copy), and the adapter checkpoint reloads and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from regroup.runtime.checkpoint import list_checkpoints, load_model_weights
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def lora_config(model_dir, run_dir, *extra):
    # digit_reward: a random model's groups are mixed under it, so every step really updates.
    return load_config(
        CONFIGS / "grpo.yaml",
        [
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            "data.num_train=64",
            "grpo.prompts_per_step=4",
            "grpo.num_generations=4",
            "rollout.max_new_tokens=12",
            "train.steps=3",
            "train.checkpoint_every=2",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "diagnostics.grad_conflict_every=0",
            "optim.warmup_steps=1",
            "optim.lr=1e-2",
            "rewards=[_dist_worker:digit_reward]",
            "model.lora.enabled=true",
            "model.lora.r=4",
            "model.lora.alpha=8",
            "grpo.beta=0.1",
            *extra,
        ],
    )


def named(model, adapters: bool) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ("lora_" in n) == adapters}


def test_lora_trains_only_adapters_against_the_base_reference(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = build_trainer(lora_config(tiny_model_dir, tmp_path / "run"), tmp_path / "run", log=lambda m: None)
    assert hasattr(trainer.model, "peft_config") and trainer.reference.model is None  # no copy of the weights
    base0, lora0 = named(trainer.model, adapters=False), named(trainer.model, adapters=True)
    assert lora0 and all(not p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)
    trainer.train()
    base1, lora1 = named(trainer.model, adapters=False), named(trainer.model, adapters=True)
    assert all(torch.equal(base0[k], base1[k]) for k in base0)
    b_keys = [k for k in lora0 if "lora_B" in k]
    assert all(float(lora0[k].abs().max()) == 0.0 for k in b_keys)  # peft starts B at zero ...
    assert max(float(lora1[k].abs().max()) for k in b_keys) > 1e-3  # ... and training moved it

    # The reference is the untouched base model; the trained policy is not.
    ids = torch.tensor([[5, 20, 30, 40, 50, 60]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        want = base(input_ids=ids).logits
        policy = trainer.model.eval()(input_ids=ids).logits
    got = trainer.reference(lambda m: m(input_ids=ids).logits)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert float((policy - want).abs().max()) > 1e-4

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # B = 0: the policy starts as the reference
    assert metrics[-1]["kl"] > 1e-5


def test_lora_checkpoint_reloads_and_resumes_exactly(tiny_model_dir, tmp_path):
    straight = build_trainer(lora_config(tiny_model_dir, tmp_path / "a"), tmp_path / "a", log=lambda m: None)
    straight.train()
    final = list_checkpoints(tmp_path / "a")[-1]
    assert (final / "adapter_model.safetensors").is_file() and (final / "adapter_config.json").is_file()

    # load_model_weights puts the adapter into a fresh LoRA-wrapped base model, exactly
    from regroup.models.load import load_policy

    fresh = load_policy(tiny_model_dir, straight.cfg.model, lora=True)
    load_model_weights(fresh, final)
    want = named(straight.model, adapters=True)
    got = named(fresh, adapters=True)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)

    # loadable without regroup: peft on top of the base folder
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), final)
    ids = torch.tensor([[5, 20, 30, 40]])
    with torch.no_grad():
        torch.testing.assert_close(
            plain.eval()(input_ids=ids).logits, straight.model.eval()(input_ids=ids).logits, atol=1e-5, rtol=0
        )

    # a run that stopped after its step-2 checkpoint resumes to the same adapters as the straight run
    crashed = build_trainer(lora_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", log=lambda m: None)
    for step in range(2):
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
    crashed.save()
    resumed = build_trainer(
        lora_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", resume=True, log=lambda m: None
    )
    assert resumed.step == 2
    resumed.train()
    got = named(resumed.model, adapters=True)
    assert all(torch.equal(want[k], got[k]) for k in want)

"""The GRPO trainer end to end on the tiny random model: files written, exact resume, NaN guard,
accumulation invariance, and every recipe running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from regroup.checkpoint import list_checkpoints
from regroup.config import load_config
from regroup.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def small_config(model_dir, run_dir, recipe="grpo.yaml", *extra):
    return load_config(CONFIGS / recipe, [
        f"model.path={model_dir}", f"run_dir={run_dir}", "data.num_train=64", "grpo.prompts_per_step=4",
        "grpo.num_generations=4", "rollout.max_new_tokens=12", "train.steps=4", "train.checkpoint_every=2",
        "train.progress=false", "diagnostics.diversity_every=2", "diagnostics.embedder=char-ngram",
        "optim.warmup_steps=1", "optim.lr=1e-3", *extra,
    ])


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_train_writes_metrics_checkpoints_and_config(tiny_model_dir, tmp_path):
    cfg = small_config(tiny_model_dir, tmp_path / "run", "grpo.yaml", "train.steps=3")
    Trainer(cfg, tmp_path / "run", log=lambda m: None).train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3]
    for key in ["reward/mean", "groups/uniform_frac", "groups/all_correct_frac", "groups/all_wrong_frac",
                "clip/low_frac", "clip/high_frac", "entropy", "grad_norm", "length/mean", "length/max",
                "length/truncated_frac", "tokens_per_s", "time/rollout", "time/reward", "time/update", "loss", "lr"]:
        assert key in lines[-1], key
    assert "diversity" in lines[1]
    assert (tmp_path / "run" / "config.yaml").exists()
    ckpts = list_checkpoints(tmp_path / "run")
    assert [p.name for p in ckpts] == ["step-000002", "step-000003"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpts[-1])  # loadable without regroup


def test_resume_is_bit_identical(tiny_model_dir, tmp_path):
    straight = Trainer(small_config(tiny_model_dir, tmp_path / "a"), tmp_path / "a", log=lambda m: None)
    straight.train()
    # a run "killed" after step 3: step 2 was checkpointed, step 3 is lost
    crashed = Trainer(small_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", log=lambda m: None)
    for step in range(3):
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
        if crashed.step == 2:
            crashed.save()
    resumed = Trainer(small_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", resume=True, log=lambda m: None)
    assert resumed.step == 2
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ma = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(l) for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    assert [m["reward/mean"] for m in ma] == [m["reward/mean"] for m in mb]


def test_nonfinite_loss_skips_the_update(tiny_model_dir, tmp_path, monkeypatch):
    import regroup.trainer as trainer_module

    real = trainer_module.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return loss * float("nan"), metrics

    trainer = Trainer(small_config(tiny_model_dir, tmp_path / "r"), tmp_path / "r", log=lambda m: None)
    before = weights(trainer.model)
    monkeypatch.setattr(trainer_module, "policy_loss", poisoned)
    metrics = trainer.train_step(0)
    assert calls["n"] > 0 and metrics["skipped_nonfinite"] == 1.0
    after = weights(trainer.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    monkeypatch.setattr(trainer_module, "policy_loss", real)
    metrics = trainer.train_step(1)
    assert metrics["skipped_nonfinite"] == 0.0
    assert all(torch.isfinite(v).all() for v in weights(trainer.model).values())


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
def test_micro_batch_accumulation_is_invariant(tiny_model_dir, tmp_path, agg):
    """1 micro-batch of 16 and 16 micro-batches of 1 give the same update."""
    results = []
    for mb in (16, 1):
        cfg = small_config(tiny_model_dir, tmp_path / f"{agg}{mb}", "grpo.yaml", f"grpo.micro_batch_size={mb}",
                           f"grpo.loss_agg={agg}", "optim.max_grad_norm=1e9")
        trainer = Trainer(cfg, tmp_path / f"{agg}{mb}", log=lambda m: None)
        trainer.train_step(0)
        results.append(weights(trainer.model))
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("recipe", ["ta_grpo.yaml", "grpo_matched.yaml", "dagrpo.yaml", "dagrpo_mask_only.yaml", "dagrpo_ta.yaml"])
def test_every_recipe_runs(tiny_model_dir, tmp_path, recipe):
    cfg = small_config(tiny_model_dir, tmp_path / "run", recipe, "train.steps=2", "grpo.prompts_per_step=2")
    trainer = Trainer(cfg, tmp_path / "run", log=lambda m: None)
    metrics = trainer.train()
    assert metrics["skipped_nonfinite"] == 0.0
    if cfg.ta.enabled:
        assert "variant/acc/1" in metrics and "groups/per_question_uniform_frac" in metrics
    if cfg.mask.enabled:
        assert "mask/pos_frac" in metrics and "mask/neg_frac" in metrics
    if cfg.anchors.enabled:
        assert metrics["anchor/count"] == 2.0  # one reference anchor per question, always

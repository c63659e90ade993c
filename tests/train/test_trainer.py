"""The GRPO trainer end to end on the tiny random model: files written, exact resume, NaN guard,
accumulation invariance, and every recipe running."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import CONFIGS, Rewritten, small_config, weights

from regroup.algo.loss_config import resolve_loss
from regroup.runtime.checkpoint import list_checkpoints
from regroup.stages.base import StepBatch
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config
from regroup.train.trainer import Trainer


def test_train_writes_metrics_checkpoints_and_config(tiny_model_dir, tmp_path):
    cfg = small_config(tiny_model_dir, tmp_path / "run", "grpo.yaml", "train.steps=3")
    build_trainer(cfg, tmp_path / "run", log=lambda m: None).train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [1, 2, 3]
    for key in [
        "reward/mean",
        "groups/uniform_frac",
        "groups/all_correct_frac",
        "groups/all_wrong_frac",
        "clip/low_frac",
        "clip/high_frac",
        "entropy",
        "grad_norm",
        "length/mean",
        "length/max",
        "length/truncated_frac",
        "tokens_per_s",
        "time/rollout",
        "time/reward",
        "time/update",
        "loss",
        "lr",
    ]:
        assert key in lines[-1], key
    assert "diversity" in lines[1]
    assert (tmp_path / "run" / "config.yaml").exists()
    ckpts = list_checkpoints(tmp_path / "run")
    assert [p.name for p in ckpts] == ["step-000002", "step-000003"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpts[-1])  # loadable without regroup


def test_resume_is_bit_identical(tiny_model_dir, tmp_path):
    straight = build_trainer(small_config(tiny_model_dir, tmp_path / "a"), tmp_path / "a", log=lambda m: None)
    straight.train()
    # a run "killed" after step 3: step 2 was checkpointed, step 3 is lost
    crashed = build_trainer(small_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", log=lambda m: None)
    for step in range(3):
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
        if crashed.step == 2:
            crashed.save()
    resumed = build_trainer(
        small_config(tiny_model_dir, tmp_path / "b"), tmp_path / "b", resume=True, log=lambda m: None
    )
    assert resumed.step == 2
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ma = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    assert [m["reward/mean"] for m in ma] == [m["reward/mean"] for m in mb]


def test_nonfinite_loss_skips_the_update(tiny_model_dir, tmp_path, monkeypatch):
    import regroup.train.trainer as trainer_module

    real = trainer_module.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return loss * float("nan"), metrics

    trainer = build_trainer(small_config(tiny_model_dir, tmp_path / "r"), tmp_path / "r", log=lambda m: None)
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
        cfg = small_config(
            tiny_model_dir,
            tmp_path / f"{agg}{mb}",
            "grpo.yaml",
            f"grpo.micro_batch_size={mb}",
            f"grpo.loss_agg={agg}",
            "optim.max_grad_norm=1e9",
        )
        trainer = build_trainer(cfg, tmp_path / f"{agg}{mb}", log=lambda m: None)
        trainer.train_step(0)
        results.append(weights(trainer.model))
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "recipe", ["ta_grpo.yaml", "grpo_matched.yaml", "dagrpo.yaml", "dagrpo_mask_only.yaml", "dagrpo_ta.yaml"]
)
def test_every_recipe_runs(tiny_model_dir, tmp_path, recipe):
    cfg = small_config(
        tiny_model_dir, tmp_path / "run", recipe, "train.steps=2", "grpo.prompts_per_step=2", "anchors.max_tokens=64"
    )
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda m: None)
    metrics = trainer.train()
    assert metrics["skipped_nonfinite"] == 0.0
    if cfg.ta.enabled:
        assert "variant/acc/1" in metrics and "groups/per_question_uniform_frac" in metrics
    if cfg.mask.enabled:
        assert "mask/pos_frac" in metrics and "mask/neg_frac" in metrics
    if cfg.anchors.enabled:
        assert metrics["anchor/count"] == 2.0  # one reference anchor per question, always


# ---- training semantics the papers use, and the stages added beside them ----------------------------------


def test_mini_batches_make_k_optimizer_steps_with_pi_old_from_before_the_first(tiny_model_dir, tmp_path, monkeypatch):
    """grpo.mini_batches=2: two optimizer steps per rollout; the first equals a one-step update on its half,
    and the second sees ratios != 1 (pi_old was computed once, before the first step)."""
    cfg = small_config(tiny_model_dir, tmp_path / "mb", "grpo.yaml", "grpo.mini_batches=2", "optim.max_grad_norm=1e9")
    trainer = build_trainer(cfg, tmp_path / "mb", log=lambda m: None)
    batch, _ = trainer.collect(0)
    for i, s in enumerate(batch.samples):  # a random model earns no reward: set mixed rewards by hand
        s.reward = float(i % 3 == 0)
    batch.advantages = None
    next(s for s in trainer.recipe.stages if s.name == "advantages")(batch, trainer.ctx)
    n = len(batch.samples)
    grads, ratios = [], []
    real_step = trainer._optimizer_step

    def capture(loss_total):
        grads.append({k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None})
        return real_step(loss_total)

    import regroup.train.trainer as trainer_module

    real_loss = trainer_module.policy_loss

    def spy(logps, old, inputs, spec, totals):
        ratios.append(float((logps.detach() - old).abs().max()))
        return real_loss(logps, old, inputs, spec, totals)

    monkeypatch.setattr(trainer, "_optimizer_step", capture)
    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    metrics = trainer.update(batch)
    assert len(grads) == 2 and trainer.scheduler.last_epoch == 2
    # first mini-batch: pi_theta == pi_old (up to float noise of another micro-batch split); then it moved
    assert ratios[0] < 1e-5 and ratios[-1] > 1e-3
    assert "clip/low_frac" in metrics

    # the first mini-batch alone, through a fresh trainer with one mini-batch
    monkeypatch.setattr(trainer_module, "policy_loss", real_loss)
    cfg1 = small_config(tiny_model_dir, tmp_path / "one", "grpo.yaml", "optim.max_grad_norm=1e9")
    single = build_trainer(cfg1, tmp_path / "one", log=lambda m: None)
    half = StepBatch(step=0, samples=batch.samples[: n // 2], advantages=batch.advantages[: n // 2])
    one = []
    monkeypatch.setattr(
        single,
        "_optimizer_step",
        lambda lt: (
            one.append({k: p.grad.clone() for k, p in single.model.named_parameters() if p.grad is not None}) or {}
        ),
    )
    single.update(half)
    for k in one[0]:
        torch.testing.assert_close(grads[0][k], one[0][k], atol=1e-7, rtol=1e-5)


def test_epochs_stop_after_whole_passes(tiny_model_dir, tmp_path):
    cfg = small_config(
        tiny_model_dir, tmp_path / "ep", "grpo.yaml", "data.num_train=10", "train.epochs=2", "train.steps=100"
    )
    trainer = build_trainer(cfg, tmp_path / "ep", log=lambda m: None)
    assert trainer.total_steps == 5  # ceil(2 passes x 10 questions / 4 per step)
    trainer.train()
    assert trainer.step == 5 and trainer.stream.epoch * 10 + trainer.stream.position == 20  # exactly two passes


def test_samples_log_and_eval_during_training(tiny_model_dir, tmp_path):
    cfg = small_config(
        tiny_model_dir,
        tmp_path / "ev",
        "grpo.yaml",
        "train.steps=2",
        "train.eval_every=2",
        "train.eval_limit=4",
        "train.eval_n=2",
        "train.sample_every=2",
    )
    build_trainer(cfg, tmp_path / "ev", log=lambda m: None).train()
    lines = [json.loads(line) for line in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/pass@1" in lines[1] and "eval/pass@1" not in lines[0]
    assert 0.0 <= lines[1]["eval/pass@2"] <= 1.0
    records = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2}
    assert all({"question", "response", "reward", "advantage"} <= set(r) for r in records)


@pytest.mark.parametrize(
    "extra",
    [
        ("dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=2"),
        ("overlong.filter=true", "overlong.soft_punish=true", "overlong.buffer=4"),
        ("grpo.policy_loss=gspo", "grpo.num_iterations=2"),
    ],
)
def test_new_variants_train_and_resume_exactly(tiny_model_dir, tmp_path, extra):
    extra = (*extra, "rewards=[_dist_worker:digit_reward]")  # mixed groups from a random model
    straight = build_trainer(
        small_config(tiny_model_dir, tmp_path / "a", "grpo.yaml", *extra), tmp_path / "a", log=lambda m: None
    )
    last = straight.train()
    assert last["skipped_nonfinite"] == 0.0
    crashed = build_trainer(
        small_config(tiny_model_dir, tmp_path / "b", "grpo.yaml", *extra), tmp_path / "b", log=lambda m: None
    )
    for step in range(2):
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
    crashed.save()
    resumed = build_trainer(
        small_config(tiny_model_dir, tmp_path / "b", "grpo.yaml", *extra),
        tmp_path / "b",
        resume=True,
        log=lambda m: None,
    )
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if "dynamic_sampling.enabled=true" in extra:
        assert "dynamic/kept_groups" in last


def test_recipe_stage_lists():
    from regroup.tasks import get_task
    from regroup.train.recipes import build_recipe, describe

    def names(recipe, *extra):
        cfg = load_config(CONFIGS / recipe, list(extra))
        return build_recipe(
            cfg, get_task("arithmetic"), lambda t: [1] * len(t), "/tmp/unused", loss=resolve_loss(cfg)
        ).names

    assert names("grpo.yaml") == ["sample", "reward", "advantages"]
    assert names("ta_grpo.yaml") == ["variants", "sample", "reward", "advantages"]
    assert names("dagrpo.yaml") == ["anchor_slots", "sample", "reward", "anchors", "advantages", "mask"]
    assert names("dagrpo_ta.yaml") == ["variants", "anchor_slots", "sample", "reward", "anchors", "advantages", "mask"]
    assert names("grpo.yaml", "dynamic_sampling.enabled=true", "overlong.filter=true", "overlong.soft_punish=true") == [
        "sample",
        "reward",
        "overlong_penalty",
        "dynamic_sampling",
        "advantages",
        "overlong_filter",
    ]
    cfg = load_config(CONFIGS / "grpo.yaml", ["grpo.policy_loss=gspo"])
    assert "sequence (GSPO)" in describe(
        build_recipe(cfg, get_task("arithmetic"), lambda t: [1], "/tmp/unused", loss=resolve_loss(cfg))
    )


def test_report_to_tensorboard_through_accelerate(tiny_model_dir, tmp_path):
    from regroup.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'tensorboard'"):
        small_config(tiny_model_dir, tmp_path / "x", "grpo.yaml", "train.report_to=[tensorbord]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = small_config(
        tiny_model_dir,
        tmp_path / "tb",
        "grpo.yaml",
        "train.steps=2",
        "train.report_to=[tensorboard]",
        "train.sample_every=1",
    )
    build_trainer(cfg, tmp_path / "tb", log=lambda m: None).train()
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert (tmp_path / "tb" / "metrics.jsonl").exists()  # the JSONL stays the report's source


def _conflict_every(trainer) -> int:
    """The gradient-conflict hook's cadence among the trainer's update hooks (0: not among them)."""
    from regroup.diagnostics.grad_conflict import GradientConflict

    return next((h.every for h in trainer.update_hooks if isinstance(h, GradientConflict)), 0)


def test_gradient_conflict_default_depends_on_the_measured_size(tiny_model_dir, tmp_path, monkeypatch):
    import regroup.diagnostics.hooks as hooks_module

    cfg = small_config(tiny_model_dir, tmp_path / "gc", "grpo.yaml")
    assert _conflict_every(build_trainer(cfg, tmp_path / "gc", log=lambda m: None)) == 10  # tiny: on
    monkeypatch.setattr(hooks_module, "GRAD_CONFLICT_AUTO_LIMIT", 10)  # as if lm_head held more than the limit
    assert _conflict_every(build_trainer(cfg, tmp_path / "gc2", log=lambda m: None)) == 0
    cfg = small_config(tiny_model_dir, tmp_path / "gc3", "grpo.yaml", "diagnostics.grad_conflict_every=3")
    assert _conflict_every(build_trainer(cfg, tmp_path / "gc3", log=lambda m: None)) == 3


def test_gradient_conflict_runs_on_the_step_train_step_is_given(tiny_model_dir, tmp_path, monkeypatch):
    """The cadence follows the step being trained, not the loop's counter: a caller that drives
    `train_step(step)` itself (benchmarks/overhead.py) measured the diagnostic on every step before."""
    import regroup.diagnostics.grad_conflict as grad_conflict_module

    cfg = small_config(tiny_model_dir, tmp_path / "gc", "grpo.yaml", "diagnostics.grad_conflict_every=3")
    trainer = build_trainer(cfg, tmp_path / "gc", log=lambda m: None)
    calls = []
    monkeypatch.setattr(grad_conflict_module, "gradient_conflict", lambda *a, **k: calls.append(1) or {})
    measured = []
    for step in range(4):
        before = len(calls)
        trainer.train_step(step)
        measured.append(len(calls) > before)
    assert trainer.step == 0  # the loop's counter never moved
    assert measured == [True, False, False, True]


def test_sharded_checkpoint_path_saves_full_weights_and_training_state_and_resumes(
    tiny_model_dir, tmp_path, monkeypatch
):
    """The trainer's FSDP / ZeRO-3 save and resume path (gather + accelerate state), run in one process with
    `is_sharded` forced on; the collectives themselves are tested in 2 processes in tests/runtime/test_sharded.py."""
    from transformers import AutoModelForCausalLM

    import regroup.train.trainer as trainer_module

    straight = build_trainer(
        small_config(tiny_model_dir, tmp_path / "a", "grpo.yaml", "rewards=[_dist_worker:digit_reward]"),
        tmp_path / "a",
        log=lambda m: None,
    )
    straight.train()
    monkeypatch.setattr(trainer_module, "is_sharded", lambda acc: True)
    crashed = build_trainer(
        small_config(tiny_model_dir, tmp_path / "b", "grpo.yaml", "rewards=[_dist_worker:digit_reward]"),
        tmp_path / "b",
        log=lambda m: None,
    )
    for step in range(2):
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
    path = crashed.save()
    assert (path / "accelerate_state").is_dir() and (path / "model.safetensors").exists()
    assert not list((tmp_path / "b" / "checkpoints").glob(".sharded-*"))
    loaded = AutoModelForCausalLM.from_pretrained(path)  # plain HF weights
    assert all(torch.equal(v, crashed.model.state_dict()[k]) for k, v in loaded.state_dict().items())
    resumed = build_trainer(
        small_config(tiny_model_dir, tmp_path / "b", "grpo.yaml", "rewards=[_dist_worker:digit_reward]"),
        tmp_path / "b",
        resume=True,
        log=lambda m: None,
    )
    assert resumed.step == 2
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_over_long_questions_are_skipped_and_counted(tiny_model_dir, tmp_path):
    from regroup.data.load import save_problems
    from regroup.tasks import get_task

    problems = get_task("arithmetic").generate(12, seed=5)
    huge = problems[3].__class__(problems[3].id + "-huge", "x" * 50_000_000, problems[3].answer, problems[3].solution)
    data = tmp_path / "train.jsonl"
    save_problems(problems[:3] + [huge] + problems[3:], data)
    cfg = small_config(
        tiny_model_dir,
        tmp_path / "long",
        "grpo.yaml",
        f"data.train_file={data}",
        "data.task=arithmetic",
        "train.steps=3",
        "data.max_prompt_tokens=200",
        "rewards=[_dist_worker:digit_reward]",
    )
    trainer = build_trainer(cfg, tmp_path / "long", log=lambda m: None)
    last = trainer.train()
    assert last["data/skipped_long"] == 1.0  # the 50 MB question, never tokenized nor sampled


@pytest.mark.parametrize(
    "recipe,extra",
    [
        ("grpo.yaml", ()),
        ("grpo.yaml", ("grpo.mini_batches=2", "grpo.num_iterations=2", "grpo.micro_batch_size=3")),
        ("grpo.yaml", ("grpo.beta=0.05",)),
        ("dagrpo.yaml", ("anchors.max_tokens=64",)),
        ("ta_grpo.yaml", ("grpo.micro_batch_size=5",)),
    ],
)
def test_skipping_rows_without_gradient_changes_no_weight(tiny_model_dir, tmp_path, recipe, extra):
    """grpo.skip_zero_gradient_rows: the update leaves out rows of uniform groups (A = 0, beta = 0) and
    masked rows, and the weights after the step equal those of the update that forwards every row."""
    import copy

    def build(skip: bool) -> Trainer:
        cfg = small_config(
            tiny_model_dir,
            tmp_path / f"s{skip}",
            recipe,
            f"grpo.skip_zero_gradient_rows={str(skip).lower()}",
            "optim.max_grad_norm=1e9",
            *extra,
        )
        return build_trainer(cfg, tmp_path / f"s{skip}", log=lambda m: None)

    skipping, forwarding = build(True), build(False)
    batch, _ = skipping.collect(0)
    groups = sorted({s.group_id for s in batch.samples})
    for s in batch.samples:  # a random model earns no reward: group 0 all correct, group 1 all wrong, others mixed
        rank = groups.index(s.group_id)
        s.reward = 1.0 if rank == 0 else 0.0 if rank == 1 else float(hash((s.group_id, tuple(s.response_ids))) % 2)
    batch.advantages, batch.weights = None, None
    next(s for s in skipping.recipe.stages if s.name == "advantages")(batch, skipping.ctx)
    n = len(batch.samples)
    masked = [i for i in range(n) if float(batch.advantages[i]) != 0][:2]  # a mask (DaGRPO's) on two rows
    batch.multiply_weights(torch.tensor([0.0 if i in masked else 1.0 for i in range(n)]))
    carrying = int(((batch.advantages != 0) | (skipping.cfg.grpo.beta != 0)).logical_and(batch.weights != 0).sum())
    assert 0 < carrying < n, "the batch must hold rows of both kinds, or the test proves nothing"

    start = weights(skipping.model)
    m_skip = skipping.update(copy.deepcopy(batch))
    m_all = forwarding.update(copy.deepcopy(batch))
    if skipping.cfg.grpo.mini_batches == 1:
        assert m_skip["update/forwarded_frac"] == carrying / n
    else:
        assert m_skip["update/forwarded_frac"] < 1.0
    assert m_all["update/forwarded_frac"] == 1.0
    a, b = weights(skipping.model), weights(forwarding.model)
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-4, "the update did not move the weights"
    steps = skipping.cfg.grpo.mini_batches * skipping.cfg.grpo.num_iterations
    # one AdamW step: float noise only; four: Adam's m/sqrt(v) amplifies the summation-order noise of
    # near-zero gradient elements (1.3e-6 seen). A normaliser over the forwarded rows alone moves ~1e-4.
    tol = 1e-6 if steps == 1 else 1e-5
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=1e-5)
    assert m_skip["loss"] == pytest.approx(m_all["loss"], abs=1e-6)


def test_truncated_is_with_q0_ratios_is_refused():
    """pi_old(o|q0)/pi_sampler(o|q_n) would compare two prompts (per-row weights: tests/algo/test_loss_inputs.py)."""
    from regroup.errors import ConfigError
    from regroup.train.run_config import load_config

    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(None, ["ta.enabled=true", "rollout.tis_cap=2.0"])
    load_config(None, ["ta.enabled=true", "ta.ratio_anchor=own", "rollout.tis_cap=2.0"])  # same prompt: fine


def test_a_trainer_state_of_the_older_format_is_refused_in_one_line(tiny_model_dir, tmp_path):
    """A state written before stages and hooks had names (`anchors`, `watch` at the top) is not half-loaded."""
    from regroup.runtime.checkpoint import CheckpointRefused, save_checkpoint

    cfg = small_config(tiny_model_dir, tmp_path / "old", "grpo.yaml")
    trainer = build_trainer(cfg, tmp_path / "old", log=lambda m: None)
    state = trainer.state()
    assert {"stages", "hooks"} <= set(state)
    state["anchors"], state["watch"] = state.pop("stages"), state.pop("hooks")
    save_checkpoint(tmp_path / "old", 1, trainer.model, trainer.tokenizer, state, config=cfg.to_dict())
    with pytest.raises(CheckpointRefused, match="older regroup") as refused:
        build_trainer(cfg, tmp_path / "old", resume=True, log=lambda m: None)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("shift", "dropped"), [(0.0, False), (3.0, True)])
def test_opsm_measures_its_kl_from_the_engines_logprobs(tiny_model_dir, tmp_path, shift, dropped):
    """OPSM (grpo.off_policy_mask_threshold) takes the sampler's log-probs, as TRL's takes vLLM's: with one
    mini-batch pi_old = pi_theta, so only the engine's log-probs can put a response past the threshold."""
    cfg = small_config(
        tiny_model_dir, tmp_path / "r", "grpo.yaml", "grpo.off_policy_mask_threshold=0.5",
        "rewards.functions=[plugins:noisy_reward_mod7]", "rollout.logprob_gap_stop_steps=0",
        "diagnostics.diversity_every=0",
    )  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "r", log=lambda m: None)
    trainer.ctx.sampler = Rewritten(trainer.ctx.sampler, lambda lp: [x + shift for x in lp])  # the engine, shift off
    metrics = trainer.train_step(0)
    assert metrics["adv/abs_mean"] > 0  # mixed groups: some responses have A < 0
    if dropped:  # every A < 0 response is 3 nats off: dropped; the A > 0 ones are kept
        assert 0.0 < metrics["off_policy/masked_frac"] < 1.0
    else:
        assert metrics["off_policy/masked_frac"] == 0.0


def test_opsm_counts_a_token_the_sampler_did_not_score_as_zero_as_trl(tiny_model_dir, tmp_path, monkeypatch):
    """OPSM with pi_old given (grpo.num_iterations=2, so pi_old != pi_theta on the second pass): a token the
    sampler could not score (NaN) adds 0 to the response's mean KL, as in TRL 1.16's `get_off_policy_mask`;
    it is not replaced by pi_old. The trial: delta = 0.5, A < 0, the sampler scored 1 token of 4. Every
    keep decision of a real `Trainer.update` is checked against TRL's own function on the same tensors."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    import copy
    import math

    import regroup.algo.off_policy_mask as opsm_module
    import regroup.train.trainer as trainer_module
    from regroup.models.logprobs import response_logps

    delta = 0.5
    cfg = small_config(
        tiny_model_dir, tmp_path / "r", "grpo.yaml", f"grpo.off_policy_mask_threshold={delta}",
        "grpo.num_iterations=2", "grpo.prompts_per_step=4", "grpo.num_generations=8", "rollout.max_new_tokens=4",
        "optim.lr=1e-2", "optim.warmup_steps=0", "optim.max_grad_norm=1e9", "diagnostics.grad_conflict_every=0",
    )  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "r", log=lambda m: None)
    batch, _ = trainer.collect(0)
    for i, s in enumerate(batch.samples):  # mixed rewards; the sampler scored the first token only, shifted by c
        s.reward = float(i % 2)
        c = 1.2 + 0.04 * (i % 21)  # its KL alone, c / 4, is 0.3..0.5: kept unless the unscored tokens count
        s.behaviour_logps = [s.behaviour_logps[0] + c] + [math.nan] * (len(s.behaviour_logps) - 1)
    batch.advantages = None
    next(s for s in trainer.recipe.stages if s.name == "advantages")(batch, trainer.ctx)
    before = copy.deepcopy(trainer.model)  # pi_old: the weights that drew the batch

    parts, checked = [], []
    real_logps, real_mask = trainer_module.response_logps, opsm_module.off_policy_mask

    def logps_spy(model, part, *args, **kwargs):
        if torch.is_grad_enabled():
            parts.append(part)  # the micro-batch the next loss is built for
        return real_logps(model, part, *args, **kwargs)

    def mask_spy(advantages, logps, sampler_logps, mask, threshold):
        keep = real_mask(advantages, logps, sampler_logps, mask, threshold)
        checked.append((parts[-1], advantages, logps.detach(), mask, keep))
        return keep

    monkeypatch.setattr(trainer_module, "response_logps", logps_spy)
    monkeypatch.setattr(opsm_module, "off_policy_mask", mask_spy)
    trainer.update(batch)

    trial_cases = 0
    for part, advantages, logps, mask, keep in checked:
        adv = advantages.unsqueeze(1)  # [b, 1]
        sampler = part.behaviour_logps  # [b, T] NaN where the sampler did not score
        trl_keep = grpo_trainer.GRPOTrainer.get_off_policy_mask(adv, logps, sampler, mask.float(), delta)  # [b, 1]
        assert torch.equal(keep, trl_keep)
        with torch.no_grad():
            old = response_logps(before, part, cfg.rollout.temperature)[0]  # [b, T]
        substituted = torch.where(sampler.isfinite(), sampler, old)  # the NaN replaced by pi_old
        sub_keep = grpo_trainer.GRPOTrainer.get_off_policy_mask(adv, logps, substituted, mask.float(), delta)
        scored = (sampler.isfinite() & mask.bool()).sum(-1)  # [b]
        trial = (adv[:, 0] < 0) & (mask.sum(-1) == 4) & (scored == 1) & (trl_keep[:, 0] == 1) & (sub_keep[:, 0] == 0)
        trial_cases += int(trial.sum())
    assert len(checked) == 2  # one micro-batch, two passes
    assert trial_cases >= 1  # not vacuous: TRL keeps a response that pi_old in the NaN's place would drop

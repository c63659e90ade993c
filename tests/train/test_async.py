"""Asynchronous rollouts (`rollout.async_steps`) end to end on the tiny model with the built-in HF sampler
(its own weights copy, on the producer's thread): the fixed lag is exact, a killed and resumed run equals
the uninterrupted one, TA-GRPO pools and DaGRPO anchors and masks arrive intact, the off-policy
corrections, and the faults (an engine that dies, stalls or returns a malformed batch) with the last
checkpoint left good. The stand-in engines here only ADD a fault to the real sampler."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch
from helpers import small_config, weights

from regroup.errors import ConfigError
from regroup.rollout.factory import own_copy
from regroup.rollout.hf import HFSampler
from regroup.rollout.versions import AsyncRolloutError, OwnCopyWeights
from regroup.runtime.checkpoint import list_checkpoints, load_trainer_state
from regroup.train.trainer import Trainer

MIXED = ("rewards=[plugins:varied_reward]", "optim.lr=1e-2", "optim.warmup_steps=0")
"""A reward that varies within every group, so each update moves the weights the next batches sample with."""


def make_trainer(cfg, run_dir, resume=False):
    try:
        from regroup.train.build import build_trainer  # the builder, where the trainer is built from a config
    except ImportError:
        return Trainer.from_config(cfg, run_dir, resume=resume, log=lambda m: None)
    return build_trainer(cfg, run_dir, resume=resume, log=lambda m: None)


def config(model_dir, run_dir, *extra, recipe="grpo.yaml"):
    return small_config(model_dir, run_dir, recipe, "diagnostics.diversity_every=0", *MIXED, *extra)


def responses(run_dir) -> list[tuple[int, str]]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["response"]) for r in rows]


def test_batch_t_is_drawn_by_version_t_minus_k_exactly_as_a_hand_made_lagged_run(tiny_model_dir, tmp_path):
    """The async run (producer thread) equals a synchronous loop that draws batch t itself from a copy of
    the weights of version t − 1: the same tokens and the same final weights, bit for bit."""
    steps, lag = 4, 1
    cfg = config(tiny_model_dir, tmp_path / "async", f"rollout.async_steps={lag}", f"train.steps={steps}")
    asynchronous = make_trainer(cfg, tmp_path / "async")
    drawn = []
    for step in range(steps):
        metrics = asynchronous.train_step(step)
        drawn.append(metrics)
        asynchronous.step = step + 1
    asynchronous.producer.close()
    assert [m["rollout/policy_version"] for m in drawn] == [0, 0, 1, 2]
    assert [m["rollout/policy_lag"] for m in drawn] == [0, 1, 1, 1]

    ref = make_trainer(config(tiny_model_dir, tmp_path / "ref", f"train.steps={steps}"), tmp_path / "ref")
    sampler = HFSampler(own_copy(ref.model), ref.tokenizer, batch_size=cfg.rollout.batch_size)
    ref.ctx.sampler = sampler
    weights_of = OwnCopyWeights(sampler)
    versions = {0: weights_of.snapshot(ref.model)}
    ref_tokens, async_tokens = [], []
    for step in range(steps):
        weights_of.load(versions[max(0, step - lag)], max(0, step - lag))
        batch, _ = ref.collect(step)
        ref_tokens.append([s.response_ids for s in batch.samples])
        ref.update(batch)
        versions[step + 1] = weights_of.snapshot(ref.model)
    for step in range(steps):
        async_tokens.append([r for s, r in responses(tmp_path / "async") if s == step + 1])
    a, b = weights(asynchronous.model), weights(ref.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert sum(map(len, ref_tokens)) == steps * 16
    # the updates moved the weights, so a lag of 1 shows in the gap between sampler and learner
    assert drawn[0]["rollout/logprob_gap_mean"] < 1e-4 < drawn[2]["rollout/logprob_gap_mean"]


@pytest.mark.parametrize("lag", [1, 2])
def test_a_killed_and_resumed_async_run_equals_the_uninterrupted_one(tiny_model_dir, tmp_path, lag):
    extra = (f"rollout.async_steps={lag}", "train.steps=5", "train.checkpoint_every=2", "train.sample_every=1")
    straight = make_trainer(config(tiny_model_dir, tmp_path / "a", *extra), tmp_path / "a")
    straight.train()
    crashed = make_trainer(config(tiny_model_dir, tmp_path / "b", *extra), tmp_path / "b")
    for step in range(3):  # killed during step 3: steps 1-2 are checkpointed with their in-flight batches
        crashed.logger.log(step + 1, crashed.train_step(step))
        crashed.step = step + 1
        if crashed.step == 2:
            crashed.save()
    crashed.producer.close()
    state = load_trainer_state(list_checkpoints(tmp_path / "b")[-1])  # weights_only=True
    inflight = state["async"]["batches"]
    assert [b["batch"]["step"] for b in inflight][:lag] == list(range(2, 2 + lag))
    assert all(isinstance(b["batch"]["samples"][0]["response_ids"], torch.Tensor) for b in inflight)
    resumed = make_trainer(config(tiny_model_dir, tmp_path / "b", *extra), tmp_path / "b", resume=True)
    assert resumed.step == 2
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert responses(tmp_path / "a") == responses(tmp_path / "b")
    ma = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4, 5]
    for key in ("loss", "rollout/policy_version", "reward/mean"):
        assert [m[key] for m in ma] == [m[key] for m in mb], key


class Replay:
    """A stand-in sampler that returns, call by call, the completions another run drew (and checks it is
    asked for the same prompts): the sync run trains on the async run's samples."""

    def __init__(self, calls):
        self.calls = list(calls)

    def generate(self, prompts, params, seed=None):
        want_prompts, completions = self.calls.pop(0)
        assert prompts == want_prompts
        return copy.deepcopy(completions)

    def sync_weights(self, model):
        pass


@pytest.mark.parametrize(
    "recipe, extra",
    [
        ("ta_grpo.yaml", ("ta.n_variants=2",)),  # a pooled TA group: q0 and its variants share one group
        ("dagrpo.yaml", ("anchors.max_tokens=64", "rewards=[task,plugins:varied_reward*0.5]")),  # anchored, masked
    ],
)
def test_pools_anchors_and_masks_trained_async_equal_the_same_groups_trained_sync(
    tiny_model_dir, tmp_path, recipe, extra
):
    steps = 3
    cfg = config(
        tiny_model_dir, tmp_path / "async", "rollout.async_steps=1", f"train.steps={steps}", *extra, recipe=recipe
    )
    asynchronous = make_trainer(cfg, tmp_path / "async")
    engine = asynchronous.producer.engine.sampler
    calls, batches = [], []
    real = engine.generate

    def recording(prompts, params, seed=None):
        out = real(prompts, params, seed)
        calls.append((prompts, copy.deepcopy(out)))
        return out

    engine.generate = recording
    real_update = asynchronous.update
    asynchronous.update = lambda b: (batches.append(copy.deepcopy(b)), real_update(b))[1]
    asynchronous.train()

    sync = make_trainer(
        config(tiny_model_dir, tmp_path / "sync", f"train.steps={steps}", *extra, recipe=recipe), tmp_path / "sync"
    )
    sync.ctx.sampler = Replay(calls)
    sync_batches = []
    real_sync_update = sync.update
    sync.update = lambda b: (sync_batches.append(copy.deepcopy(b)), real_sync_update(b))[1]
    sync.train()
    for a, b in zip(batches, sync_batches, strict=True):
        assert [(s.group_id, s.variant, s.is_anchor, s.response_ids, s.reward) for s in a.samples] == [
            (s.group_id, s.variant, s.is_anchor, s.response_ids, s.reward) for s in b.samples
        ]
        assert torch.equal(a.advantages, b.advantages)
        assert (a.weights is None) == (b.weights is None) and (a.weights is None or torch.equal(a.weights, b.weights))
    if cfg.ta.enabled:
        pooled = [s for s in batches[0].samples if s.variant > 0]
        assert pooled and {s.group_id for s in pooled} <= {s.group_id for s in batches[0].samples if s.variant == 0}
    else:
        assert any(s.is_anchor for b in batches for s in b.samples) and batches[0].weights is not None
    wa, wb = weights(asynchronous.model), weights(sync.model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_behaviour_correction_uses_the_engines_logps_as_pi_old(tiny_model_dir, tmp_path, monkeypatch):
    import regroup.train.trainer as trainer_module

    seen = []
    real = trainer_module.policy_loss

    def spy(logps, old, inputs, spec, totals):
        seen.append((logps.detach().clone(), old.clone()))
        return real(logps, old, inputs, spec, totals)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    extra = ("rollout.async_steps=1", "train.steps=3")
    for correction in ("decoupled", "behaviour"):
        seen.clear()
        trainer = make_trainer(
            config(tiny_model_dir, tmp_path / correction, *extra, f"rollout.async_correction={correction}"),
            tmp_path / correction,
        )
        trainer.train()
        logps, old = seen[-1]  # step 3: sampled by version 1, trained at version 2
        if correction == "decoupled":
            assert torch.equal(logps, old)  # pi_old = the proximal policy: the learner's weights before the update
        else:
            assert not torch.equal(logps, old)  # pi_old = the engine's log-probs of version 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (("rollout.backend=vllm",), "colocated vllm engine shares the learner's process"),
        (("rollout.backend=hf_generate",), "global RNG"),
        (("rollout.async_correction=behaviour", "rollout.tis_cap=2"), "nothing left to correct"),
    ],
)
def test_async_settings_that_cannot_work_are_one_line(tiny_model_dir, tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        config(tiny_model_dir, tmp_path, "rollout.async_steps=1", *extra)


def _fault_run(tiny_model_dir, tmp_path, fault, *extra):
    """Train async with a fault ADDED to the real sampler from batch 3 (step 4) on; returns (the error, the steps
    logged, the trainer)."""
    cfg = config(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.async_steps=1",
        "train.steps=6",
        "train.checkpoint_every=2",
        *extra,
    )
    trainer = make_trainer(cfg, tmp_path / "run")
    sampler = trainer.producer.engine.sampler
    real = sampler.generate
    calls = {"n": 0}

    def faulty(prompts, params, seed=None):
        calls["n"] += 1
        out = real(prompts, params, seed)
        return fault(out) if calls["n"] >= 4 else out  # batches 0-2 are good; batch 3 (step 4) is not

    sampler.generate = faulty
    logged = []
    with pytest.raises(Exception) as info:
        trainer.train(on_step=lambda step, m: logged.append(step))
    return info.value, logged, trainer


def _checkpoint_digest(run_dir):
    path = list_checkpoints(run_dir)[-1]
    return path.name, {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_an_engine_that_dies_mid_async_is_one_line_and_the_last_checkpoint_stays_good(tiny_model_dir, tmp_path):
    def die(_):
        raise RuntimeError("the engine core died")

    error, logged, trainer = _fault_run(tiny_model_dir, tmp_path, die)
    assert isinstance(error, AsyncRolloutError) and isinstance(error, OSError)  # the CLI: one line, exit 2
    assert str(error) == "the rollout engine failed while drawing step 4: RuntimeError: the engine core died"
    assert logged == [1, 2, 3]  # nothing of step 4 was trained on
    name, files = _checkpoint_digest(tmp_path / "run")
    assert name == "step-000002"
    resumed = make_trainer(
        config(tiny_model_dir, tmp_path / "run", "rollout.async_steps=1", "train.steps=6", "train.checkpoint_every=2"),
        tmp_path / "run",
        resume=True,
    )
    assert resumed.step == 2  # the checkpoint is good: the run resumes from it
    resumed.producer.close()


def test_a_malformed_batch_mid_async_is_one_line_and_nothing_partial_is_trained(tiny_model_dir, tmp_path):
    error, logged, trainer = _fault_run(tiny_model_dir, tmp_path, lambda out: out[:-1])
    assert isinstance(error, AsyncRolloutError)
    assert str(error) == "the engine returned 15 completions for 16 requested"
    assert logged == [1, 2, 3]
    assert _checkpoint_digest(tmp_path / "run")[0] == "step-000002"


def test_a_stalled_engine_mid_async_is_one_line_within_the_deadline(tiny_model_dir, tmp_path):
    release = threading.Event()

    def stall(out):
        release.wait(120)
        return out

    try:
        error, logged, _ = _fault_run(tiny_model_dir, tmp_path, stall, "rollout.async_timeout_s=8")
    finally:
        release.set()
    assert isinstance(error, AsyncRolloutError)
    assert "no rollout batch for step 4 within 8 s (rollout.async_timeout_s)" in str(error)
    assert logged == [1, 2, 3]
    assert _checkpoint_digest(tmp_path / "run")[0] == "step-000002"


def test_held_out_evaluation_during_async_training_samples_the_current_weights_and_changes_nothing(
    tiny_model_dir, tmp_path
):
    """`train.eval_every` under async: the engine holds the learner's newest weights for the evaluation, then
    the producer reloads the version its next batch needs: the run trains exactly as without evaluation."""
    extra = ("rollout.async_steps=1", "train.steps=4")
    plain = make_trainer(config(tiny_model_dir, tmp_path / "plain", *extra), tmp_path / "plain")
    plain.train()
    evaluated = make_trainer(
        config(tiny_model_dir, tmp_path / "eval", *extra, "train.eval_every=2", "train.eval_limit=4"), tmp_path / "eval"
    )
    last = evaluated.train()
    assert "eval/pass@1" in last
    switches = evaluated.producer.engine.switches
    assert 2 in switches and switches[-1] == 4  # the evaluations after steps 2 and 4 loaded versions 2 and 4
    assert evaluated.producer.drawn == [(0, 0), (1, 0), (2, 1), (3, 2)]  # the batches' versions did not move
    assert responses(tmp_path / "plain") == responses(tmp_path / "eval")
    a, b = weights(plain.model), weights(evaluated.model)
    assert all(torch.equal(a[k], b[k]) for k in a)

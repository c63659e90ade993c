"""The async producer's schedule without a model: batch t is drawn by version t − k exactly, whatever the
speed of either side; the engine switches versions only between batches; checkpoints hold it at a batch
boundary; faults are one line within the deadline and nothing partial is handed over."""

from __future__ import annotations

import math
import random
import re
import threading
import time

import pytest
import torch

from regroup.batch import Sample
from regroup.errors import ConfigError
from regroup.rollout.base import Completion, SamplingParams
from regroup.rollout.producer import AsyncProducer, batch_version
from regroup.rollout.versions import AsyncRolloutError, VersionedEngine
from regroup.runtime.checkpoint import CheckpointError
from regroup.stages.base import StepBatch

PARAMS = SamplingParams(1.0, 1.0, max_new_tokens=4, n=1)


class CountingEngine:
    """An engine whose 'weights' are one number: each completion's only token is the version it holds, so
    a reply drawn across a switch would show two values. `delay` jitters each call (speed must not matter)."""

    def __init__(self, delay: float = 0.0, seed: int = 0):
        self.weights = None
        self.delay = delay
        self.rng = random.Random(seed)
        self.calls = 0

    def generate(self, prompts, params, seed=None):
        self.calls += 1
        out = []
        for i, _ in enumerate(prompts):
            if self.delay:
                time.sleep(self.rng.random() * self.delay)
            out.append(Completion(i, [int(self.weights)], "", [-1.0], False))
        return out


class NumberWeights:
    """The stand-in engine's snapshot: the model object's `value` attribute at publish time."""

    def __init__(self, engine):
        self.engine = engine

    @staticmethod
    def snapshot(model):
        return model.value

    def load(self, payload, version):
        self.engine.weights = payload


class Model:
    def __init__(self):
        self.value = 0


def make(lag, total, *, delay=0.0, timeout_s=60.0, fault=None):
    engine = CountingEngine(delay)
    versioned = VersionedEngine(engine, NumberWeights(engine))

    def collect(step):
        if fault is not None:
            fault(step)
        completions = versioned.generate([[1], [2]], PARAMS)
        batch = StepBatch(step=step)
        for c in completions:
            batch.samples.append(
                Sample(
                    step,
                    "q",
                    0,
                    False,
                    [1],
                    [1],
                    c.token_ids,
                    "",
                    behaviour_logps=c.logps,
                    policy_version=c.policy_version,
                )
            )
        batch.advantages = torch.zeros(len(batch.samples))  # [B] the trainer's stages always set them
        return batch, {"tokens/generated": 2.0}

    return AsyncProducer(collect, versioned, lag, total, timeout_s=timeout_s), versioned, engine


def learn(producer, model, steps, *, start=0, train_s=0.0, on_step=None):
    """The trainer's loop, reduced: take batch t, 'update' (the model's value becomes t + 1), publish."""
    seen = []
    for step in range(start, steps):
        batch, metrics = producer.take(step, model)
        seen.append((step, [s.response_ids[0] for s in batch.samples], metrics))
        if train_s:
            time.sleep(train_s)
        model.value = step + 1
        producer.publish(step + 1, model)
        if on_step is not None:
            on_step(step + 1)
    return seen


@pytest.mark.parametrize("lag", [1, 2, 3])
@pytest.mark.parametrize("speed", ["engine_slow", "learner_slow"])
def test_batch_t_is_drawn_by_version_t_minus_k_exactly(lag, speed):
    producer, versioned, _ = make(lag, 8, delay=0.01 if speed == "engine_slow" else 0.0)
    model = Model()
    try:
        seen = learn(producer, model, 8, train_s=0.02 if speed == "learner_slow" else 0.0)
    finally:
        producer.close()
    for step, tokens, metrics in seen:
        version = batch_version(step, lag)
        assert tokens == [version, version], (step, tokens)  # the weights of version t − k, in every response
        assert metrics["rollout/policy_version"] == version
        assert metrics["rollout/policy_lag"] == step - version
    assert producer.drawn == [(t, batch_version(t, lag)) for t in range(8)]
    # the engine switched only to the versions batches needed, each once, in order
    assert versioned.switches == sorted(set(versioned.switches)) == sorted({batch_version(t, lag) for t in range(8)})


def test_every_sample_records_the_version_that_drew_it():
    producer, _, _ = make(1, 4)
    model = Model()
    got = []
    try:
        for step in range(4):
            batch, _ = producer.take(step, model)
            got.append({s.policy_version for s in batch.samples})
            model.value = step + 1
            producer.publish(step + 1, model)
    finally:
        producer.close()
    assert got == [{0}, {0}, {1}, {2}]


def test_a_load_waits_for_the_requests_in_flight():
    """A version switch requested mid-generate happens after it: no reply mixes two versions."""
    engine = CountingEngine()
    versioned = VersionedEngine(engine, NumberWeights(engine))
    versioned.load(versioned.snapshot(type("M", (), {"value": 7})(), 7))
    started, release = threading.Event(), threading.Event()
    real = engine.generate

    def slow_generate(prompts, params, seed=None):
        started.set()
        release.wait(10)
        return real(prompts, params, seed)

    engine.generate = slow_generate
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("c", versioned.generate([[1], [2], [3]], PARAMS)))
    t.start()
    assert started.wait(10)
    loader = threading.Thread(target=lambda: versioned.load(versioned.snapshot(type("M", (), {"value": 8})(), 8)))
    loader.start()
    time.sleep(0.05)
    assert engine.weights == 7  # the load is waiting for the lock
    release.set()
    t.join(10)
    loader.join(10)
    assert [c.token_ids for c in result["c"]] == [[7]] * 3
    assert {c.policy_version for c in result["c"]} == {7}
    assert engine.weights == 8 and versioned.loaded_version == 8


def test_the_producer_never_runs_more_than_k_batches_ahead():
    producer, _, _ = make(2, 10)
    model = Model()
    try:
        producer.take(0, model)
        time.sleep(0.2)  # the learner is slow: the producer may only draw what versions 0.. allow
        assert [s for s, _ in producer.drawn] == [0, 1, 2]
    finally:
        producer.close()


def test_checkpoint_pause_holds_exactly_the_batches_versions_older_than_the_checkpoint_need():
    """At a checkpoint of step s, batches s .. s+k-1 are drawn and saved; the resumed producer draws the
    same batches with the same versions as the uninterrupted one."""
    lag, total = 2, 7
    producer, _, _ = make(lag, total)
    model = Model()
    states = {}

    def checkpoint(step):
        if step == 3:
            with producer.paused(step):
                states[step] = producer.state_dict()

    try:
        straight = learn(producer, model, total, on_step=checkpoint)
    finally:
        producer.close()
    state = states[3]
    assert [b["batch"]["step"] for b in state["batches"]][:2] == [3, 4]
    assert all(b["version"] == batch_version(b["batch"]["step"], lag) for b in state["batches"])

    resumed, _, _ = make(lag, total)
    resumed.load_state_dict(state, 3)
    model = Model()
    model.value = 3  # the checkpoint's weights are version 3
    try:
        rest = learn(resumed, model, total, start=3)
    finally:
        resumed.close()
    assert [(s, tok) for s, tok, _ in rest] == [(s, tok) for s, tok, _ in straight[3:]]


def test_an_engine_that_dies_is_one_line_and_no_batch_is_handed_over():
    def die(step):
        if step == 2:
            raise RuntimeError("engine core died")

    producer, _, _ = make(1, 6, fault=die)
    model = Model()
    try:
        learn(producer, model, 2)
        with pytest.raises(AsyncRolloutError, match="failed while drawing step 3: RuntimeError: engine core died"):
            producer.take(2, model)
    finally:
        producer.close()


def test_a_stalled_engine_is_one_line_within_the_deadline():
    stall, hanging = threading.Event(), threading.Event()

    def hang(step):
        if step == 1:
            hanging.set()
            stall.wait(600)
            hanging.clear()

    producer, _, _ = make(1, 4, fault=hang, timeout_s=1.0)
    model = Model()
    try:
        learn(producer, model, 1)
        with pytest.raises(
            AsyncRolloutError, match=r"no rollout batch for step 2 within 1 s \(rollout.async_timeout_s\)"
        ):
            producer.take(1, model)
        assert hanging.is_set()  # the deadline ended the wait, not the stall: the engine is still stuck
    finally:
        stall.set()
        producer.close()


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda cs: cs[:-1], "returned 1 completions for 2 requested"),
        (lambda cs: [Completion(0, ["x"], "", None, False), cs[1]], "token_ids is not a list of ints"),
        (lambda cs: [Completion(0, [1] * 50, "", None, False), cs[1]], "50 tokens for rollout.max_new_tokens=4"),
        (lambda cs: [Completion(0, [1, 2], "", [-1.0], False), cs[1]], "1 log-probs for 2 tokens"),
    ],
)
def test_a_malformed_reply_is_one_line(bad, message):
    producer, _, engine = make(1, 3)
    real = engine.generate
    engine.generate = lambda prompts, params, seed=None: bad(real(prompts, params, seed))
    try:
        with pytest.raises(AsyncRolloutError, match=message):
            producer.take(0, Model())
    finally:
        producer.close()


def test_inflight_state_is_plain_and_loads_with_weights_only(tmp_path):
    producer, _, _ = make(1, 4)
    model = Model()
    try:
        learn(producer, model, 2)
        with producer.paused(2):
            state = producer.state_dict()
    finally:
        producer.close()
    torch.save(state, tmp_path / "s.pt")
    back = torch.load(tmp_path / "s.pt", weights_only=True)
    again, _, _ = make(1, 4)
    again.load_state_dict(back, 2)
    batch, metrics = again.take(2, model)  # handed over without the engine drawing anything
    assert [s.response_ids for s in batch.samples] == [[1], [1]] and metrics["rollout/policy_version"] == 1
    again.close()


@pytest.mark.parametrize("lag", [1, 2, 3])
def test_a_resume_with_more_steps_from_a_checkpoint_near_the_end_goes_on(lag):
    """A checkpoint at, or within k of, the end holds no batch past the end; resumed with more steps, the
    producer draws those with the checkpoint's weights (the older versions are gone), the rest at lag k.
    Before, it waited for version t − k, which no one publishes after a resume, until async_timeout_s."""
    total, more = 5, 8
    for at in range(total - lag, total + 1):  # the checkpoint at `at`, k steps from the end or nearer
        producer, _, _ = make(lag, total)
        model = Model()
        states = {}

        def checkpoint(step, producer=producer, states=states, at=at):
            if step == at:
                with producer.paused(step):
                    states[step] = producer.state_dict()

        try:
            learn(producer, model, total, on_step=checkpoint)
        finally:
            producer.close()
        state = states[at]
        held = [b["batch"]["step"] for b in state["batches"]]
        assert held == list(range(at, total))  # nothing past the old end was drawn

        resumed, _, _ = make(lag, more, timeout_s=30.0)
        resumed.load_state_dict(state, at)
        model = Model()
        model.value = at  # the checkpoint's weights are version `at`
        try:
            seen = learn(resumed, model, more, start=at)
        finally:
            resumed.close()
        assert [step for step, _, _ in seen] == list(range(at, more))  # every step trained, counted
        versions = {step: tokens[0] for step, tokens, _ in seen}
        for step in range(at, more):
            expected = max(0, step - lag) if step < total else max(at, step - lag)
            assert versions[step] == expected, (at, step, versions)
        assert resumed.drawn == [(t, max(at, t - lag)) for t in range(total, more)]


def test_taking_a_batch_the_producer_is_past_is_one_line_at_once():
    producer, _, _ = make(1, 4, timeout_s=600.0)
    model = Model()
    try:
        producer.take(0, model)
        with pytest.raises(AsyncRolloutError, match="no rollout batch for step 1: the producer is past it"):
            producer.take(0, model)  # not a wait of async_timeout_s: the batch will never come
    finally:
        producer.close()


def _held_state():
    """The in-flight state of a checkpoint at step 2 of a lag-1 run: batch 2 (0-based), drawn by version 1."""
    producer, _, _ = make(1, 4)
    model = Model()
    try:
        learn(producer, model, 2)
        with producer.paused(2):
            return producer.state_dict()
    finally:
        producer.close()


def _sample(state):
    return state["batches"][0]["batch"]["samples"][0]


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda s: _sample(s).update(response_ids=torch.tensor([-3])), "response_ids holds token id -3"),
        (
            lambda s: _sample(s).update(response_ids=torch.tensor([99])),
            "token id 99, outside the model's vocabulary of 50",
        ),
        (lambda s: _sample(s).update(problem=-1), "problem is -1, not an index into the batch's 0 problems"),
        (lambda s: _sample(s).update(behaviour_logps=torch.tensor([math.inf])), "holds a log-prob of +inf"),
        (lambda s: _sample(s).update(behaviour_logps=torch.tensor([-1.0, -1.0])), "has 2 log-probs for 1 tokens"),
        (lambda s: _sample(s).update(reward="high"), "reward is a str"),
        (lambda s: _sample(s).pop("group_id"), "samples[0] has no group_id"),
        (lambda s: _sample(s).update(policy_version=0), "holds samples drawn by version 0, not 1"),
        (lambda s: s["batches"][0]["metrics"].update(x="y"), "batches[0].metrics are not numbers by name"),
        (lambda s: s.update(next_step=9), "next_step is 9, not 2..3 (a checkpoint at step 2)"),
        (lambda s: s["batches"].append(s["batches"][0]), "holds 2 batches, not the 1 its next_step (3) says"),
        (lambda s: s.update(format=7), "have format 7, not 1"),
        (lambda s: s.update(lag=2), "were drawn with rollout.async_steps=2, not 1"),
    ],
)
def test_hand_edited_inflight_state_is_refused_in_one_line(edit, words):
    state = _held_state()
    edit(state)
    fresh, _, _ = make(1, 4)
    with pytest.raises((CheckpointError, ConfigError), match=re.escape(words)) as refused:
        fresh.load_state_dict(state, 2, vocab_size=50)
    assert "\n" not in str(refused.value)
    fresh.close()

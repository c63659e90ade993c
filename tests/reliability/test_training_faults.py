"""Faults during training: non-finite numbers (NaN logits in the update, rewards that are NaN / None /
inf) and an LLM judge that fails about half its requests and goes down mid-run. The run must finish
every step with finite weights; a non-finite update is skipped and logged (`skipped_nonfinite`),
an unscorable reward gets advantage 0, and a failed judge score leaves the sample unmasked and counted
(`mask/unscored`, `scorer/failed`)."""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402  (reliability_helpers put tests/ on the path)

from regroup.net import DiskCache  # noqa: E402
from regroup.train.build import build_trainer  # noqa: E402
from regroup.train.run_config import load_config  # noqa: E402
from regroup.train.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.reliability


def build(model_dir, run_dir, recipe="grpo.yaml", *extra) -> Trainer:
    cfg = load_config(h.CONFIGS / recipe, h.small_overrides(model_dir, run_dir, *extra))
    return build_trainer(cfg, run_dir, log=lambda m: None)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- numerics


def test_nan_logits_skip_the_update_and_the_run_finishes(tiny_model_dir, tmp_path, figures):
    """The policy's forward returns NaN logits during the updates of steps 2 and 4: those updates are
    skipped (weights and Adam state untouched, `skipped_nonfinite` = 1), the others go through."""
    poisoned_steps = {2, 4}
    trainer = build(tiny_model_dir, tmp_path, "grpo.yaml", "train.steps=5", "rewards=[reliability_helpers:coin_reward]")
    model = trainer.model
    forward, update = model.forward, trainer.update
    state = {"poison": False}

    def nan_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        if state["poison"]:
            out.logits = out.logits * math.nan  # keeps the graph: the gradients are NaN too
        return out

    def poisoning_update(samples):
        state["poison"] = trainer.step + 1 in poisoned_steps
        try:
            return update(samples)
        finally:
            state["poison"] = False

    model.forward, trainer.update = nan_forward, poisoning_update
    snapshots = {0: weights(model)}
    trainer.train(on_step=lambda step, m: snapshots.__setitem__(step, weights(model)))

    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert [m["skipped_nonfinite"] for m in metrics] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert [m["loss"] is None for m in metrics] == [False, True, False, True, False]  # NaN is logged as null
    for step in range(1, 6):
        same = all(torch.equal(snapshots[step][k], snapshots[step - 1][k]) for k in snapshots[0])
        assert same == (step in poisoned_steps), f"step {step}: weights {'un' if same else ''}changed"
    assert all(torch.isfinite(v).all() for v in weights(model).values())
    for group in trainer.optimizer.state.values():
        assert all(torch.isfinite(t).all() for t in group.values() if torch.is_tensor(t))
    figures(
        f"NaN logits in the updates of steps {sorted(poisoned_steps)} of 5: skipped_nonfinite "
        f"{[m['skipped_nonfinite'] for m in metrics]}, weights and Adam state finite"
    )


def expected_advantages(rewards: list[float], group_ids: list[int], eps: float = 1e-4) -> list[float]:
    """SPEC §1 with scale=group, written out independently: unscorable rewards are left out of their
    group's mean and (n-1) std and get 0; a group with < 2 scored or all-equal rewards gives 0."""
    out = [0.0] * len(rewards)
    for g in set(group_ids):
        members = [i for i, gi in enumerate(group_ids) if gi == g and math.isfinite(rewards[i])]
        values = [rewards[i] for i in members]
        if len(values) < 2 or len(set(values)) == 1:
            continue
        mean, std = statistics.mean(values), statistics.stdev(values)
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def test_unscorable_rewards_get_zero_advantage(tiny_model_dir, tmp_path, figures):
    """`rewards=[reliability_helpers:flaky_reward]` returns NaN, None or inf for half the responses:
    those samples get advantage exactly 0, the others the advantage of their group's scored rewards."""
    trainer = build(
        tiny_model_dir,
        tmp_path,
        "grpo.yaml",
        "rewards=[reliability_helpers:flaky_reward]",
        "train.steps=3",
        "grpo.num_generations=6",
    )
    seen: list[tuple[list, torch.Tensor, torch.Tensor]] = []
    stage = next(s for s in trainer.recipe.stages if s.name == "advantages")
    compute = stage.__call__

    def recording_advantages(batch, ctx):
        metrics = compute(batch, ctx)
        group_ids = torch.tensor([s.group_id for s in batch.samples])
        seen.append((list(batch.samples), group_ids, batch.advantages.clone()))
        return metrics

    trainer.recipe.stages[trainer.recipe.stages.index(stage)] = recording_advantages
    recording_advantages.name = "advantages"
    before = weights(trainer.model)
    trainer.train()

    unscorable = nonzero = 0
    for samples, group_ids, adv in seen:
        rewards = [math.nan if h.is_unscorable(s.reward) else float(s.reward) for s in samples]
        assert torch.isfinite(adv).all()
        want = expected_advantages(rewards, group_ids.tolist())
        assert adv.tolist() == pytest.approx(want, abs=1e-5)
        for s, a in zip(samples, adv.tolist()):
            if h.is_unscorable(s.reward):
                unscorable += 1
                assert a == 0.0
            nonzero += a != 0.0
    assert unscorable > 10 and nonzero > 5  # the test exercised both kinds of sample

    metrics = read_metrics(tmp_path)
    assert [m["skipped_nonfinite"] for m in metrics] == [0.0, 0.0, 0.0]
    for m, (samples, _, _) in zip(metrics, seen):
        assert m["reward/unscored"] == sum(h.is_unscorable(s.reward) for s in samples)
        scored = [s.reward for s in samples if not h.is_unscorable(s.reward)]
        assert m["reward/mean"] == pytest.approx(sum(scored) / len(scored))
    after = weights(trainer.model)
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before), "no update ever happened"
    total = sum(len(samples) for samples, _, _ in seen)
    figures(
        f"{unscorable} of {total} rewards NaN/None/inf over 3 steps: all got advantage 0; "
        f"{nonzero} nonzero advantages match SPEC §1 over the scored rewards; no step skipped"
    )


# ------------------------------------------------------------------------------ judge failing mid-run

KEY_ENV = "REGROUP_TEST_JUDGE_KEY"
KEY = "sk-test-judge-faults"


class RecordingMasker:
    """Wraps the run's masker and keeps (scores, advantages, keep) of every step."""

    def __init__(self, inner):
        self.inner = inner
        self.steps: list[tuple[list, torch.Tensor, torch.Tensor]] = []

    def __call__(self, samples, advantages, group_ids):
        keep, metrics = self.inner(samples, advantages, group_ids)
        self.steps.append(([s.score for s in samples], advantages.clone(), keep.clone()))
        return keep, metrics


@pytest.mark.parametrize("steps", [4, pytest.param(12, marks=pytest.mark.slow)])
def test_judge_failing_half_the_time_and_going_down(tiny_model_dir, tmp_path, monkeypatch, steps, figures):
    timeout_s = 0.4
    judge = h.FlakyJudge(h.judge_faults(timeout_s), p_fault=0.5, seed=3)
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI(api_key=KEY, responder=judge) as srv:
        trainer = build(
            tiny_model_dir,
            tmp_path,
            "dagrpo.yaml",
            f"train.steps={steps}",
            "mask.scorer.name=judge",
            f"mask.scorer.base_url={srv.base_url}",
            f"mask.scorer.api_key_env={KEY_ENV}",
            f"mask.scorer.timeout_s={timeout_s}",
            "mask.scorer.max_retries=2",
            "mask.scorer.concurrency=32",
            "mask.scorer.structured=none",  # the fake judge answers in the paper's free-text "SCORE: n" form
            "anchors.max_tokens=64",  # the references are longer than the 16 generated tokens
        )
        stage = next(s for s in trainer.recipe.stages if s.name == "mask")
        masker = RecordingMasker(stage.mask)
        stage.mask = masker  # the stage scores and masks through it
        down_after = steps // 2

        def on_step(step, m):
            if step == down_after:
                srv.down_for(1.0)  # refuses connections for the start of the next step's judging

        trainer.train(on_step=on_step)
        requests = list(srv.requests)

    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert all(m["skipped_nonfinite"] == 0.0 for m in metrics)
    unscored = [m["mask/unscored"] for m in metrics]
    # scorer/failed counts every failed item since the start: the running sum of the per-step unscored
    assert [m["scorer/failed"] for m in metrics] == [sum(unscored[: i + 1]) for i in range(steps)]
    assert sum(unscored) > 0

    masked = unscored_with_signal = 0
    for scores, adv, keep in masker.steps:
        for score, a, k in zip(scores, adv.tolist(), keep.tolist()):
            if score is None:
                assert k, "an unscored sample was masked"
                unscored_with_signal += a != 0.0
            masked += not k
    assert masked > 0 and unscored_with_signal > 0  # the mask did act, and unscored samples mattered

    assert all(r.auth_ok for r in requests)
    injected = Counter(r.action for r in requests)
    assert {"Status", "Slow", "Malformed", "Partial", "Drop", "Answer"} <= set(injected)
    assert min(judge.counts[k] for k in judge.faults) > 0, judge.counts
    figures(
        f"{steps} steps finished; server down {1.0:g} s after step {down_after}; judge replies by kind "
        f"{dict(sorted(judge.counts.items()))}; {int(sum(unscored))} samples unscored (all kept, "
        f"{unscored_with_signal} of them with a nonzero advantage); {masked} scored samples masked"
    )

    cache_path = tmp_path / "cache" / "judge.sqlite"
    with sqlite3.connect(cache_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with DiskCache(cache_path) as cache:
        stored = cache.items()
        assert len(stored) > 0 and all(1 <= v["score"] <= 10 for _, v in stored)
        assert len(cache.failures()) > 0

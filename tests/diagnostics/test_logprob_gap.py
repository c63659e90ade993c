"""The sampler-vs-learner log-prob gap (sync and async, every backend): hand-computed metrics, the watch's
warning and stop, and real runs where the engine's log-probs are stale (a server that says it reloaded but
kept its old weights: -0.01 against the learner's -4.6), NaN or missing. The stand-ins only change what
the real HF sampler returns."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import Rewritten, small_config

from regroup.batch import RolloutBatch
from regroup.diagnostics import logprob_gap
from regroup.diagnostics.logprob_gap import LogprobGapError, LogprobGapWatch
from regroup.train.build import build_trainer


def make_trainer(cfg, run_dir, log):
    return build_trainer(cfg, run_dir, log=log)


def part(behaviour, lengths, has=None, sampled=None, on_prompt=None) -> RolloutBatch:
    b, t = behaviour.shape
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()  # [b, T]
    zeros = torch.zeros((b, t), dtype=torch.long)
    return RolloutBatch(
        input_ids=zeros,
        attention_mask=zeros,
        position_ids=zeros,
        completion_mask=mask,
        sampled_mask=mask.bool() if sampled is None else sampled,
        behaviour_logps=behaviour,
        has_behaviour_logps=torch.ones(b, dtype=torch.bool) if has is None else has,
        on_sampled_prompt=torch.ones(b, dtype=torch.bool) if on_prompt is None else on_prompt,
        rewards=torch.zeros(b),
        group_ids=torch.zeros(b, dtype=torch.long),
        is_anchor=torch.zeros(b, dtype=torch.bool),
    )


def test_the_gap_by_hand():
    behaviour = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])  # row 1 has 2 tokens
    learner = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -1.0, -9.0]])
    sums: dict = {}
    logprob_gap.accumulate(sums, part(behaviour, [3, 2]), learner)
    out = logprob_gap.finish(sums)
    deltas = torch.tensor([-0.5, 0.0, 1.0, 0.0, -0.5])
    assert out["rollout/logprob_gap_mean"] == pytest.approx(float(deltas.abs().mean()))
    assert out["rollout/logprob_gap_max"] == pytest.approx(1.0)
    ratios = deltas.double().exp()
    assert out["rollout/is_ratio_min"] == pytest.approx(float(ratios.min()))
    assert out["rollout/is_ratio_max"] == pytest.approx(math.e)
    assert out["rollout/is_ratio_std"] == pytest.approx(float(ratios.std(unbiased=False)), rel=1e-9)
    assert out["rollout/behaviour_logps_bad_frac"] == 0.0


def test_missing_and_nan_behaviour_logps_are_counted_but_not_an_appended_eos():
    nan = math.nan
    behaviour = torch.tensor([[-1.0, nan, -1.0], [-1.0, -1.0, nan], [0.0, 0.0, 0.0]])
    has = torch.tensor([True, True, False])  # row 2: the backend gave none
    sums: dict = {}
    logprob_gap.accumulate(sums, part(behaviour, [3, 3, 2], has=has), torch.full((3, 3), -1.0))
    out = logprob_gap.finish(sums)
    # bad: row 0's middle NaN and row 2's 2 tokens; row 1's NaN is its last token (the EOS the client appended)
    assert out["rollout/behaviour_logps_bad_frac"] == pytest.approx(3 / 8)
    assert out["rollout/logprob_gap_mean"] == 0.0


def test_anchor_tokens_are_not_the_engines():
    behaviour = torch.zeros((1, 2))
    sampled = torch.tensor([[False, False]])
    sums: dict = {}
    logprob_gap.accumulate(sums, part(behaviour, [2], sampled=sampled), torch.full((1, 2), -3.0))
    assert logprob_gap.finish(sums) == {}


def test_the_watch_warns_then_stops_and_resets_on_a_good_step():
    watch = LogprobGapWatch(warn_gap=1.0, stop_steps=3)
    bad = {"rollout/logprob_gap_mean": 4.6, "rollout/logprob_gap_max": 9.0, "rollout/behaviour_logps_bad_frac": 0.0}
    good = {"rollout/logprob_gap_mean": 1e-5, "rollout/behaviour_logps_bad_frac": 0.0}
    (line,) = watch.observe(1, bad)
    assert "differ from the learner's by 4.6 nats" in line and "stops after 3" in line
    assert watch.observe(2, good) == []
    watch.observe(3, bad)
    watch.observe(4, bad)
    with pytest.raises(LogprobGapError, match="step 5: .* for 3 steps in a row; stopped"):
        watch.observe(5, bad)
    only_warns = LogprobGapWatch(stop_steps=0)
    for step in range(10):
        assert "warning only" in only_warns.observe(step, bad)[0]


def _gaps(watch, gaps, first_step=1) -> list[str]:
    lines = []
    for step, gap in enumerate(gaps, first_step):
        lines += watch.observe(step, {"rollout/logprob_gap_mean": gap, "rollout/behaviour_logps_bad_frac": 0.0})
    return lines


def test_a_jump_against_the_runs_own_baseline_warns_far_below_the_warning_level():
    """The trial: a second client reloaded MLP weights x1.03 on a SmolLM2 LoRA run's server; the gap went from
    0.016 to 0.165 nats, under rollout.logprob_gap_warn=1.0, and nothing was said."""
    watch = LogprobGapWatch(warn_gap=1.0, stop_steps=2)
    assert _gaps(watch, [0.016, 0.015, 0.017, 0.016]) == []
    (line,) = _gaps(watch, [0.165], first_step=5)
    assert line.startswith("warning: step 5: ") and "gap is 0.165 nats" in line and "median of 0.016" in line
    assert "warning only" in line and "second client" in line
    assert _gaps(watch, [0.17, 0.16, 0.18], first_step=6) != []  # it goes on: a jump never joins the baseline
    assert watch.streak == 0  # and never stops the run
    assert _gaps(watch, [0.016, 0.017], first_step=9) == []


@pytest.mark.parametrize(
    "gaps",
    [
        [1e-5, 2e-5, 1e-5, 3e-4, 1e-5],  # fp32 kernel noise: 30x, but far under JUMP_MIN_NATS
        [0.01 * k for k in range(1, 30)],  # a linear rise (async drift under a warm-up)
        [0.001, 0.3, 0.31, 0.29],  # no call before the baseline has BASELINE_MIN_STEPS steps
        [0.05, 0.06, 0.05, 0.19],  # 3.8x: under JUMP_RATIO
    ],
)
def test_no_jump_is_called_on_noise_a_steady_rise_or_without_a_baseline(gaps):
    assert _gaps(LogprobGapWatch(), gaps) == []


def test_the_baseline_survives_a_resume():
    watch = LogprobGapWatch()
    _gaps(watch, [0.02, 0.02, 0.02])
    resumed = LogprobGapWatch()
    resumed.load_state_dict(watch.state_dict())
    assert len(_gaps(resumed, [0.2], first_step=4)) == 1
    old_checkpoint = LogprobGapWatch()
    old_checkpoint.load_state_dict({"streak": 0})  # written before the baseline existed
    assert _gaps(old_checkpoint, [0.2]) == []


class Shifted:
    """Behaviour log-probs moved by `shift` nats from the `after`-th generate call on (foreign weights)."""

    def __init__(self, after, shift):
        self.calls, self.after, self.shift = 0, after, shift

    def __call__(self, logps):
        return [v - self.shift for v in logps] if self.calls > self.after else logps

    def count(self, generate):
        def counted(*args, **kwargs):
            self.calls += 1
            return generate(*args, **kwargs)

        return counted


def test_a_run_whose_engine_moves_a_little_warns_once_it_moves_and_trains_on(tiny_model_dir, tmp_path):
    cfg = small_config(tiny_model_dir, tmp_path / "run", "grpo.yaml", "train.steps=6", "diagnostics.diversity_every=0")
    lines = []
    trainer = make_trainer(cfg, tmp_path / "run", lines.append)
    shifted = Shifted(after=4, shift=0.2)  # steps 5 and 6: 0.2 nats off, 5x under rollout.logprob_gap_warn
    sampler = Rewritten(trainer.ctx.sampler, shifted)
    sampler.generate = shifted.count(sampler.generate)
    trainer.ctx.sampler = sampler
    metrics = trainer.train()
    jumps = [line for line in lines if "moved away from the learner's" in line]
    assert [j.split(":")[1].strip() for j in jumps] == ["step 5", "step 6"]
    assert metrics["rollout/logprob_gap_mean"] < cfg.rollout.logprob_gap_warn


@pytest.mark.parametrize(
    "fn, says",
    [
        (lambda lp: [-0.01] * len(lp), "differ from the learner's by"),  # kept its old weights: -0.01 vs ~-4.6
        (lambda lp: [math.nan] * len(lp), "no finite behaviour log-prob"),
        (lambda lp: None, "no finite behaviour log-prob"),  # too short: the server client drops them
    ],
)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_run_whose_engine_logps_are_wrong_warns_then_stops(tiny_model_dir, tmp_path, fn, says, asynchronous):
    cfg = small_config(
        tiny_model_dir,
        tmp_path / "run",
        "grpo.yaml",
        "train.steps=6",
        "train.checkpoint_every=1",
        "rollout.logprob_gap_stop_steps=3",
        "rollout.tis_cap=2",
        "diagnostics.diversity_every=0",
        f"rollout.async_steps={int(asynchronous)}",
    )
    lines = []
    trainer = make_trainer(cfg, tmp_path / "run", lines.append)
    if asynchronous:
        trainer.producer.engine.sampler = Rewritten(trainer.producer.engine.sampler, fn)
    else:
        trainer.ctx.sampler = Rewritten(trainer.ctx.sampler, fn)
    with pytest.raises(LogprobGapError, match="step 3: .*for 3 steps in a row; stopped"):
        trainer.train()
    warnings = [line for line in lines if says in line]
    assert [w.split(":")[1].strip() for w in warnings] == ["step 1", "step 2"]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-000001", "step-000002"]  # the stopped step wrote none


def test_a_healthy_run_has_a_tiny_gap_and_no_warning(tiny_model_dir, tmp_path):
    cfg = small_config(tiny_model_dir, tmp_path / "run", "grpo.yaml", "train.steps=2", "diagnostics.diversity_every=0")
    lines = []
    metrics = make_trainer(cfg, tmp_path / "run", lines.append).train()
    assert metrics["rollout/logprob_gap_mean"] < 1e-4 and metrics["rollout/behaviour_logps_bad_frac"] == 0.0
    assert not [line for line in lines if "behaviour log-prob" in line or "log-probs differ" in line]


def test_a_rephrasing_scored_on_q0_is_left_out_of_the_gap():
    """TA-GRPO ratio_anchor=original: row 1 was sampled on its rephrasing but the learner scores it on q0, so its
    log-probs differ by the prompt, not the policy: neither a gap nor a missing log-prob is counted for it."""
    behaviour = torch.tensor([[-1.0, -2.0], [-0.1, -0.1]])
    learner = torch.tensor([[-1.5, -2.0], [-6.0, -7.0]])  # row 1: 6-7 nats apart, on another prompt
    on_prompt = torch.tensor([True, False])
    sums: dict = {}
    logprob_gap.accumulate(sums, part(behaviour, [2, 2], on_prompt=on_prompt), learner)
    out = logprob_gap.finish(sums)
    assert out["rollout/logprob_gap_mean"] == pytest.approx(0.25)  # row 0 only: |-0.5|, 0
    assert out["rollout/logprob_gap_max"] == pytest.approx(0.5)
    sums = {}
    missing = part(behaviour, [2, 2], has=torch.tensor([True, False]), on_prompt=on_prompt)
    logprob_gap.accumulate(sums, missing, learner)
    assert logprob_gap.finish(sums)["rollout/behaviour_logps_bad_frac"] == 0.0  # not compared, so not "missing"


def test_a_ta_grpo_run_with_ratios_on_q0_has_a_tiny_gap_and_no_warning(tiny_model_dir, tmp_path):
    """configs/ta_grpo.yaml (ratio_anchor=original): the rephrasings' rows, sampled on their own prompts and
    scored on q0, stay out of the gap; the rest shows the kernels' difference only, with no false alarm."""
    cfg = small_config(
        tiny_model_dir, tmp_path / "run", "ta_grpo.yaml", "train.steps=2", "diagnostics.diversity_every=0",
        "grpo.num_generations=2",
    )  # fmt: skip
    lines = []
    metrics = make_trainer(cfg, tmp_path / "run", lines.append).train()
    assert metrics["rollout/logprob_gap_mean"] < 1e-4 and metrics["rollout/behaviour_logps_bad_frac"] == 0.0
    assert not [line for line in lines if "log-prob" in line]

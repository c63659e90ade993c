"""The sampler-vs-learner log-prob gap: does the engine sample from the weights the learner trains?

Every backend gives behaviour log-probs (the HF loop, colocated vLLM, the vLLM server). On the tokens
the update trains on (sampled by the engine, inside the loss mask) the learner scores the same tokens in
its first forward; `accumulate` / `finish` turn the two into per-step metrics:

| metric                                | meaning                                                          |
|---------------------------------------|------------------------------------------------------------------|
| `rollout/logprob_gap_mean`, `_max`    | mean and max of `|log π_learner − log π_sampler|` per token      |
| `rollout/is_ratio_min`, `_max`, `_std`| the spread of the raw IS ratio `π_learner / π_sampler` per token |
| `rollout/behaviour_logps_bad_frac`    | share of those tokens whose behaviour log-prob is missing or NaN |

In a synchronous run the two policies are the same weights: the gap is the kernels' difference (fp32 vLLM
against the learner: about 1e-5 mean; bf16 more). Under `rollout.async_steps = k` the gap also holds k
updates of drift. A server that says it reloaded but kept its old weights shows nats (-0.01 against
-4.6: a gap of 4.6). A NaN at a response's last position is not counted as bad: the server client
appends an EOS the engine left out, with an unknown log-prob.

`LogprobGapWatch` reads the metrics each step: a gap over `rollout.logprob_gap_warn` or any bad
behaviour log-prob gives a warning line, and `rollout.logprob_gap_stop_steps` such steps in a row stop the
run with one line (`LogprobGapError`, exit 2) saying what to check.

A foreign change far smaller than `logprob_gap_warn` still shows against the run's own baseline: a second
client reloading a SmolLM2 LoRA run's server with MLP weights x1.03 raised the gap from 0.016 to 0.165
nats per token. So a step whose gap is over `JUMP_RATIO` times the median of the last `BASELINE_STEPS`
unflagged steps, and over it by `JUMP_MIN_NATS` (kernel noise and async drift stay under both), gives a
warning line too (never a stop: a jump is a lead, not proof).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import torch

from regroup.batch import RolloutBatch
from regroup.config.schema import RunConfig
from regroup.diagnostics.hooks import WatchHook

KEYS = (
    "rollout/logprob_gap_mean",
    "rollout/logprob_gap_max",
    "rollout/is_ratio_min",
    "rollout/is_ratio_max",
    "rollout/is_ratio_std",
    "rollout/behaviour_logps_bad_frac",
)


def gap_tokens(part: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(trained [b, T], bad [b, T]): tokens the engine sampled inside the loss mask, on the prompt the learner
    scores them on (a TA-GRPO rephrasing with ratios on q0 compares two prompts, not two policies), and
    those of them whose behaviour log-prob is missing (the row has none) or not finite (but for the row's
    last token)."""
    trained = part.completion_mask.bool() & part.sampled_mask & part.on_sampled_prompt[:, None]  # [b, T]
    lengths = part.completion_mask.sum(-1).long()  # [b]
    positions = torch.arange(trained.shape[1], device=trained.device)  # [T]
    last = positions[None, :] == (lengths[:, None] - 1)  # [b, T]
    has = part.has_behaviour_logps[:, None].expand_as(trained)  # [b, T]
    nonfinite = ~torch.isfinite(part.behaviour_logps)  # [b, T]
    bad = trained & (~has | (nonfinite & ~last))  # [b, T]
    return trained, bad


def accumulate(sums: dict, part: RolloutBatch, learner_logps: torch.Tensor) -> None:
    """Add one micro-batch's gap to `sums` (learner_logps [b, T]: the learner's log-probs of the tokens)."""
    trained, bad = gap_tokens(part)
    usable = trained & part.behaviour_usable  # [b, T]
    sums["gap_trained"] = sums.get("gap_trained", 0.0) + float(trained.sum())
    sums["gap_bad"] = sums.get("gap_bad", 0.0) + float(bad.sum())
    if not bool(usable.any()):
        return
    delta = (learner_logps.float() - part.behaviour_logps.float())[usable]  # [n]
    ratio = delta.double().clamp(-50.0, 50.0).exp()  # [n], in float64: its spread is read from moments
    sums["gap_n"] = sums.get("gap_n", 0.0) + float(delta.numel())
    sums["gap_abs"] = sums.get("gap_abs", 0.0) + float(delta.abs().sum())
    sums["gap_max"] = max(sums.get("gap_max", 0.0), float(delta.abs().max()))
    sums["ratio_sum"] = sums.get("ratio_sum", 0.0) + float(ratio.sum())
    sums["ratio_sq"] = sums.get("ratio_sq", 0.0) + float((ratio**2).sum())
    sums["ratio_min"] = min(sums.get("ratio_min", math.inf), float(ratio.min()))
    sums["ratio_max"] = max(sums.get("ratio_max", 0.0), float(ratio.max()))


def finish(sums: dict) -> dict[str, float]:
    """The step's gap metrics from `accumulate`'s sums ({} when no token was sampled by the engine)."""
    trained = sums.get("gap_trained", 0.0)
    if not trained:
        return {}
    out = {"rollout/behaviour_logps_bad_frac": sums.get("gap_bad", 0.0) / trained}
    n = sums.get("gap_n", 0.0)
    if n:
        mean_ratio = sums["ratio_sum"] / n
        out["rollout/logprob_gap_mean"] = sums["gap_abs"] / n
        out["rollout/logprob_gap_max"] = sums["gap_max"]
        out["rollout/is_ratio_min"] = sums["ratio_min"]
        out["rollout/is_ratio_max"] = sums["ratio_max"]
        out["rollout/is_ratio_std"] = math.sqrt(max(sums["ratio_sq"] / n - mean_ratio**2, 0.0))
    return out


class LogprobGapError(OSError):
    """The engine's log-probs say it does not sample from the learner's weights, step after step: the run
    stops (one line, exit 2; the last checkpoint is the one before)."""


JUMP_RATIO = 4.0
"""A gap this many times the run's baseline is a jump (a linear rise, as under a warm-up, stays under 2x
the median of the steps before it)."""
JUMP_MIN_NATS = 0.05
"""... and over the baseline by at least this much (fp32 kernels differ by about 1e-5; bf16 by more)."""
BASELINE_STEPS = 20
"""The baseline is the median gap of up to this many recent steps that were not flagged."""
BASELINE_MIN_STEPS = 3
"""No jump is called before the baseline has this many steps."""


class LogprobGapWatch:
    """Warns when the engine plainly is not running the learner's weights, and stops the run after
    `stop_steps` such steps in a row (0: never stops); warns (only) when the gap jumps against the run's
    own baseline (`JUMP_RATIO`, `JUMP_MIN_NATS`)."""

    def __init__(self, warn_gap: float = 1.0, stop_steps: int = 5, lag: int = 0):
        self.warn_gap = warn_gap
        self.stop_steps = stop_steps
        self.lag = lag
        self.streak = 0
        self.recent: deque[float] = deque(maxlen=BASELINE_STEPS)  # gaps of recent unflagged steps

    @classmethod
    def for_config(cls, cfg: RunConfig) -> LogprobGapWatch:
        r = cfg.rollout
        return cls(r.logprob_gap_warn, r.logprob_gap_stop_steps, r.async_steps)

    def _problem(self, m: dict) -> str | None:
        bad = m.get("rollout/behaviour_logps_bad_frac", 0.0)
        if bad > 0:
            return (
                f"{bad:.0%} of the trained tokens have no finite behaviour log-prob from the engine (missing, "
                "NaN or too short): the IS correction and the gap cannot be computed for them"
            )
        gap = m.get("rollout/logprob_gap_mean")
        if gap is not None and math.isfinite(gap) and gap > self.warn_gap:
            lag = f", {self.lag} update(s) behind by design" if self.lag else ""
            return (
                f"the engine's log-probs differ from the learner's by {gap:.3g} nats per token on average "
                f"(max {m.get('rollout/logprob_gap_max', math.nan):.3g}; rollout.logprob_gap_warn={self.warn_gap:g}"
                f"{lag}): the engine is not sampling from the learner's weights"
            )
        return None

    def _jump(self, m: dict) -> str | None:
        """A warning when the step's gap jumped against the baseline, else None (and the gap joins it)."""
        gap = m.get("rollout/logprob_gap_mean")
        if gap is None or not math.isfinite(gap):
            return None
        baseline = statistics.median(self.recent) if len(self.recent) >= BASELINE_MIN_STEPS else None
        if baseline is not None and gap > JUMP_RATIO * baseline and gap - baseline > JUMP_MIN_NATS:
            return (
                f"the engine's log-probs moved away from the learner's: the gap is {gap:.3g} nats per token "
                f"against a median of {baseline:.3g} over the last {len(self.recent)} steps (warning only): check "
                "that nothing else reloads the engine's weights (a second client or run on the same vLLM server) "
                "and that the last update was not abnormally large (grad_norm)"
            )
        self.recent.append(float(gap))
        return None

    def observe(self, step: int, metrics: dict) -> list[str]:
        problem = self._problem(metrics)
        if problem is None:
            self.streak = 0
            jump = self._jump(metrics)
            return [f"warning: step {step}: {jump}"] if jump else []
        self.streak += 1
        if self.stop_steps and self.streak >= self.stop_steps:
            raise LogprobGapError(
                f"step {step}: {problem}, for {self.streak} steps in a row; stopped. Check that the engine "
                "reloads the pushed weights (time/sync, the server's log) and returns log-probs "
                "(vllm-serve adds --logprobs-mode processed_logprobs); rollout.logprob_gap_stop_steps=0 "
                "only warns"
            )
        then = f"stops after {self.stop_steps} such steps in a row" if self.stop_steps else "warning only"
        return [f"warning: step {step}: {problem} ({then})"]

    def state_dict(self) -> dict:
        return {"streak": self.streak, "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        state = state or {}
        self.streak = int(state.get("streak", 0))
        recent = state.get("recent") or []  # absent in checkpoints written before the baseline existed
        self.recent = deque((float(g) for g in recent if isinstance(g, (int, float))), maxlen=BASELINE_STEPS)


class WatchLogprobGap(WatchHook):
    """`LogprobGapWatch` as an update hook: its warnings are logged, its stop raises."""

    name = "logprob_gap"

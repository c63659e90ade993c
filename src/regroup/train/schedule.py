"""The learning-rate schedule, in one place: linear warm-up, then cosine decay to a floor or constant.

A resume that changes the number of steps (`--resume RUN train.steps=12`) does not re-spread the cosine
from step 0 (the lr would jump: 1e-5 to 4.9e-5 at the resume of an 8-step run): the lr keeps the course it
had up to the resume step, then decays from its value there to the floor at the new last step. The course
is saved with the scheduler (`LambdaLR.state_dict` keeps a callable object's `__dict__`), so a second
resume goes on from where the first left it.
"""

from __future__ import annotations

import math


class LrSchedule:
    """Multiplier of the peak lr at optimizer step `step` (for `torch.optim.lr_scheduler.LambdaLR`).

    Warm-up starts at lr/(warmup+1), never at 0 (a step at lr 0 would waste a rollout), and reaches the
    peak after `warmup_steps`; then cosine to `min_ratio`·lr at `total_steps`, or constant.
    `peak_in_warmup=True` ramps as (step+1)/warmup instead, reaching the peak on the last warm-up step
    (the tiny model's SFT warm-up was measured with that ramp; RL keeps the gentler one).

    The configured plan lives in slots (never saved); `course` (in `__dict__`, saved and restored with the
    scheduler) lists the decays the run has followed, each `[start step, last step]`. When the restored
    course ends elsewhere than this run's `total_steps` (a resume changed `train.steps`), the next call adds
    a decay from the step before it (the resume) to `total_steps`, starting at the lr the run had there.
    """

    __slots__ = ("warmup_steps", "total_steps", "schedule", "min_ratio", "ramp", "__dict__")

    def __init__(self, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float, ramp: int) -> None:
        self.warmup_steps, self.total_steps, self.schedule = int(warmup_steps), int(total_steps), schedule
        self.min_ratio, self.ramp = float(min_ratio), ramp
        self.course = [[0, self.total_steps]]

    def _cosine(self, step: int, start: int, last: int, peak: float) -> float:
        progress = min(1.0, max(0.0, (step - start) / max(1, last - start)))
        return self.min_ratio + (peak - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def _decay(self, step: int, course: list) -> float:
        """The multiplier after warm-up along `course` (the last decay whose start is at or before `step`)."""
        index = max(i for i, (start, _) in enumerate(course) if i == 0 or start <= step)
        if index == 0:
            return self._cosine(step, self.warmup_steps, course[0][1], 1.0)
        start = max(course[index][0], self.warmup_steps)  # a resume during warm-up: the decay starts after it
        peak = self._decay(start, course[:index])
        return self._cosine(step, start, course[index][1], peak)

    def __call__(self, step: int) -> float:
        if self.course[-1][1] != self.total_steps:  # restored from a run planned for another length
            self.course = [list(part) for part in self.course] + [[max(step - 1, 0), self.total_steps]]
        if step < self.warmup_steps:
            return (step + 1) / self.ramp
        if self.schedule == "constant":
            return 1.0
        return self._decay(step, self.course)


def lr_lambda(
    warmup_steps: int, total_steps: int, schedule: str, min_ratio: float, *, peak_in_warmup: bool = False
) -> LrSchedule:
    """The schedule `LrSchedule` of these settings (`peak_in_warmup`: the warm-up reaches the peak on its
    last step)."""
    return LrSchedule(
        warmup_steps, total_steps, schedule, min_ratio, warmup_steps if peak_in_warmup else warmup_steps + 1
    )


def resume_note(old_steps: int, new_steps: int, resume_step: int, schedule: str, min_ratio: float) -> str | None:
    """The one line a resume prints when it changes `train.steps` under a cosine schedule, else None."""
    if old_steps == new_steps or schedule != "cosine":
        return None
    return (
        f"train.steps {old_steps} -> {new_steps}: the cosine lr keeps its course up to the checkpoint (step "
        f"{resume_step}), then decays from its value there to optim.min_lr_ratio={min_ratio:g} x optim.lr at step "
        f"{new_steps} (it is not re-spread from step 0)"
    )

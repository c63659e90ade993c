"""A cosine run resumed with more steps keeps the learning rate it had up to the checkpoint, then decays from
there to its minimum (`optim.min_lr_ratio`) at the new last step (before: it jumped back up to the middle of a
new cosine); a resume of a resume keeps both courses, and one line says so."""

from __future__ import annotations

import json

import pytest

from regroup.cli import main

pytestmark = pytest.mark.reliability


def _lr_after_resume(total_before: int, total_after: int, resume_at: int, warmup: int = 1) -> list[float]:
    import torch

    from regroup.train.schedule import lr_lambda

    def make(total):
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=1.0)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, total, "cosine", 0.1))

    opt, sched = make(total_before)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(resume_at):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    state = sched.state_dict()
    opt, sched = make(total_after)
    sched.load_state_dict(state)
    for _ in range(resume_at, total_after):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    return lrs


def test_a_resume_with_more_steps_goes_on_from_the_lr_it_had():
    lrs = _lr_after_resume(8, 12, resume_at=4)
    planned = _lr_after_resume(8, 8, resume_at=4)
    assert lrs[:5] == planned[:5]  # the course up to the resume is the one the run had
    assert all(b <= a for a, b in zip(lrs[4:], lrs[5:]))  # no jump up: it decays from there
    assert lrs[-1] == pytest.approx(0.1) and lrs[5] > planned[5]  # to the floor at the new last step, more slowly


def test_a_resume_of_a_resume_keeps_both_courses():
    import torch

    from regroup.train.schedule import lr_lambda

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    first = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, 12, "cosine", 0.1))
    first.load_state_dict({**first.state_dict(), "lr_lambdas": [{"course": [[0, 8]]}], "last_epoch": 4})
    opt.step()
    first.step()
    state = first.state_dict()
    assert state["lr_lambdas"] == [{"course": [[0, 8], [4, 12]]}]
    second = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, 12, "cosine", 0.1))
    second.load_state_dict(state)
    opt.step()
    second.step()
    assert second.get_last_lr()[0] < first.get_last_lr()[0]


def test_resume_with_more_steps_does_not_raise_the_lr_and_says_so(run_copy, capsys, figures):
    """The finished 2-step run (warm-up 1, cosine to 0.1) resumed to 4 steps: the lr stays at the floor it
    had reached (before: it jumped back up to the middle of a new cosine)."""
    before = [json.loads(x)["lr"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert main(["train", "--resume", str(run_copy), "train.steps=4"]) == 0
    lrs = [json.loads(x)["lr"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert lrs[:2] == before and lrs[2] <= lrs[1] and lrs[3] <= lrs[2]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.steps 2 -> 4")]
    assert len(notes) == 1 and "not re-spread" in notes[0]
    figures(f"lr by step, 2-step run resumed to 4: {[f'{x:.2e}' for x in lrs]}")

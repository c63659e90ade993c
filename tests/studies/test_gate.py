"""studies.gate: the registered pilot's verdict from its kept table, by hand."""

import pytest

from studies.gate import GateSettings, gate_verdict, pilot_overrides, summarize_gate
from studies.table import write_table


def _entry(correct, n=4):
    return {"ids": f"v0..{len(correct) - 1}", "n": n, "correct": correct}


def _rows(final_a, final_b):
    start = {"regime": "gate", "arm": "start", "seed": 0, "evals": {"t1": _entry([1, 2, 0, 1])}, "extra": {}}
    a = {
        "regime": "gate",
        "arm": "drgrpo_lr0.0001",
        "seed": 0,
        "evals": {"step50": _entry([1, 2, 1, 1]), "step150": _entry(final_a)},
        "extra": {},
    }
    b = {"regime": "gate", "arm": "drgrpo_lr0.0002", "seed": 0, "evals": {"step150": _entry(final_b)}, "extra": {}}
    return [start, a, b]


def test_the_gate_takes_the_better_rate_and_pairs_its_gain_over_the_problems():
    g = GateSettings(eval_at=(50, 150))
    # start pass@1 per problem: .25 .5 0 .25 (mean .25); lr 1e-4 at 150: .5 .5 .25 .25 -> diffs .25 0 .25 0
    v = gate_verdict(_rows([2, 2, 1, 1], [1, 2, 0, 1]), g)
    assert v["start"] == pytest.approx(0.25)
    best = v["best"]
    assert best["arm"] == "drgrpo_lr0.0001" and best["gain"] == pytest.approx(0.125)
    # sd of (.25, 0, .25, 0) = 0.1443, SE = 0.0722; t_{0.975, 3} = 3.1824
    assert best["se"] == pytest.approx(0.144338 / 2, rel=1e-4)
    assert v["ci"][0] == pytest.approx(0.125 - 3.182446 * 0.072169, rel=1e-4)
    assert v["met"] is True and best["curve"]["step50"] == pytest.approx(5 / 16)
    flat = gate_verdict(_rows([1, 2, 0, 1], [1, 2, 0, 1]), g)  # neither rate moves: a tie goes to the smaller
    assert flat["met"] is False and flat["best"]["arm"] == "drgrpo_lr0.0001" and flat["best"]["gain"] == 0


def test_a_gain_under_the_threshold_fails_and_says_what_that_means(tmp_path):
    g = GateSettings(eval_at=(50, 150), min_gain=0.10)
    write_table(_rows([1, 2, 1, 1], [1, 2, 0, 1]), tmp_path / "runs.jsonl")  # +0.0625 at best
    text = summarize_gate([tmp_path], g)
    assert "**failed**" in text and "RL does not learn at this budget" in text
    assert "| drgrpo_lr0.0001 | 31.2 % | 31.2 % | +6.2 ± 6.2 |" in text


def test_the_pilot_is_dr_grpo_at_a_constant_lr_with_checkpoints_at_the_evaluated_steps():
    o = pilot_overrides(GateSettings(), 2e-4)
    assert "grpo.advantage_estimator=dr_grpo" in o and "optim.schedule=constant" in o
    assert "train.checkpoint_every=50" in o and "train.keep_checkpoints=3" in o
    assert "optim.lr=0.0002" in o and "grpo.num_generations=8" in o

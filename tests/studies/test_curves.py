"""studies.curves: learning curves, AUC and steps-to-target from kept-table rows, by hand."""

import pytest

from studies.curves import auc, auc_by_seed, auc_difference, curve, plot_curves, samples_seen, steps_to_target

KEYS = ["step0", "step50", "step100"]


def _entry(correct, n=4):
    return {"ids": f"p0..{len(correct) - 1}", "n": n, "correct": correct}


def _row(arm, seed, *per_step):
    return {"regime": "r", "arm": arm, "seed": seed, "evals": {k: _entry(c) for k, c in zip(KEYS, per_step)}}


# pass@1 per seed and step: a s0 .5 .75 1; a s1 .5 .5 .75; b s0 .5 .5 .5; b s1 .5 .5 .75
ROWS = [
    _row("a", 0, [2, 2], [4, 2], [4, 4]),
    _row("a", 1, [2, 2], [2, 2], [4, 2]),
    _row("b", 0, [2, 2], [2, 2], [2, 2]),
    _row("b", 1, [2, 2], [2, 2], [4, 2]),
]


def test_the_curve_is_the_mean_over_seeds_with_a_t_band():
    points = curve(ROWS, "a", KEYS)
    assert [p[0] for p in points] == [0, 50, 100]
    assert points[0] == (0, 0.5, 0.5, 0.5)  # no spread: a zero-width band
    # step 50: .75 and .5, mean .625, sd .17678, SE .125, t_{.975, 1} = 12.7062
    step, mean, lo, hi = points[1]
    assert mean == pytest.approx(0.625) and lo == pytest.approx(0.625 - 12.7062 * 0.125, rel=1e-4)
    assert hi == pytest.approx(0.625 + 12.7062 * 0.125, rel=1e-4)
    one = curve(ROWS[:1], "a", KEYS)  # one seed: no band
    assert one[2] == (100, 1.0, None, None)
    # the stratum {p1} at step 100: 1.0 and .5, mean .75, SE .25
    hard = curve(ROWS, "a", ["step0", "step100"], problems={"p1"})
    assert hard[1][:2] == (100, 0.75) and hard[1][2] == pytest.approx(0.75 - 12.7062 * 0.25, rel=1e-4)
    assert samples_seen(points[:1], 16) == [(0, 0.5, 0.5, 0.5)] and samples_seen([(50, 0.6, None, None)], 16) == [
        (800, 0.6, None, None)
    ]


def test_auc_is_the_trapezoid_over_the_checkpoints_normalised_by_the_last_step():
    # seed 0 of a: 50 (.5 + .75) / 2 + 50 (.75 + 1) / 2 = 75, / 100
    assert auc({0: 0.5, 50: 0.75, 100: 1.0}, 100) == pytest.approx(0.75)
    assert auc({0: 0.3, 100: 0.3}, 100) == pytest.approx(0.3)  # flat at p: AUC p
    assert auc({0: 0.5, 50: 0.75, 100: 1.0, 150: 0.0}, 100) == pytest.approx(0.75)  # past the last step: ignored
    with pytest.raises(ValueError):
        auc({0: 0.5, 50: 0.75}, 100)  # the curve does not reach the last step
    assert auc_by_seed(ROWS, "a", KEYS, 100) == pytest.approx({0: 0.75, 1: 0.5625})


def test_steps_to_target_is_the_first_checkpoint_reaching_it():
    c = {0: 0.5, 50: 0.75, 100: 1.0}
    assert steps_to_target(c, 0.75) == 50 and steps_to_target(c, 0.5) == 0
    assert steps_to_target(c, 1.01) is None


def test_the_auc_difference_is_the_paired_t_over_seeds():
    # a − b per seed: .75 − .5 = .25, .5625 − .5625 = 0: mean .125, SE .125, df 1, t = 1: p = 0.5 (Cauchy)
    c, p, ci = auc_difference(ROWS, "a", "b", KEYS, 100)
    assert c.delta == pytest.approx(0.125) and c.se == pytest.approx(0.125) and c.seeds == 2
    assert p == pytest.approx(0.5) and ci[0] == pytest.approx(0.125 - 12.7062 * 0.125, rel=1e-4)
    single, p1, ci1 = auc_difference(ROWS[::2], "a", "b", KEYS, 100)  # one seed: no test
    assert single.seeds == 1 and p1 is None and ci1 is None


def test_the_plot_is_a_png(tmp_path):
    out = plot_curves(
        {"a": curve(ROWS, "a", KEYS), "b": curve(ROWS, "b", KEYS)}, tmp_path / "c.png", {"a": 16, "b": 16}
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

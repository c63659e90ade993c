"""studies.stats: scipy's t and statsmodels' Holm against closed forms, tables and hand-computed cases."""

import math

import pytest

import studies.stats as stats


def test_student_t_tails_and_quantiles_by_closed_forms_and_tables():
    # closed forms: 1 df is the Cauchy, 2 df has P(T > t) = (1 − t/√(t² + 2)) / 2
    for t in (0.3, 1.0, 2.4, 7.0):
        assert stats.t_sf(t, 1.0) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-9)
        assert stats.t_sf(t, 2.0) == pytest.approx(0.5 * (1 - t / math.sqrt(t * t + 2)), rel=1e-9)
        assert stats.t_sf(-t, 3.0) == pytest.approx(1 - stats.t_sf(t, 3.0), rel=1e-12)
    # table values: t_{0.975} for 4, 10, 30 df; the normal limit
    for df, q in ((4, 2.776445), (10, 2.228139), (30, 2.042272)):
        assert stats.t_ppf(0.975, df) == pytest.approx(q, abs=1e-5)
        assert 2 * stats.t_sf(q, df) == pytest.approx(0.05, abs=1e-6)
    assert stats.t_sf(1.959964, math.inf) == pytest.approx(0.025, abs=1e-6)
    assert stats.t_sf(1.959964, 1e7) == pytest.approx(0.025, abs=1e-6)
    with pytest.raises(ValueError):
        stats.t_sf(1.0, 0.0)


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 0.02, 0.03, 0.06, max(0.06, 0.04) = 0.06; None stays None
    assert stats.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0] and stats.holm([]) == []


def test_the_two_way_bootstrap_of_a_table_whose_problems_are_identical_is_the_seed_bootstrap():
    import numpy as np

    # seed 0 differs by 0 on every problem, seed 1 by 1: resampling the problems changes nothing, and the
    # resampled seeds give the mean 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4 (counts (2, 0), (1, 1), (0, 2))
    diffs = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    two_way = stats.crossed_bootstrap(diffs, resamples=20_000)
    seeds_only = stats.crossed_bootstrap(diffs, resamples=20_000, problems=False)
    assert np.allclose(two_way, seeds_only)
    shares = [np.mean(np.isclose(two_way, m)) for m in (0.0, 0.5, 1.0)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.02)
    assert stats.percentile_interval(two_way) == (0.0, 1.0)
    # the problems alone carry no spread: their bootstrap is the point
    assert stats.percentile_interval(stats.crossed_bootstrap(diffs, 2000, seeds=False)) == (0.5, 0.5)


def test_the_two_way_bootstrap_of_a_table_whose_seeds_are_identical_reflects_the_problems_only():
    import numpy as np

    diffs = [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]  # every seed the same: only the problems vary
    two_way = stats.crossed_bootstrap(diffs, resamples=20_000)
    assert np.allclose(two_way, stats.crossed_bootstrap(diffs, resamples=20_000, seeds=False))
    assert stats.percentile_interval(stats.crossed_bootstrap(diffs, 2000, problems=False)) == (0.5, 0.5)
    shares = [np.mean(np.isclose(two_way, m)) for m in (0.0, 0.5, 1.0)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.02)


def test_the_two_way_bootstrap_is_reproducible_and_wider_than_either_margin():
    import numpy as np

    rng = np.random.default_rng(7)
    diffs = rng.normal(0.0, 1.0, (6, 40)) + rng.normal(0.0, 1.0, (6, 1)) + rng.normal(0.0, 1.0, (1, 40))
    a, b = stats.crossed_bootstrap(diffs, 5000), stats.crossed_bootstrap(diffs, 5000)
    assert np.array_equal(a, b)  # a fixed RNG seed: the page's interval is the same on every run
    assert a.mean() == pytest.approx(diffs.mean(), abs=0.05)
    assert a.std() > stats.crossed_bootstrap(diffs, 5000, problems=False).std()
    assert a.std() > stats.crossed_bootstrap(diffs, 5000, seeds=False).std()
    with pytest.raises(ValueError):
        stats.crossed_bootstrap([1.0, 2.0])


def test_the_stratified_test_by_hand():
    # strata [1, 2, 3] and [2, 4]: means 2 and 3, overall 12 / 5 = 2.4; pooled variance (1 + 0 + 1 + 1 + 1) / 3;
    # SE² = pooled · ((3/5)²/3 + (2/5)²/2) = pooled · 0.2; the strata's difference: t = 1 / √(pooled · (1/3 + 1/2))
    pooled = 4 / 3
    estimate, p, heterogeneity = stats.stratified_mean_test([[1.0, 2.0, 3.0], [2.0, 4.0]])
    assert estimate == pytest.approx(2.4)
    assert p == pytest.approx(2 * stats.t_sf(2.4 / math.sqrt(pooled * 0.2), 3.0))
    assert heterogeneity == pytest.approx(2 * stats.t_sf(1 / math.sqrt(pooled * (1 / 3 + 1 / 2)), 3.0))
    with pytest.raises(ValueError):
        stats.stratified_mean_test([[1.0, 2.0]])


def test_the_crossed_anova_interval_by_hand():
    # [[1, 2], [3, 6]]: mean 3; seed means 1.5, 4.5 (MS = 2 · 4.5 = 9); problem means 2, 4 (MS = 2 · 2 = 4);
    # residuals ±0.5 (MS = 4 · 0.25 / 1 = 1): var = (9 + 4 − 1) / 4 = 3, df = 12² / (81 + 16 + 1)
    mean, se, df, (lo, hi) = stats.crossed_anova_interval([[1.0, 2.0], [3.0, 6.0]])
    assert (mean, se, df) == pytest.approx((3.0, math.sqrt(3.0), 144 / 98))
    assert hi - mean == pytest.approx(stats.t_ppf(0.975, 144 / 98) * math.sqrt(3.0))
    # identical problems: the paired t over seeds (sd of the seed means / √S, S − 1 df)
    mean, se, df, _ = stats.crossed_anova_interval([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    assert (mean, df) == pytest.approx((2.0, 2.0)) and se == pytest.approx(math.sqrt(7.0 / 3.0))

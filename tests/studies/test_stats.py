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

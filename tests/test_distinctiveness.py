"""DaGRPO distinctiveness mask (SPEC §2a): hand-computed groups."""

from __future__ import annotations

import pytest
import torch

from regroup.algo.distinctiveness import distinctiveness_mask, mask_stats

NAN = float("nan")


def T(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def test_basic_group_delta_3():
    # A: + + − − ; S: 9, 6, 5, 2 -> S⁻max = 5, S⁺min = 6
    # positives: 9 − 5 = 4 ≥ 3 keep; 6 − 5 = 1 drop.  negatives: 6 − 5 = 1 drop; 6 − 2 = 4 keep
    m = distinctiveness_mask(T(1, 1, -1, -1), T(9, 6, 5, 2), ids(0, 0, 0, 0), 3.0)
    assert m.tolist() == [True, False, False, True]
    assert m.dtype == torch.bool


def test_tie_exactly_at_delta_keeps_and_below_drops():
    # 8 − 5 = 3 = δ keeps; 5 − 2 = 3 keeps. Float scores: 7.3 − 4.3 = 2.9999999999999996 in float64 still keeps.
    assert distinctiveness_mask(T(1, -1), T(8, 5), ids(0, 0), 3.0).tolist() == [True, True]
    assert distinctiveness_mask(T(1, -1), T(7.3, 4.3), ids(0, 0), 3.0).tolist() == [True, True]
    s = torch.tensor([7.3, 4.3], dtype=torch.float64)
    assert distinctiveness_mask(T(1, -1), s, ids(0, 0), 3.0).tolist() == [True, True]
    # δ − ε: difference 2.99 < 3 drops both sides
    assert distinctiveness_mask(T(1, -1), T(7.99, 5), ids(0, 0), 3.0).tolist() == [False, False]


def test_empty_other_side_masks_nothing():
    # only positives (and a zero): nothing masked even though scores are close
    assert distinctiveness_mask(T(1, 1, 0), T(2, 3, 3), ids(0, 0, 0), 3.0).tolist() == [True, True, True]
    # only negatives
    assert distinctiveness_mask(T(-1, -2), T(9, 9), ids(0, 0), 3.0).tolist() == [True, True]


def test_zero_advantage_always_kept():
    # A = 0 sample with a score inside the band is kept; it does not count as G⁺ or G⁻ either:
    # positives S 9, negatives S 5 -> 9 − 5 = 4 keep both; the zero-advantage 8 would break S⁺min if counted
    m = distinctiveness_mask(T(1, 0, -1), T(9, 6, 5), ids(0, 0, 0), 3.0)
    assert m.tolist() == [True, True, True]


def test_all_masked():
    # every positive within δ of the best negative and vice versa
    m = distinctiveness_mask(T(1, 1, -1, -1), T(6, 7, 5, 6), ids(0, 0, 0, 0), 3.0)
    assert m.tolist() == [False, False, False, False]


def test_unscored_kept_and_ignored_for_extremes():
    # negative with NaN score: kept, and ignored for S⁻max -> S⁻max = 2 (not NaN): positive 6 − 2 = 4 keep
    m = distinctiveness_mask(T(1, -1, -1), T(6, NAN, 2), ids(0, 0, 0), 3.0)
    assert m.tolist() == [True, True, True]
    # all negatives unscored -> G⁻ has no score: positives kept; the unscored positive is kept too
    m = distinctiveness_mask(T(1, 1, -1), T(4, NAN, NAN), ids(0, 0, 0), 3.0)
    assert m.tolist() == [True, True, True]
    # unscored positive ignored for S⁺min: S⁺min = 9 (a NaN min would drop the negative), 9 − 5 = 4 keep
    m = distinctiveness_mask(T(1, 1, -1), T(NAN, 9, 5), ids(0, 0, 0), 3.0)
    assert m.tolist() == [True, True, True]
    # and with negative 7: 9 − 7 = 2 drops both the 9 and the 7; the unscored positive stays
    m = distinctiveness_mask(T(1, 1, -1), T(NAN, 9, 7), ids(0, 0, 0), 3.0)
    assert m.tolist() == [True, False, False]


def test_several_groups_interleaved():
    # group 10: positions 0, 2, 4 -> A +, −, − ; S 8, 6, 4
    #   S⁻max = 6 -> 8 − 6 = 2 drop; S⁺min = 8: 8 − 6 = 2 drop, 8 − 4 = 4 keep
    # group −3: positions 1, 3, 5 -> A −, +, + ; S 3, 5, 9
    #   S⁻max = 3 -> 5 − 3 = 2 drop, 9 − 3 = 6 keep; S⁺min = 5: 5 − 3 = 2 drop
    # group 7: position 6 alone, A 0 -> keep
    adv = T(1, -1, -1, 1, -1, 1, 0)
    scores = T(8, 3, 6, 5, 4, 9, 1)
    g = ids(10, -3, 10, -3, 10, -3, 7)
    m = distinctiveness_mask(adv, scores, g, 3.0)
    assert m.tolist() == [False, False, False, False, True, True, True]
    # the same with another δ: δ = 2 keeps all the differences of exactly 2
    assert distinctiveness_mask(adv, scores, g, 2.0).tolist() == [True] * 7
    # permutation invariance
    perm = torch.tensor([6, 3, 0, 5, 1, 4, 2])
    assert distinctiveness_mask(adv[perm], scores[perm], g[perm], 3.0).tolist() == [m[i].item() for i in perm]


def test_delta_zero_keeps_everything_ordered():
    # δ = 0: a positive scored below a negative is still dropped (5 − 6 < 0)
    assert distinctiveness_mask(T(1, -1), T(5, 6), ids(0, 0), 0.0).tolist() == [False, False]
    assert distinctiveness_mask(T(1, -1), T(6, 6), ids(0, 0), 0.0).tolist() == [True, True]


def test_errors_and_empty():
    with pytest.raises(ValueError, match="same length"):
        distinctiveness_mask(T(1, -1), T(5), ids(0, 0), 3.0)
    with pytest.raises(ValueError, match="delta"):
        distinctiveness_mask(T(1, -1), T(5, 6), ids(0, 0), -1.0)
    assert distinctiveness_mask(T(), T(), ids(), 3.0).numel() == 0


def test_mask_stats():
    # positives at 0, 1, 2 (one dropped), negatives at 3, 4 (both dropped), zero at 5
    adv = T(1, 2, 0.5, -1, -1, 0)
    mask = torch.tensor([True, False, True, False, False, True])
    s = mask_stats(adv, mask)
    assert s["frac_pos_masked"] == pytest.approx(1 / 3)
    assert s["frac_neg_masked"] == 1.0
    assert s["frac_masked"] == pytest.approx(0.5)
    assert s["num_pos"] == 3.0 and s["num_neg"] == 2.0
    empty = mask_stats(T(0, 0), torch.tensor([True, True]))
    assert empty["frac_pos_masked"] == 0.0 and empty["frac_neg_masked"] == 0.0

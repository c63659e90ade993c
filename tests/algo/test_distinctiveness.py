"""DaGRPO distinctiveness mask (SPEC §2a): hand-computed groups."""

from __future__ import annotations

import math
import random

import pytest
import torch

from regroup.algo.distinctiveness import distinctiveness_mask, mask_stats, pair_masked_advantages

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


# ------------------------------------------------------------------------------ the per-pair reading


def _group(n):
    return torch.zeros(n, dtype=torch.long)


def test_pair_mask_the_issue_case_by_hand():
    # R = [1, 1, 0, 0] under Dr. GRPO: A = R - 0.5; S = [9, 5, 4, 1], delta = 3. Only pair (1, 2) has
    # 5 - 4 < 3: per sample both 1 and 2 drop; per pair only their term (A1 - A2)/4 = 0.25 goes.
    a, s = torch.tensor([0.5, 0.5, -0.5, -0.5]), torch.tensor([9.0, 5.0, 4.0, 1.0])
    keep = distinctiveness_mask(a, s, _group(4), 3.0)
    assert (a * keep).tolist() == [0.5, 0.0, 0.0, -0.5]
    masked, stats = pair_masked_advantages(a, s, _group(4), 3.0)
    assert masked.tolist() == pytest.approx([0.5, 0.25, -0.25, -0.5])
    assert stats["pairs"] == 4 and stats["pairs_masked"] == 1 and stats["frac_pairs_masked"] == 0.25


def test_pair_mask_under_std_scaling_keeps_the_full_groups_scale():
    # R = [1, 0, 0], mean 1/3, std (n-1) 0.57735: A = c (R - 1/3) with c = 1 / std. Pair (0, 2) is within
    # delta: A'_0 = c (R0 - R1) / 3 = c / 3, A'_2 = 0 (its only non-zero term dropped), A'_1 = -c / 3.
    c = 1.0 / math.sqrt(1.0 / 3.0)
    a = torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64) * c
    masked, _ = pair_masked_advantages(a, torch.tensor([6.0, 1.0, 5.0]), _group(3), 3.0)
    assert masked.tolist() == pytest.approx([c / 3, -c / 3, 0.0])


def test_pair_mask_exact_delta_unscored_and_continuous_rewards():
    a = torch.tensor([0.5, -0.5])
    # exactly delta apart keeps (7.3 - 4.3 vs 3 in float rounding)
    assert pair_masked_advantages(a, torch.tensor([7.3, 4.3]), _group(2), 3.0)[0].tolist() == pytest.approx([0.5, -0.5])
    # an unscored member keeps the pair, as the per-sample rule never masks unscored samples
    assert pair_masked_advantages(a, torch.tensor([5.0, math.nan]), _group(2), 3.0)[0].tolist() == [0.5, -0.5]
    # three reward levels R = [2, 1, 0] (A = [1, 0, -1]), S = [9, 8, 2]: pair (0,1) is within delta (9 - 8),
    # (0,2) and (1,2) stand apart. A'_0 = (A0 - A2)/3 = 2/3, A'_1 = (A1 - A2)/3 = 1/3,
    # A'_2 = ((A2 - A0) + (A2 - A1))/3 = -1: the pair terms still sum to 0
    masked, stats = pair_masked_advantages(
        torch.tensor([1.0, 0.0, -1.0]), torch.tensor([9.0, 8.0, 2.0]), _group(3), 3.0
    )
    assert masked.tolist() == pytest.approx([2 / 3, 1 / 3, -1.0]) and stats["pairs_masked"] == 1


def test_pair_mask_refuses_advantages_without_the_group_mean_baseline():
    with pytest.raises(ValueError, match="mean"):
        pair_masked_advantages(torch.tensor([1.0, 0.5]), torch.tensor([9.0, 1.0]), _group(2), 3.0)


def test_pair_and_sample_readings_agree_wherever_they_coincide():
    """Random groups with two reward levels under Dr. GRPO or std scaling: nothing masked per pair means
    nothing changed; a sample whose positive-negative pairs all keep or all drop gets A_i·λ_i exactly."""
    rng = random.Random(0)
    checked = whole = 0
    for _ in range(300):
        sizes = [rng.randint(2, 8) for _ in range(rng.randint(1, 4))]
        gids = torch.tensor([g for g, n in enumerate(sizes) for _ in range(n)])
        rewards = torch.tensor([float(rng.random() < 0.5) for _ in gids], dtype=torch.float64)
        adv = torch.zeros_like(rewards)
        for g in range(len(sizes)):
            m = gids == g
            centred = rewards[m] - rewards[m].mean()
            adv[m] = centred / (rewards[m].std() + 1e-4) if rng.random() < 0.5 and m.sum() > 1 else centred
        scores = torch.tensor([float(rng.randint(1, 10)) for _ in gids])
        delta = float(rng.choice([0, 1, 2, 3, 5]))
        per_sample = adv * distinctiveness_mask(adv, scores, gids, delta)
        per_pair, stats = pair_masked_advantages(adv, scores, gids, delta)
        if stats["pairs_masked"] == 0:
            assert torch.allclose(per_pair, adv)
        for i in range(len(gids)):
            same = (gids == gids[i]) & ((adv > 0) != (adv[i] > 0)) & (adv != 0) & (adv[i] != 0)
            hi_gap = torch.where(adv[i] > 0, scores[i] - scores[same], scores[same] - scores[i])
            kept = hi_gap >= delta - 1e-6
            if bool(same.any()) and (bool(kept.all()) or not bool(kept.any())):
                assert float(per_pair[i]) == pytest.approx(float(per_sample[i]), abs=1e-9)
                checked += 1
            whole += 1
    assert checked > whole // 3  # the property was exercised on many samples, not vacuously

"""group_advantages / group_reward_stats: hand-computed cases (SPEC §1, §3.6)."""

from __future__ import annotations

import math

import pytest
import torch

from regroup.algo.advantages import group_advantages, group_reward_stats

NAN = float("nan")
EPS = 1e-4


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def test_mixed_group_scale_group():
    # rewards 1,0,0,1: mean 0.5, deviations ±0.5, unbiased var = 4·0.25/3 = 1/3, std = √(1/3) = 0.57735
    # A = ±0.5 / (0.57735 + 1e-4) = ±0.865876
    a = group_advantages(t(1, 0, 0, 1), ids(0, 0, 0, 0))
    s = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert torch.allclose(a, t(s, -s, -s, s), atol=1e-12)
    assert abs(s - 0.865876) < 1e-6


def test_all_equal_groups_give_exact_zero():
    # binary all-correct, all-wrong, and a float value whose mean is not exactly representable (0.1·3/3)
    r = t(1, 1, 1, 0, 0, 0, 0.1, 0.1, 0.1)
    g = ids(0, 0, 0, 1, 1, 1, 2, 2, 2)
    for scale in ("group", "batch", "none"):
        a = group_advantages(r, g, scale=scale)
        assert torch.equal(a, torch.zeros(9, dtype=torch.float64)), scale


def test_unscored_left_out_of_mean_and_std():
    # scored 1,0,0: mean 1/3; deviations 2/3, −1/3, −1/3; var = (4/9 + 1/9 + 1/9)/2 = 1/3; std = 0.57735
    a = group_advantages(t(1, NAN, 0, 0), ids(5, 5, 5, 5))
    s = math.sqrt(1 / 3) + EPS
    assert torch.allclose(a, t((2 / 3) / s, 0.0, (-1 / 3) / s, (-1 / 3) / s), atol=1e-12)
    assert a[1].item() == 0.0


def test_singleton_and_single_scored_groups_are_zero():
    # group 0: one sample; group 1: one scored + two unscored; group 2: all unscored
    r = t(1, NAN, 1, NAN, NAN, NAN)
    g = ids(0, 1, 1, 1, 2, 2)
    for scale in ("group", "batch", "none"):
        a = group_advantages(r, g, scale=scale)
        assert torch.equal(a, torch.zeros(6, dtype=torch.float64)), scale
        assert not torch.isnan(a).any()


def test_out_of_order_arbitrary_ids():
    # group 7 = {1, 0, 1} at positions 0,2,5: mean 2/3, dev 1/3,−2/3,1/3, var=(1/9+4/9+1/9)/2=1/3
    # group −2 = {0, 1} at positions 1,4 (position 3 is group 1000, singleton -> 0):
    #   mean 0.5, dev ∓0.5, var = 0.5/1 = 0.5, std = 0.70711
    r = t(1, 0, 0, 1, 1, 1)
    g = ids(7, -2, 7, 1000, -2, 7)
    a = group_advantages(r, g)
    s7 = math.sqrt(1 / 3) + EPS
    s2 = math.sqrt(0.5) + EPS
    expected = t((1 / 3) / s7, -0.5 / s2, (-2 / 3) / s7, 0.0, 0.5 / s2, (1 / 3) / s7)
    assert torch.allclose(a, expected, atol=1e-12)
    # permuting the batch permutes the advantages: grouping is by id, never by position
    perm = torch.tensor([3, 5, 0, 4, 1, 2])
    assert torch.allclose(group_advantages(r[perm], g[perm]), expected[perm], atol=1e-12)


def test_scale_none_is_centred_reward():
    # Dr. GRPO: 1,0,0,1 -> ±0.5; unscored -> 0; group {0.2, 0.8} -> ∓0.3
    a = group_advantages(t(1, 0, 0, 1, NAN, 0.2, 0.8), ids(0, 0, 0, 0, 1, 1, 1), scale="none")
    assert torch.allclose(a, t(0.5, -0.5, -0.5, 0.5, 0.0, -0.3, 0.3), atol=1e-12)


def test_scale_batch_uses_batch_std_and_group_mean():
    # g0 = {1, 0}: group mean 0.5 -> centred ±0.5; g1 = {1, 1} -> 0; g2 = {NaN} ignored.
    # batch std over scored rewards 1,0,1,1: mean .75, squared devs .0625+.5625+.0625+.0625 = .75,
    # unbiased var .75/3 = .25, std .5  -> A = ±0.5/(0.5+1e-4) = ±0.99980
    a = group_advantages(t(1, 0, 1, 1, NAN), ids(0, 0, 1, 1, 2), scale="batch")
    s = 0.5 / (0.5 + EPS)
    assert torch.allclose(a, t(s, -s, 0, 0, 0), atol=1e-12)


def test_eps_is_a_setting():
    # group {1, 0}: std = √0.5; with eps = 0.5: A = 0.5/(0.70711+0.5) = 0.41421
    a = group_advantages(t(1, 0), ids(0, 0), eps=0.5)
    assert torch.allclose(a, t(0.5 / (math.sqrt(0.5) + 0.5), -0.5 / (math.sqrt(0.5) + 0.5)), atol=1e-12)


def test_matches_loop_reference_on_random_batch():
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 3, (200,), generator=gen).double() / 2  # rewards in {0, .5, 1}
    r[torch.rand(200, generator=gen) < 0.1] = NAN
    g = torch.randint(-5, 40, (200,), generator=gen)
    a = group_advantages(r, g)
    for gid in g.unique():
        sel = (g == gid) & ~torch.isnan(r)
        vals = r[sel]
        if vals.numel() < 2 or bool((vals == vals[0]).all()):
            exp = torch.zeros_like(vals)
        else:
            exp = (vals - vals.mean()) / (vals.std(unbiased=True) + EPS)
        assert torch.allclose(a[sel], exp, atol=1e-10)
    assert torch.equal(a[torch.isnan(r)], torch.zeros(int(torch.isnan(r).sum()), dtype=torch.float64))


def test_dtype_and_empty():
    assert group_advantages(torch.tensor([1.0, 0.0]), ids(0, 0)).dtype == torch.float32
    assert group_advantages(t(1, 0), ids(0, 0)).dtype == torch.float64
    assert group_advantages(torch.tensor([1, 0]), ids(0, 0)).dtype == torch.float32  # int rewards promoted
    assert group_advantages(t(), ids()).numel() == 0


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t(1, 0), ids(0, 0), scale="std")
    with pytest.raises(ValueError, match="group_ids shape"):
        group_advantages(t(1, 0), ids(0))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(t(1, 0), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), ids(0, 0))


def test_group_reward_stats():
    # g0 {1,1} all correct; g1 {0,0,NaN} all wrong; g2 {1,0} mixed; g3 {.5,.5} uniform (neither);
    # g4 {NaN} has no scored reward -> not counted. 4 counted groups; 2 of 10 samples unscored.
    r = t(1, 1, 0, 0, NAN, 1, 0, 0.5, 0.5, NAN)
    g = ids(0, 0, 1, 1, 1, 2, 2, 3, 3, 4)
    s = group_reward_stats(r, g)
    assert s == {
        "num_groups": 4.0,
        "frac_all_equal": 0.75,
        "frac_all_correct": 0.25,
        "frac_all_wrong": 0.25,
        "frac_mixed": 0.25,
        "frac_unscored_samples": 0.2,
    }


def test_group_reward_stats_no_scored():
    s = group_reward_stats(t(NAN, NAN), ids(0, 1))
    assert s["num_groups"] == 0.0 and s["frac_all_equal"] == 0.0 and s["frac_unscored_samples"] == 1.0

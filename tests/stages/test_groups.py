"""Group expansion (`regroup.stages.groups`): per-sample seeds and samples per question, hand-computed."""

from __future__ import annotations

from regroup.stages.groups import sample_seed, samples_per_question


def test_seeds_unique_within_a_step_for_large_groups_and_many_variants():
    for G, N in [(8, 3), (65, 0), (128, 3), (16, 150)]:
        seeds = {
            sample_seed(0, 5, g, v, j, max_variants=N, max_samples=G)
            for g in range(80, 84)
            for v in range(N + 1)
            for j in range(G)
        }
        assert len(seeds) == 4 * (N + 1) * G, (G, N)


def test_seeds_keep_the_historical_values_for_small_groups():
    # the formula regroup used before (G <= 64, N < 101): (run*1000003 + step*10007 + group*101 + v) * 64 + j
    for run, step, g, v, j in [(0, 0, 0, 0, 0), (3, 7, 113, 2, 31), (1, 99, 1584, 3, 7)]:
        old = ((run * 1_000_003 + step * 10_007 + g * 101 + v) % 2**62) * 64 + j
        assert sample_seed(run, step, g, v, j, max_variants=3, max_samples=32) == old


def test_samples_per_question():
    assert samples_per_question(8) == 8
    assert samples_per_question(8, 4) == 32  # grpo_matched
    assert samples_per_question(8, 1, 3) == 32  # TA-GRPO pool
    assert samples_per_question(8, 1, 0, 1) == 9  # one anchor added

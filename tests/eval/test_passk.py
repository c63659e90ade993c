"""pass@k (unbiased, Chen et al. 2021) vs brute force over all k-subsets; mean@n (SPEC §5)."""

from __future__ import annotations

import itertools

import pytest
import torch

from regroup.eval.passk import mean_at_n, mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (c correct) with at least one correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(1 for s in subsets if any(samples[i] for i in s)) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_brute_force(n: int):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_hand_values():
    # n = 10, c = 3, k = 2: 1 − C(7,2)/C(10,2) = 1 − 21/45 = 0.533333
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    # pass@1 = c/n
    assert pass_at_k(32, 5, 1) == pytest.approx(5 / 32)


def test_edges_exact():
    assert pass_at_k(16, 0, 4) == 0.0
    assert pass_at_k(16, 16, 4) == 1.0
    assert pass_at_k(16, 13, 4) == 1.0  # n − c = 3 < k: every 4-subset holds a correct one
    assert pass_at_k(1, 1, 1) == 1.0


def test_large_n_stable():
    # n = 1024: no huge binomials; compare with the k-factor product C(n−c,k)/C(n,k) = Π_j (n−c−j)/(n−j)
    n, c, k = 1024, 7, 128
    ref = 1.0
    for j in range(k):
        ref *= (n - c - j) / (n - j)
    assert pass_at_k(n, c, k) == pytest.approx(1 - ref, rel=1e-12)
    assert 0.0 < pass_at_k(n, 1, 1) < 1.0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="larger than"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="correct count"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="must be an int"):
        pass_at_k(4.0, 1, 1)  # type: ignore[arg-type]


def test_mean_pass_at_k():
    # problems (4,1), (4,4), (4,0) at k=2: 1 − C(3,2)/C(4,2) = 1 − 3/6 = .5 ; 1 ; 0 -> mean .5
    assert mean_pass_at_k([(4, 1), (4, 4), (4, 0)], 2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)


def test_mean_at_n():
    # per-problem accuracy: 1/2 and 3/4 -> mean 0.625 (problems weigh the same even with different n)
    assert mean_at_n([[1, 0], [True, True, True, False]]) == pytest.approx(0.625)
    m = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert mean_at_n(m) == pytest.approx(0.375)
    with pytest.raises(ValueError, match="no problems"):
        mean_at_n([])
    with pytest.raises(ValueError, match="no samples"):
        mean_at_n([[1], []])

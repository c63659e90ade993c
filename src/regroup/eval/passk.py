"""pass@k and mean@n estimators (SPEC §5).

pass@k is the unbiased estimator of Chen et al. (2021), `1 − C(n−c, k) / C(n, k)` for n samples of
which c are correct, computed as a product of ratios so that n in the hundreds never builds a huge
binomial coefficient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased probability that at least one of k samples (drawn without replacement from n, c correct) is correct.

    Equals `1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)`. Exact edge values: c = 0 → 0.0,
    n − c < k (includes c = n) → 1.0. Raises ValueError for k > n, k < 1, or c outside [0, n].
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {v!r}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} is larger than the number of samples n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: correct count c={c} must be in [0, n={n}]")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    # C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (i − k)/i: c factors, each in (0, 1).
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of `pass_at_k(n, c, k)` over problems given as `(n, c)` pairs. Raises ValueError if empty."""
    values = [pass_at_k(int(n), int(c), k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k: no problems given")
    return sum(values) / len(values)


def mean_at_n(correct_matrix: torch.Tensor | Sequence[Sequence[bool | float | int]]) -> float:
    """mean@n (avg@n): the mean over problems of each problem's fraction of correct samples.

    `correct_matrix` is [P, n] (tensor) or a list of per-problem lists (lengths may differ; each problem
    then weighs the same). Raises ValueError if there is no problem or a problem has no sample.
    """
    if isinstance(correct_matrix, torch.Tensor):
        if correct_matrix.dim() != 2 or correct_matrix.numel() == 0:
            raise ValueError(f"mean_at_n: need a non-empty [P, n] tensor, got shape {tuple(correct_matrix.shape)}")
        return float(correct_matrix.to(torch.float64).mean(dim=1).mean())
    rows = [list(r) for r in correct_matrix]
    if not rows:
        raise ValueError("mean_at_n: no problems given")
    per_problem = []
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"mean_at_n: problem {i} has no samples")
        per_problem.append(sum(float(x) for x in row) / len(row))
    return sum(per_problem) / len(per_problem)

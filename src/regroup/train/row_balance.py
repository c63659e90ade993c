"""Which rows of a mini-batch the update forwards, the same number on every process.

`grpo.skip_zero_gradient_rows` leaves out rows that carry no gradient (A = 0 with no KL term, or a mask of
0): their loss term is 0, so the update is unchanged. Under data parallelism every process must still
run the same number of forward/backward passes (FSDP, DeepSpeed and DDP's all-reduce are collectives), so
each process forwards its rows that carry gradient, then rows that carry none, up to the largest count
of carrying rows on any process. At least one row is forwarded: AdamW steps on zero gradients too (its
moments decay), as it does when every row is forwarded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def forwarded_rows(rows: range, carries: torch.Tensor, global_max: Callable[[float], float]) -> torch.Tensor:
    """Row indices [n] of the mini-batch `rows` to forward, in batch order.

    `carries` [B] (bool, over the whole batch): whether each row carries gradient. `global_max(x)`: the
    largest `x` over the processes (the identity on one process). n = min(len(rows), max(most carrying
    rows on any process, 1)); the carrying rows come first, then the others in batch order.
    """
    index = torch.arange(rows.start, rows.stop)  # [R]
    keep = carries[index]  # [R]
    target = min(len(index), max(int(global_max(float(keep.sum()))), 1))
    return torch.cat([index[keep], index[~keep]])[:target].sort().values  # [n]

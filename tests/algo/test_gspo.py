"""GSPO's sequence ratio and its clipped loss (`regroup.algo.gspo`), hand-computed."""

from __future__ import annotations

import pytest
import torch

from regroup.algo.gspo import sequence_clipped_pg_loss, sequence_ratio


def test_gspo_sequence_ratio_hand_computed():
    logps = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.4, 0.4]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.2, 0.4, 0.4]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    # row 0: mean(log 2, log 0.5) = 0 -> s = 1; row 1: log 2 -> s = 2
    s = sequence_ratio(logps, old, mask)
    assert s.squeeze(1).tolist() == pytest.approx([1.0, 2.0])
    loss, low, high = sequence_clipped_pg_loss(
        logps, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask, 0.2, 0.2
    )
    # row 1 is clipped at 1.2 -> loss −1.2 on each token; row 0: −1
    assert loss[:, 0].tolist() == pytest.approx([-1.0, -1.2])
    assert bool(high[1].all()) and not bool(high[0].any()) and not bool(low.any())

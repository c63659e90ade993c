"""Which rows a mini-batch forwards under `grpo.skip_zero_gradient_rows`, hand-computed."""

from __future__ import annotations

import torch

from regroup.train.row_balance import forwarded_rows

# rows 0..9 of a batch; rows 0, 3, 5 and 6 carry gradient
CARRIES = torch.tensor([True, False, False, True, False, True, True, False, False, False])


def test_one_process_forwards_the_carrying_rows_only():
    assert forwarded_rows(range(2, 8), CARRIES, lambda x: x).tolist() == [3, 5, 6]


def test_a_process_with_fewer_carrying_rows_pads_with_non_carrying_rows_in_batch_order():
    # rows 2..7 hold 3 carrying rows; another process holds 5: forward 3 + the first 2 others (2, 4)
    assert forwarded_rows(range(2, 8), CARRIES, lambda x: max(x, 5.0)).tolist() == [2, 3, 4, 5, 6]


def test_never_more_rows_than_the_mini_batch_holds():
    # another process holds 9 carrying rows, this mini-batch only 6 rows: all 6
    assert forwarded_rows(range(2, 8), CARRIES, lambda x: max(x, 9.0)).tolist() == [2, 3, 4, 5, 6, 7]


def test_at_least_one_row_when_no_process_has_gradient():
    # rows 7..9 carry none anywhere: one row still forwarded (AdamW steps on zero gradients too)
    assert forwarded_rows(range(7, 10), CARRIES, lambda x: x).tolist() == [7]


def test_the_count_asked_of_the_others_is_this_process_s_carrying_rows():
    asked = []
    forwarded_rows(range(2, 8), CARRIES, lambda x: asked.append(x) or x)
    assert asked == [3.0]  # rows 3, 5 and 6 of rows 2..7

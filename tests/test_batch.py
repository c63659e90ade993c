"""`regroup.batch`: samples into the padded tensors every update reads."""

from __future__ import annotations

import torch

from regroup.batch import Sample, collate
from regroup.rollout.producer import behaviour_old_logps


def test_collate_marks_the_rows_scored_on_another_prompt():
    def sample(prompt, ratio_prompt):
        return Sample(
            group_id=0, question_id="q", variant=0 if prompt == ratio_prompt else 1, is_anchor=False,
            prompt_ids=prompt, ratio_prompt_ids=ratio_prompt, response_ids=[7, 8], response_text="",
            behaviour_logps=[-0.5, -0.25],
        )  # fmt: skip

    batch = collate([sample([1, 2], [1, 2]), sample([3, 4, 5], [1, 2])], pad_id=0)
    assert batch.on_sampled_prompt.tolist() == [True, False]
    assert batch.behaviour_usable.tolist() == [[True, True], [False, False]]
    old = torch.full((2, 2), -9.0)
    assert behaviour_old_logps(old, batch).tolist() == [[-0.5, -0.25], [-9.0, -9.0]]  # row 1 keeps pi_old

"""`regroup.batch`: samples into the padded tensors every update reads."""

from __future__ import annotations

import torch
from loss_call import loss_spec

from regroup.algo.loss_inputs import build_loss_inputs
from regroup.batch import Sample, collate


def test_collate_marks_the_rows_scored_on_another_prompt():
    def sample(prompt, ratio_prompt):
        return Sample(
            group_id=0, question_id="q", variant=0 if prompt == ratio_prompt else 1, is_anchor=False,
            prompt_ids=prompt, ratio_prompt_ids=ratio_prompt, response_ids=[7, 8], response_text="",
            behaviour_logps=[-0.5, -0.25],
        )  # fmt: skip

    batch = collate([sample([1, 2], [1, 2]), sample([3, 4, 5], [1, 2])], pad_id=0)
    assert batch.on_sampled_prompt.tolist() == [True, False]
    assert batch.behaviour_rows.tolist() == [True, False]
    assert batch.behaviour_usable.tolist() == [[True, True], [False, False]]
    old = torch.full((2, 2), -9.0)
    pi_old, _ = build_loss_inputs(
        loss_spec(), old, torch.zeros(2), batch.completion_mask, old_logps=old, sampler_logps=batch.behaviour_logps,
        sampler_rows=batch.behaviour_rows, sampled_mask=batch.sampled_mask, old_from_sampler=True,
    )  # fmt: skip
    assert pi_old.tolist() == [[-0.5, -0.25], [-9.0, -9.0]]  # row 1 keeps pi_old

"""DaGRPO stages: anchor placement and sources, masking over G_mix, and the recipe end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from regroup.algo.loss_config import resolve_loss
from regroup.batch import Sample, collate
from regroup.config.schema import AnchorConfig
from regroup.stages.anchors import AnchorInjector
from regroup.stages.masking import DistinctivenessMasker
from regroup.tasks import get_task
from regroup.tasks.base import Problem
from regroup.train.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TASK = get_task("arithmetic")


def grade(text, problem):
    return TASK.grade(text, problem)


def injector(**kw):
    return AnchorInjector(AnchorConfig(enabled=True, **kw), grade, lambda text: [ord(c) for c in text] + [1])


def on_policy(problem, gid, rewards, variant=0):
    return [
        Sample(
            group_id=gid,
            question_id=problem.id,
            variant=variant,
            is_anchor=False,
            prompt_ids=[5],
            ratio_prompt_ids=[5],
            response_ids=[9, 1],
            response_text=f"resp{i}",
            reward=r,
            problem=problem,
        )
        for i, r in enumerate(rewards)
    ]


def test_replace_always_reserves_one_slot_and_injects_the_verified_reference():
    p1, p2 = TASK.generate(2, seed=3)
    inj = injector(mode="replace", when="always")
    assert inj.reserved_slots([p1, p2]) == [1, 1]  # 7 + 1 for G = 8
    samples = on_policy(p1, 0, [0.0] * 7) + on_policy(p2, 1, [1.0] * 7)
    out, metrics = inj.inject(samples, [p1, p2], [0, 1], [[5], [6]])
    anchors = [s for s in out if s.is_anchor]
    assert len(out) == 16 and metrics["anchor/count"] == 2.0
    assert [(a.group_id, a.response_text, a.reward, a.variant) for a in anchors] == [
        (0, p1.solution, 1.0, 0),
        (1, p2.solution, 1.0, 0),
    ]
    assert anchors[0].response_ids == [ord(c) for c in p1.solution] + [1]
    batch = collate(out, pad_id=0)
    assert not batch.sampled_mask[batch.is_anchor].any()  # anchor tokens are forced, not sampled
    assert batch.sampled_mask[~batch.is_anchor].any()


def test_wrong_reference_is_never_injected_and_is_counted():
    (p,) = TASK.generate(1, seed=4)
    wrong = Problem(id=p.id, question=p.question, answer=p.answer, solution="1+1=2. #### 999", meta=p.meta)
    inj = injector()
    assert inj.reserved_slots([wrong]) == [0]  # no anchor, so the group keeps all G on-policy samples
    out, metrics = inj.inject(on_policy(wrong, 0, [0.0] * 8), [wrong], [0], [[5]])
    assert metrics["anchor/count"] == 0.0 and not any(s.is_anchor for s in out)
    assert inj.totals["rejected_reference"] == 1


def test_no_correct_injects_only_into_all_wrong_groups_replacing_a_sample():
    p1, p2 = TASK.generate(2, seed=5)
    inj = injector(when="no_correct", mode="replace")
    assert inj.reserved_slots([p1, p2]) == [0, 0]
    samples = on_policy(p1, 0, [0.0] * 8) + on_policy(p2, 1, [0.0, 1.0] + [0.0] * 6)
    out, _ = inj.inject(samples, [p1, p2], [0, 1], [[5], [6]])
    g0 = [s for s in out if s.group_id == 0]
    g1 = [s for s in out if s.group_id == 1]
    assert len(g0) == 8 and sum(s.is_anchor for s in g0) == 1  # replaced: still 8
    assert len(g1) == 8 and not any(s.is_anchor for s in g1)


def test_add_mode_grows_the_group():
    (p,) = TASK.generate(1, seed=6)
    inj = injector(mode="add", count=1)
    out, _ = inj.inject(on_policy(p, 0, [0.0] * 8), [p], [0], [[5]])
    assert len(out) == 9


def test_self_bootstrapped_anchors_come_from_earlier_correct_answers():
    (p,) = TASK.generate(1, seed=7)
    bare = Problem(id=p.id, question=p.question, answer=p.answer, solution=None, meta=p.meta)
    inj = injector(source="self", buffer_size=2)
    assert inj.reserved_slots([bare]) == [0]  # nothing in the buffer yet
    earlier = on_policy(bare, 0, [1.0, 0.0, 1.0, 1.0])
    for i, s in enumerate(earlier):
        s.response_text = f"answer {i}"
    earlier[3].variant = 2  # a variant's answer is not an answer to q0's text: not kept
    inj.observe(earlier)
    assert inj.buffer[p.id] == ["answer 0", "answer 2"]
    assert inj.reserved_slots([bare]) == [1]
    out, _ = inj.inject(on_policy(bare, 1, [0.0] * 7), [bare], [1], [[5]])
    assert [s.response_text for s in out if s.is_anchor] == ["answer 2"]  # the most recent
    restored = injector(source="self", buffer_size=2)
    restored.load_state_dict(inj.state_dict())
    assert restored.buffer == inj.buffer


class FixedScorer:
    stats = {"scored": 0}

    def __init__(self, scores):
        self.scores = scores

    def score_batch(self, items):
        return self.scores[: len(items)]


def test_masker_scores_the_mixed_group_and_masks_indistinct_samples():
    (p,) = TASK.generate(1, seed=8)
    samples = on_policy(p, 0, [1.0, 1.0, 0.0, 0.0])
    # positives scored 9 and 5, negatives 4 and None; S-max = 4, S+min = 5; delta 3:
    # pos 9-4=5 keep, pos 5-4=1 drop, neg 5-4=1 drop, unscored keep
    masker = DistinctivenessMasker(FixedScorer([9.0, 5.0, 4.0, None]), delta=3.0)
    adv = torch.tensor([0.866, 0.866, -0.866, -0.866])
    keep, metrics = masker.mask(samples, adv, torch.zeros(4, dtype=torch.long))
    assert keep.tolist() == [True, False, False, True]
    assert metrics["mask/pos_frac"] == 0.5 and metrics["mask/neg_frac"] == 0.5 and metrics["mask/unscored"] == 1.0
    assert [s.score for s in samples] == [9.0, 5.0, 4.0, None]


def test_gradient_conflict_is_minus_one_for_the_same_response_on_both_sides(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from regroup.diagnostics.grad_conflict import gradient_conflict

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    (p,) = TASK.generate(1, seed=9)
    same = on_policy(p, 0, [1.0, 0.0])
    for s in same:
        s.response_ids = [20, 21, 22, 1]
    batch = collate(same, pad_id=0)
    # g+ = −a∇log π(o), g− = +a∇log π(o): exactly opposite
    out = gradient_conflict(model, batch, torch.tensor([0.7, -0.7]), param_pattern=".", max_samples=4, temperature=1.0)
    assert abs(out["grad_conflict/cosine"] + 1.0) < 1e-5
    other = on_policy(p, 0, [1.0, 0.0])
    other[0].response_ids, other[1].response_ids = [20, 21, 22, 1], [30, 31, 1]
    cos = gradient_conflict(
        model, collate(other, 0), torch.tensor([0.7, -0.7]), param_pattern=".", max_samples=4, temperature=1.0
    )["grad_conflict/cosine"]
    assert -1.0 < cos < 1.0
    assert (
        gradient_conflict(model, batch, torch.tensor([0.7, 0.0]), param_pattern=".", max_samples=4, temperature=1.0)
        == {}
    )


def test_pair_unit_masker_rewrites_advantages_term_by_term_and_keeps_weights():
    from regroup.stages.base import StepBatch

    (p,) = TASK.generate(1, seed=3)
    samples = on_policy(p, 0, [1.0, 1.0, 0.0, 0.0])
    batch = StepBatch(step=1, samples=samples)
    batch.advantages = torch.tensor([0.5, 0.5, -0.5, -0.5])
    masker = DistinctivenessMasker(FixedScorer([9.0, 5.0, 4.0, 1.0]), delta=3.0, unit="pair")
    metrics = masker(batch, None)
    assert batch.advantages.tolist() == pytest.approx([0.5, 0.25, -0.25, -0.5])  # sum over pairs >= delta apart, / G
    assert batch.weights is None and metrics["mask/pair_frac"] == 0.25 and metrics["mask/adv_removed"] == 0.25
    with pytest.raises(ValueError, match="unit"):
        DistinctivenessMasker(FixedScorer([]), delta=3.0, unit="pairs")


def test_mask_unit_is_a_config_field_and_reaches_the_stage(tiny_model_dir, tmp_path):
    from regroup.train.recipes import build_recipe

    cfg = load_config(CONFIGS / "dagrpo_mask_only.yaml", [f"model.path={tiny_model_dir}", "mask.unit=pair"])
    recipe = build_recipe(cfg, TASK, lambda text: [ord(c) for c in text], tmp_path, loss=resolve_loss(cfg))
    assert [s.unit for s in recipe.stages if isinstance(s, DistinctivenessMasker)] == ["pair"]
    cfg = load_config(CONFIGS / "dagrpo_mask_only.yaml", [f"model.path={tiny_model_dir}", "mask.unit=pair"])
    assert cfg.mask.unit == "pair"
    with pytest.raises(Exception, match="unit"):
        load_config(CONFIGS / "dagrpo_mask_only.yaml", [f"model.path={tiny_model_dir}", "mask.unit=both"])

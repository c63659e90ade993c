"""regroup.integrations.trl: the GRPOTrainer subclass with DaGRPO masks / anchors and TA-GRPO pooling.

Pure helpers are checked on hand-made cases; the trainer on a tiny random model (hidden 32, 2 layers)
and arithmetic problems with short reference solutions, with tensors captured from inside TRL's loop.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from regroup.algo.advantages import group_advantages  # noqa: E402
from regroup.algo.distinctiveness import distinctiveness_mask  # noqa: E402
from regroup.integrations.trl import (  # noqa: E402
    ANCHOR_MASK,
    GROUP_ID,
    IS_ANCHOR,
    Q0_PROMPT,
    SAMPLE_WEIGHT,
    VARIANT,
    PooledRepeatSampler,
    RegroupGRPOTrainer,
    RegroupTRLConfig,
    anchor_slots,
    expand_variants,
    loss_totals,
)
from regroup.models.tiny import build_tokenizer  # noqa: E402
from regroup.scorers import Scorer  # noqa: E402
from regroup.tasks import get_task  # noqa: E402

TASK = get_task("arithmetic")
N_VARIANTS = 3
MAX_LEN = 24  # completion tokens; every reference solution below fits (+ eos)


# ---- data, reward, trainer factory ----------------------------------------------------------------------


def _problems():
    short = [p for p in TASK.generate(64, 0) if len(p.solution) <= 20]
    return short[:8]


PROBLEMS = _problems()
BY_ID = {p.id: p for p in PROBLEMS}


def _rows(problems=PROBLEMS, wrong_solution_for: str | None = None) -> list[dict]:
    rows = []
    for p in problems:
        solution = "1+1=3. #### 3" if p.id == wrong_solution_for else p.solution
        rows.append(
            {
                "prompt": [{"role": "user", "content": p.question}],
                "answer": p.answer,
                "solution": solution,
                "id": p.id,
                "variants": TASK.rephrase(p, N_VARIANTS, random.Random(0)),
            }
        )
    return rows


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def grade_reward(prompts, completions, id, **kwargs):
    """The task grader as a TRL reward function."""
    return [TASK.grade(_text(c), BY_ID[i]) for c, i in zip(completions, id)]


def noisy_reward(prompts, completions, id, **kwargs):
    """Grader, else a length-based 0/1 (mixed groups from a random model), None when length % 5 == 0."""
    out = []
    for c, i in zip(completions, id):
        text = _text(c)
        if TASK.grade(text, BY_ID[i]) == 1.0:
            out.append(1.0)
        elif len(text) % 5 == 0:
            out.append(None)
        else:
            out.append(float(len(text) % 3 == 0))
    return out


def _trainer(model_dir, tmp_path, regroup=None, rows=None, reward=grade_reward, **overrides) -> RegroupGRPOTrainer:
    kw = dict(
        output_dir=str(tmp_path / "out"),
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default bf16 autocast on CPU moves log-probs
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=MAX_LEN,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-4,
        seed=0,
    )
    kw.update(overrides)
    tok = build_tokenizer()
    return RegroupGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=GRPOConfig(**kw),
        train_dataset=Dataset.from_list(rows if rows is not None else _rows()),
        processing_class=tok,
        regroup=regroup,
    )


def _capture(trainer):
    """Record (input rows, output batch) of every _generate_and_score_completions and the gathered rewards."""
    batches, rewards = [], []
    generate = trainer._generate_and_score_completions
    calculate = trainer._calculate_rewards

    def wrapped_generate(inputs):
        rows = [dict(r) for r in inputs]
        out = generate(inputs)
        batches.append((rows, {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}))
        return out

    def wrapped_calculate(inputs, prompts, completions, completion_ids_list):
        r = calculate(inputs, prompts, completions, completion_ids_list)
        rewards.append((list(prompts), r.clone()))
        return r

    trainer._generate_and_score_completions = wrapped_generate
    trainer._calculate_rewards = wrapped_calculate
    return batches, rewards


def _prompt_ids(tok, prompt) -> tuple[int, ...]:
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return tuple(ids)


def _unpad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(ids[mask.bool()].tolist())


# ---- pure helpers ---------------------------------------------------------------------------------------


def test_anchor_slots_one_per_group_last_q0_sample():
    gid = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])
    var = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    r = torch.tensor([0.0, 0, 0, 0, 0, 1, 0, math.nan])
    always = anchor_slots(gid, var, r, when="always")
    assert always.tolist() == [False, True, False, False, False, True, False, False]
    # group 3 has a correct sample -> no anchor there; NaN never counts as correct
    none_correct = anchor_slots(gid, var, r, when="no_correct", correct_reward=1.0)
    assert none_correct.tolist() == [False, True, False, False, False, False, False, False]
    with pytest.raises(ValueError, match="when"):
        anchor_slots(gid, var, r, when="sometimes")


def test_expand_variants_rows_in_question_order():
    ds = Dataset.from_list(
        [
            {
                "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "q0"}],
                "variants": ["a", "b", "c"],
                "x": 1,
            },
            {"prompt": [{"role": "user", "content": "r0"}], "variants": ["d", "e"], "x": 2},
        ]
    )
    out, n = expand_variants(ds, num_variants=2)
    assert n == 2 and len(out) == 6
    assert out[GROUP_ID] == [0, 0, 0, 1, 1, 1]
    assert out[VARIANT] == [0, 1, 2, 0, 1, 2]
    assert out["x"] == [1, 1, 1, 2, 2, 2]
    assert [p[-1]["content"] for p in out["prompt"]] == ["q0", "a", "b", "r0", "d", "e"]
    assert out["prompt"][1][0] == {"role": "system", "content": "S"}  # system turn kept
    assert all(q[-1]["content"] == "q0" for q in out[Q0_PROMPT][:3])
    with pytest.raises(ValueError, match="different numbers of variants"):
        expand_variants(ds)
    with pytest.raises(ValueError, match="fewer than num_variants"):
        expand_variants(ds, num_variants=3)
    text, _ = expand_variants(Dataset.from_list([{"prompt": "Q", "variants": ["V1"]}]))
    assert text["prompt"] == ["Q", "V1"]


def test_pooled_sampler_keeps_pools_in_one_chunk():
    # 3 questions x pool 2 = 6 rows; 4 unique rows per generation batch -> one full chunk per epoch
    sampler = PooledRepeatSampler(6, pool_size=2, mini_repeat_count=3, batch_size=4, repeat_count=2, seed=1)
    idx = list(sampler)
    assert len(idx) == len(sampler) == 4 * 3 * 2
    chunk = idx[:12]
    assert idx[12:] == chunk  # repeat_count
    uniq = list(dict.fromkeys(chunk))
    assert all(chunk[3 * k : 3 * k + 3] == [uniq[k]] * 3 for k in range(4))  # mini repeats
    assert uniq[0] // 2 == uniq[1] // 2 and uniq[0] % 2 == 0 and uniq[1] == uniq[0] + 1  # a whole pool, q0 first
    assert uniq[2] // 2 == uniq[3] // 2 and uniq[2] // 2 != uniq[0] // 2
    with pytest.raises(ValueError, match="multiple of the pool size"):
        PooledRepeatSampler(6, pool_size=2, mini_repeat_count=3, batch_size=3)


def test_loss_totals_reproduce_trl_normalisers():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    common = dict(loss_mask=mask, num_items_in_batch=40, num_processes=2, grad_accum=4, steps_per_generation=2,
                  max_completion_length=3)
    agg, t = loss_totals("dapo", **common)
    assert agg == "token_mean" and t["total_tokens"] == 40 / 2 * 4 / 2
    agg, t = loss_totals("bnpo", **common)
    assert agg == "token_mean" and t["total_tokens"] == 3 * 4
    agg, t = loss_totals("grpo", **common)
    assert agg == "seq_mean_token_mean" and t["total_sequences"] == 8
    agg, t = loss_totals("dr_grpo", **common)
    assert agg == "seq_sum_constant" and t["total_sequences"] == 8 and t["max_completion_length"] == 3
    with pytest.raises(ValueError, match="cispo"):
        loss_totals("cispo", **common)


def test_config_validation():
    for bad in (dict(anchor_when="never"), dict(ratio_anchor="q1"), dict(anchor_ratio="x"), dict(anchor_mode="add"),
                dict(delta=-1.0), dict(num_variants=0), dict(distinctiveness=True, scorer="step")):
        with pytest.raises(ValueError):
            RegroupTRLConfig(**bad).validate()


# ---- the trainer ----------------------------------------------------------------------------------------


def _masks_cfg(**kw):
    return RegroupTRLConfig(distinctiveness=True, scorer="step", problem_fn=lambda row: BY_ID[row["id"]], **kw)


RECIPES = {
    "grpo": (RegroupTRLConfig(), {}),
    "masks": (_masks_cfg(), {}),
    "anchors": (RegroupTRLConfig(anchors=True), {}),
    "ta": (RegroupTRLConfig(ta_pooling=True), dict(num_generations=2)),
    "all": (_masks_cfg(ta_pooling=True, anchors=True, anchor_when="no_correct"), dict(num_generations=2, beta=0.01)),
}
RECIPE_METRICS = {
    "grpo": ["regroup/groups/frac_all_equal", "entropy", "clip_ratio/region_mean"],
    "masks": ["regroup/mask/frac", "regroup/mask/pos_frac", "regroup/score/mean"],
    "anchors": ["regroup/anchor/frac_groups", "regroup/anchor/token_frac", "regroup/anchor/prob_mean"],
    "ta": ["regroup/groups/frac_all_wrong"],
    "all": ["regroup/mask/neg_frac", "regroup/anchor/frac_groups", "kl"],
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_train_with_finite_loss_and_metrics(tiny_model_dir, tmp_path, recipe):
    cfg, overrides = RECIPES[recipe]
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, **overrides)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs)
    for key in RECIPE_METRICS[recipe]:
        assert key in logs[-1], (key, sorted(logs[-1]))
    if recipe in ("anchors", "all"):
        # the random model never answers, so every group with a reference gets its anchor
        assert logs[-1]["regroup/anchor/frac_groups"] == 1.0
        assert trainer.regroup_last_batch["is_anchor"].any()
    if recipe in ("ta", "all"):
        gids = trainer.regroup_last_batch["group_ids"]
        assert gids.unique().numel() * (N_VARIANTS + 1) * 2 == gids.numel() == 8  # one pool of (N+1)·G


def test_pooled_advantages_equal_group_advantages(tiny_model_dir, tmp_path):
    """TA pools + anchors: the advantages in TRL's batch == group_advantages on the same rewards / group ids."""
    cfg = RegroupTRLConfig(ta_pooling=True, anchors=True)
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, reward=noisy_reward, num_generations=2,
                       steps_per_generation=2, max_steps=1)
    batches, rewards = _capture(trainer)
    trainer.train()
    (rows, out), (_, rpf) = batches[0], rewards[0]
    assert len(rows) == 16 and rpf.shape == (16, 1)
    r = rpf[:, 0].clone()  # [16] NaN = unscorable
    r[out[IS_ANCHOR]] = 1.0  # the verified reference's reward
    gid = torch.tensor([row[GROUP_ID] for row in rows])
    expected = group_advantages(r, gid, scale="group", eps=1e-4)
    assert torch.allclose(out["advantages"], expected, atol=1e-6)
    assert (expected != 0).any()
    # one pool by hand: (N+1)·G = 8 samples of one question share mean and std
    pool = gid == gid[0]
    assert int(pool.sum()) == 8 and sorted({row[VARIANT] for row, p in zip(rows, pool) if p}) == [0, 1, 2, 3]
    scored = pool & ~torch.isnan(r)
    vals = r[scored]
    assert vals.max() > vals.min()  # a mixed pool, so the check below is not 0 == 0
    for i in scored.nonzero().flatten().tolist():
        hand = (r[i] - vals.mean()) / (vals.std() + 1e-4)  # torch.std is the unbiased (n−1) estimator
        assert math.isclose(float(out["advantages"][i]), float(hand), abs_tol=1e-5)
    assert (out["advantages"][pool & torch.isnan(r)] == 0).all()
    # exactly one anchor per pool, on a q0 row
    assert int(out[IS_ANCHOR].sum()) == gid.unique().numel()
    assert all(rows[i][VARIANT] == 0 for i in out[IS_ANCHOR].nonzero().flatten().tolist())


@pytest.mark.parametrize("ratio_anchor", ["original", "own"])
def test_ta_logprobs_use_q0_prompt(tiny_model_dir, tmp_path, ratio_anchor):
    """Variants are sampled on their own prompt, but every forward (old, ref, current) sees q0 ('original')."""
    tok = build_tokenizer()
    cfg = RegroupTRLConfig(ta_pooling=True, ratio_anchor=ratio_anchor)
    # GA 1 < steps_per_generation 2: TRL computes π_old in a forward; beta > 0: π_ref too.
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, num_generations=2, steps_per_generation=2,
                       beta=0.01, max_steps=1)
    batches, rewards = _capture(trainer)
    forwards = []
    inner = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        forwards.append((input_ids[:, :-logits_to_keep].clone(), attention_mask[:, :-logits_to_keep].clone()))
        return inner(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    trainer.train()
    rows, out = batches[0]
    sampled_prompts, _ = rewards[0]
    # generation (and the reward) used each row's own variant prompt
    assert [p[-1]["content"] for p in sampled_prompts] == [row["prompt"][-1]["content"] for row in rows]
    assert any(row[VARIANT] > 0 for row in rows)
    q0_ids = {_prompt_ids(tok, row[Q0_PROMPT]) for row in rows}
    own_ids = {_prompt_ids(tok, row["prompt"]) for row in rows if row[VARIANT] > 0}
    assert not q0_ids & own_ids
    for i, row in enumerate(rows):
        got = _unpad(out["prompt_ids"][i], out["prompt_mask"][i])
        want = row[Q0_PROMPT] if ratio_anchor == "original" else row["prompt"]
        assert got == _prompt_ids(tok, want)
    # old + ref over the 16-row generation batch, then current on the one 8-row micro-batch of the step
    seen = [_unpad(ids[j], m[j]) for ids, m in forwards for j in range(ids.shape[0])]
    assert len(seen) == 16 + 16 + 8
    if ratio_anchor == "original":
        assert set(seen) <= q0_ids
    else:
        assert set(seen) & own_ids


def test_anchor_tokens_flagged_with_reference_ids(tiny_model_dir, tmp_path):
    tok = build_tokenizer()
    rows = _rows(wrong_solution_for=PROBLEMS[0].id)  # its reference fails verification: no anchor there
    cfg = RegroupTRLConfig(anchors=True)
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, rows=rows, max_steps=2)
    batches, _ = _capture(trainer)
    trainer.train()
    skipped = [h["regroup/anchor/skipped_unverified"] for h in trainer.state.log_history if "loss" in h]
    n_wrong = 0
    for data_rows, out in batches:
        is_anchor, amask = out[IS_ANCHOR], out[ANCHOR_MASK]
        for g in range(len(data_rows) // 4):
            members = list(range(4 * g, 4 * g + 4))
            row = data_rows[members[-1]]
            if row["id"] == PROBLEMS[0].id:
                n_wrong += 1
                assert not is_anchor[members].any()
                continue
            assert is_anchor[members].tolist() == [False, False, False, True]  # the last sample is replaced
            i = members[-1]
            want = tok(row["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert _unpad(out["completion_ids"][i], out["completion_mask"][i]) == tuple(want)
            assert torch.equal(amask[i], out["completion_mask"][i].bool())
        assert not amask[~is_anchor].any()
        assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    assert sum(skipped) == n_wrong


class _LengthScorer(Scorer):
    """5 for the reference solution, else 4 (even length) or 1 (odd length)."""

    name = "length"

    def score_batch(self, items):
        return [5.0 if it.response == it.reference else (4.0 if len(it.response) % 2 == 0 else 1.0) for it in items]


def test_distinctiveness_mask_multiplies_advantages(tiny_model_dir, tmp_path):
    tok = build_tokenizer()
    cfg = RegroupTRLConfig(distinctiveness=True, scorer=_LengthScorer(), delta=3.0, anchors=True)
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, max_steps=2)
    batches, rewards = _capture(trainer)
    trainer.train()
    any_masked = False
    for (rows, out), (_, rpf) in zip(batches, rewards):
        r = rpf[:, 0].clone()
        r[out[IS_ANCHOR]] = 1.0
        gid = torch.arange(len(rows)) // 4
        raw = group_advantages(r, gid, scale="group", eps=1e-4)
        texts = tok.batch_decode(out["completion_ids"], skip_special_tokens=True)  # what the scorer saw
        scores = torch.tensor([4.0 if len(t) % 2 == 0 else 1.0 for t in texts])
        scores[out[IS_ANCHOR]] = 5.0
        keep = distinctiveness_mask(raw, scores, gid, 3.0)
        assert torch.equal(out[SAMPLE_WEIGHT], keep.float())
        assert torch.allclose(out["advantages"], raw * keep, atol=1e-6)
        any_masked |= bool((~keep).any())
    assert any_masked  # the case is not vacuous
    logged = [h["regroup/mask/frac"] for h in trainer.state.log_history if "loss" in h]
    assert max(logged) > 0


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_loss_equals_trl_compute_loss(tiny_model_dir, tmp_path, loss_type):
    """With nothing switched on, regroup's loss path == GRPOTrainer._compute_loss: value, grads, metrics."""
    trainer = _trainer(tiny_model_dir, tmp_path, loss_type=loss_type, beta=0.04, gradient_accumulation_steps=2,
                       steps_per_generation=2, epsilon_high=0.28)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model
    gen = torch.Generator().manual_seed(3)
    B, P, T = 6, 5, 7
    vocab, pad_id = model.config.vocab_size, trainer.processing_class.pad_token_id
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": torch.randint(5, vocab, (B, P), generator=gen).masked_fill(prompt_mask == 0, pad_id),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(5, vocab, (B, T), generator=gen).masked_fill(completion_mask == 0, pad_id),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.7, 0.0, 0.5, -1.5, 0.9]),
        "num_items_in_batch": torch.tensor(40),
    }
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([prompt_mask, completion_mask], 1), T)
    inputs["old_per_token_logps"] = lp + (torch.rand(B, T, generator=gen) - 0.5)
    inputs["ref_per_token_logps"] = lp + (torch.rand(B, T, generator=gen) - 0.5)

    def run(fn):
        model.zero_grad()
        trainer._metrics["train"].clear()
        loss = fn(trainer, model, dict(inputs))
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return loss.detach(), grads, dict(trainer._metrics["train"])

    ours, g_ours, m_ours = run(RegroupGRPOTrainer._compute_loss)
    theirs, g_theirs, m_theirs = run(GRPOTrainer._compute_loss)
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-5), (ours, theirs)
    assert len(g_ours) == len(g_theirs) > 0
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_ours, g_theirs))
    for key in ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert math.isclose(m_ours[key][-1], m_theirs[key][-1], rel_tol=1e-5, abs_tol=1e-6), key
    assert m_theirs["clip_ratio/region_mean"][-1] > 0  # both clip sides are exercised


def test_unsupported_settings_raise(tiny_model_dir, tmp_path):
    # 6 prompts / generation batch over G=2 -> 3 unique prompts, not a multiple of N+1 = 4
    with pytest.raises(ValueError, match="multiple of N\\+1 = 4"):
        _trainer(tiny_model_dir, tmp_path, regroup=RegroupTRLConfig(ta_pooling=True), num_generations=2,
                 per_device_train_batch_size=6)
    with pytest.raises(ValueError, match="loss_type"):
        _trainer(tiny_model_dir, tmp_path, loss_type="cispo")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _trainer(tiny_model_dir, tmp_path, top_entropy_quantile=0.2)


# ---- two real processes (gloo on CPU): pools and anchors that span ranks ---------------------------------

_DDP_SCRIPT = r'''
import random, sys, tempfile
import torch
from datasets import Dataset
from trl import GRPOConfig
from regroup.algo.advantages import group_advantages
from regroup.integrations.trl import IS_ANCHOR, RegroupGRPOTrainer, RegroupTRLConfig
from regroup.models.tiny import build_tokenizer
from regroup.tasks import get_task

torch.set_num_threads(1)
task = get_task("arithmetic")
probs = [p for p in task.generate(64, 0) if len(p.solution) <= 20][:8]
by_id = {p.id: p for p in probs}
rows = [dict(prompt=[{"role": "user", "content": p.question}], solution=p.solution, id=p.id,
             variants=task.rephrase(p, 3, random.Random(0))) for p in probs]

def reward(prompts, completions, id, **kw):
    texts = [c[-1]["content"] for c in completions]
    return [1.0 if task.grade(t, by_id[i]) else float(len(t) % 3 == 0) for t, i in zip(texts, id)]

# 4 rows per rank, G = 2: one pool of (3+1)·2 = 8 samples spans both ranks.
args = GRPOConfig(output_dir=tempfile.mkdtemp(), bf16=False, report_to=[], use_cpu=True, per_device_train_batch_size=4,
                  num_generations=2, max_completion_length=24, max_steps=2, logging_steps=1, save_strategy="no",
                  beta=0.01)
cfg = RegroupTRLConfig(ta_pooling=True, anchors=True, distinctiveness=True, problem_fn=lambda r: by_id[r["id"]])
tr = RegroupGRPOTrainer(model=sys.argv[1], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                        processing_class=build_tokenizer(), regroup=cfg)
inner = tr._generate_and_score_completions

def check(inputs):
    out = inner(inputs)
    lb, rank, n = tr.regroup_last_batch, tr.accelerator.process_index, len(inputs)
    assert lb["group_ids"].numel() == 8 and lb["group_ids"].unique().numel() == 1
    want = group_advantages(lb["rewards"], lb["group_ids"]) * lb["weight"]
    assert torch.allclose(out["advantages"], want[rank * n:(rank + 1) * n], atol=1e-6)
    assert int(lb["is_anchor"].sum()) == 1 and torch.equal(out[IS_ANCHOR], lb["is_anchor"][rank * n:(rank + 1) * n])
    print(f"CHECKED rank{rank}", flush=True)
    return out

tr._generate_and_score_completions = check
tr.train()
'''


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_pool_spanning_ranks(tiny_model_dir, tmp_path):
    import socket
    import subprocess
    import sys

    script = tmp_path / "ddp_check.py"
    script.write_text(_DDP_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--main_process_port", str(port), str(script), tiny_model_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("CHECKED rank0") == 2 and proc.stdout.count("CHECKED rank1") == 2, proc.stdout[-2000:]


def test_both_front_ends_give_equal_advantages_masks_and_loss(tiny_model_dir, tmp_path):
    """The same generation batch through the TRL adapter and through the native pipeline's stages and loss:
    advantages, masks, anchor flags and the loss agree."""
    from types import SimpleNamespace

    from regroup.algo.losses import LossInputs, LossSpec, LossTotals, policy_loss
    from regroup.batch import Sample
    from regroup.stages.advantages import GroupAdvantages
    from regroup.stages.base import StepBatch, StepContext, run_stages
    from regroup.stages.masking import DistinctivenessMasker

    tok = build_tokenizer()
    cfg = RegroupTRLConfig(distinctiveness=True, scorer=_LengthScorer(), delta=3.0, anchors=True)
    trainer = _trainer(tiny_model_dir, tmp_path, regroup=cfg, max_steps=1)
    batches, rewards = _capture(trainer)
    trainer.train()
    (rows, out), (_, rpf) = batches[0], rewards[0]
    last = trainer.regroup_last_batch
    texts = tok.batch_decode(out["completion_ids"], skip_special_tokens=True)
    samples = []
    for i, row in enumerate(rows):
        anchor = bool(out[IS_ANCHOR][i])
        reward = float(last["rewards"][i])
        samples.append(Sample(
            group_id=int(last["group_ids"][i]), question_id=str(row["id"]), variant=0, is_anchor=anchor,
            prompt_ids=[], ratio_prompt_ids=[], response_ids=[], reward=reward,
            response_text=row["solution"] if anchor else texts[i],
            problem=SimpleNamespace(question=row["prompt"], solution=row["solution"])))
    native = StepBatch(step=0, samples=samples)
    run_stages([GroupAdvantages("group", 1e-4), DistinctivenessMasker(_LengthScorer(), 3.0)], native,
               StepContext(seed=0, num_generations=trainer.num_generations))
    assert torch.equal(torch.tensor([s.is_anchor for s in samples]), last["is_anchor"].cpu())
    torch.testing.assert_close(native.advantages, last["raw_advantages"].cpu().float(), atol=1e-6, rtol=0)
    assert torch.equal(native.weights, out[SAMPLE_WEIGHT].float())
    # the loss: the adapter's _compute_loss and policy_loss with the native LossSpec on the same tensors
    model = trainer.model
    inputs = {k: v for k, v in out.items()}
    inputs["old_per_token_logps"] = None
    trl_loss = float(trainer._compute_loss(model, inputs))
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, out["completion_ids"].shape[1])
    mask = out["completion_mask"]
    spec = LossSpec(eps_low=trainer.epsilon_low, eps_high=trainer.epsilon_high, agg="token_mean",
                    anchor_ratio="shaped", shaping_gamma=0.1)
    loss, _ = policy_loss(logps, logps.detach(), LossInputs(
        advantages=native.advantages * native.weights, loss_mask=mask, sample_weight=native.weights,
        anchor_token_mask=out["completion_mask"].bool() & out[IS_ANCHOR].unsqueeze(1)), spec,
        LossTotals(total_tokens=float(mask.sum()), total_sequences=len(rows), max_completion_length=mask.shape[1]))
    assert float(loss) == pytest.approx(trl_loss, abs=1e-6)

"""regroup.integrations.trl: TRL's GRPOTrainer running a regroup recipe (its stages and loss).

Pure helpers are checked on hand-made cases; the trainer on a tiny random model (hidden 32, 2 layers)
and arithmetic problems with short reference solutions, with tensors captured from inside TRL's loop.
That both front-ends compute the same thing is tests/integrations/test_trl_front_ends.py.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer

from regroup.algo.advantages import group_advantages
from regroup.errors import ConfigError
from regroup.integrations.trl import STAGE_STATES, RegroupGRPOTrainer, grpo_args
from regroup.integrations.trl_helpers import (
    ADAPTER_SETTINGS,
    ANCHOR_MASK,
    GROUP_ID,
    IS_ANCHOR,
    Q0_PROMPT,
    QUESTION_ID,
    SHARED_SETTINGS,
    TRL_VERSIONS,
    VARIANT,
    PooledRepeatSampler,
    check_adapter_settings,
    check_shared_settings,
    check_trl_version,
    loss_totals,
    problem_rows,
)
from regroup.models.tiny import build_tokenizer
from regroup.tasks import get_task
from regroup.tasks.base import Problem
from regroup.train.run_config import load_config

TASK = get_task("arithmetic")
MAX_LEN = 24  # completion tokens; every reference solution below fits (+ eos)
PROBLEMS = [p for p in TASK.generate(64, 0) if len(p.solution) <= 20][:8]


NOISY = "rewards.functions=[plugins:noisy_reward_mod5]"


def _cfg(name: str, *overrides: str):
    return load_config(
        name, [f"rollout.max_new_tokens={MAX_LEN}", "data.num_train=8", "grpo.num_generations=4", *overrides]
    )


def _trainer(model_dir, tmp_path, cfg, problems=PROBLEMS, **trl) -> RegroupGRPOTrainer:
    kw = dict(
        output_dir=str(tmp_path / "out"),
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default bf16 autocast on CPU moves log-probs
        per_device_train_batch_size=8,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-4,
        seed=0,
    )
    kw.update(trl)
    return RegroupGRPOTrainer(
        model=model_dir,
        args=grpo_args(cfg, **kw),
        regroup_config=cfg,
        problems=problems,
        processing_class=build_tokenizer(),
    )


def _capture(trainer):
    """Record (input rows, output batch, the step batch) of every _generate_and_score_completions."""
    batches = []
    generate = trainer._generate_and_score_completions

    def wrapped(inputs):
        rows = [dict(r) for r in inputs]
        out = generate(inputs)
        batches.append(
            (
                rows,
                {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()},
                trainer.regroup_last_batch,
                list(trainer.regroup_rows),
            )
        )
        return out

    trainer._generate_and_score_completions = wrapped
    return batches


def _prompt_ids(tok, prompt) -> tuple[int, ...]:
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return tuple(ids)


def _unpad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(ids[mask.bool()].tolist())


# ---- pure helpers ---------------------------------------------------------------------------------------


def test_problem_rows_one_row_per_question_and_variant():
    probs = [
        Problem(id="a", question="q0", answer="1"),
        Problem(id="b", question="r0", answer="2"),
        Problem(id="c", question="s0", answer="3"),
    ]

    def messages(text):
        return [{"role": "system", "content": "S"}, {"role": "user", "content": text}]

    rows, dropped = problem_rows(probs, [["a1", "a2", "a3"], ["b1", "b2"], ["c1"]], messages, 2)
    assert dropped == 1  # "c" has one variant of 2: TRL's pools have one size
    assert [r[GROUP_ID] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert [r[VARIANT] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert [r[QUESTION_ID] for r in rows] == ["a"] * 3 + ["b"] * 3
    assert [r["prompt"][-1]["content"] for r in rows] == ["q0", "a1", "a2", "r0", "b1", "b2"]  # a3 cut at N = 2
    assert all(r["prompt"][0] == {"role": "system", "content": "S"} for r in rows)
    assert all(r[Q0_PROMPT] == messages("q0") for r in rows[:3])
    plain, _ = problem_rows(probs[:1], None, lambda t: t, 0)
    assert plain == [
        {"prompt": "q0", GROUP_ID: 0, VARIANT: 0, QUESTION_ID: "a", "regroup_question": "q0", Q0_PROMPT: "q0"}
    ]


def test_shared_settings_must_agree():
    cfg = _cfg("dagrpo")  # advantage_estimator dr_grpo, loss_agg seq_sum_constant
    good = SimpleNamespace(
        num_generations=4,
        max_completion_length=MAX_LEN,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        epsilon_high=None,
        scale_rewards="none",
        importance_sampling_level="token",
        use_bias_correction_kl=True,
        loss_type="dr_grpo",
        delta=None,
        off_policy_mask_threshold=None,
    )
    check_shared_settings(cfg, good)  # epsilon_high None = epsilon; the KL correction is moot at beta 0
    for field, value, key in (
        ("scale_rewards", "group", "grpo.advantage_estimator"),
        ("loss_type", "dapo", "grpo.loss_agg"),
        ("num_generations", 8, "grpo.num_generations"),
        ("epsilon_high", 0.28, "grpo.eps_high"),
        ("max_completion_length", 32, "rollout.max_new_tokens"),
        ("delta", 2.0, r"grpo\.policy_loss_args\.delta"),
        ("off_policy_mask_threshold", 0.5, "grpo.off_policy_mask_threshold"),
    ):
        bad = SimpleNamespace(**{**vars(good), field: value})
        with pytest.raises(ConfigError, match=rf"GRPOConfig\.{field}=.* disagrees with {key}"):
            check_shared_settings(cfg, bad)
    matched = _cfg("grpo_matched", "grpo.num_generations=2")  # (multiplier 4)·G = 8 samples of q0 per TRL prompt
    assert grpo_args(matched, output_dir="x", use_cpu=True).num_generations == 8


@pytest.mark.parametrize(
    ("version", "inside"),
    [("1.16.0", True), ("1.16.9", True), ("1.16.1.dev0", True), ("1.15.2", False), ("1.17.0", False),
     ("1.17.0rc1", False), ("2.0.0", False), ("not-a-version", False)],
)  # fmt: skip
def test_trl_outside_the_window_is_refused_in_one_line(version, inside, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", version)
    if inside:
        check_trl_version()
        return
    for build in (
        lambda: grpo_args(_cfg("grpo"), output_dir="x", use_cpu=True),
        lambda: RegroupGRPOTrainer(model="no-such-model", args=None, regroup_config=_cfg("grpo")),
    ):
        with pytest.raises(ConfigError) as raised:
            build()
        line = str(raised.value)
        assert "\n" not in line
        assert f"trl {version} is installed" in line and "trl>=1.16,<1.17 only" in line


def test_the_trl_extra_is_the_window_the_adapter_checks():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = meta["project"]["optional-dependencies"]
    assert extras["trl"] == [f"trl{TRL_VERSIONS}"]
    assert f"trl{TRL_VERSIONS}" in extras["dev"]  # the tests run the adapter
    check_trl_version()  # the installed TRL is inside it


def test_grpo_args_sets_every_field_the_adapter_depends_on(monkeypatch):
    import trl

    given = {}
    real = trl.GRPOConfig
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kw: given.update(kw) or real(**kw))
    grpo_args(_cfg("grpo"), output_dir="x", use_cpu=True)
    names = {name for name, _, _ in SHARED_SETTINGS} | {name for name, _, _ in ADAPTER_SETTINGS}
    assert names <= set(given)  # none left to TRL's defaults
    for field in (
        "use_bias_correction_kl",
        "max_completion_length",
        "loss_type",
        "beta",
        "epsilon",
        "epsilon_high",
        "scale_rewards",
        "importance_sampling_level",
        "mask_truncated_completions",
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "sync_ref_model",
        "top_k",
    ):
        assert field in names  # fmt: skip


@pytest.mark.parametrize("correction", [False, True])
def test_grpo_args_takes_each_shared_field_from_the_config(correction):
    cfg = _cfg(
        "grpo",
        "grpo.beta=0.01",
        f"grpo.kl_ratio_correction={str(correction).lower()}",
        "grpo.eps_low=0.15",
        "grpo.eps_high=0.28",
        "grpo.loss_agg=seq_mean_token_mean",
        "grpo.advantage_estimator_args={scale: batch}",
        "grpo.policy_loss=gspo",
        "rollout.tis_cap=2.5",
        "rollout.is_mode=sequence_mask",
        "rollout.is_min=0.5",
    )
    args = grpo_args(cfg, output_dir="x", use_cpu=True)
    assert args.use_bias_correction_kl is correction  # TRL 1.16's default: True
    assert args.max_completion_length == MAX_LEN  # TRL 1.16's default: 512
    assert (args.beta, args.epsilon, args.epsilon_high) == (0.01, 0.15, 0.28)
    assert (args.loss_type, args.scale_rewards, args.importance_sampling_level) == ("grpo", "batch", "sequence")
    assert args.vllm_importance_sampling_correction is True
    assert args.vllm_importance_sampling_mode == "sequence_mask"  # TRL 1.16's default too; set all the same
    assert (args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min) == (2.5, 0.5)
    plain = grpo_args(_cfg("grpo"), output_dir="x", use_cpu=True)
    assert plain.vllm_importance_sampling_correction is False  # rollout.tis_cap=0; TRL 1.16's default: True
    assert plain.use_bias_correction_kl is False  # grpo.kl_ratio_correction's default
    for name, value, _ in ADAPTER_SETTINGS:
        assert getattr(plain, name) == value


def test_a_hand_built_config_with_another_adapter_setting_or_is_correction_is_refused():
    cfg = _cfg("grpo")
    with pytest.raises(ConfigError, match=r"GRPOConfig\.mask_truncated_completions=True: truncated responses"):
        check_adapter_settings(grpo_args(cfg, output_dir="x", use_cpu=True, mask_truncated_completions=True))
    with pytest.raises(ConfigError, match=r"GRPOConfig\.top_k=20: regroup samples"):
        check_adapter_settings(grpo_args(cfg, output_dir="x", use_cpu=True, top_k=20))
    # TRL's IS correction on vLLM's samples (its default) while the recipe has none: refused under vLLM only
    is_on = dict(
        output_dir="x", use_cpu=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_clip_max=3.0
    )
    check_shared_settings(cfg, grpo_args(cfg, **is_on))  # TRL's own generation: TRL reads no IS setting
    with_vllm = SimpleNamespace(**{**vars(grpo_args(cfg, **is_on)), "use_vllm": True})
    with pytest.raises(ConfigError, match=r"vllm_importance_sampling_correction=True disagrees with rollout\.tis_cap"):
        check_shared_settings(cfg, with_vllm)
    capped = _cfg("grpo", "rollout.tis_cap=3", "rollout.is_mode=token_mask")
    args = SimpleNamespace(**{**vars(grpo_args(capped, output_dir="x", use_cpu=True)), "use_vllm": True})
    check_shared_settings(capped, args)
    args.vllm_importance_sampling_clip_max = 2.0
    with pytest.raises(ConfigError, match=r"vllm_importance_sampling_clip_max=2\.0 disagrees with rollout\.tis_cap"):
        check_shared_settings(capped, args)


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
    common = dict(
        loss_mask=mask,
        num_items_in_batch=40,
        num_processes=2,
        grad_accum=4,
        steps_per_generation=2,
        max_completion_length=3,
    )
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


# ---- the trainer ----------------------------------------------------------------------------------------


RECIPES = {
    "grpo": (("grpo",), {}, ["regroup/adv/abs_mean", "regroup/reward/checked", "entropy", "clip_ratio/region_mean"]),
    "dagrpo": (
        ("dagrpo",),
        {},
        [
            "regroup/mask/frac",
            "regroup/score/mean",
            "regroup/anchor/count",
            "regroup/anchor/token_frac",
            "regroup/anchor/prob_mean",
        ],
    ),
    "ta_grpo": (("ta_grpo", "grpo.num_generations=2"), {}, ["regroup/adv/abs_mean", "kl"]),
    "dagrpo_ta": (
        ("dagrpo_ta", "grpo.num_generations=2", "grpo.beta=0.01", "anchors.when=no_correct"),
        {},
        ["regroup/mask/neg_frac", "regroup/anchor/count", "kl"],
    ),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_train_with_finite_loss_and_metrics(tiny_model_dir, tmp_path, recipe):
    config, trl, keys = RECIPES[recipe]
    trainer = _trainer(tiny_model_dir, tmp_path, _cfg(*config), **trl)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs)
    for key in keys:
        assert key in logs[-1], (key, sorted(logs[-1]))
    batch = trainer.regroup_last_batch
    if "anchors" in trainer.recipe.names:
        # the random model never answers, so every group with a reference gets its anchor
        assert logs[-1]["regroup/anchor/count"] == len(batch.group_ids) == sum(s.is_anchor for s in batch.samples)
    if trainer.regroup_n_variants:
        gids = torch.tensor([s.group_id for s in batch.samples])
        assert gids.unique().numel() * (3 + 1) * 2 == gids.numel() == 8  # one pool of (N+1)·G


def test_pooled_advantages_equal_group_advantages(tiny_model_dir, tmp_path):
    """TA pools + anchors: the advantages in TRL's batch == group_advantages on the same rewards / group ids."""
    cfg = _cfg("dagrpo_ta", "grpo.num_generations=2", "mask.enabled=false", "grpo.advantage_estimator=grpo", NOISY)
    trainer = _trainer(tiny_model_dir, tmp_path, cfg, steps_per_generation=2, max_steps=1)
    batches = _capture(trainer)
    trainer.train()
    rows, out, batch, index = batches[0]
    assert len(rows) == 16 and len(index) == 16
    held = [batch.samples[j] for j in index]  # what each TRL row holds after the stages
    r = torch.tensor([math.nan if s.reward is None else s.reward for s in held])  # [16] NaN = unscorable
    gid = torch.tensor([row[GROUP_ID] for row in rows])
    assert gid.tolist() == [s.group_id for s in held]
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
    # exactly one anchor per pool, on a q0 row, rewarded 1 (the verified reference)
    assert int(out[IS_ANCHOR].sum()) == gid.unique().numel()
    assert all(rows[i][VARIANT] == 0 and r[i] == 1.0 for i in out[IS_ANCHOR].nonzero().flatten().tolist())


@pytest.mark.parametrize("ratio_anchor", ["original", "own"])
def test_ta_logprobs_use_q0_prompt(tiny_model_dir, tmp_path, ratio_anchor):
    """Variants are sampled on their own prompt, but every forward (old, ref, current) sees q0 ('original')."""
    tok = build_tokenizer()
    cfg = _cfg("ta_grpo", "grpo.num_generations=2", "grpo.beta=0.01", f"ta.ratio_anchor={ratio_anchor}")
    # GA 1 < steps_per_generation 2: TRL computes π_old in a forward; beta > 0: π_ref too.
    trainer = _trainer(tiny_model_dir, tmp_path, cfg, steps_per_generation=2, max_steps=1)
    batches = _capture(trainer)
    forwards = []
    inner = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        forwards.append((input_ids[:, :-logits_to_keep].clone(), attention_mask[:, :-logits_to_keep].clone()))
        return inner(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    trainer.train()
    rows, out, batch, index = batches[0]
    assert any(row[VARIANT] > 0 for row in rows)
    q0_ids = {_prompt_ids(tok, row[Q0_PROMPT]) for row in rows}
    own_ids = {_prompt_ids(tok, row["prompt"]) for row in rows if row[VARIANT] > 0}
    assert not q0_ids & own_ids
    for i, row in enumerate(rows):
        got = _unpad(out["prompt_ids"][i], out["prompt_mask"][i])
        want = row[Q0_PROMPT] if ratio_anchor == "original" else row["prompt"]
        assert got == _prompt_ids(tok, want)
        held = batch.samples[index[i]]  # the sample keeps the prompt it answered and the prompt it is scored on
        assert tuple(held.prompt_ids) == _prompt_ids(tok, row["prompt"]) and tuple(held.ratio_prompt_ids) == got
    # old + ref over the 16-row generation batch, then current on the one 8-row micro-batch of the step
    seen = [_unpad(ids[j], m[j]) for ids, m in forwards for j in range(ids.shape[0])]
    assert len(seen) == 16 + 16 + 8
    if ratio_anchor == "original":
        assert set(seen) <= q0_ids
    else:
        assert set(seen) & own_ids


def test_anchor_tokens_flagged_with_reference_ids(tiny_model_dir, tmp_path):
    tok = build_tokenizer()
    wrong = PROBLEMS[0]
    problems = [Problem(id=wrong.id, question=wrong.question, answer=wrong.answer, solution="1+1=3. #### 3")]
    problems += PROBLEMS[1:]  # the first reference fails verification: no anchor there
    cfg = _cfg("dagrpo", "mask.enabled=false")
    trainer = _trainer(tiny_model_dir, tmp_path, cfg, problems=problems, max_steps=2)
    batches = _capture(trainer)
    trainer.train()
    n_wrong = 0
    for rows, out, batch, index in batches:
        is_anchor, amask = out[IS_ANCHOR], out[ANCHOR_MASK]
        for g in range(len(rows) // 4):
            members = list(range(4 * g, 4 * g + 4))
            row = rows[members[-1]]
            if row[QUESTION_ID] == wrong.id:
                n_wrong += 1
                assert not is_anchor[members].any()
                continue
            assert is_anchor[members].tolist() == [False, False, False, True]  # the last sample is replaced
            i = members[-1]
            solution = next(p.solution for p in problems if p.id == row[QUESTION_ID])
            want = tok(solution, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert _unpad(out["completion_ids"][i], out["completion_mask"][i]) == tuple(want)
            assert tuple(batch.samples[index[i]].response_ids) == tuple(want)
            assert torch.equal(amask[i], out["completion_mask"][i].bool())
        assert not amask[~is_anchor].any()
        assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    assert n_wrong > 0
    assert trainer.recipe.stages[trainer.recipe.names.index("anchors")].injector.totals["rejected_reference"] == 1


def test_stage_states_saved_with_checkpoints_and_restored(tiny_model_dir, tmp_path, monkeypatch):
    cfg = _cfg("dagrpo", "mask.enabled=false", "anchors.source=both", NOISY)

    def injector(trainer):
        return trainer.recipe.stages[trainer.recipe.names.index("anchors")].injector

    first = _trainer(tiny_model_dir, tmp_path, cfg, max_steps=1, save_strategy="steps", save_steps=1)
    first.train()
    saved = json.loads((tmp_path / "out" / "checkpoint-1" / STAGE_STATES).read_text())
    assert saved["anchors"]["totals"]["injected"] == injector(first).totals["injected"] == 2  # 2 groups of 4
    assert saved["anchors"]["buffer"] == dict(injector(first).buffer)
    again = _trainer(tiny_model_dir, tmp_path, cfg, max_steps=1, save_strategy="steps", save_steps=1)
    assert injector(again).totals["injected"] == 0
    resumed = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, **kw: resumed.append(kw))  # TRL's own resume: not ours
    again.train(resume_from_checkpoint=True)
    assert resumed == [{"resume_from_checkpoint": True, "trial": None, "ignore_keys_for_eval": None}]
    assert injector(again).totals == injector(first).totals
    assert dict(injector(again).buffer) == dict(injector(first).buffer)


WATCHED = ("grpo", "rollout.max_new_tokens=8", "diagnostics.diversity_every=0", "diagnostics.grad_conflict_every=0")


def _uniform_run(model_dir, tmp_path, caplog) -> tuple[RegroupGRPOTrainer, list[str]]:
    """5 TRL steps whose every group is uniform (the task's grader on a random model: all wrong); the
    warnings the adapter logged."""
    trainer = _trainer(model_dir, tmp_path, _cfg(*WATCHED), max_steps=5, save_strategy="steps", save_steps=5)
    with caplog.at_level(logging.WARNING, logger="regroup.integrations.trl"):
        trainer.train()
    return trainer, [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning (step")]


def test_uniform_groups_warn_at_step_3(tiny_model_dir, tmp_path, caplog):
    """The TRL adapter runs the native trainer's SignalWatch: 5 of 5 uniform steps warn once, at step 3
    (without the watch, a TRL run whose every group is uniform says nothing)."""
    trainer, warned = _uniform_run(tiny_model_dir, tmp_path, caplog)
    uniform = [line for line in warned if "uniform rewards" in line]
    assert uniform == [
        "warning (step 3): 100% of groups had uniform rewards for 3 steps: advantages are 0 and nothing is learned "
        "(all-wrong 100%, all-correct 0%, unscored 0%). Check reward/extracted_frac and samples.jsonl; try a prompt "
        "template asking for \\boxed{}, easier data, more samples per group, dynamic_sampling.enabled=true or "
        "anchors.enabled=true (the data's reference solutions join all-wrong groups)."
    ]
    assert all(line.startswith("warning (step 3): ") for line in warned)  # here also: no answer extracted
    assert trainer.regroup_warnings == warned
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["regroup/groups/uniform_frac"] for h in logs] == [1.0] * 5  # the native trainer's metric, logged
    saved = json.loads((tmp_path / "out" / "checkpoint-5" / "regroup_watch.json").read_text())
    assert saved["uniform"] == 5  # a resumed run goes on counting


@pytest.mark.slow  # a TRL run and a native run (~70 s on the loaded 2-core machine)
def test_uniform_warnings_are_the_native_trainers_lines(tiny_model_dir, tmp_path, caplog):
    """The same config through the native trainer prints the very lines the TRL adapter logged."""
    from regroup.train.build import build_trainer

    _, warned = _uniform_run(tiny_model_dir, tmp_path, caplog)
    native = _cfg(
        *WATCHED,
        f"model.path={tiny_model_dir}",
        f"run_dir={tmp_path / 'native'}",
        "train.steps=5",
        "train.checkpoint_every=0",
        "train.progress=false",
        "grpo.prompts_per_step=2",
    )
    lines: list[str] = []
    build_trainer(native, tmp_path / "native", log=lines.append).train()
    assert len(warned) == 2 and [line for line in lines if line.startswith("warning (step")] == warned


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_loss_equals_trl_compute_loss(tiny_model_dir, tmp_path, loss_type):
    """The grpo recipe's loss through the adapter == GRPOTrainer._compute_loss: value, grads, metrics."""
    agg = {"dapo": "token_mean", "bnpo": "token_mean", "grpo": "seq_mean_token_mean", "dr_grpo": "seq_sum_constant"}
    cfg = _cfg(
        "grpo",
        "grpo.beta=0.04",
        "grpo.eps_high=0.28",
        "grpo.kl_ratio_correction=true",
        f"grpo.loss_agg={agg[loss_type]}",
    )
    trainer = _trainer(
        tiny_model_dir, tmp_path, cfg, loss_type=loss_type, gradient_accumulation_steps=2, steps_per_generation=2
    )
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
            model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            T,
        )
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


# ---- two real processes (gloo on CPU): pools and anchors that span ranks ---------------------------------

_DDP_REWARD = r"""
from regroup.tasks import get_task

task = get_task("arithmetic")


def reward(response, problem):
    return 1.0 if task.grade(response, problem) else float(len(response) % 3 == 0)
"""

_DDP_SCRIPT = r"""
import sys, tempfile
import torch
from accelerate.utils import gather
from regroup.algo.advantages import group_advantages
from regroup.train.run_config import load_config
from regroup.integrations.trl import RegroupGRPOTrainer, grpo_args
from regroup.integrations.trl_helpers import IS_ANCHOR
from regroup.models.tiny import build_tokenizer
from regroup.tasks import get_task

torch.set_num_threads(1)
task = get_task("arithmetic")
probs = [p for p in task.generate(64, 0) if len(p.solution) <= 20][:8]
cfg = load_config("dagrpo_ta", ["grpo.num_generations=2", "rollout.max_new_tokens=24", "grpo.beta=0.01",
                                "rewards.functions=[ddp_reward:reward]", "data.num_train=8"])
# 4 rows per rank, G = 2: one pool of (3+1)·2 = 8 samples spans both ranks.
args = grpo_args(cfg, output_dir=tempfile.mkdtemp(), bf16=False, report_to=[], use_cpu=True,
                 per_device_train_batch_size=4, max_steps=2, logging_steps=1, save_strategy="no")
tr = RegroupGRPOTrainer(model=sys.argv[1], args=args, regroup_config=cfg, problems=probs,
                        processing_class=build_tokenizer())
inner = tr._generate_and_score_completions

def check(inputs):
    out = inner(inputs)
    batch, rows, rank, n = tr.regroup_last_batch, tr.regroup_rows, tr.accelerator.process_index, len(inputs)
    gids = torch.tensor([s.group_id for s in batch.samples])
    assert gids.numel() == 8 and gids.unique().numel() == 1
    r = torch.tensor([float("nan") if s.reward is None else s.reward for s in batch.samples])
    assert torch.allclose(batch.advantages, group_advantages(r, gids, scale="none"), atol=1e-6)
    # every rank ran the stages on the same whole batch: the rows they hand TRL fit together
    assert torch.allclose(gather(out["advantages"]), batch.advantages[rows], atol=1e-6)
    assert sum(s.is_anchor for s in batch.samples) == 1
    assert out[IS_ANCHOR].tolist() == [batch.samples[j].is_anchor for j in rows[rank * n:(rank + 1) * n]]
    print(f"CHECKED rank{rank}", flush=True)
    return out

tr._generate_and_score_completions = check
tr.train()
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_pool_spanning_ranks(tiny_model_dir, tmp_path):
    import socket
    import subprocess
    import sys

    script = tmp_path / "ddp_check.py"
    script.write_text(_DDP_SCRIPT)
    (tmp_path / "ddp_reward.py").write_text(_DDP_REWARD)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(port),
        str(script),
        tiny_model_dir,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("CHECKED rank0") == 2 and proc.stdout.count("CHECKED rank1") == 2, proc.stdout[-2000:]

"""The verl plug-in's pure parts (no verl needed): the settings check, the dataset rows, the variant each
sample answers, and the micro-batch loss with verl's normaliser, against hand-computed values."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from loss_call import loss_spec

from regroup.algo.loss_config import resolve_loss
from regroup.errors import ConfigError
from regroup.integrations import verl_reward
from regroup.integrations.verl_helpers import (
    ADVANTAGE,
    IS_ANCHOR,
    PROMPTS,
    QUESTION_ID,
    REWARD_FILE,
    SHARED_SETTINGS,
    VARIANT,
    WEIGHT,
    check_shared_settings,
    micro_batch_loss,
    problem_rows,
    reward_function_settings,
    variant_of,
    verl_overrides,
)
from regroup.tasks import Problem
from regroup.train.run_config import load_config


def settings(cfg, **changes):
    """verl's config as the plug-in reads it: the shared settings from `cfg`, then `changes`."""
    values = {}
    for override in verl_overrides(cfg):
        key, value = override.split("=", 1)
        values[key] = {"true": True, "false": False}.get(value, value)
    for key, _, want in SHARED_SETTINGS:
        values[key] = want(cfg)
    values.update(changes)
    return values.get


def test_the_overrides_satisfy_the_check_and_a_disagreement_names_both_keys():
    cfg = load_config("dagrpo_ta", ["grpo.num_generations=4", "ta.n_variants=2"])
    check_shared_settings(cfg, settings(cfg))
    assert "actor_rollout_ref.rollout.n=12" in verl_overrides(cfg)  # (N + 1) * G
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n=8 disagrees with grpo.num_generations"):
        check_shared_settings(cfg, settings(cfg, **{"actor_rollout_ref.rollout.n": 8}))
    with pytest.raises(ConfigError, match="use_kl_loss"):
        check_shared_settings(cfg, settings(cfg, **{"actor_rollout_ref.actor.use_kl_loss": True}))


def test_verls_rollout_correction_and_kl_in_reward_are_refused():
    cfg = load_config("grpo", [])
    with pytest.raises(ConfigError, match="rollout.tis_cap"):
        check_shared_settings(cfg, settings(cfg, **{"algorithm.rollout_correction": {"rollout_is": "token"}}))
    with pytest.raises(ConfigError, match="use_kl_in_reward"):
        check_shared_settings(cfg, settings(cfg, **{"algorithm.use_kl_in_reward": True}))


def test_opsm_is_refused_before_any_model_loads():
    cfg = load_config("grpo", ["grpo.off_policy_mask_threshold=0.5"])
    with pytest.raises(ConfigError, match="off_policy_mask_threshold is not supported by the verl plug-in"):
        check_shared_settings(cfg, settings(cfg))


def test_rows_carry_q0_and_its_rephrasings_and_drop_short_ones():
    problems = [Problem(id="a", question="qa", answer="1"), Problem(id="b", question="qb", answer="2")]
    rows, dropped = problem_rows(problems, [["a1", "a2"], ["b1"]], lambda t: [{"role": "user", "content": t}], 2)
    assert dropped == 1 and len(rows) == 1
    info = rows[0]["extra_info"]
    assert info[QUESTION_ID] == "a" and rows[0]["reward_model"]["ground_truth"] == "1"
    assert [m[0]["content"] for m in info[PROMPTS]] == ["qa", "a1", "a2"]
    json.dumps(rows[0])  # plain data: parquet and Ray carry it


def test_each_prompt_gets_g_consecutive_samples():
    assert [variant_of(i, 12, 3) for i in range(12)] == [0] * 4 + [1] * 4 + [2] * 4


def fields(adv, weight, anchor, old, mask):
    b = len(adv)
    return {
        "response_mask": torch.tensor(mask),
        "old_log_probs": torch.tensor(old),
        ADVANTAGE: torch.tensor(adv),
        WEIGHT: torch.tensor(weight),
        IS_ANCHOR: torch.tensor(anchor),
        VARIANT: torch.zeros(b, dtype=torch.long),
    }


def test_token_mean_is_verls_normaliser_and_ratio_one_gives_minus_a():
    # 2 rows, 3 + 1 loss tokens, the mini-batch has 8 tokens on 2 ranks: verl's token-mean is Σ l / 8 · 2
    logps = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 0.5]])).requires_grad_(True)
    f = fields([1.0, -2.0], [1.0, 1.0], [False, False], logps.detach().tolist(), [[1, 1, 1], [1, 0, 0]])
    loss, _ = micro_batch_loss(
        loss_spec(agg="token_mean"), logps, f, dp_size=2, batch_num_tokens=8, global_batch_size=4, max_len=3
    )
    # ratio 1 everywhere: l = −A per token; Σ = −(1·3) − (−2·1) = −1; / 8 · 2 = −0.25
    assert loss.item() == pytest.approx(-0.25, abs=1e-7)


def test_anchor_tokens_are_shaped_and_a_masked_row_gets_no_gradient():
    gamma = 0.1
    p = torch.tensor([[0.3, 0.6], [0.4, 0.2], [0.5, 0.5]])
    logps = p.log().requires_grad_(True)
    f = fields([2.0, -1.0, 3.0], [1.0, 1.0, 0.0], [True, False, False], logps.detach().tolist(), [[1, 1]] * 3)
    spec = loss_spec(agg="seq_sum_constant", anchor_ratio="shaped", shaping_gamma=gamma)
    loss, m = micro_batch_loss(spec, logps, f, dp_size=1, batch_num_tokens=6, global_batch_size=3, max_len=4)
    (grad,) = torch.autograd.grad(loss, logps)
    scale = 3 * 4  # seq_sum_constant: sequences · max_len
    # anchor row: l = −A·p/(p+γ), dl/dlogp = −A·γp/(p+γ)²
    want_anchor = -2.0 * gamma * p[0] / (p[0] + gamma) ** 2 / scale
    assert torch.allclose(grad[0], want_anchor, atol=1e-7)
    # on-policy row at ratio 1: l = −A·ratio, dl/dlogp = −A
    assert torch.allclose(grad[1], torch.full((2,), 1.0 / scale), atol=1e-7)
    assert torch.equal(grad[2], torch.zeros(2))  # weight 0: masked
    assert m["anchor/logp_mean"].n.item() == 2


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["anchors.mode=add"], "anchors.mode=add"), (["dynamic_sampling.enabled=true"], "dynamic_sampling.enabled")],
)
def test_verls_fixed_shape_batch_refuses_growing_or_refilling_groups(overrides, key, tmp_path):
    from regroup.tasks import get_task
    from regroup.train.recipes import build_recipe

    cfg = load_config("dagrpo", overrides)
    recipe = build_recipe(
        cfg, get_task("arithmetic"), lambda text: list(text.encode()), tmp_path, loss=resolve_loss(cfg)
    )
    recipe.check_front_end("native")
    with pytest.raises(ConfigError, match=rf"{key}.*the verl batch.*not supported by the verl front-end"):
        recipe.check_front_end("verl")


# --- verl's reward function: the config names the task, a dataset row may name a registered one only ---------


def _module_with_side_effect(folder, name: str) -> None:
    """A module `name` in `folder` that, when imported, writes `folder/<name>.imported`; it holds a task
    `Task` whose grade is 0.25 on any response (so its use shows)."""
    (folder / f"{name}.py").write_text(
        "from pathlib import Path\n"
        f"Path(__file__).with_name('{name}.imported').write_text('imported')\n"
        "class Task:\n"
        "    name = 'quarter'\n"
        "    def grade(self, response, problem):\n"
        "        return 0.25\n"
    )


@pytest.mark.parametrize("named", ["row_task_with_side_effect:Task", "os:system"])
def test_a_row_naming_a_dotted_task_is_refused_and_nothing_is_imported(named, tmp_path, monkeypatch):
    _module_with_side_effect(tmp_path, "row_task_with_side_effect")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "row_task_with_side_effect", raising=False)
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    verl_reward._task.cache_clear()
    with pytest.raises(ValueError, match=r"a dataset row may name a registered task only \(arithmetic"):
        verl_reward.compute_score("regroup", "5", "5", extra_info={"regroup_task": named})
    assert "row_task_with_side_effect" not in sys.modules
    assert not (tmp_path / "row_task_with_side_effect.imported").exists()
    assert calls == []
    # a registered name in a row still grades (arithmetic: 1 for the right answer, 0 otherwise)
    assert verl_reward.compute_score("regroup", "#### 5", "5", extra_info={"regroup_task": "arithmetic"}) == 1.0
    assert verl_reward.compute_score("regroup", "#### 4", "5", extra_info={}) == 0.0


def test_the_recipes_task_reaches_verls_reward_through_the_config(tmp_path, monkeypatch):
    _module_with_side_effect(tmp_path, "config_task_mod")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "config_task_mod", raising=False)
    cfg = load_config("grpo", ["data.task=config_task_mod:Task"])
    # verl's defaults: no reward function named; the plug-in names regroup's and the recipe's task
    section = reward_function_settings(cfg, {"path": None, "name": "compute_score"})
    assert section["path"] == str(REWARD_FILE) and section["name"] == "compute_score"
    assert section["reward_kwargs"] == {"regroup_task": "config_task_mod:Task"}
    # the rows the plug-in writes name no task: the config's reaches every call through verl's reward_kwargs
    rows, _ = problem_rows([Problem(id="a", question="q", answer="5")], None, lambda t: t, 0)
    assert "regroup_task" not in rows[0]["extra_info"]
    verl_reward._task.cache_clear()
    score = verl_reward.compute_score(
        "regroup", "#### 5", "5", extra_info=rows[0]["extra_info"], **section["reward_kwargs"]
    )
    assert score == 0.25  # the recipe's task graded, not arithmetic (which gives 1.0 here)
    # regroup's file named by path (as tests/verl_cpu's harness does) is told the task too
    named = reward_function_settings(cfg, {"path": str(REWARD_FILE), "name": "compute_score"})
    assert named["reward_kwargs"] == {"regroup_task": "config_task_mod:Task"}


def test_a_users_own_reward_function_is_left_alone_and_a_disagreeing_task_refused(tmp_path):
    cfg = load_config("grpo", [])
    own = {"path": str(tmp_path / "mine.py"), "name": "score", "reward_kwargs": {"k": 1}}
    assert reward_function_settings(cfg, own) == own
    with pytest.raises(ConfigError, match=r"reward_kwargs.regroup_task='other' disagrees with data.task='arithmetic'"):
        reward_function_settings(cfg, {"path": None, "reward_kwargs": {"regroup_task": "other"}})

"""The typed config against the registries: piece names come from the registries, user stages load by
dotted path (checked before any model loads, inserted where asked, run in a real training step), every
Literal field works from YAML and the command line, and the small parse-time checks."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import yaml

from regroup.algo.loss_config import resolve_loss
from regroup.config.fields import leaves
from regroup.config.registry import REPHRASERS, REWARDS, SCORERS, STAGES, TASKS
from regroup.config.schema import RunConfig
from regroup.errors import ConfigError
from regroup.train.run_config import config_from_dict, load_config, save_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

USER_STAGES = textwrap.dedent('''
    import torch

    class CountAdvantaged:
        """Counts the samples with a non-zero advantage; runs after the advantage stage."""
        name = "count_advantaged"
        calls = 0

        def __call__(self, batch, ctx):
            type(self).calls += 1
            assert batch.advantages is not None, "placed after advantages, so they exist"
            return {"user/advantaged": float((batch.advantages != 0).sum())}

    class HalveWeights:
        name = "halve_weights"

        def __call__(self, batch, ctx):
            batch.multiply_weights(torch.full((len(batch.samples),), 0.5))
            return {}

    class Tail:
        name = "tail"

        def __call__(self, batch, ctx):
            return {}

    ready = CountAdvantaged()
    tail = Tail()
    not_a_stage = 42

    def a_function(batch, ctx):
        return {}

    class Advantages:
        name = "advantages"

        def __call__(self, batch, ctx):
            return {}
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module outside the package, importable as `user_stages_mod`."""
    (tmp_path / "user_stages_mod.py").write_text(USER_STAGES)
    (tmp_path / "broken_stages_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_stages_mod"
    for name in ("user_stages_mod", "broken_stages_mod"):
        sys.modules.pop(name, None)


# -- registries -----------------------------------------------------------------------------------------


def test_built_in_pieces_are_registered_where_they_are_defined():
    assert REWARDS.names() == ("task", "math")
    assert SCORERS.names() == ("step", "judge", "similarity")
    assert REPHRASERS.names() == ("rules", "openai", "dataset")
    assert TASKS.names() == ("arithmetic",)
    assert set(STAGES.names()) == {
        "variants",
        "anchor_slots",
        "sample",
        "reward",
        "overlong_penalty",
        "anchors",
        "dynamic_sampling",
        "advantages",
        "mask",
        "overlong_filter",
    }
    for name in STAGES.names():
        assert STAGES.get(name).name == name  # registered under its own `name`
    from regroup.rephrase import build_rephraser
    from regroup.scorers import build_scorer

    assert type(build_scorer("similarity")).__name__ == "SimilarityScorer"
    assert type(build_rephraser("dataset")).__name__ == "DatasetRephraser"
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        build_scorer("nope")


def test_config_reads_piece_names_from_the_registries(monkeypatch):
    """A reward registered on REWARDS is accepted by name, with no list in the config to update."""
    with pytest.raises(ConfigError, match="rewards: unknown reward 'constant'"):
        load_config(CONFIGS / "grpo.yaml", ["rewards=[constant]"])
    monkeypatch.setattr(REWARDS, "_items", {**REWARDS._items, "constant": lambda task, **_: lambda r, p: 1.0})
    assert load_config(CONFIGS / "grpo.yaml", ["rewards=[constant*2]"]).rewards.functions == ["constant*2"]
    from regroup.rewards.build import build_reward_fn
    from regroup.tasks import get_task
    from regroup.tasks.base import Problem

    fn = build_reward_fn(["constant * 2", "task"], get_task("arithmetic"))
    assert fn("no answer here", Problem("p0", "1+1?", "2")) == 2.0  # 2 x 1.0 + the task's 0.0


def test_reward_specs_with_spaces_parse_or_fail_in_one_line():
    cfg = load_config(CONFIGS / "grpo.yaml", ["rewards=task *0.5"])
    assert cfg.rewards.functions == ["task *0.5"]
    from regroup.config.schema import parse_weighted

    assert parse_weighted("task *0.5") == ("task", 0.5) and parse_weighted(" math * 2 ") == ("math", 2.0)
    for bad, message in (("ta sk*0.5", "is not 'name' or 'name\\*weight'"), ("task*", "not a number")):
        with pytest.raises(ConfigError, match=message) as err:
            load_config(CONFIGS / "grpo.yaml", [f"rewards={bad}"])
        assert "\n" not in str(err.value) and str(err.value).startswith("rewards")


# -- user stages ----------------------------------------------------------------------------------------


def _recipe(cfg):
    from regroup.tasks import get_task
    from regroup.train.recipes import build_recipe

    return build_recipe(cfg, get_task(cfg.data.task), lambda text: [0] * len(text), "/tmp", loss=resolve_loss(cfg))


def test_user_stages_are_inserted_where_asked(user_module):
    cfg = load_config(
        CONFIGS / "grpo.yaml",
        [
            f"stages.extra=[after:advantages={user_module}:CountAdvantaged,before:sample={user_module}:HalveWeights,"
            f"{user_module}:tail]"
        ],
    )
    recipe = _recipe(cfg)
    assert recipe.names == ["halve_weights", "sample", "reward", "advantages", "count_advantaged", "tail"]
    assert recipe.stages[-1] is sys.modules[user_module].tail  # a ready instance is used as it is


def test_two_stages_with_one_name_are_refused(user_module):
    cfg = load_config(CONFIGS / "grpo.yaml", [f"stages.extra=[{user_module}:CountAdvantaged,{user_module}:ready]"])
    with pytest.raises(ConfigError, match="stages.extra: two stages are called 'count_advantaged'"):
        _recipe(cfg)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "after:advantagez=M:CountAdvantaged",
            r"stages.extra\[0\]: after:advantagez: no stage called 'advantagez' "
            r"\(did you mean 'advantages'\?\)",
        ),
        ("M:not_a_stage", r"stages.extra\[0\]: 'M:not_a_stage' is not a stage"),
        ("M:a_function", r"stages.extra\[0\]: 'M:a_function' is not a stage"),
        ("M:Advantages", "the name of a built-in stage"),
        ("M:NoSuch", "has no attribute 'NoSuch'"),
        ("no_such_module_xyz:Stage", "cannot import module 'no_such_module_xyz'"),
        ("broken_stages_mod:Stage", "importing 'broken_stages_mod:Stage' failed: RuntimeError: boom at import"),
        ("middle:advantages=M:CountAdvantaged", "is not '\\[before:STAGE=|after:STAGE=\\]package.module:Object'"),
        ("just_a_name", "is not '"),
    ],
)
def test_bad_user_stages_fail_in_one_line_before_any_model(user_module, entry, message):
    with pytest.raises(ConfigError, match=message.replace("M:", user_module + ":")) as err:
        load_config(CONFIGS / "grpo.yaml", [f"stages.extra=[{entry.replace('M:', user_module + ':')}]"])
    assert "\n" not in str(err.value) and str(err.value).startswith("stages.extra")


def test_a_position_this_recipe_does_not_run_is_refused(user_module):
    cfg = load_config(CONFIGS / "grpo.yaml", [f"stages.extra=[after:mask={user_module}:CountAdvantaged]"])
    with pytest.raises(ConfigError, match=r"stages.extra\[0\]: after:mask, but this recipe runs no 'mask' stage"):
        _recipe(cfg)


def test_config_stages_lists_user_and_registered_stages(user_module, capsys):
    from regroup.cli import main

    assert (
        main(
            [
                "config",
                "--stages",
                "--config",
                str(CONFIGS / "grpo.yaml"),
                f"stages.extra=[after:advantages={user_module}:CountAdvantaged]",
            ]
        )
        == 0
    )
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first.startswith("sample → reward → advantages → count_advantaged → loss[")
    assert second.startswith("registered stages: variants, anchor_slots, anchors, sample, reward")


def test_a_user_stage_runs_in_a_real_training_step(user_module, tiny_model_dir, tmp_path):
    from regroup.train.build import build_trainer

    run = tmp_path / "run"
    cfg = load_config(
        CONFIGS / "grpo.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={run}",
            "data.num_train=16",
            "grpo.prompts_per_step=2",
            "grpo.num_generations=4",
            "rollout.max_new_tokens=8",
            "train.steps=2",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "diagnostics.grad_conflict_every=0",
            "train.sample_every=0",
            "optim.warmup_steps=1",
            f"stages.extra=[after:advantages={user_module}:CountAdvantaged]",
        ],
    )
    trainer = build_trainer(cfg, run, log=lambda m: None)
    assert "count_advantaged" in trainer.recipe.names
    trainer.train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("user/advantaged" in r and 0 <= r["user/advantaged"] <= 8 for r in rows)
    assert sys.modules[user_module].CountAdvantaged.calls == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["stages"]["extra"] == cfg.stages.extra


# -- every Literal field, from YAML and from the command line ------------------------------------------


def _literal_cases():
    cases = []
    for key, _, hint in leaves(RunConfig):
        if typing.get_origin(hint) is typing.Literal:
            cases += [(key, choice) for choice in typing.get_args(hint)]
    return cases


LITERAL_CASES = _literal_cases()


def test_the_literal_cases_cover_the_known_fields():
    keys = {key for key, _ in LITERAL_CASES}
    assert {"data.chat_template", "grpo.shared_prefix", "rollout.backend", "anchors.when"} <= keys
    assert len(keys) >= 14


LITERAL_NEEDS = {"rollout.is_mode": ["rollout.tis_cap=3"]}


@pytest.mark.parametrize("key, choice", LITERAL_CASES, ids=[f"{k}={c}" for k, c in LITERAL_CASES])
def test_every_literal_choice_loads_from_yaml_and_the_command_line(tmp_path, key, choice):
    raw = {True: "true", False: "false"}.get(choice, choice) if isinstance(choice, bool) else choice
    section, _, name = key.rpartition(".")
    text = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split("."))) if section else ""
    indent = "  " * (section.count(".") + 1 if section else 0)
    path = tmp_path / "literal.yaml"
    path.write_text(f"extends: {CONFIGS / 'grpo.yaml'}\n{text}{indent}{name}: {raw}\n")  # unquoted, as users write
    needs = LITERAL_NEEDS.get(key, [])  # a choice that only takes effect with another setting
    from_yaml = load_config(path, needs)
    from_cli = load_config(CONFIGS / "grpo.yaml", [f"{key}={raw}", *needs])
    for cfg in (from_yaml, from_cli):
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        assert value == choice and type(value) is type(choice)


def test_chat_template_on_off_survive_a_save(tmp_path):
    for choice in ("on", "off"):
        cfg = load_config(CONFIGS / "grpo.yaml", [f"data.chat_template={choice}"])
        save_config(cfg, tmp_path / "config.yaml")
        assert config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text())).data.chat_template == choice
    assert load_config(CONFIGS / "grpo.yaml", ["train.progress=off", "model.lora.enabled=yes"]).train.progress is False


# -- parse-time checks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ta.api_key_env", "mask.scorer.api_key_env"])
@pytest.mark.parametrize("value", ["null", "''"])
def test_api_key_env_may_be_empty_for_servers_without_authentication(key, value):
    cfg = load_config(CONFIGS / "grpo.yaml", [f"{key}={value}"])
    section, _, name = key.rpartition(".")
    got = getattr(cfg.ta if section == "ta" else cfg.mask.scorer, name)
    assert got in (None, "")
    with pytest.raises(ConfigError, match=f"{key}: this looks like an API key"):
        load_config(CONFIGS / "grpo.yaml", [f"{key}=sk-abcdefghijklmnopqrstuvwxyz123456"])


def test_run_dir_expands_the_home_folder():
    cfg = load_config(CONFIGS / "grpo.yaml", ["run_dir=~/regroup-x"])
    assert cfg.run_dir == os.path.join(os.path.expanduser("~"), "regroup-x") and "~" not in cfg.run_dir


@pytest.mark.parametrize(
    "name, ok",
    [
        ("grpo", True),
        ("paper_ta_qwen3_4b+mask-v2.1", True),
        ("a$b", False),
        ("<script>", False),
        ("two words", False),
        ("", False),
        ("x" * 101, False),
    ],
)
def test_recipe_names_are_checked_where_parsed(name, ok):
    override = [f"recipe={name!r}" if name else "recipe=''"]
    if ok:
        assert load_config(CONFIGS / "grpo.yaml", override).recipe == name
    else:
        with pytest.raises(ConfigError, match="recipe: .* is not a plain name"):
            load_config(CONFIGS / "grpo.yaml", override)


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.max_new_tokens=100000000", "rollout.max_new_tokens"),
        ("grpo.num_generations=2147483647", "grpo.num_generations"),
        ("data.max_prompt_tokens=100000000", "data.max_prompt_tokens"),
    ],
)
def test_absurd_sizes_stop_at_parse_time(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "grpo.yaml", [override])
    assert str(err.value).startswith(f"{key} must be a finite number >= 1 and <= ")


def test_the_listing_shows_each_fields_bounds():
    from regroup.config.schema import field_docs

    rows = {key: doc for key, _, doc in field_docs()}
    assert rows["rollout.max_new_tokens"].endswith("[a finite number >= 1 and <= 131072]")
    assert rows["grpo.num_generations"].endswith("[a finite number >= 1 and <= 1024]")


# -- the removed train.tensorboard / train.wandb switches --------------------------------------------------


@pytest.mark.parametrize("old", ["train.tensorboard", "train.wandb"])
def test_removed_switches_are_unknown_keys(old):
    with pytest.raises(ConfigError, match=rf"^unknown config key {old} .*report_to"):
        load_config(CONFIGS / "grpo.yaml", [f"{old}=true"])


def test_an_old_saved_config_is_refused_in_one_line_not_migrated():
    """0.1.0 has no users to migrate: a saved config with the removed switches is refused, naming the key."""
    saved = load_config(CONFIGS / "grpo.yaml").to_dict()
    saved["train"] |= {"tensorboard": True}
    with pytest.raises(ConfigError, match=r"^unknown config key train.tensorboard"):
        config_from_dict(saved)
    assert not {"tensorboard", "wandb"} & set(type(load_config(CONFIGS / "grpo.yaml").train).model_fields)

"""Reading, checking and writing a whole run config.

`load_config("grpo", ["optim.lr=1e-4"])` reads a recipe (a file or a shipped recipe's name, which may `extends:`
another), applies the dotted overrides and runs `check_config`: keys, types and bounds (`schema`), then the named
pieces against their registries (rewards, scorer, rephraser, task, stages, loss pieces; a dotted `pkg.mod:obj` is
imported here), then the files and folders the run will read. No model is touched; an error is one `ConfigError`
line naming the dotted key. This module sits above the packages whose registries it reads.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path

import yaml

# Importing these packages registers their built-in pieces (rephrasers, rewards, scorers, stages, tasks).
import regroup.rephrase
import regroup.rewards
import regroup.scorers
import regroup.stages
import regroup.tasks  # noqa: F401  (registers the built-in tasks; `regroup` is bound by the lines above)
from regroup.algo.loss_config import resolve_loss
from regroup.config.fields import check, read_yaml
from regroup.config.registry import REPHRASERS, REWARDS, SCORERS, STAGES, TASKS
from regroup.config.schema import (
    PACKAGED_CONFIGS,
    RunConfig,
    apply_overrides,
    get_dotted,
    parse_weighted,
    resolve_config_path,
    shorthand,
)
from regroup.data.load import DataError, peek_columns
from regroup.errors import ConfigError
from regroup.io import write_atomic
from regroup.net.redact import check_key_env_name
from regroup.rollout.producer import check_async_config
from regroup.stages.user import check_user_stage, parse_stage_entry
from regroup.train.recipes import features

PIECE_KEYS = (
    "data.task",
    "rewards.functions",
    "mask.scorer.name",
    "ta.rephraser",
    "stages.extra",
    "grpo.policy_loss",
    "grpo.kl_estimator",
    "grpo.loss_terms",
)
"""The keys whose value may name code (`pkg.mod:obj`) that checking the config imports and training runs."""


def _dotted(key: str, value: str) -> str | None:
    if key == "stages.extra":
        try:
            return parse_stage_entry(value).path
        except ValueError:
            return None
    name = parse_weighted(value, key)[0] if key in ("rewards.functions", "grpo.loss_terms") else str(value).strip()
    return name if ":" in name else None


def config_pieces(data: dict) -> list[tuple[str, str]]:
    """(key, "pkg.mod:obj") of every piece of code a config mapping names, found WITHOUT importing anything
    (what `--resume` prints before `check_config` imports them). [] when the mapping does not build: the
    full check reports why."""
    try:
        cfg = check(RunConfig, shorthand(data))
    except ConfigError:
        return []
    out = []
    for key in PIECE_KEYS:
        value = get_dotted(cfg, key)
        for item in value if isinstance(value, list) else [value]:
            try:
                name = _dotted(key, item)
            except ConfigError:
                name = None
            if name:
                out.append((key, name))
    return out


def check_config(cfg: RunConfig) -> None:
    """Every setting checked again (bounds, cross-field rules: a caller may have assigned one since), then the named
    pieces, the files the run will read, the key variables' names and the loss. No model is touched."""
    check(RunConfig, cfg.model_dump())
    check_pieces(cfg)
    for key in ("data.train_file", "data.eval_file"):
        check_readable(key, get_dotted(cfg, key))
    if cfg.model.path is not None and not os.path.isdir(cfg.model.path):
        raise ConfigError(f"model.path: no such model folder: {cfg.model.path}")
    for key in ("ta.api_key_env", "mask.scorer.api_key_env", "rollout.vllm_server_api_key_env"):
        if get_dotted(cfg, key):  # null or "": a server without authentication
            check_key_env_name(get_dotted(cfg, key), key)  # a key pasted where its variable's name goes
    resolve_loss(cfg)  # the loss pieces exist (dotted paths import) and compose; the recipe reuses this resolution
    ratio_on_original = features(cfg).ratio_on_original
    if cfg.rollout.tis_cap > 0 and ratio_on_original:
        raise ConfigError(
            "rollout.tis_cap > 0 with ta.ratio_anchor=original would divide pi_old(o|q0) by the sampler's "
            "pi(o|q_n), a ratio of two different prompts; set rollout.tis_cap=0 or ta.ratio_anchor=own"
        )
    check_async_config(cfg, ratio_on_original=ratio_on_original)  # rollout.async_steps: what cannot work


def check_pieces(cfg: RunConfig) -> None:
    """Reward, scorer, rephraser, task and user-stage names exist in their registries (dotted paths import),
    and the pieces bound to the built-in task are not used on external data it does not describe."""
    user_task = ":" in cfg.data.task
    TASKS.resolve("data.task", cfg.data.task, must_call=False)
    # External data that the task does not own: the task's grader, step scorer and rules know only its format.
    foreign, task = cfg.data.train_file is not None and not user_task, cfg.data.task
    if not cfg.rewards.functions:
        raise ConfigError("rewards: no reward function; give at least one, e.g. rewards=[math]")
    for spec in cfg.rewards.functions:
        name, _ = parse_weighted(spec)
        REWARDS.resolve("rewards", name)
        if name == "task" and foreign:
            raise ConfigError(
                f"rewards: 'task' grades the built-in {task} task's answers and cannot grade "
                f"data.train_file; use rewards=[math] (or a 'package.module:function')"
            )
    on = features(cfg)
    scorer = cfg.mask.scorer.name
    if on.mask or not SCORERS.known(scorer):
        SCORERS.resolve("mask.scorer.name", scorer)
    if on.mask and scorer == "step" and foreign:
        raise ConfigError(
            f"mask.scorer.name: 'step' scores the built-in {task} task's steps and would score "
            "every response of data.train_file alike; use mask.scorer.name=judge or similarity"
        )
    if on.variants or not REPHRASERS.known(cfg.ta.rephraser):
        REPHRASERS.resolve("ta.rephraser", cfg.ta.rephraser)
    if on.variants and cfg.ta.rephraser == "rules" and foreign:
        raise ConfigError(
            f"ta.rephraser: 'rules' rewrites the built-in {task} task's questions only; with "
            "data.train_file use ta.rephraser=openai, or dataset (variants stored in the data)"
        )
    if on.variants and cfg.ta.rephraser == "dataset":
        _check_variants(cfg)
    for i, entry in enumerate(cfg.stages.extra):
        try:
            check_user_stage(parse_stage_entry(entry), STAGES)
        except ValueError as e:
            raise ConfigError(f"stages.extra[{i}]: {e}") from None


def _check_variants(cfg: RunConfig) -> None:
    """ta.rephraser=dataset needs data that stores variants (a `variants` column or index/sub_index rows)."""
    if cfg.data.train_file is None:
        raise ConfigError(
            "ta.rephraser: 'dataset' takes the variants stored in data.train_file, and none is set "
            "(generated questions have no stored variants); use ta.rephraser=rules"
        )
    if str(cfg.data.train_file).startswith("hf:"):
        return  # a hub data set: its columns are checked when it loads, before the model does
    check_readable("data.train_file", cfg.data.train_file)
    try:
        columns = peek_columns(cfg.data.train_file)
    except DataError as e:
        raise ConfigError(f"data.train_file: {e}") from None
    if "variants" not in columns and not {"index", "sub_index"} <= columns:
        raise ConfigError(
            f"ta.rephraser: 'dataset' needs stored variants, but {cfg.data.train_file} has no "
            f"'variants' column and no index/sub_index rows (columns: {', '.join(sorted(columns))}); "
            "add them with `regroup rephrase`, or use ta.rephraser=openai"
        )


def check_readable(key: str, path: str | None) -> None:
    """A data file (or datasets folder) that exists and can be read; `hf:` specs are read by `datasets`."""
    if path is None or str(path).startswith("hf:"):
        return
    if not os.path.exists(path):
        raise ConfigError(f"{key}: no such file or folder: {path}")
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"{key}: folder {path} is not readable")
        return
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path}: {e.strerror or e}") from None


# -- loading ----------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a YAML recipe (a file, or a shipped recipe's name), apply dotted overrides, type-check, validate.
    No model is touched. A recipe that is neither is one ConfigError naming `path` as given and the shipped
    recipes; an error that the file itself holds (not an override) names the file."""
    if not path:
        cfg = check(RunConfig, apply_overrides({}, overrides))
        check_config(cfg)
        return cfg
    recipe = resolve_config_path(path)
    if not recipe.is_file():
        what = "a folder, not a file" if recipe.is_dir() else "no such file"
        raise ConfigError(
            f"config file not found: {path} ({what}, and no shipped recipe of that name); {shipped_recipes(path)}"
        )
    from_file = read_yaml(recipe)
    try:
        cfg = check(RunConfig, apply_overrides(copy.deepcopy(from_file), overrides))
        check_config(cfg)
    except ConfigError as e:
        if overrides and not _fails_alone(from_file, str(e)):
            raise  # the override's error: the dotted key it names is on the command line
        named = str(path) if os.path.isfile(path) else str(recipe)
        raise ConfigError(f"{named}: {e}") from None
    return cfg


def _fails_alone(data: dict, message: str) -> bool:
    """Whether the recipe's own mapping (no overrides) fails with the same `message`: the error is in the file."""
    try:
        check_config(check(RunConfig, apply_overrides(copy.deepcopy(data), ())))
    except Exception as e:  # anything else: not the same error
        return isinstance(e, ConfigError) and str(e) == message
    return False


def shipped_recipes(typed: str | os.PathLike) -> str:
    """The shipped recipes, named as `--config` takes them, with the nearest to `typed` first when one is close."""
    names = sorted(
        str(p.relative_to(PACKAGED_CONFIGS).with_suffix(""))
        for p in PACKAGED_CONFIGS.rglob("*.yaml")
        if p.parent.name != "accelerate"  # launcher settings, not recipes
    )
    top = [n for n in names if "/" not in n]
    papers = [n for n in names if "/" in n]
    stem = Path(typed).with_suffix("").name
    close = difflib.get_close_matches(stem, [Path(n).name for n in names], n=1)
    hint = f"did you mean {next(n for n in names if Path(n).name == close[0])!r}? " if close else ""
    return (
        f"{hint}shipped recipes: {', '.join(top)}; and {len(papers)} paper recipes "
        f"({', '.join(papers[:2])}, ...) in {PACKAGED_CONFIGS}"
    )


def config_from_dict(data: dict) -> RunConfig:
    """Rebuild a saved config (e.g. RUN_DIR/config.yaml) with the same checks as `load_config`."""
    if not isinstance(data, dict):
        raise ConfigError(f"a saved config must be a mapping, got {type(data).__name__}")
    cfg = check(RunConfig, shorthand(data))
    check_config(cfg)
    return cfg


def save_config(cfg: RunConfig, path: str | os.PathLike) -> None:
    write_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))

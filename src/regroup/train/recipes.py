"""A recipe is an ordered list of stages plus a loss spec, built once at start-up from the config.

This module is the ONLY reader of feature flags. The trainer (and the TRL adapter) run whatever stages
the recipe lists, in order, and call the loss with its spec; neither asks which algorithm it runs.

| recipe           | stages (in order)                                                                  | loss spec |
|------------------|------------------------------------------------------------------------------------|-----------|
| grpo             | sample, reward, advantages                                                         | token ratio |
| grpo_matched     | sample ((N+1)·G of q0), reward, advantages                                         | token ratio |
| ta_grpo          | variants, sample (ratios on q0), reward, advantages                                | token ratio on (q0, o) |
| dagrpo           | anchor_slots, sample, reward, anchors, advantages, mask                           | anchor-shaped |
| dagrpo_ta        | variants, anchor_slots, sample (q0), reward, anchors, advantages, mask            | both |
| + dynamic_sampling | … reward, [anchors], dynamic_sampling, advantages …                               | |
| + overlong       | … reward, overlong_penalty, …, advantages, overlong_filter                          | |
| + GSPO           | unchanged                                                                          | sequence ratio |
| + stages.extra   | user stages by dotted path, before/after a stage above or at the end               | |
| + CISPO/SAPO/GMPO, KL estimator, IS mode, entropy, user terms | unchanged                             | named pieces (`regroup.train.loss_config`) |

`describe(recipe)` prints the list; `regroup config --stages` shows it for a config.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from regroup.algo.losses import LossSpec
from regroup.config.schema import parse_reward_spec
from regroup.errors import ConfigError
from regroup.registry import REWARDS, load_dotted
from regroup.rephrase import build_rephraser as build_named_rephraser
from regroup.rewards import combine
from regroup.rewards.deadline import DeadlineReward
from regroup.scorers.registry import build_scorer as build_named_scorer
from regroup.stages.advantages import GroupAdvantages
from regroup.stages.anchors import AnchorInjector, InjectAnchors, ReserveAnchorSlots
from regroup.stages.dynamic_sampling import DynamicSampling
from regroup.stages.masking import DistinctivenessMasker
from regroup.stages.overlong import OverlongFilter, OverlongPenalty
from regroup.stages.rephrasing import VariantProvider
from regroup.stages.rewarding import RewardResponses
from regroup.stages.sampling import SampleResponses
from regroup.stages.user import insert_user_stages, parse_stage_entry
from regroup.train.loss_config import advantage_estimator, describe_loss, loss_spec


@dataclass
class Recipe:
    stages: list = field(default_factory=list)
    """Stage objects in the order they run each step (see `regroup.stages.base`)."""
    loss: LossSpec = field(default_factory=LossSpec)
    reward_fn: object = None
    """(response, problem) -> float | None: the verifiable reward the stages use (eval uses it too)."""
    ratio_on_original: bool = False
    """Every ratio and KL on (q0, o) — TA-GRPO's anchored ratio (SPEC §3.4); needed by the IS check."""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def check_front_end(self, front_end: str) -> None:
        """Refuse, in one line naming the config key, a stage `front_end` cannot run ("native" runs all).

        A stage that needs something a front-end lacks (the TRL adapter's fixed-shape generation batch cannot
        refill groups or grow them) says so in `unsupported_by(front_end) -> str | None`."""
        for stage in self.stages:
            reason = stage.unsupported_by(front_end) if hasattr(stage, "unsupported_by") else None
            if reason:
                raise ConfigError(f"{reason} (not supported by the {front_end} front-end)")

    def collect_stages(self) -> list:
        """The stages before the first filter: what a dynamic-sampling refill runs on new questions."""
        for i, s in enumerate(self.stages):
            if getattr(s, "is_filter", False):
                return self.stages[:i]
        return list(self.stages)


def describe(recipe: Recipe) -> str:
    return " → ".join(recipe.names) + " → " + describe_loss(recipe.loss)


def build_reward_fn(specs: list[str], task, workers: int = 1, correct_threshold: float = 1.0, timeout_s: float = 0.0):
    """A registered reward (`task`, `math`) or `pkg.mod:fn`, each optionally `*weight`; several are summed.

    A user function (`pkg.mod:fn`, a plain function) runs in a worker process with a deadline of
    `timeout_s` per call when `timeout_s > 0` (`rewards.timeout_s`): past it, it scores None (unscored).
    A callable object runs in-process (it may keep state or its own pool)."""
    parts = []
    for spec in specs:
        name, weight = parse_reward_spec(spec)
        if ":" in name:
            fn = load_dotted(name)
            if timeout_s > 0 and inspect.isfunction(fn):
                fn = DeadlineReward(name, timeout_s)
        else:
            fn = REWARDS.get(name)(task, workers=workers, correct_threshold=correct_threshold)
        parts.append((fn, weight))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    return combine(parts)


def build_rephraser(cfg, task, run_dir: Path):
    ta = cfg.ta
    if ta.rephraser == "rules":
        return build_named_rephraser("rules", rephrase_fn=task.rephrase, seed=cfg.seed)
    if ta.rephraser == "openai":
        (run_dir / "cache").mkdir(parents=True, exist_ok=True)
        return build_named_rephraser(
            "openai",
            base_url=ta.base_url,
            model=ta.model,
            api_key_env=ta.api_key_env,
            cache_path=str(run_dir / "cache" / "rephrase.sqlite"),
        )
    return build_named_rephraser(ta.rephraser)


def build_scorer(cfg, task, run_dir: Path):
    s = cfg.mask.scorer
    if s.name == "judge":
        cache = Path(s.cache_dir) if s.cache_dir else run_dir / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        return build_named_scorer(
            "judge",
            base_url=s.base_url,
            model=s.model,
            api_key_env=s.api_key_env,
            concurrency=s.concurrency,
            timeout_s=s.timeout_s,
            max_retries=s.max_retries,
            structured=s.structured,
            max_tokens=s.max_tokens or None,
            cache_path=str(cache / "judge.sqlite"),
        )
    if s.name == "step":
        return build_named_scorer("step", step_fn=getattr(task, "step_score", None))
    return build_named_scorer(s.name)


def build_recipe(cfg, task, encode_response, run_dir) -> Recipe:
    """The stages and loss spec `cfg` switches on, in the order of `regroup.stages.base`'s diagram, with the
    user's `stages.extra` inserted."""
    run_dir = Path(run_dir)
    reward_fn = build_reward_fn(
        cfg.rewards.functions, task, cfg.rewards.workers, cfg.rewards.correct_threshold, cfg.rewards.timeout_s
    )
    ratio_on_original = cfg.ta.enabled and cfg.ta.ratio_anchor == "original"
    stages: list = []
    if cfg.ta.enabled:
        stages.append(VariantProvider(build_rephraser(cfg, task, run_dir), cfg.ta.n_variants))
    injector = None
    if cfg.anchors.enabled:
        injector = AnchorInjector(
            cfg.anchors,
            reward_fn,
            encode_response,
            correct_threshold=cfg.rewards.correct_threshold,
            max_tokens=cfg.anchors.max_tokens or cfg.rollout.max_new_tokens,
        )
        stages.append(ReserveAnchorSlots(injector))
    stages += [SampleResponses(ratio_on_original), RewardResponses(reward_fn)]
    o = cfg.overlong
    if o.soft_punish:
        stages.append(OverlongPenalty(cfg.rollout.max_new_tokens, o.buffer, o.penalty))
    if injector is not None:
        stages.append(InjectAnchors(injector))
    if cfg.dynamic_sampling.enabled:
        stages.append(DynamicSampling(cfg.grpo.prompts_per_step, cfg.dynamic_sampling.max_rounds))
    stages.append(GroupAdvantages(*advantage_estimator(cfg)))
    if cfg.mask.enabled:  # SPEC §2a: masks after advantages, over G_mix
        stages.append(
            DistinctivenessMasker(
                build_scorer(cfg, task, run_dir), cfg.mask.delta, cfg.mask.scorer.question, cfg.mask.unit
            )
        )
    if o.filter:
        stages.append(OverlongFilter())
    stages = insert_user_stages(stages, [parse_stage_entry(e) for e in cfg.stages.extra])  # checked by the config
    return Recipe(stages=stages, loss=loss_spec(cfg), reward_fn=reward_fn, ratio_on_original=ratio_on_original)

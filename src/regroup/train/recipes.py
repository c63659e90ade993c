"""A recipe is an ordered list of stages plus a loss spec, built once at start-up from the config.

This module is the ONLY reader of feature flags (the `*.enabled` switches; tests/train/test_recipes.py greps
for any other). `features(cfg)` answers every question the rest of the code asks of them (a `Features`,
also `Recipe.features`); the trainer (and the TRL adapter) run whatever stages the recipe lists, in order,
and call the loss with its spec; neither asks which algorithm it runs.

| recipe             | stages (in order)                                                      | loss spec        |
|--------------------|------------------------------------------------------------------------|------------------|
| grpo               | sample, reward, advantages                                             | token ratio      |
| grpo_matched       | sample ((N+1)·G of q0), reward, advantages                             | token ratio      |
| ta_grpo            | variants, sample (ratios on q0), reward, advantages                    | ratio on (q0, o) |
| dagrpo             | anchor_slots, sample, reward, anchors, advantages, mask                | anchor-shaped    |
| dagrpo_ta          | variants, anchor_slots, sample (q0), reward, anchors, advantages, mask | both             |
| + dynamic_sampling | … reward, [anchors], dynamic_sampling, advantages …                    |                  |
| + overlong         | … reward, overlong_penalty, …, advantages, overlong_filter             |                  |
| + GSPO             | unchanged                                                              | sequence ratio   |
| + stages.extra     | user stages by dotted path, before/after a stage above or at the end   |                  |
| + CISPO/SAPO/GMPO, KL estimator, IS mode, entropy, user terms | unchanged                   | named pieces     |

The loss and the advantage estimator are resolved once per run, before the recipe is built
(`regroup.algo.loss_config.resolve_loss`); the recipe takes what that returned.

`describe(recipe)` prints the list; `regroup config --stages` shows it for a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from regroup.algo.loss_config import describe_loss
from regroup.algo.loss_spec import LossSpec, Piece
from regroup.config.schema import RunConfig
from regroup.errors import ConfigError
from regroup.rephrase import build_rephraser as build_named_rephraser
from regroup.rewards.build import reward_fn_from_config
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


@dataclass(frozen=True)
class Features:
    """What a config switches on, read once from its `*.enabled` flags: the answers every other module uses."""

    variants: bool = False
    """TA-GRPO (`ta.enabled`): each question is expanded into N rephrasings that share its group."""
    anchors: bool = False
    """DaGRPO (`anchors.enabled`): verified off-policy solutions join their question's group."""
    mask: bool = False
    """DaGRPO (`mask.enabled`): the distinctiveness mask, which builds a scorer."""
    dynamic_sampling: bool = False
    """DAPO (`dynamic_sampling.enabled`): uniform groups are dropped and refilled with new questions."""
    lora: bool = False
    """`model.lora.enabled`: LoRA adapters are trained instead of every weight."""
    n_variants: int = 0
    """Rephrasings per question (0 without TA-GRPO)."""
    anchor_count: int = 0
    """Anchors per question at most (0 without anchors)."""
    added_anchors: int = 0
    """Anchors that grow their group (anchors.mode=add); 0 when they replace a sample or are off."""
    ratio_on_original: bool = False
    """Every ratio and KL on (q0, o): TA-GRPO's anchored ratio (SPEC §3.4)."""
    draw_rounds: int = 1
    """Question batches one step may draw: 1, or 1 + dynamic_sampling.max_rounds with refills."""
    needs_reference: bool = False
    """A frozen reference policy is kept (grpo.beta > 0: the KL term needs pi_ref)."""
    judge: bool = False
    """The mask scores with the LLM judge (a remote client, its API key checked at start-up)."""
    remote_rephraser: bool = False
    """TA-GRPO rephrases with the OpenAI-compatible rewriter (a remote client)."""
    reference_anchors: bool = False
    """Anchors may come from the data's reference solutions (anchors on, anchors.source != self)."""


def features(cfg: RunConfig) -> Features:
    """The `Features` of a run config (the only reader of its `*.enabled` flags)."""
    ta, anchors, mask, dyn = cfg.ta.enabled, cfg.anchors.enabled, cfg.mask.enabled, cfg.dynamic_sampling.enabled
    return Features(
        variants=ta,
        anchors=anchors,
        mask=mask,
        dynamic_sampling=dyn,
        lora=cfg.model.lora.enabled,
        n_variants=cfg.ta.n_variants if ta else 0,
        anchor_count=cfg.anchors.count if anchors else 0,
        added_anchors=cfg.anchors.count if anchors and cfg.anchors.mode == "add" else 0,
        ratio_on_original=ta and cfg.ta.ratio_anchor == "original",
        draw_rounds=cfg.dynamic_sampling.max_rounds + 1 if dyn else 1,
        needs_reference=cfg.grpo.beta > 0,
        judge=mask and cfg.mask.scorer.name == "judge",
        remote_rephraser=ta and cfg.ta.rephraser == "openai",
        reference_anchors=anchors and cfg.anchors.source != "self",
    )


@dataclass
class Recipe:
    loss: LossSpec
    """The loss: its config sections and its pieces, resolved once (`regroup.algo.loss_config.resolve_loss`)."""
    stages: list = field(default_factory=list)
    """Stage objects in the order they run each step (see `regroup.stages.base`)."""
    reward_fn: object = None
    """(response, problem) -> float | None: the verifiable reward the stages use (eval uses it too)."""
    features: Features = field(default_factory=Features)
    """What the config switched on (`features`): the recipe's answers to the questions below."""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    @property
    def ratio_on_original(self) -> bool:
        """Every ratio and KL on (q0, o) — TA-GRPO's anchored ratio (SPEC §3.4); needed by the IS check."""
        return self.features.ratio_on_original

    @property
    def uses_anchors(self) -> bool:
        return self.features.anchors

    @property
    def uses_dynamic_sampling(self) -> bool:
        return self.features.dynamic_sampling

    @property
    def needs_reference(self) -> bool:
        return self.features.needs_reference

    @property
    def n_variants(self) -> int:
        return self.features.n_variants

    @property
    def draw_rounds(self) -> int:
        return self.features.draw_rounds

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


def build_rephraser(cfg: RunConfig, task, run_dir: Path):
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


def build_scorer(cfg: RunConfig, task, run_dir: Path):
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


def build_recipe(cfg: RunConfig, task, encode_response, run_dir, *, loss: tuple[LossSpec, Piece]) -> Recipe:
    """The stages and loss spec `cfg` switches on, in the order of `regroup.stages.base`'s diagram, with the
    user's `stages.extra` inserted. `loss`: the run's loss and advantage estimator, resolved once from the checked
    config (`regroup.algo.loss_config.resolve_loss`)."""
    spec, estimator = loss
    run_dir = Path(run_dir)
    reward_fn = reward_fn_from_config(cfg.rewards, task)
    on = features(cfg)
    stages: list = []
    if on.variants:
        stages.append(VariantProvider(build_rephraser(cfg, task, run_dir), cfg.ta.n_variants))
    injector = None
    if on.anchors:
        injector = AnchorInjector(
            cfg.anchors,
            reward_fn,
            encode_response,
            correct_threshold=cfg.rewards.correct_threshold,
            max_tokens=cfg.anchors.max_tokens or cfg.rollout.max_new_tokens,
        )
        stages.append(ReserveAnchorSlots(injector))
    stages += [SampleResponses(on.ratio_on_original), RewardResponses(reward_fn)]
    o = cfg.overlong
    if o.soft_punish:
        stages.append(OverlongPenalty(cfg.rollout.max_new_tokens, o.buffer, o.penalty))
    if injector is not None:
        stages.append(InjectAnchors(injector))
    if on.dynamic_sampling:
        stages.append(DynamicSampling(cfg.grpo.prompts_per_step, cfg.dynamic_sampling.max_rounds))
    stages.append(GroupAdvantages(estimator))
    if on.mask:  # SPEC §2a: masks after advantages, over G_mix
        stages.append(
            DistinctivenessMasker(
                build_scorer(cfg, task, run_dir), cfg.mask.delta, cfg.mask.scorer.question, cfg.mask.unit
            )
        )
    if o.filter:
        stages.append(OverlongFilter())
    stages = insert_user_stages(stages, [parse_stage_entry(e) for e in cfg.stages.extra])  # checked by the config
    return Recipe(stages=stages, loss=spec, reward_fn=reward_fn, features=on)

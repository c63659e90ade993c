"""A recipe is the list of pieces a run switches on, decided once at start-up from the config.

| recipe       | variants (TA §3) | anchors (Da §2b) | masks (Da §2a) | ratio prompt |
|--------------|------------------|------------------|----------------|--------------|
| grpo         | –                | –                | –              | own          |
| grpo_matched | – ((N+1)·G of q0)| –                | –              | own          |
| ta_grpo      | rephraser        | –                | –              | q0 (original)|
| dagrpo       | –                | injector         | masker         | own          |
| dagrpo_ta    | rephraser        | injector         | masker         | q0 (original)|

The trainer calls whatever is present, in a fixed order; it never asks which algorithm it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from regroup.stages.anchors import AnchorInjector
from regroup.stages.masking import DistinctivenessMasker
from regroup.stages.rephrasing import VariantProvider


@dataclass
class Recipe:
    reward_fn: object
    """(response, problem) -> float | None."""
    variants: VariantProvider | None = None
    anchors: AnchorInjector | None = None
    masker: DistinctivenessMasker | None = None
    ratio_on_original: bool = False
    """Compute every ratio (and the KL) on (q0, o) — TA-GRPO's anchored ratio (SPEC §3.4)."""


def build_reward_fn(specs: list[str], task):
    """`task`, `math`, or `pkg.mod:fn`, each optionally `*weight`; several are summed with weights."""
    from regroup.rewards import combine, task_grader
    from regroup.rewards.math_verify import MathAnswerChecker
    from regroup.registry import load_dotted

    parts = []
    for spec in specs:
        name, _, weight = spec.partition("*")
        if name == "task":
            fn = task_grader(task)
        elif name == "math":
            fn = MathAnswerChecker()
        else:
            fn = load_dotted(name)
        parts.append((fn, float(weight) if weight else 1.0))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    return combine(parts)


def build_rephraser(cfg, task, run_dir: Path):
    from regroup.rephrase import build_rephraser as _build

    ta = cfg.ta
    if ta.rephraser == "rules":
        return _build("rules", rephrase_fn=task.rephrase, seed=cfg.seed)
    if ta.rephraser == "openai":
        (run_dir / "cache").mkdir(parents=True, exist_ok=True)
        return _build("openai", base_url=ta.base_url, model=ta.model, api_key_env=ta.api_key_env,
                      cache_path=str(run_dir / "cache" / "rephrase.sqlite"))
    return _build(ta.rephraser)


def build_scorer(cfg, task, run_dir: Path):
    from regroup.scorers.registry import build_scorer as _build

    s = cfg.mask.scorer
    if s.name == "judge":
        cache = Path(s.cache_dir) if s.cache_dir else run_dir / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        return _build("judge", base_url=s.base_url, model=s.model, api_key_env=s.api_key_env,
                      concurrency=s.concurrency, timeout_s=s.timeout_s, max_retries=s.max_retries,
                      cache_path=str(cache / "judge.sqlite"))
    if s.name == "step":
        return _build("step", step_fn=getattr(task, "step_score", None))
    return _build(s.name)


def build_recipe(cfg, task, encode_response, run_dir) -> Recipe:
    run_dir = Path(run_dir)
    reward_fn = build_reward_fn(cfg.rewards.functions, task)
    recipe = Recipe(reward_fn=reward_fn)
    if cfg.ta.enabled:
        recipe.variants = VariantProvider(build_rephraser(cfg, task, run_dir), cfg.ta.n_variants)
        recipe.ratio_on_original = cfg.ta.ratio_anchor == "original"
    if cfg.anchors.enabled:
        recipe.anchors = AnchorInjector(cfg.anchors, reward_fn, encode_response)
    if cfg.mask.enabled:
        recipe.masker = DistinctivenessMasker(build_scorer(cfg, task, run_dir), cfg.mask.delta)
    return recipe

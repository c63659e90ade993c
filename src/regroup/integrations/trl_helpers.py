"""Pure helpers of the TRL adapter (no TRL trainer state): the TRL settings regroup's config decides, the
dataset rows built from regroup's problems, the sampler that keeps a TA-GRPO question's N+1 rows together,
and TRL's loss normalisers expressed as regroup's aggregation totals. Tested without building a trainer;
`regroup.integrations.trl` uses them (import them from here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from torch import Tensor
from torch.utils.data import Sampler

from regroup.config.schema import RunConfig
from regroup.errors import ConfigError
from regroup.train.recipes import features

TRL_VERSIONS = ">=1.16,<1.17"
"""The TRL versions the adapter runs under (the `trl` extra's pin): it overrides TRL's private methods
(`_generate_and_score_completions`, `_compute_loss`, ...) as trl 1.16 writes them, and TRL changes them, and
its defaults, within 1.x; a new minor version is allowed once the adapter's tests pass under it."""


def check_trl_version(version: str | None = None) -> None:
    """ConfigError, in one line, when TRL's version (default: the imported `trl.__version__`) is outside
    `TRL_VERSIONS`."""
    if version is None:
        import trl  # optional (trl): the TRL front-end only

        version = str(trl.__version__)
    try:
        inside = SpecifierSet(TRL_VERSIONS).contains(Version(version), prereleases=True)
    except InvalidVersion:
        inside = False
    if not inside:
        raise ConfigError(
            f"trl {version} is installed; regroup's TRL adapter overrides TRL internals and runs under trl"
            f"{TRL_VERSIONS} only: pip install 'regroup-rl[trl]'"
        )


# Dataset columns of the rows the adapter builds (one row per (question, variant)).
GROUP_ID, VARIANT, QUESTION_ID, QUESTION, Q0_PROMPT = (
    "regroup_group_id",
    "regroup_variant",
    "regroup_question_id",
    "regroup_question",
    "regroup_q0_prompt",
)
# Batch keys the adapter adds to TRL's generation batch (all [B] or [B, T], so TRL shuffles / splits them).
SAMPLE_WEIGHT, ANCHOR_MASK, IS_ANCHOR = "regroup_sample_weight", "regroup_anchor_mask", "regroup_is_anchor"

# TRL loss_type -> regroup aggregation mode computing the same loss (see `loss_totals`).
LOSS_AGG = {"dapo": "token_mean", "grpo": "seq_mean_token_mean", "dr_grpo": "seq_sum_constant", "bnpo": "token_mean"}

# GRPOConfig fields TRL uses itself whose value regroup's config decides: (GRPOConfig field, regroup key,
# the value TRL must have). TRL samples and computes π_old / π_ref with them; the recipe's stages and loss
# use regroup's keys; so the two must agree.
SHARED_SETTINGS: tuple[tuple[str, str, Callable[[RunConfig], Any]], ...] = (
    (
        "num_generations",
        "grpo.num_generations",
        lambda c: c.grpo.num_generations * (1 if features(c).variants else c.grpo.samples_multiplier),
    ),
    ("max_completion_length", "rollout.max_new_tokens", lambda c: c.rollout.max_new_tokens),
    ("temperature", "rollout.temperature", lambda c: c.rollout.temperature),
    ("top_p", "rollout.top_p", lambda c: c.rollout.top_p),
    ("beta", "grpo.beta", lambda c: c.grpo.beta),
    ("num_iterations", "grpo.num_iterations", lambda c: c.grpo.num_iterations),
    ("epsilon", "grpo.eps_low", lambda c: c.grpo.eps_low),
    ("epsilon_high", "grpo.eps_high", lambda c: c.grpo.eps_high),
    ("scale_rewards", "grpo.advantage_estimator", lambda c: _trl_scale_rewards(c)),
    ("importance_sampling_level", "grpo.policy_loss", lambda c: _trl_ratio_level(c)),
    ("use_bias_correction_kl", "grpo.kl_ratio_correction", lambda c: c.grpo.kl_ratio_correction),
    ("loss_type", "grpo.loss_agg", lambda c: {v: k for k, v in LOSS_AGG.items() if k != "bnpo"}[c.grpo.loss_agg]),
    ("delta", "grpo.policy_loss_args.delta", lambda c: c.grpo.policy_loss_args.get("delta")),
    ("off_policy_mask_threshold", "grpo.off_policy_mask_threshold", lambda c: c.grpo.off_policy_mask_threshold),
    # the sampler IS correction (TRL applies it to vLLM's samples only): rollout.tis_cap > 0 turns it on
    ("vllm_importance_sampling_correction", "rollout.tis_cap", lambda c: c.rollout.tis_cap > 0),
    ("vllm_importance_sampling_mode", "rollout.is_mode", lambda c: c.rollout.is_mode),
    ("vllm_importance_sampling_clip_max", "rollout.tis_cap", lambda c: c.rollout.tis_cap or None),
    ("vllm_importance_sampling_clip_min", "rollout.is_min", lambda c: c.rollout.is_min or None),
)
_IS_FIELDS = ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min")

# GRPOConfig fields the adapter needs at one value, whatever regroup's config: (field, value, why). TRL's
# defaults for them have moved within 1.x, so `grpo_args` sets each and the trainer refuses another value.
ADAPTER_SETTINGS: tuple[tuple[str, Any, str], ...] = (
    (
        "mask_truncated_completions",
        False,
        "truncated responses are the recipe's (overlong.filter); TRL's mask would also change the normaliser",
    ),
    ("top_entropy_quantile", 1.0, "the recipe's loss does not implement it"),
    ("entropy_coef", 0.0, "the recipe's loss does not implement it; the entropy bonus is grpo.entropy_coef"),
    ("use_adaptive_entropy", False, "the recipe's loss does not implement it"),
    ("remove_unused_columns", False, "the adapter reads its own dataset columns"),
    ("sync_ref_model", False, "the reference policy is frozen, as in the native trainer"),
    ("top_k", 0, "regroup samples with rollout.temperature and rollout.top_p only"),
    ("min_p", None, "regroup samples with rollout.temperature and rollout.top_p only"),
    ("repetition_penalty", 1.0, "regroup samples with rollout.temperature and rollout.top_p only"),
)


def _trl_scale_rewards(cfg: RunConfig) -> str:
    """TRL's `scale_rewards` for regroup's advantage estimator: grpo's `scale`, "none" for dr_grpo, TRL's
    default for a user's estimator (the adapter replaces TRL's advantages with the recipe's)."""
    g = cfg.grpo
    if g.advantage_estimator == "dr_grpo":
        return "none"
    return g.advantage_estimator_args.get("scale", "group") if g.advantage_estimator == "grpo" else "group"


def _trl_ratio_level(cfg: RunConfig) -> str:
    """TRL's `importance_sampling_level`: "sequence" for GSPO's and LUSPO's sequence ratio, else "token"."""
    return "sequence" if cfg.grpo.policy_loss in ("gspo", "luspo") else "token"


def _trl_value(args: Any, name: str) -> Any:
    if name == "epsilon_high" and args.epsilon_high is None:  # TRL: None = epsilon
        return args.epsilon
    if name == "loss_type" and args.loss_type == "bnpo":  # token mean over the local batch
        return "dapo"
    return getattr(args, name)


def check_shared_settings(cfg: RunConfig, args: Any) -> None:
    """Raise ConfigError naming both keys when a GRPOConfig field disagrees with regroup's config."""
    for name, key, want in SHARED_SETTINGS:
        if name.startswith("vllm_importance_sampling") and not getattr(args, "use_vllm", False):
            continue  # TRL's own generation is the learner: TRL reads no IS setting
        if name in _IS_FIELDS and not cfg.rollout.tis_cap > 0:
            continue  # the correction is off on both sides (checked just before): its bounds change nothing
        got, need = _trl_value(args, name), want(cfg)
        if name == "use_bias_correction_kl" and cfg.grpo.beta == 0:
            continue  # no KL term: TRL's default (True) changes nothing
        if name == "loss_type" and args.loss_type not in LOSS_AGG:
            raise ConfigError(
                f"GRPOConfig.loss_type={args.loss_type!r}: the adapter computes the recipe's loss "
                f"(grpo.loss_agg), which TRL's {sorted(LOSS_AGG)} normalise"
            )
        if got != need:
            raise ConfigError(
                f"GRPOConfig.{name}={got!r} disagrees with {key} (TRL needs {need!r}): TRL samples and "
                f"the recipe trains with one setting; regroup.integrations.trl.grpo_args(cfg, ...) sets it"
            )


def check_adapter_settings(args: Any) -> None:
    """Raise ConfigError when a GRPOConfig field the adapter needs at one value (`ADAPTER_SETTINGS`) differs."""
    for name, need, why in ADAPTER_SETTINGS:
        got = getattr(args, name)
        if got != need:
            raise ConfigError(f"GRPOConfig.{name}={got!r}: {why}; use {need!r} (grpo_args sets it)")


def grpo_args(cfg: RunConfig, **trl_only: Any) -> Any:
    """TRL's `GRPOConfig` with every field the adapter depends on set explicitly, never left to TRL's
    defaults: those regroup's config decides from `cfg` (`SHARED_SETTINGS`), those the adapter needs at one
    value (`ADAPTER_SETTINGS`); the rest (output_dir, batch sizes, steps, logging, vLLM, ...) from `trl_only`."""
    check_trl_version()
    from trl import GRPOConfig  # optional (trl): the TRL front-end only

    pinned = {name: value for name, value, _ in ADAPTER_SETTINGS}
    shared = {name: want(cfg) for name, _, want in SHARED_SETTINGS}
    return GRPOConfig(**{**pinned, **shared, **trl_only})


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: the string, or the content of its last (assistant) message."""
    if isinstance(completion, str):
        return completion
    if completion and isinstance(completion, list):
        return str(completion[-1].get("content", ""))
    return ""


def problem_rows(
    problems: list, variants: list[list[str]] | None, messages: Any, n_variants: int
) -> tuple[list[dict], int]:
    """TRL's dataset rows of regroup problems, one per prompt TRL samples: q0 and, for TA-GRPO (SPEC §3.1–2),
    each of its `n_variants` rephrasings, consecutive, sharing the question's group id. `messages(text)` is
    the run's prompt (`Prompter.messages`). A question with fewer than `n_variants` variants is left out
    (TRL's pooled sampler needs pools of one size); returns (rows, questions left out)."""
    rows: list[dict] = []
    dropped = 0
    for index, problem in enumerate(problems):
        texts = [problem.question]
        if variants is not None:
            if len(variants[index]) < n_variants:
                dropped += 1
                continue
            texts += list(variants[index])[:n_variants]
        q0 = messages(problem.question)
        for k, text in enumerate(texts):
            rows.append(
                {
                    "prompt": messages(text),
                    GROUP_ID: index,
                    VARIANT: k,
                    QUESTION_ID: problem.id,
                    QUESTION: text,
                    Q0_PROMPT: q0,
                }
            )
    return rows, dropped


class PooledRepeatSampler(Sampler[int]):
    """TRL's `RepeatSampler` over whole TA pools: shuffles questions, not rows, so that a question's
    `pool_size` consecutive rows (q0..qN) always fall in the same chunk of `batch_size` unique rows, i.e.
    the same generation batch. Yields each row `mini_repeat_count` times (TRL's G), each chunk
    `repeat_count` times (TRL's num_iterations × steps_per_generation), and drops a final partial chunk.
    """

    def __init__(
        self,
        num_rows: int,
        pool_size: int,
        mini_repeat_count: int,
        batch_size: int,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> None:
        if pool_size < 1 or num_rows % pool_size != 0:
            raise ValueError(f"num_rows ({num_rows}) must be a multiple of pool_size ({pool_size})")
        if batch_size % pool_size != 0:
            raise ValueError(
                f"the unique prompts per generation batch ({batch_size}) must be a multiple of the pool size "
                f"N+1 = {pool_size}, so that a question and all its variants are generated together"
            )
        self.num_rows, self.pool_size, self.batch_size = num_rows, pool_size, batch_size
        self.mini_repeat_count, self.repeat_count, self.shuffle = mini_repeat_count, repeat_count, shuffle
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        num_questions = self.num_rows // self.pool_size
        if self.shuffle:
            order = torch.randperm(num_questions, generator=self.generator).tolist()
        else:
            order = list(range(num_questions))
        rows = [q * self.pool_size + k for q in order for k in range(self.pool_size)]
        for start in range(0, len(rows) - self.batch_size + 1, self.batch_size):
            chunk = rows[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return (self.num_rows // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count


def loss_totals(
    loss_type: str,
    *,
    loss_mask: Tensor,
    num_items_in_batch: float,
    num_processes: int,
    grad_accum: int,
    steps_per_generation: int,
    max_completion_length: int,
) -> tuple[str, dict[str, Any]]:
    """regroup aggregation mode + whole-batch totals that reproduce TRL 1.16's normaliser for `loss_type`.

    TRL (`_compute_loss`) divides one micro-batch [B, T] by: dapo — `max(num_items, 1) / num_processes ·
    grad_accum / steps_per_generation` tokens; bnpo — its own loss tokens · grad_accum; grpo — `B ·
    grad_accum` sequences (token mean per sequence first); dr_grpo — `B · grad_accum · max_completion_length`.
    Returns `(agg, totals)` for `regroup.algo.losses.policy_loss(..., agg=agg, **totals)`.
    """
    if loss_type not in LOSS_AGG:
        raise ValueError(
            f"loss_type {loss_type!r} is not supported by the regroup adapter; use one of {sorted(LOSS_AGG)}"
        )
    batch = int(loss_mask.shape[0])
    if loss_type == "dapo":
        total_tokens = max(float(num_items_in_batch), 1.0) / num_processes * grad_accum / steps_per_generation
    elif loss_type == "bnpo":
        total_tokens = max(float(loss_mask.sum()), 1.0) * grad_accum
    else:  # unused by the sequence modes; any valid value
        total_tokens = float(loss_mask.sum())
    totals = dict(
        total_tokens=total_tokens,
        total_sequences=max(batch * grad_accum, 1),
        max_completion_length=max_completion_length,
    )
    return LOSS_AGG[loss_type], totals


def pad_right(t: Tensor, width: int, value: float) -> Tensor:
    """`t` [B, T, ...] right-padded with `value` to [B, width, ...]."""
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    filler = torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, filler], dim=1)

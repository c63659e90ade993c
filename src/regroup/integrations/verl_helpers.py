"""Pure helpers of the verl plug-in (torch only, no verl): the verl settings regroup's config decides, the
names of the fields the plug-in adds to verl's batch, the dataset rows built from regroup's problems, and
the loss of one verl micro-batch computed by regroup's `policy_loss`. Tested without verl;
`regroup.integrations.verl` uses them, and so does the equality test on a batch captured inside verl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from regroup.algo.loss_inputs import Mean, build_loss_inputs
from regroup.algo.loss_spec import LossSpec
from regroup.algo.losses import LossTotals, policy_loss
from regroup.config.schema import RunConfig
from regroup.errors import ConfigError
from regroup.stages.groups import samples_per_question
from regroup.train.recipes import features

# Per-sample fields the plug-in writes into verl's batch (TransferQueue) after the recipe's stages; each is
# one value per response, so verl's micro-batching carries them to the loss.
ADVANTAGE, WEIGHT, IS_ANCHOR, SCORE, GROUP, VARIANT, REWARD = (
    "regroup_advantage",
    "regroup_weight",
    "regroup_is_anchor",
    "regroup_score",
    "regroup_group",
    "regroup_variant",
    "regroup_reward",
)
# Keys of a dataset row's `extra_info` the plug-in reads (written by `problem_rows`).
QUESTION_ID, PROMPTS = "regroup_question_id", "regroup_prompts"

# verl's loss aggregation for each regroup aggregation mode (the normalisers agree: `verl_totals`).
VERL_AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean", "seq_sum_constant": None}


def _want_n(cfg: RunConfig) -> int:
    return samples_per_question(
        cfg.grpo.num_generations, cfg.grpo.samples_multiplier, features(cfg).n_variants if features(cfg).variants else 0
    )


# verl config keys whose value regroup's config decides: (verl key, regroup key, the value verl must have).
# verl samples, batches and computes π_old / π_ref with them; the recipe's stages and loss use regroup's keys.
SHARED_SETTINGS: tuple[tuple[str, str, Callable[[RunConfig], Any]], ...] = (
    ("actor_rollout_ref.rollout.n", "grpo.num_generations", _want_n),
    ("data.train_batch_size", "grpo.prompts_per_step", lambda c: c.grpo.prompts_per_step),
    (
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "grpo.mini_batches",
        lambda c: c.grpo.prompts_per_step // c.grpo.mini_batches,
    ),
    ("actor_rollout_ref.actor.ppo_epochs", "grpo.num_iterations", lambda c: c.grpo.num_iterations),
    ("data.max_response_length", "rollout.max_new_tokens", lambda c: c.rollout.max_new_tokens),
    ("actor_rollout_ref.rollout.temperature", "rollout.temperature", lambda c: c.rollout.temperature),
    ("actor_rollout_ref.rollout.top_p", "rollout.top_p", lambda c: c.rollout.top_p),
    # verl computes the reference's log-probs only for its KL loss; regroup's loss reads them when β > 0
    ("actor_rollout_ref.actor.use_kl_loss", "grpo.beta", lambda c: c.grpo.beta > 0),
    # verl's optimizer steps; its warm-up and schedule keys are verl's own (docs/verl.md)
    ("actor_rollout_ref.actor.optim.lr", "optim.lr", lambda c: c.optim.lr),
    ("actor_rollout_ref.actor.optim.weight_decay", "optim.weight_decay", lambda c: c.optim.weight_decay),
    ("actor_rollout_ref.actor.optim.clip_grad", "optim.max_grad_norm", lambda c: c.optim.max_grad_norm),
)


def check_shared_settings(cfg: RunConfig, get: Callable[[str], Any]) -> None:
    """Raise ConfigError naming both keys when a verl setting disagrees with regroup's config, and refuse what
    the plug-in cannot run. `get(dotted_key)` reads verl's config (None when absent)."""
    if cfg.grpo.prompts_per_step % cfg.grpo.mini_batches:
        raise ConfigError(
            f"grpo.mini_batches={cfg.grpo.mini_batches} must divide grpo.prompts_per_step={cfg.grpo.prompts_per_step} "
            "(verl's ppo_mini_batch_size counts questions)"
        )
    if features(cfg).variants and cfg.grpo.samples_multiplier != 1:
        raise ConfigError("grpo.samples_multiplier with ta.enabled: verl samples every question rollout.n times")
    for key, regroup_key, want in SHARED_SETTINGS:
        got, need = get(key), want(cfg)
        if isinstance(need, float) and isinstance(got, int | float):
            same = math.isclose(float(got), need)
        else:
            same = got == need
        if not same:
            raise ConfigError(
                f"{key}={got!r} disagrees with {regroup_key} (verl needs {need!r}): verl samples and the recipe "
                f"trains with one setting; regroup.integrations.verl.verl_overrides(cfg) lists them"
            )
    correction = get("algorithm.rollout_correction") or {}
    if any(correction.get(k) for k in ("rollout_is", "rollout_rs", "bypass_mode")):
        raise ConfigError(
            "algorithm.rollout_correction: the loss is the recipe's, whose sampler IS correction is "
            "rollout.tis_cap / rollout.is_mode; set algorithm.rollout_correction.rollout_is=null, rollout_rs=null "
            "and bypass_mode=false"
        )
    if get("algorithm.use_kl_in_reward"):
        raise ConfigError("algorithm.use_kl_in_reward: the recipe's KL is grpo.beta (in the loss); set it false")
    if cfg.grpo.off_policy_mask_threshold is not None:  # verl's rollout log-probs are unchecked against OPSM
        raise ConfigError("grpo.off_policy_mask_threshold is not supported by the verl plug-in yet; leave it unset")


def verl_overrides(cfg: RunConfig) -> list[str]:
    """verl's Hydra overrides for the settings regroup's config decides (`SHARED_SETTINGS`)."""
    out = []
    for key, _, want in SHARED_SETTINGS:
        value = want(cfg)
        out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


REWARD_FILE = Path(__file__).with_name("verl_reward.py")
"""regroup's reward function for verl (`compute_score`): the task's grade."""
REWARD_TASK = "regroup_task"
"""The keyword `verl_reward.compute_score` reads the task from (verl's `reward_kwargs`)."""


def reward_function_settings(cfg: RunConfig, given: dict | None, reward_file: Path = REWARD_FILE) -> dict:
    """verl's `reward.custom_reward_function` for a regroup run, from what verl's config `given` holds.

    None given (no `path`): regroup's `reward_file` (`compute_score`). When the function is regroup's, the
    recipe's task (`data.task`) reaches it through `reward_kwargs.regroup_task`, which verl passes to every
    call: the config names the task, never the dataset's rows. A user's own reward function is left as given.
    A `regroup_task` that disagrees with `data.task` is refused in one line."""
    section = dict(given or {})
    path = section.get("path")
    if path and Path(str(path)).resolve() != Path(reward_file).resolve():
        return section
    if not path:
        section.update(path=str(reward_file), name="compute_score")
    kwargs = dict(section.get("reward_kwargs") or {})
    named = kwargs.get(REWARD_TASK)
    if named is not None and named != cfg.data.task:
        raise ConfigError(
            f"reward.custom_reward_function.reward_kwargs.{REWARD_TASK}={named!r} disagrees with data.task="
            f"{cfg.data.task!r}: verl's reward and the recipe grade with one task; drop the verl setting"
        )
    kwargs[REWARD_TASK] = cfg.data.task
    section["reward_kwargs"] = kwargs
    return section


def problem_rows(problems: list, variants: list[list[str]] | None, messages: Callable[[str], Any], n_variants: int):
    """verl's RL dataset rows of regroup problems, one per question (verl samples it `rollout.n` times): the
    `prompt` is q0's, and `extra_info` carries the question id and, for TA-GRPO, the prompts of q0 and its
    `n_variants` rephrasings (the plug-in's agent loop samples G of each). A question with fewer variants is
    left out. Returns (rows, questions left out)."""
    rows: list[dict] = []
    dropped = 0
    for index, problem in enumerate(problems):
        texts = [problem.question]
        if variants is not None:
            if len(variants[index]) < n_variants:
                dropped += 1
                continue
            texts += list(variants[index])[:n_variants]
        rows.append(
            {
                "data_source": "regroup",
                "prompt": messages(problem.question),
                "ability": "regroup",
                "reward_model": {"style": "rule", "ground_truth": problem.answer},
                "extra_info": {
                    "index": index,
                    QUESTION_ID: problem.id,
                    PROMPTS: [messages(t) for t in texts],
                },
            }
        )
    return rows, dropped


def variant_of(session_id: int, n: int, n_prompts: int) -> int:
    """Which prompt (0 = q0, k = the k-th rephrasing) the `session_id`-th of a row's `n` samples answers: G
    consecutive samples per prompt, G = n / n_prompts."""
    return int(session_id) // (n // n_prompts)


def verl_totals(spec: LossSpec, *, dp_size: int, batch_num_tokens: float, global_batch_size: int, max_len: int):
    """regroup's whole-batch totals that give verl's normaliser (`core_algos.agg_loss` with its global batch
    info): verl divides a micro-batch's sum by the mini-batch's tokens (or sequences) and multiplies by the
    data-parallel size, since FSDP averages the ranks' gradients; so the per-rank totals are the global ones
    over `dp_size`. Dr. GRPO's constant (`seq_sum_constant`) is `max_len`, the longest response."""
    return LossTotals(
        total_tokens=float(batch_num_tokens) / dp_size,
        total_sequences=max(int(round(global_batch_size / dp_size)), 1),
        max_completion_length=max_len,
    )


def micro_batch_loss(
    spec: LossSpec,
    logps: Tensor,
    fields: dict[str, Tensor],
    *,
    dp_size: int,
    batch_num_tokens: float,
    global_batch_size: int,
    max_len: int,
    entropy: Tensor | None = None,
    sampler_on_prompt: bool = True,
) -> tuple[Tensor, dict[str, Mean]]:
    """The recipe's loss of one verl micro-batch: `policy_loss` on verl's padded tensors.

    - `logps` [b, T]: π_θ on the response tokens (verl's `no_padding_2_padding` of the model output);
    - `fields`: verl's `response_mask` [b, T] and `old_log_probs` [b, T], the plug-in's `ADVANTAGE` [b],
      `WEIGHT` [b], `IS_ANCHOR` [b], and when present `ref_log_prob` [b, T] and `rollout_log_probs` [b, T];
    - `sampler_on_prompt`: the rollout drew each response on the prompt the learner scores (False for
      TA-GRPO's ratios on q0, where a rephrasing's rollout log-probs belong to another prompt).
    """
    mask = fields["response_mask"].to(logps.dtype)  # [b, T]
    is_anchor = fields[IS_ANCHOR].bool()  # [b]
    sampled = ~is_anchor[:, None].expand_as(mask)  # [b, T] False on an anchor's (forced) tokens
    variant = fields.get(VARIANT)
    rows = None if sampler_on_prompt or variant is None else variant.eq(0) & ~is_anchor  # [b]
    old, inputs = build_loss_inputs(  # the native trainer's own builder, on the tensors verl hands over
        spec,
        logps,
        fields[ADVANTAGE].to(logps.dtype),
        mask,
        old_logps=fields["old_log_probs"].to(logps.dtype),
        sampler_logps=fields.get("rollout_log_probs"),
        sampler_rows=rows,
        sampled_mask=sampled,
        ref_logps=None if fields.get("ref_log_prob") is None else fields["ref_log_prob"].to(logps.dtype),
        sample_weight=fields[WEIGHT].to(logps.dtype),
        entropy=entropy,
    )
    totals = verl_totals(
        spec, dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size, max_len=max_len
    )
    return policy_loss(logps, old, inputs, spec, totals)

"""TRL adapter: regroup's DaGRPO masks and anchors and TA-GRPO pooling inside TRL's `GRPOTrainer`.

For users who keep TRL's stack (vLLM, DeepSpeed, PEFT). Written against trl 1.16.0 / transformers 5.24;
it hooks four `GRPOTrainer` methods and leaves the rest of TRL's machinery alone:

- `_generate`: remembers the completions; for TA-GRPO with `ratio_anchor="original"` it hands back the
  q0 prompt ids, so old / ref / current log-probs are all computed on `(q0, o)` (SPEC §3.4).
- `_calculate_rewards`: remembers the gathered rewards.
- `_generate_and_score_completions`: after TRL has built the batch, injects anchors (SPEC §2b), recomputes
  the advantages with `regroup.algo.advantages.group_advantages` over explicit group ids (pooled TA
  groups, SPEC §3.2–3), and applies the distinctiveness mask (SPEC §2a). Train mode only.
- `_compute_loss`: `regroup.algo.losses.policy_loss` with TRL's normalisation for `loss_type`
  dapo / grpo / dr_grpo / bnpo (shaped loss on anchor tokens, sample weights for masks).

TA-GRPO expands every dataset row into N+1 rows (q0, q1..qN) that TRL samples as ordinary prompts, and
a sampler keeps each question's N+1 rows in the same generation batch. See docs/trl_adapter.md.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from torch import Tensor, nn
from torch.utils.data import Sampler
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.trainer.utils import is_async_callable, use_adapter

from regroup.algo.advantages import group_reward_stats
from regroup.algo.losses import ANCHOR_RATIOS, LossInputs, LossSpec, LossTotals, policy_loss
from regroup.batch import Sample
from regroup.stages.advantages import GroupAdvantages
from regroup.stages.anchors import is_verified
from regroup.stages.base import StepBatch, StepContext
from regroup.stages.masking import DistinctivenessMasker
from regroup.integrations.trl_helpers import (  # noqa: F401  (re-exported)
    ANCHOR_MASK, ANCHOR_MODES, ANCHOR_WHEN, GROUP_ID, IS_ANCHOR, LOSS_AGG, Q0_PROMPT, RATIO_ANCHORS, SAMPLE_WEIGHT, VARIANT,
    PooledRepeatSampler, _pad_right, anchor_slots, completion_text, expand_variants, loss_totals,
    prompt_question,
)
from regroup.scorers import Scorer, build_scorer

__all__ = [
    "ANCHOR_MASK",
    "GROUP_ID",
    "IS_ANCHOR",
    "Q0_PROMPT",
    "SAMPLE_WEIGHT",
    "VARIANT",
    "PooledRepeatSampler",
    "RegroupGRPOTrainer",
    "RegroupTRLConfig",
    "anchor_slots",
    "expand_variants",
    "loss_totals",
]

# Multimodal / model-specific forward inputs TRL passes through to `_get_per_token_logps_and_entropies`.
_FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


@dataclass
class RegroupTRLConfig:
    """Which regroup pieces `RegroupGRPOTrainer` switches on; all off = TRL's GRPO through regroup's loss."""

    # --- DaGRPO sequence-level gradient rectification (SPEC §2a) ---
    distinctiveness: bool = False
    """Multiply each advantage by the distinctiveness mask λ (the normaliser is not reduced)."""
    scorer: str | Scorer = "step"
    """Fine-grained scorer: "step", "judge", "similarity", "pkg.mod:obj", or a ready `Scorer` instance."""
    scorer_kwargs: dict[str, Any] = field(default_factory=dict)
    """Settings passed to `regroup.scorers.build_scorer` (ignored for a ready instance)."""
    delta: float = 3.0
    """Margin δ on the 1–10 score scale (paper: 3)."""
    problem_fn: Callable[[Mapping[str, Any]], Any] | None = None
    """Builds `ScoreItem.problem` from a dataset row (the `step` scorer needs it); None = no problem."""

    # --- DaGRPO off-policy anchors (SPEC §2b) ---
    anchors: bool = False
    """Replace one on-policy completion per group with the row's reference solution."""
    reference_column: str = "solution"
    """Dataset column holding the reference solution text (rows without one get no anchor)."""
    anchor_mode: str = "replace"
    """Only "replace": the anchor takes the slot of one of the G sampled completions."""
    anchor_when: str = "always"
    """"always", or "no_correct": only in groups where no sampled completion is correct."""
    anchor_ratio: str = "shaped"
    """Anchor-token objective: "shaped" (−A·p/(p+γ), LUFFY) or "plain" (π_old := stop_grad π_θ)."""
    shaping_gamma: float = 0.1
    """γ of the policy-shaping function."""
    correct_reward: float = 1.0
    """A reward >= this counts as correct: the reference must reach it to be used, and it defines
    "no correct sample" for `anchor_when="no_correct"`."""
    anchor_suffix_ids: list[int] | None = None
    """Token ids appended to the reference's tokens (what ends a generated turn); None = [eos_token_id]."""

    # --- TA-GRPO pooling (SPEC §3) ---
    ta_pooling: bool = False
    """Sample G completions for q0 and for every variant, one advantage group of (N+1)·G per question."""
    variants_column: str = "variants"
    """Dataset column with the N rephrased questions (strings, or full prompts in the prompt's format)."""
    num_variants: int | None = None
    """N; None = the number every row has (they must agree). Extra variants are cut, missing ones raise."""
    ratio_anchor: str = "original"
    """"original": every log-prob (old, current, ref) on (q0, o); "own": on the variant's own prompt."""

    # --- shared ---
    adv_eps: float = 1e-4
    """eps of the advantage std division (TRL hard-codes 1e-4)."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting that is out of range."""
        if self.anchor_mode not in ANCHOR_MODES:
            raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {self.anchor_mode!r}")
        if self.anchor_when not in ANCHOR_WHEN:
            raise ValueError(f"anchor_when must be one of {ANCHOR_WHEN}, got {self.anchor_when!r}")
        if self.anchor_ratio not in ANCHOR_RATIOS:
            raise ValueError(f"anchor_ratio must be one of {ANCHOR_RATIOS}, got {self.anchor_ratio!r}")
        if self.ratio_anchor not in RATIO_ANCHORS:
            raise ValueError(f"ratio_anchor must be one of {RATIO_ANCHORS}, got {self.ratio_anchor!r}")
        if not self.delta >= 0:
            raise ValueError(f"delta must be >= 0, got {self.delta}")
        if not self.shaping_gamma > 0:
            raise ValueError(f"shaping_gamma must be > 0, got {self.shaping_gamma}")
        if not self.adv_eps >= 0:
            raise ValueError(f"adv_eps must be >= 0, got {self.adv_eps}")
        if self.num_variants is not None and self.num_variants < 1:
            raise ValueError(f"num_variants must be >= 1 (or None), got {self.num_variants}")
        if not isinstance(self.scorer, str) and not callable(getattr(self.scorer, "score_batch", None)):
            raise ValueError(f"scorer must be a name or an object with score_batch(items), got {self.scorer!r}")
        if self.distinctiveness and self.scorer == "step" and self.problem_fn is None:
            raise ValueError(
                "the 'step' scorer checks a response against the task's Problem: set problem_fn "
                "(dataset row -> Problem), or choose another scorer"
            )


# ----------------------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------------------


class RegroupGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with regroup's DaGRPO masks / anchors and TA-GRPO pooling, each switchable.

    Takes every `GRPOTrainer` argument plus `regroup: RegroupTRLConfig`. With TA pooling the train
    dataset is expanded by `expand_variants` and sampled by `PooledRepeatSampler`; this needs
    `generation_batch_size / num_generations` (unique prompts per generation batch) to be a multiple of
    N+1. Supported TRL settings: `loss_type` in dapo / grpo / dr_grpo / bnpo, token-level importance
    sampling, `multi_objective_aggregation="sum_then_normalize"`; entropy bonus, `top_entropy_quantile`,
    `off_policy_mask_threshold` and two-sided clipping (`delta`) are refused. After each generation,
    `regroup_last_batch` holds the global tensors used (rewards, group ids, advantages, scores, masks).
    """

    def __init__(self, *args: Any, regroup: RegroupTRLConfig | None = None, **kwargs: Any) -> None:
        cfg = regroup if regroup is not None else RegroupTRLConfig()
        if not isinstance(cfg, RegroupTRLConfig):
            raise TypeError(f"regroup must be a RegroupTRLConfig, got {type(cfg).__name__}")
        cfg.validate()
        self.regroup = cfg
        self.regroup_num_variants = 0
        self.regroup_last_batch: dict[str, Tensor] = {}
        self._regroup_inputs: list[dict[str, Any]] | None = None
        self._regroup_completions: list[Any] | None = None
        self._regroup_rewards_per_func: Tensor | None = None
        self._regroup_anchor_cache: dict[tuple[str, str], float | None] = {}
        self._regroup_masker: DistinctivenessMasker | None = None
        if cfg.distinctiveness:
            scorer = build_scorer(cfg.scorer, **cfg.scorer_kwargs) if isinstance(cfg.scorer, str) else cfg.scorer
            self._regroup_masker = DistinctivenessMasker(scorer, cfg.delta)

        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs)
        if cfg.ta_pooling:
            dataset = bound.arguments.get("train_dataset")
            if dataset is None:
                raise ValueError("TA pooling needs a train_dataset with a 'variants' column")
            expanded, n = expand_variants(dataset, cfg.variants_column, cfg.num_variants)
            bound.arguments["train_dataset"] = expanded
            self.regroup_num_variants = n
        super().__init__(*bound.args[1:], **bound.kwargs)
        self._regroup_check_settings()

    # --- set-up checks -------------------------------------------------------------------------------------

    def _regroup_check_settings(self) -> None:
        """Refuse TRL settings the adapter does not implement, naming the setting and the way out."""
        cfg, args = self.regroup, self.args
        if self.loss_type not in LOSS_AGG:
            raise ValueError(
                f"RegroupGRPOTrainer computes the loss with regroup's policy_loss, which matches TRL's loss_type "
                f"{sorted(LOSS_AGG)}; got loss_type={self.loss_type!r}"
            )
        refused = {
            "delta (two-sided clipping)": (args.delta is not None, "None"),
            "top_entropy_quantile": (self.top_entropy_quantile != 1.0, "1.0"),
            "off_policy_mask_threshold": (self.off_policy_mask_threshold is not None, "None"),
            "entropy_coef / use_adaptive_entropy": (bool(getattr(self, "_entropy_bonus_enabled", False)), "0 / False"),
            "multi_objective_aggregation": (
                self.multi_objective_aggregation != "sum_then_normalize", "'sum_then_normalize'"
            ),
        }
        for name, (bad, ok) in refused.items():
            if bad:
                raise ValueError(f"RegroupGRPOTrainer does not support {name} other than {ok}")
        if cfg.anchors:
            if any(isinstance(f, nn.Module) for f in self.reward_funcs):
                raise ValueError(
                    "anchors are verified with the reward functions, which must be callables (a verifier); "
                    "reward models (nn.Module) are not supported for anchor verification"
                )
            if self.environment_factories is not None or self.tools:
                raise ValueError("anchors are not supported together with tools / environments")
        if cfg.ta_pooling:
            pool = self.regroup_num_variants + 1
            unique = args.generation_batch_size // self.num_generations
            if unique % pool != 0:
                raise ValueError(
                    f"TA pooling needs the unique prompts per generation batch, generation_batch_size / "
                    f"num_generations = {args.generation_batch_size} / {self.num_generations} = {unique}, to be a "
                    f"multiple of N+1 = {pool} (q0 and its {pool - 1} variants are generated together); e.g. set "
                    f"per_device_train_batch_size × num_processes × steps_per_generation = "
                    f"{pool * self.num_generations}·k"
                )
            if cfg.ratio_anchor == "original" and self.use_vllm and self.vllm_importance_sampling_correction:
                raise ValueError(
                    "TA pooling with ratio_anchor='original' computes π_old on (q0, o) while vLLM sampled o from the "
                    "variant's prompt, so TRL's vLLM importance-sampling correction would compare different "
                    "distributions; set vllm_importance_sampling_correction=False or ratio_anchor='own'"
                )
            if self.environment_factories is not None or self.rollout_func is not None:
                raise ValueError("TA pooling is not supported together with environments or a rollout_func")

    def _set_signature_columns_if_needed(self) -> None:
        # With remove_unused_columns=True, TRL would drop the columns the adapter reads.
        super()._set_signature_columns_if_needed()
        extra = [GROUP_ID, VARIANT, Q0_PROMPT, self.regroup.reference_column]
        self._signature_columns = list(dict.fromkeys(list(self._signature_columns) + extra))

    def _get_train_sampler(self, dataset: Any = None) -> Sampler:
        if not self.regroup.ta_pooling:
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        return PooledRepeatSampler(
            num_rows=len(dataset),
            pool_size=self.regroup_num_variants + 1,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    # --- hooks into TRL's generation --------------------------------------------------------------------

    def _generate(self, prompts: list) -> Any:
        result = super()._generate(prompts)
        prompt_ids, completion_ids, tool_mask, completions, *rest = result
        self._regroup_completions = list(completions)
        rows = self._regroup_inputs
        swap = (
            self.regroup.ta_pooling
            and self.regroup.ratio_anchor == "original"
            and self.model.training
            and rows is not None
            and len(rows) == len(prompt_ids)
            and all(Q0_PROMPT in r for r in rows)
        )
        if swap:
            # SPEC §3.4: the response was sampled from q_n, but every log-prob is taken on (q0, o).
            q0_ids, _, _ = self._tokenize_prompts([r[Q0_PROMPT] for r in rows])
            prompt_ids = [list(ids) for ids in q0_ids]
        return (prompt_ids, completion_ids, tool_mask, completions, *rest)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._regroup_rewards_per_func = rewards_per_func  # [B_global, F]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._regroup_inputs = inputs
        self._regroup_rewards_per_func = None
        try:
            out = super()._generate_and_score_completions(inputs)
            if self.model.training:
                out = self._regroup_postprocess(inputs, out)
        finally:
            self._regroup_inputs = None
        return out

    # --- the regroup stages on TRL's batch ----------------------------------------------------------------

    def _regroup_groups(self, inputs: list[dict[str, Any]], total: int) -> tuple[Tensor, Tensor]:
        """Global group ids and variant ids [B]: the pooled TA groups, else TRL's G consecutive samples."""
        device = self.accelerator.device
        G = self.num_generations
        if not self.regroup.ta_pooling:
            if total % G != 0:
                raise RuntimeError(f"batch of {total} samples is not a whole number of groups of {G}")
            return torch.arange(total, device=device) // G, torch.zeros(total, dtype=torch.long, device=device)
        missing = [k for k in (GROUP_ID, VARIANT) if k not in inputs[0]]
        if missing:
            raise RuntimeError(f"TA pooling: batch rows lack the columns {missing} the dataset expansion adds")
        gids = torch.tensor(gather_object([int(r[GROUP_ID]) for r in inputs]), device=device)
        variants = torch.tensor(gather_object([int(r[VARIANT]) for r in inputs]), device=device)
        if gids.numel() != total:
            raise RuntimeError(f"TA pooling: {gids.numel()} group ids for {total} rewards")
        pool = (self.regroup_num_variants + 1) * G
        _, counts = torch.unique(gids, return_counts=True)
        if bool((counts != pool).any()):
            raise RuntimeError(
                f"TA pooling: a generation batch holds a question with {int(counts[counts != pool][0])} samples "
                f"instead of (N+1)·G = {pool}; the pooled sampler was bypassed (custom sampler or iterable data?)"
            )
        return gids, variants

    def _regroup_postprocess(self, inputs: list[dict[str, Any]], out: dict[str, Any]) -> dict[str, Any]:
        """Anchors, pooled advantages and distinctiveness masks on TRL's generation batch (train mode)."""
        cfg = self.regroup
        mode = "train"
        device = out["advantages"].device
        rpf = self._regroup_rewards_per_func
        if rpf is None:
            raise RuntimeError("internal: TRL did not call _calculate_rewards before computing advantages")
        # The reward TRL normalises (sum_then_normalize): weighted nansum, NaN where no function scored.
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)  # [B]
        rewards[torch.isnan(rpf).all(dim=1)] = torch.nan
        rewards = rewards.to(device)
        total, local_n = rewards.numel(), len(inputs)
        start = self.accelerator.process_index * local_n
        local = slice(start, start + local_n)
        group_ids, variants = self._regroup_groups(inputs, total)

        is_anchor = torch.zeros(total, dtype=torch.bool, device=device)  # [B]
        if cfg.anchors:
            rewards, is_anchor = self._regroup_anchors(inputs, out, rewards, group_ids, variants, local)

        # The same stages as the native trainer, on the global batch (TRL has already gathered it).
        step = StepBatch(step=int(self.state.global_step), samples=[
            Sample(group_id=int(g), question_id=str(int(g)), variant=int(v), is_anchor=bool(a), prompt_ids=[],
                   ratio_prompt_ids=[], response_ids=[], response_text="", reward=None if math.isnan(r) else r)
            for g, v, a, r in zip(group_ids.tolist(), variants.tolist(), is_anchor.tolist(), rewards.tolist())])
        whole = StepContext(seed=self.args.seed, num_generations=self.num_generations)  # one "process": the global batch
        GroupAdvantages(self.scale_rewards, cfg.adv_eps)(step, whole)
        raw_adv = step.advantages.to(device=device, dtype=out["advantages"].dtype)  # [B]
        weight = torch.ones(total, dtype=raw_adv.dtype, device=device)  # [B]
        scores = None
        if cfg.distinctiveness:
            scores = self._regroup_scores(inputs, out, is_anchor[local])  # [B]
            keep, mask_metrics = self._regroup_masker.mask_from_scores(raw_adv.cpu(), scores.cpu(), group_ids.cpu())
            weight = keep.to(device=device, dtype=raw_adv.dtype)
            for key, value in mask_metrics.items():
                self._metrics[mode][f"regroup/{key}"].append(value)
            out[SAMPLE_WEIGHT] = weight[local]
        # SPEC §2a.4: a masked sample's advantage is 0; the loss normaliser is not reduced.
        advantages = raw_adv * weight  # [B]
        out["advantages"] = advantages[local].to(out["advantages"].dtype)
        logged = self._logs.get("advantages")
        if logged is not None and len(logged) >= total:
            # TRL's completions table got its own (per-prompt) advantages for this batch; show ours instead.
            for _ in range(total):
                logged.pop()
            logged.extend(advantages.tolist())

        stats = group_reward_stats(rewards, group_ids, correct_value=cfg.correct_reward)
        for key in ("frac_all_equal", "frac_all_correct", "frac_all_wrong"):
            self._metrics[mode][f"regroup/groups/{key}"].append(stats[key])
        self.regroup_last_batch = {
            "rewards": rewards.detach().clone(),
            "group_ids": group_ids,
            "variants": variants,
            "is_anchor": is_anchor,
            "raw_advantages": raw_adv,
            "weight": weight,
            "advantages": advantages,
        }
        if scores is not None:
            self.regroup_last_batch["scores"] = scores
        return out

    def _regroup_anchors(
        self,
        inputs: list[dict[str, Any]],
        out: dict[str, Any],
        rewards: Tensor,
        group_ids: Tensor,
        variants: Tensor,
        local: slice,
    ) -> tuple[Tensor, Tensor]:
        """Replace each group's anchor slot by the verified reference (SPEC §2b); returns (rewards, is_anchor) [B]."""
        cfg, device = self.regroup, rewards.device
        slots = anchor_slots(group_ids, variants, rewards, when=cfg.anchor_when, correct_reward=cfg.correct_reward)
        local_slots = slots[local].nonzero().flatten().tolist()
        anchor_reward = torch.full((len(inputs),), torch.nan, device=device)  # [L] NaN = no anchor here
        skipped: Counter[str] = Counter()
        replaced: list[tuple[int, list[int]]] = []
        for i in local_slots:
            found = self._regroup_anchor_for(inputs[i], skipped)
            if found is not None:
                ids, reward = found
                anchor_reward[i] = reward
                replaced.append((i, ids))
        if replaced:
            self._regroup_insert_anchors(out, replaced)
        # Loss-token count TRL uses for dapo must include the anchor tokens.
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()

        all_anchor_reward = gather(anchor_reward)  # [B]
        is_anchor = ~torch.isnan(all_anchor_reward)  # [B]
        rewards = torch.where(is_anchor, all_anchor_reward, rewards)  # [B]
        is_anchor_local = is_anchor[local]
        out[IS_ANCHOR] = is_anchor_local
        out[ANCHOR_MASK] = out["completion_mask"].bool() & is_anchor_local.unsqueeze(1)  # [L, T]

        counts = torch.tensor(
            [float(slots.sum()), skipped["missing"], skipped["too_long"], skipped["unverified"]], device=device
        )
        counts[1:] = self.accelerator.reduce(counts[1:].contiguous(), reduction="sum")
        num_groups = max(int(torch.unique(group_ids).numel()), 1)
        metrics = self._metrics["train"]
        metrics["regroup/anchor/frac_groups"].append(float(is_anchor.sum()) / num_groups)
        metrics["regroup/anchor/frac_slots"].append(float(counts[0]) / num_groups)
        metrics["regroup/anchor/skipped_missing"].append(float(counts[1]))
        metrics["regroup/anchor/skipped_too_long"].append(float(counts[2]))
        metrics["regroup/anchor/skipped_unverified"].append(float(counts[3]))
        return rewards, is_anchor

    def _regroup_anchor_for(self, row: Mapping[str, Any], skipped: Counter[str]) -> tuple[list[int], float] | None:
        """The reference's completion ids and verified reward for `row`, or None (counted in `skipped`)."""
        cfg = self.regroup
        reference = row.get(cfg.reference_column)
        if not isinstance(reference, str) or not reference.strip():
            skipped["missing"] += 1
            return None
        suffix = cfg.anchor_suffix_ids if cfg.anchor_suffix_ids is not None else [self._tokenizer.eos_token_id]
        ids = list(self._tokenizer(reference, add_special_tokens=False)["input_ids"]) + list(suffix)
        if self.max_completion_length is not None and len(ids) > self.max_completion_length:
            skipped["too_long"] += 1  # a cut reference is not a verified solution
            return None
        key = (repr(row["prompt"]), reference)
        if key not in self._regroup_anchor_cache:
            self._regroup_anchor_cache[key] = self._regroup_verify(row, reference, ids)
        reward = self._regroup_anchor_cache[key]
        if not is_verified(reward, cfg.correct_reward):
            skipped["unverified"] += 1
            return None
        return ids, reward

    def _regroup_verify(self, row: Mapping[str, Any], reference: str, ids: list[int]) -> float | None:
        """The weighted reward TRL's reward functions give `reference` as the answer to the row's prompt."""
        prompt = row["prompt"]
        completion: Any = reference
        if is_conversational({"prompt": prompt}):
            completion = [{"role": "assistant", "content": reference}]
        kwargs: dict[str, Any] = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
        kwargs.update(trainer_state=self.state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        values: list[float] = []
        for func in self.reward_funcs:
            call = dict(prompts=[prompt], completions=[completion], completion_ids=[ids], **kwargs)
            if is_async_callable(func):
                result = asyncio.run_coroutine_threadsafe(func(**call), self.async_loop).result()
            else:
                result = func(**call)
            value = result[0] if result else None
            values.append(math.nan if value is None else float(value))
        v = torch.tensor(values, dtype=torch.float32)
        if bool(torch.isnan(v).all()):
            return None
        return float((v * self.reward_weights.cpu()).nansum())

    def _regroup_insert_anchors(self, out: dict[str, Any], replaced: list[tuple[int, list[int]]]) -> None:
        """Write the anchors' token ids into the local batch, widening [B, T] tensors when needed."""
        width = out["completion_ids"].shape[1]
        need = max(len(ids) for _, ids in replaced)
        if need > width:
            width = need
            if self.pad_to_multiple_of:
                width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
            pads = {
                "completion_ids": self._tokenizer.pad_token_id, "completion_mask": 0, "tool_mask": 1,
                "old_per_token_logps": 0.0, "ref_per_token_logps": 0.0, "sampling_per_token_logps": 0.0,
            }
            for key, value in pads.items():
                if out.get(key) is not None:
                    out[key] = _pad_right(out[key], width, value)
            isr = out.get("importance_sampling_ratio")
            if isr is not None and isr.dim() == 2 and isr.shape[1] > 1:
                out["importance_sampling_ratio"] = _pad_right(isr, width, 1.0)
        rows = torch.tensor([i for i, _ in replaced], device=out["completion_ids"].device)
        for i, ids in replaced:
            n = len(ids)
            out["completion_ids"][i] = self._tokenizer.pad_token_id
            out["completion_ids"][i, :n] = torch.tensor(ids, dtype=out["completion_ids"].dtype)
            out["completion_mask"][i] = 0
            out["completion_mask"][i, :n] = 1
            if out.get("tool_mask") is not None:
                out["tool_mask"][i] = 1
            # π_old / π_sampler are undefined for forced tokens; the loss ignores them there (policy_loss).
            for key in ("old_per_token_logps", "sampling_per_token_logps"):
                if out.get(key) is not None:
                    out[key][i] = 0.0
            if out.get("importance_sampling_ratio") is not None:
                out["importance_sampling_ratio"][i] = 1.0
        if out.get("ref_per_token_logps") is not None:
            # The KL term does apply to anchor tokens, so their reference log-probs must be real.
            input_ids = torch.cat([out["prompt_ids"][rows], out["completion_ids"][rows]], dim=1)
            attention = torch.cat([out["prompt_mask"][rows], out["completion_mask"][rows]], dim=1)
            out["ref_per_token_logps"][rows] = self._regroup_ref_logps(input_ids, attention, width)

    @torch.no_grad()
    def _regroup_ref_logps(self, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
        """Reference-model log-probs [n, T], as TRL computes them (separate ref model, or PEFT base)."""
        batch_size = self.args.per_device_train_batch_size
        if self.ref_model is not None:
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )
            return logps
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )
        return logps

    def _regroup_scores(self, inputs: list[dict[str, Any]], out: dict[str, Any], is_anchor_local: Tensor) -> Tensor:
        """Fine-grained scores [B] (NaN = unscored) of every sample of the global batch (SPEC §2a.1)."""
        cfg = self.regroup
        completions = self._regroup_completions or [""] * len(inputs)
        samples = []
        for i, row in enumerate(inputs):
            reference = row.get(cfg.reference_column)
            reference = reference if isinstance(reference, str) else None
            response = reference if bool(is_anchor_local[i]) and reference else completion_text(completions[i])
            question = prompt_question(row["prompt"])
            problem = cfg.problem_fn(row) if cfg.problem_fn is not None else SimpleNamespace(question=question, solution=reference)
            samples.append(Sample(group_id=0, question_id="", variant=0, is_anchor=bool(is_anchor_local[i]),
                                  prompt_ids=[], ratio_prompt_ids=[], response_ids=[], response_text=response,
                                  problem=problem, question_text=question))
        assert self._regroup_masker is not None
        self._regroup_masker.score(samples)  # the native masker's scoring, on this process's rows
        local = torch.tensor(
            [math.nan if s.score is None else float(s.score) for s in samples], dtype=torch.float32, device=out["advantages"].device
        )
        return gather(local)  # [B]

    # --- the loss --------------------------------------------------------------------------------------------

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """regroup's policy_loss (SPEC §1, §2a.4, §2b.3) with TRL's normalisation for `loss_type`."""
        cfg = self.regroup
        mode = "train" if self.model.training else "eval"
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P+T]
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # [B, P+T]
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # [B, T]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in _FORWARD_KEYS},
        )  # [B, T] x2
        old = inputs.get("old_per_token_logps")
        # Aligned generation (TRL skips π_old): π_old equals π_θ at this point.
        old = logps.detach() if old is None else old  # [B, T]
        is_weight = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            is_weight = inputs["importance_sampling_ratio"].expand_as(logps)  # [B, T]
        training = mode == "train"
        agg, totals = loss_totals(
            self.loss_type,
            loss_mask=mask,
            num_items_in_batch=float(inputs["num_items_in_batch"]),
            num_processes=self.accelerator.num_processes,
            grad_accum=self.current_gradient_accumulation_steps if training else 1,
            steps_per_generation=self.args.steps_per_generation if training else 1,
            max_completion_length=self.max_completion_length or logits_to_keep,
        )
        spec = LossSpec(eps_low=self.epsilon_low, eps_high=self.epsilon_high, beta=self.beta,
                        kl_ratio_correction=bool(self.args.use_bias_correction_kl), agg=agg,
                        ratio_level=self.importance_sampling_level, anchor_ratio=cfg.anchor_ratio,
                        shaping_gamma=cfg.shaping_gamma)
        loss_inputs = LossInputs(advantages=inputs["advantages"], loss_mask=mask, ref_logps=inputs.get("ref_per_token_logps"),
                                 sample_weight=inputs.get(SAMPLE_WEIGHT), anchor_token_mask=inputs.get(ANCHOR_MASK),
                                 is_weight=is_weight)
        loss, m = policy_loss(logps, old, loss_inputs, spec, LossTotals(**totals))
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if training else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._regroup_log_loss_metrics(mode, m, entropies, mask)
        return loss

    def _regroup_log_loss_metrics(self, mode: str, m: dict[str, Tensor], entropies: Tensor, mask: Tensor) -> None:
        """TRL's loss metrics (entropy, clip ratios, kl) plus anchor ones, as global token means."""
        maskf = mask.to(entropies.dtype)
        n_on, n_loss = m["n_onpolicy_tokens"], m["n_loss_tokens"]
        sums = torch.stack([
            m["clip_low_frac"] * n_on,
            m["clip_high_frac"] * n_on,
            m["clip_frac"] * n_on,
            n_on,
            (entropies.detach() * maskf).sum(),
            n_loss,
            m.get("kl_mean", torch.zeros_like(n_loss)) * n_loss,
            m.get("anchor_prob_mean", torch.zeros_like(n_loss)) * m["n_anchor_tokens"],
            m["n_anchor_tokens"],
        ]).float()
        s = self.accelerator.reduce(sums, reduction="sum").tolist()
        on, loss_tokens, anchor_tokens = max(s[3], 1.0), max(s[5], 1.0), s[8]
        metrics = self._metrics[mode]
        metrics["entropy"].append(s[4] / loss_tokens)
        metrics["clip_ratio/low_mean"].append(s[0] / on)
        metrics["clip_ratio/high_mean"].append(s[1] / on)
        metrics["clip_ratio/region_mean"].append(s[2] / on)
        if self.beta != 0.0:
            metrics["kl"].append(s[6] / loss_tokens)
        if self.regroup.anchors:
            metrics["regroup/anchor/token_frac"].append(anchor_tokens / loss_tokens)
            if anchor_tokens > 0:
                metrics["regroup/anchor/prob_mean"].append(s[7] / anchor_tokens)

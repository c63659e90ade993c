"""TRL adapter: TRL's `GRPOTrainer` samples; regroup's recipe does the rest, exactly as in the native trainer.

For users who keep TRL's stack (vLLM, DeepSpeed, PEFT). Written against trl 1.16.0 / transformers 5.24.
Runs under trl>=1.16,<1.17 only (`TRL_VERSIONS`, the `trl` extra): the private methods it hooks change within 1.x.
Its settings are a regroup `RunConfig` (`regroup_config=load_config("dagrpo", [...])`); the recipe built
from it (`regroup.train.recipes.build_recipe`) is the one the native trainer runs, and the adapter holds no
variant logic of its own:

- the data set: the recipe's pre-sampling stages (TA-GRPO's variants) run once over the problems, and
  every (question, variant) becomes one TRL prompt row (`problem_rows`);
- the reward: TRL's only reward function is `regroup_reward`, the recipe's stages from "sample" to
  "reward" on this process's completions (real token ids and texts, as `Sample`s);
- after TRL's generation, the remaining stages (overlong shaping, anchors, advantages, masks, filters)
  run on the whole generation batch as one `StepBatch` (every process runs them on the gathered batch, so
  groups may span processes), and the adapter writes back advantages, weights and anchor rows;
- the loss: `policy_loss` with the recipe's `LossSpec` and TRL's normaliser for `loss_type`;
- the signal watch: the native trainer's `SignalWatch` reads each generation batch's metrics (with the
  reward diagnostics, `groups/uniform_frac` and the rest) and warns, once per streak, when the training
  signal vanishes (`regroup_warnings` keeps the lines; the main process logs them).

What TRL's fixed-shape batch cannot do is refused by `Recipe.check_front_end("trl")`. TRL private
methods hooked (trl 1.16.0): `_generate_and_score_completions` (post-processing), `_compute_loss`,
`_generate` (TA-GRPO ratios on q0 only) and `_get_train_sampler` (TA-GRPO pools only). See docs/trl_adapter.md.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from torch import Tensor, nn
from torch.utils.data import Sampler
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import use_adapter

from regroup.algo.loss_config import resolve_loss
from regroup.algo.loss_inputs import LossInputs, Mean
from regroup.algo.losses import LossTotals, policy_loss
from regroup.batch import Sample
from regroup.config.schema import RunConfig
from regroup.diagnostics.signals import SignalWatch, reward_diagnostics
from regroup.errors import ConfigError
from regroup.integrations.rows import rows_after_stages
from regroup.integrations.trl_helpers import (
    ANCHOR_MASK,
    GROUP_ID,
    IS_ANCHOR,
    Q0_PROMPT,
    QUESTION,
    QUESTION_ID,
    SAMPLE_WEIGHT,
    VARIANT,
    PooledRepeatSampler,
    check_adapter_settings,
    check_shared_settings,
    check_trl_version,
    completion_text,
    grpo_args,
    loss_totals,
    pad_right,
    problem_rows,
)
from regroup.io import write_atomic
from regroup.models.prompting import build_prompter, encode_response
from regroup.stages.base import StepBatch, StepContext, load_stage_states, run_stages, stage_states
from regroup.stages.groups import samples_per_question
from regroup.tasks import get_task
from regroup.train.build import training_problems
from regroup.train.recipes import build_recipe, features

# grpo_args (defined in trl_helpers) stays public here: the adapter's users build TRL's config with it.
__all__ = ["STAGE_STATES", "RegroupGRPOTrainer", "grpo_args"]

log = logging.getLogger(__name__)

STAGE_STATES = "regroup_stages.json"
"""The recipe's stage states (self-anchor buffer, reference verdicts) in each TRL checkpoint folder."""
WATCH_STATE = "regroup_watch.json"
"""The signal watch's streaks in each TRL checkpoint folder, so a resumed run keeps counting."""

# Multimodal / model-specific forward inputs TRL passes through to `_get_per_token_logps_and_entropies`.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)

# GRPOTrainer arguments the adapter fills from the recipe, or cannot combine with it.
_TRL_ARGS_REFUSED = {
    "reward_funcs": "the reward is the recipe's (rewards.functions)",
    "train_dataset": "the rows are built from regroup's problems (data.*, or problems=)",
    "eval_dataset": "evaluate with `regroup eval`",
    "tools": "tool calls are not supported",
    "rollout_func": "a rollout_func is not supported",
    "environment_factory": "environments are not supported",
}


class RegroupGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` running a regroup recipe: `RegroupGRPOTrainer(model, args, regroup_config=cfg)`.

    `args` is TRL's `GRPOConfig`; its fields that regroup's config decides (`SHARED_SETTINGS`: group size,
    sampling, β, clip, loss normaliser, ...) must agree with `cfg` — `grpo_args(cfg, **trl_only)` builds one
    that does. `problems` (default: `cfg.data`'s training problems) and `task` (default: `cfg.data.task`)
    are regroup's. After each generation `regroup_last_batch` holds the step's `StepBatch` (samples,
    advantages, weights) and `regroup_rows[i]` the index in it of TRL's global row i. `regroup_watch` is
    the native trainer's `SignalWatch` (patience counted in generation batches: one per optimizer step
    unless `steps_per_generation` > 1); `regroup_warnings` holds every line it gave.
    """

    # transformers' Trainer types these loosely (any TrainingArguments, a model that may be None); a
    # GRPOTrainer always holds its GRPOConfig and a model.
    args: GRPOConfig
    model: nn.Module

    def __init__(
        self,
        model: Any,
        args: Any,
        *,
        regroup_config: RunConfig,
        problems: list | None = None,
        task: Any = None,
        processing_class: Any = None,
        **kwargs: Any,
    ) -> None:
        check_trl_version()
        cfg = regroup_config
        if not isinstance(cfg, RunConfig):
            raise TypeError(f"regroup_config must be a regroup RunConfig (load_config(...)), got {type(cfg).__name__}")
        for name, why in _TRL_ARGS_REFUSED.items():
            if kwargs.get(name) is not None:
                raise ValueError(f"RegroupGRPOTrainer takes no {name}: {why}")
        check_shared_settings(cfg, args)
        check_adapter_settings(args)
        if cfg.rollout.tis_cap > 0 and not args.use_vllm:
            raise ConfigError(
                "rollout.tis_cap > 0 corrects vLLM's samples: under TRL set GRPOConfig.use_vllm=True (TRL's "
                "vllm_importance_sampling_* then follow rollout.tis_cap / is_mode / is_min) or rollout.tis_cap=0"
            )
        if features(cfg).variants and cfg.grpo.samples_multiplier != 1:
            raise ConfigError("grpo.samples_multiplier with ta.enabled: TRL samples every prompt row equally often")
        if features(cfg).variants:
            pool, unique = cfg.ta.n_variants + 1, args.generation_batch_size // args.num_generations
            if unique % pool:
                raise ConfigError(
                    f"ta.n_variants={pool - 1}: the unique prompts per generation batch, generation_batch_size / "
                    f"num_generations = {args.generation_batch_size} / {args.num_generations} = {unique}, must be a "
                    f"multiple of N+1 = {pool} (q0 and its variants are generated together)"
                )
            if cfg.ta.ratio_anchor == "original" and args.use_vllm and args.vllm_importance_sampling_correction:
                raise ConfigError(
                    "ta.ratio_anchor=original with GRPOConfig.vllm_importance_sampling_correction would "
                    "divide pi_old(o|q0) by the sampler's pi(o|q_n); set one of them off"
                )
        if processing_class is None:
            if not isinstance(model, str):
                raise ValueError("pass processing_class (the tokenizer) when model is not a path")
            from transformers import AutoTokenizer  # heavy (transformers): only when a model is loaded

            processing_class = AutoTokenizer.from_pretrained(model)
        tokenizer = processing_class
        task = task if task is not None else get_task(cfg.data.task)
        problems = list(problems) if problems is not None else training_problems(cfg, task)
        self._problems = {p.id: p for p in problems}
        if len(self._problems) != len(problems):
            raise ValueError("problem ids must be unique: TRL's rows find their Problem by id")

        self.regroup_config = cfg
        self.recipe = build_recipe(
            cfg, task, lambda text: encode_response(tokenizer, text), Path(args.output_dir), loss=resolve_loss(cfg)
        )
        self.recipe.check_front_end("trl")
        names = self.recipe.names
        first, last = names.index("sample"), names.index("reward")
        self._reward_stages = self.recipe.stages[first + 1 : last + 1]  # run where the completions are
        self._batch_stages = self.recipe.stages[last + 1 :]  # run on the whole generation batch
        self.regroup_n_variants = self.recipe.n_variants
        self._group_size = samples_per_question(
            cfg.grpo.num_generations, cfg.grpo.samples_multiplier, self.regroup_n_variants
        )
        self._q0_ids: dict[str, list[int]] = {}
        self._ctx = StepContext(
            seed=cfg.seed,
            num_generations=cfg.grpo.num_generations,
            samples_multiplier=cfg.grpo.samples_multiplier,
            n_variants=self.regroup_n_variants,
            encode_prompt=lambda question: self._q0_ids[question],
            encode_response=lambda text: encode_response(tokenizer, text),
            warn=log.warning,
        )

        # TRL's data set is fixed before training: the recipe's pre-sampling stages run once, over all problems.
        prep = StepBatch(step=0, problems=problems, group_ids=list(range(len(problems))))
        run_stages(self.recipe.stages[:first], prep, self._ctx)
        prompter = build_prompter(cfg.data, tokenizer, builtin_model=False)
        rows, dropped = problem_rows(
            problems,
            prep.variants,
            prompter.messages if prompter.use_chat else prompter.render,
            self.regroup_n_variants,
        )
        if dropped:
            log.warning(
                "%d of %d questions have fewer than ta.n_variants=%d variants and are left out",
                dropped,
                len(problems),
                self.regroup_n_variants,
            )
        if not rows:
            raise ValueError("no training rows: every question was left out")
        self.regroup_last_batch: StepBatch | None = None
        self.regroup_rows: list[int] = []
        self.regroup_watch = SignalWatch.for_recipe(cfg, self.recipe)
        self.regroup_warnings: list[str] = []
        self._local_samples: list[Sample] | None = None
        self._reward_metrics: dict[str, float] = {}
        self._own_prompt_ids: list[list[int]] | None = None
        self._rows_in_flight: list[dict] | None = None

        from datasets import Dataset  # heavy (datasets): only when TRL's data set is built

        callbacks = [*(kwargs.pop("callbacks", None) or []), _SaveStageStates(self.recipe.stages, self.regroup_watch)]
        super().__init__(
            model=model,
            reward_funcs=[self.regroup_reward],
            args=args,
            callbacks=callbacks,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            **kwargs,
        )

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """TRL's `train`; a resumed run first restores the recipe's stage states saved with the checkpoint."""
        path = resume_from_checkpoint
        if path is True:
            path = get_last_checkpoint(self.args.output_dir)
        if path and (Path(path) / STAGE_STATES).is_file():
            load_stage_states(self.recipe.stages, json.loads((Path(path) / STAGE_STATES).read_text()))
        if path and (Path(path) / WATCH_STATE).is_file():
            self.regroup_watch.load_state_dict(json.loads((Path(path) / WATCH_STATE).read_text()))
        return super().train(
            resume_from_checkpoint=resume_from_checkpoint,
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    # --- the data TRL samples --------------------------------------------------------------------------------

    def _get_train_sampler(self, dataset: Any = None) -> Sampler:
        if not self.regroup_n_variants:
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        g = _filled(self.num_generations, "num_generations")
        return PooledRepeatSampler(
            num_rows=len(dataset),
            pool_size=self.regroup_n_variants + 1,
            mini_repeat_count=g,
            batch_size=_filled(self.args.generation_batch_size, "generation_batch_size") // g,
            repeat_count=self.num_iterations * _filled(self.args.steps_per_generation, "steps_per_generation"),
            shuffle=bool(self.shuffle_dataset),  # None: no shuffle
            seed=self.args.seed,
        )

    def _generate(self, prompts: list) -> Any:
        result = super()._generate(prompts)
        rows = self._rows_in_flight
        if not (self.recipe.ratio_on_original and self.model.training and rows is not None):
            return result
        # SPEC §3.4: o was sampled from q_n, but π_old, π_ref and π_θ are all taken on (q0, o); TRL computes
        # π_old / π_ref right after this call, so the prompt ids are swapped here.
        prompt_ids, *rest = result
        self._own_prompt_ids = [list(ids) for ids in prompt_ids]
        q0_ids, _, _ = self._tokenize_prompts([r[Q0_PROMPT] for r in rows])
        return ([list(ids) for ids in q0_ids], *rest)

    # --- the recipe's stages -----------------------------------------------------------------------------------

    def regroup_reward(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> list:
        """TRL's reward function: this process's completions as `Sample`s through the recipe's reward stages."""
        eos = set(self.eos_token_ids) | {self._tokenizer.pad_token_id}
        samples = [
            Sample(
                group_id=int(columns[GROUP_ID][i]),
                question_id=columns[QUESTION_ID][i],
                variant=int(columns[VARIANT][i]),
                is_anchor=False,
                prompt_ids=[],
                ratio_prompt_ids=[],  # TRL pads prompts after the reward call; filled then
                response_ids=list(ids),
                response_text=completion_text(completions[i]),
                truncated=not ids or ids[-1] not in eos,
                problem=self._problems[columns[QUESTION_ID][i]],
                question_text=columns[QUESTION][i],
            )
            for i, ids in enumerate(completion_ids)
        ]
        batch = StepBatch(step=int(self.state.global_step), samples=samples)
        self._reward_metrics = run_stages(self._reward_stages, batch, self._ctx)
        self._local_samples = samples
        return [s.reward for s in samples]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._rows_in_flight, self._own_prompt_ids, self._local_samples = inputs, None, None
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._rows_in_flight = None
        return self._run_batch_stages(out) if self.model.training else out

    def _run_batch_stages(self, out: dict[str, Any]) -> dict[str, Any]:
        """The recipe's stages after the reward on the whole generation batch; write back this process's rows."""
        local = self._local_samples
        if local is None or len(local) != out["prompt_ids"].shape[0]:
            raise RuntimeError("internal: TRL did not call the regroup reward function on this generation batch")
        for k, s in enumerate(local):
            s.ratio_prompt_ids = out["prompt_ids"][k][out["prompt_mask"][k].bool()].tolist()
            s.prompt_ids = self._own_prompt_ids[k] if self._own_prompt_ids is not None else s.ratio_prompt_ids
        samples = list(gather_object(local))  # [B_global], rank order: TRL's global row order
        groups: dict[int, Any] = {}
        for s in samples:
            groups.setdefault(s.group_id, s.problem)
        sizes = {g: sum(s.group_id == g for s in samples) for g in groups}
        if any(n != self._group_size for n in sizes.values()):
            raise RuntimeError(
                f"a generation batch holds a question with {sorted(set(sizes.values()))} samples instead "
                f"of {self._group_size}: the adapter's sampler was bypassed"
            )
        self._q0_ids = {s.problem.question: s.ratio_prompt_ids for s in samples if s.variant == 0}
        batch = StepBatch(
            step=int(self.state.global_step),
            problems=list(groups.values()),
            group_ids=list(groups),
            samples=list(samples),
        )
        metrics = {**self._reward_metrics, **run_stages(self._batch_stages, batch, self._ctx)}
        if batch.advantages is None:  # the recipe's advantages stage sets them on every non-empty batch
            raise RuntimeError("internal: the recipe's stages left the generation batch without advantages")
        metrics.update(reward_diagnostics(batch.samples))  # what the native trainer's RewardDiagnostics hook logs
        rows = rows_after_stages(samples, batch.samples)  # [B_global] index into batch.samples

        n, device = len(local), out["advantages"].device
        mine = rows[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n]
        out["advantages"] = batch.advantages[mine].to(device=device, dtype=out["advantages"].dtype)  # [n]
        if batch.weights is not None:
            out[SAMPLE_WEIGHT] = batch.weights[mine].to(device=device, dtype=out["advantages"].dtype)  # [n]
        if any(s.is_anchor for s in batch.samples):  # the same on every process: it ran on the whole batch
            anchors = [(k, batch.samples[j].response_ids) for k, j in enumerate(mine) if batch.samples[j].is_anchor]
            if anchors:
                self._write_anchor_rows(out, anchors)
            is_anchor = torch.tensor([batch.samples[j].is_anchor for j in mine], device=device)  # [n]
            out[IS_ANCHOR] = is_anchor
            out[ANCHOR_MASK] = out["completion_mask"].bool() & is_anchor.unsqueeze(1)  # [n, T]
            # The loss-token count TRL normalises dapo by includes the anchors' tokens.
            loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
            out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        logged = self._logs.get("advantages")
        if isinstance(logged, deque) and len(logged) >= len(rows):  # TRL's completions table: the recipe's advantages
            for _ in rows:  # drop TRL's per-prompt advantages of this batch
                logged.pop()
            logged.extend(batch.advantages[rows].tolist())
        for key, value in metrics.items():
            self._metrics["train"][f"regroup/{key}"].append(float(value))
        self._watch_signals(metrics)
        self.regroup_last_batch, self.regroup_rows = batch, rows
        return out

    def _watch_signals(self, metrics: dict[str, float]) -> None:
        """The native trainer's signal watch on this generation batch's metrics. The batch's own metrics
        (uniform groups, unscored rewards, masks, anchors) are the same on every process; the reward's
        counts (no-answer, out-of-range) are this process's, so the main process warns from its own."""
        step = int(self.state.global_step) + 1  # the optimizer step this batch starts, counted from 1
        for line in self.regroup_watch.observe(step, metrics):
            self.regroup_warnings.append(line)
            if self.accelerator.is_main_process:
                log.warning(line)

    def _write_anchor_rows(self, out: dict[str, Any], anchors: list[tuple[int, list[int]]]) -> None:
        """Write anchor token ids into the local batch rows they took (widening [n, T] tensors when needed)."""
        width = out["completion_ids"].shape[1]
        need = max(len(ids) for _, ids in anchors)
        if need > width:
            width = need
            multiple = self.pad_to_multiple_of  # an int or None: GRPOConfig resolves "auto" and strings
            if multiple:
                width = -(-width // int(multiple)) * int(multiple)
            pads = {
                "completion_ids": self._tokenizer.pad_token_id,
                "completion_mask": 0,
                "tool_mask": 1,
                "old_per_token_logps": 0.0,
                "ref_per_token_logps": 0.0,
                "sampling_per_token_logps": 0.0,
            }
            for key, value in pads.items():
                if out.get(key) is not None:
                    out[key] = pad_right(out[key], width, value)
            isr = out.get("importance_sampling_ratio")
            if isr is not None and isr.dim() == 2 and isr.shape[1] > 1:
                out["importance_sampling_ratio"] = pad_right(isr, width, 1.0)
        rows = torch.tensor([k for k, _ in anchors], device=out["completion_ids"].device)
        for k, ids in anchors:
            out["completion_ids"][k] = self._tokenizer.pad_token_id
            out["completion_ids"][k, : len(ids)] = torch.tensor(ids, dtype=out["completion_ids"].dtype)
            out["completion_mask"][k] = 0
            out["completion_mask"][k, : len(ids)] = 1
            if out.get("tool_mask") is not None:
                out["tool_mask"][k] = 1
            # π_old / π_sampler are undefined for forced tokens; policy_loss ignores them there.
            for key in ("old_per_token_logps", "sampling_per_token_logps"):
                if out.get(key) is not None:
                    out[key][k] = 0.0
            if out.get("importance_sampling_ratio") is not None:
                out["importance_sampling_ratio"][k] = 1.0
        if out.get("ref_per_token_logps") is not None:  # the KL term applies to anchor tokens: real π_ref there
            input_ids = torch.cat([out["prompt_ids"][rows], out["completion_ids"][rows]], dim=1)
            attention = torch.cat([out["prompt_mask"][rows], out["completion_mask"][rows]], dim=1)
            out["ref_per_token_logps"][rows] = self._ref_logps(input_ids, attention, width)

    @torch.no_grad()
    def _ref_logps(self, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
        """Reference-model log-probs [n, T], as TRL computes them (separate ref model, or PEFT base)."""
        batch_size = self.args.per_device_train_batch_size
        if self.ref_model is not None:
            return self._get_per_token_logps_and_entropies(
                self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )[0]
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )[0]

    # --- the loss ----------------------------------------------------------------------------------------------

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> Tensor:
        """The recipe's `policy_loss` and `LossSpec` (SPEC §1, §2a.4, §2b.3) with TRL's normaliser for `loss_type`."""
        mode = "train" if self.model.training else "eval"
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)  # [B, P+T]
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)  # [B, P+T]
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
        old = logps.detach() if old is None else old  # aligned generation (TRL skips π_old): π_old = π_θ  [B, T]
        is_weight = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            is_weight = inputs["importance_sampling_ratio"].expand_as(logps)  # [B, T]
        training = mode == "train"
        _, totals = loss_totals(
            self.loss_type,
            loss_mask=mask,
            num_items_in_batch=float(inputs["num_items_in_batch"]),
            num_processes=self.accelerator.num_processes,
            grad_accum=self.current_gradient_accumulation_steps if training else 1,
            steps_per_generation=_filled(self.args.steps_per_generation, "steps_per_generation") if training else 1,
            max_completion_length=self.max_completion_length or logits_to_keep,
        )
        loss_inputs = LossInputs(
            advantages=inputs["advantages"],
            loss_mask=mask,
            ref_logps=inputs.get("ref_per_token_logps"),
            sample_weight=inputs.get(SAMPLE_WEIGHT),
            anchor_token_mask=inputs.get(ANCHOR_MASK),
            is_weight=is_weight,
            entropy=entropies if self.recipe.loss.needs_entropy else None,
            # OPSM's KL is to the sampler, as TRL's (vLLM's log-probs, else pi_old); a rephrasing scored on q0 has none
            sampler_logps=None if self.recipe.ratio_on_original else inputs.get("sampling_per_token_logps"),
        )  # [B, T], with grad
        loss, m = policy_loss(logps, old, loss_inputs, self.recipe.loss, LossTotals(**totals))
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if training else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_loss_metrics(mode, m, entropies, mask)
        return loss

    def _log_loss_metrics(self, mode: str, m: dict[str, Mean], entropies: Tensor, mask: Tensor) -> None:
        """TRL's loss metrics (entropy, clip ratios, kl) plus the anchors', as global token means: each is a `Mean`
        of the loss (a sum and a count) summed over the processes; the entropy is TRL's, over the loss tokens."""
        zero = Mean(torch.zeros((), device=mask.device), torch.zeros((), device=mask.device))
        means = [m.get(name, zero) for name in TRL_METRICS.values()]
        entropy = ((entropies.detach() * mask.to(entropies.dtype)).sum(), mask.sum())
        loss_tokens = m["pg_loss"].n
        flat = [x for mean in means for x in mean] + list(entropy) + [loss_tokens]
        s = self.accelerator.reduce(torch.stack([x.float() for x in flat]), reduction="sum").tolist()
        metrics = self._metrics[mode]
        for i, (trl_name, name) in enumerate(TRL_METRICS.items()):
            total, count = s[2 * i], s[2 * i + 1]
            if name == "kl" and self.beta == 0.0 or name.startswith("anchor/") and count == 0:
                continue
            metrics[trl_name].append(total / max(count, 1.0))
        metrics["entropy"].append(s[-3] / max(s[-2], 1.0))
        anchor_tokens = s[2 * list(TRL_METRICS.values()).index("anchor/prob_mean") + 1]
        if anchor_tokens > 0:
            metrics["regroup/anchor/token_frac"].append(anchor_tokens / max(s[-1], 1.0))


TRL_METRICS = {
    "clip_ratio/low_mean": "clip/low_frac",
    "clip_ratio/high_mean": "clip/high_frac",
    "clip_ratio/region_mean": "clip/frac",
    "kl": "kl",
    "regroup/anchor/prob_mean": "anchor/prob_mean",
}
"""The TRL metric each of the loss's metrics is logged as."""


def _filled(value: int | None, name: str) -> int:
    """A GRPOConfig size that may be None when given but never after GRPOConfig is built (its
    `__post_init__` fills it in or refuses the config)."""
    if value is None:
        raise RuntimeError(f"internal: GRPOConfig.{name} is None in a built config")
    return value


class _SaveStageStates(TrainerCallback):
    """Writes the recipe's stage states and the signal watch's streaks into each checkpoint folder TRL has
    just saved (main process)."""

    def __init__(self, stages: list, watch: SignalWatch) -> None:
        self.stages, self.watch = stages, watch

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_atomic(folder / STAGE_STATES, json.dumps(stage_states(self.stages)))
            write_atomic(folder / WATCH_STATE, json.dumps(self.watch.state_dict()))

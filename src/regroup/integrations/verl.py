"""verl plug-in: verl 0.9.1's trainer samples and trains; a regroup recipe (its stages and loss) does the rest.

For users who train on verl's Ray stack. Enabled with one setting, `VERL_USE_EXTERNAL_MODULES=
regroup.integrations.verl` (or, where regroup is installed, its `verl.plugins` entry point), plus these
verl overrides (docs/verl.md):

    trainer.v1.trainer_mode=regroup
    actor_rollout_ref.rollout.agent.default_agent_loop=regroup
    +regroup.config=dagrpo_ta            # a recipe name or a regroup YAML
    +regroup.overrides=[grpo.num_generations=4,...]

Loading the module registers three things with verl, and holds no variant logic of its own:

- the trainer `regroup` (`RegroupTrainer`, verl's synchronous v1 trainer): at start it builds the recipe
  (`regroup.train.recipes.build_recipe`, the one the native trainer runs), checks the verl settings regroup
  decides (`verl_helpers.SHARED_SETTINGS`), runs the recipe's pre-sampling stages (TA-GRPO's rephrasings)
  once over the problems and writes verl's dataset from them; each step, before any log-prob is computed,
  it runs the recipe's stages from the reward on (reward, anchors, advantages, masks) over the whole batch
  as one `StepBatch` and writes back advantages, weights, scores and anchor rows; verl's own estimator is
  not used;
- the agent loop `regroup`: verl's single-turn loop that, for TA-GRPO, samples G responses of q0 and of
  each rephrasing for one dataset row (`rollout.n = (N+1)·G`, one uid: one group) and, with
  `ta.ratio_anchor=original`, hands verl q0's prompt, so that π_old, π_ref and π_θ are all taken on (q0, o);
- the loss: `policy_loss` with the recipe's `LossSpec` on verl's micro-batches (`set_loss_fn`), with
  verl's normaliser (`verl_helpers.micro_batch_loss`);
- the signal watch: the native trainer's `SignalWatch` (as its `WatchSignals` hook) reads each step's recipe
  metrics and logs a warning, once per streak, when the training signal vanishes; its streaks are saved
  with verl's checkpoints beside the stage states.

What verl's fixed-shape batch cannot do (anchors.mode=add, dynamic sampling) is refused by
`Recipe.check_front_end("verl")`. verl internals used (verl 0.9.1): `PPOTrainerSync` and its
`_init_dataloader`, `_compute_old_log_prob` and `_compute_advantage` methods, `SingleTurnAgentLoop.run`,
TransferQueue's `kv_batch_get` / `kv_batch_put`, `no_padding_2_padding`.
"""

from __future__ import annotations

import json
import logging
import math
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from tensordict import TensorDict
from verl.experimental.agent_loop.agent_loop import register as register_agent_loop
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.padding import no_padding_2_padding, response_to_nested

from regroup.algo.loss_config import resolve_loss
from regroup.algo.loss_spec import LossSpec
from regroup.batch import Sample
from regroup.config.schema import RunConfig
from regroup.diagnostics.hooks import WatchSignals
from regroup.diagnostics.signals import SignalWatch, reward_diagnostics
from regroup.errors import ConfigError
from regroup.integrations.rows import rows_after_stages
from regroup.integrations.verl_helpers import (
    ADVANTAGE,
    GROUP,
    IS_ANCHOR,
    PROMPTS,
    QUESTION_ID,
    REWARD,
    SCORE,
    VARIANT,
    WEIGHT,
    check_shared_settings,
    micro_batch_loss,
    problem_rows,
    reward_function_settings,
    variant_of,
)
from regroup.io import write_atomic
from regroup.models.prompting import build_prompter, encode_response
from regroup.stages.base import StepBatch, StepContext, load_stage_states, run_stages, stage_states
from regroup.tasks import get_task
from regroup.train.build import training_problems
from regroup.train.recipes import build_recipe
from regroup.train.run_config import load_config

__all__ = ["RegroupAgentLoop", "RegroupTrainer", "load_regroup_config", "regroup_loss"]

log = logging.getLogger(__name__)

NAME = "regroup"
"""The trainer mode and the agent loop name this module registers."""
STAGE_STATES = "regroup_stages.json"
"""The recipe's stage states in each verl checkpoint folder (`global_step_N/`)."""
WATCH_STATE = "regroup_watch.json"
"""The signal watch's streaks in each verl checkpoint folder, so a resumed run warns when the straight one would."""


def load_regroup_config(verl_config: Any) -> RunConfig:
    """The regroup `RunConfig` named by verl's `regroup.config` (a recipe name or a YAML path) with the
    overrides `regroup.overrides` (a list of `key=value`)."""
    section = OmegaConf.select(verl_config, "regroup")
    if section is None or not section.get("config"):
        raise ConfigError("trainer.v1.trainer_mode=regroup needs +regroup.config=RECIPE_OR_YAML (e.g. dagrpo)")
    overrides = [str(o) for o in (section.get("overrides") or [])]
    return load_config(str(section.config), overrides)


@register_agent_loop(NAME)
class RegroupAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn loop over a regroup row: sample `session_id` answers the row's prompt number
    `variant_of(session_id, n, N+1)`; with q0 ratios (TA-GRPO's default) verl is handed q0's prompt ids, so
    every log-prob it computes for this response is on (q0, o) (SPEC §3.4). The rollout's own log-probs
    stay those of the prompt that drew it (the plug-in refuses rollout IS correction with q0 ratios)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        info = dict(kwargs.get("extra_info") or {})
        prompts = json.loads(info[PROMPTS]) if PROMPTS in info else None
        if not prompts or len(prompts) == 1:
            return await super().run(sampling_params, **kwargs)
        n = int(self.rollout_config.n)
        variant = variant_of(int(kwargs["session_id"]), n, len(prompts))
        q0_ids = await self.ct_build_initial_tokens(list(prompts[0]))
        output = await super().run(sampling_params, **{**kwargs, "raw_prompt": prompts[variant]})
        output.extra_fields[VARIANT] = variant
        if info.get("regroup_ratio_on_q0"):
            output.extra_fields["regroup_own_prompt_ids"] = list(output.prompt_ids)
            output.prompt_ids = list(q0_ids)
        return output


def regroup_loss(
    model_output: dict,
    data: TensorDict,
    dp_group: Any = None,
    *,
    spec: LossSpec,
    max_len: int,
    sampler_on_prompt: bool,
    capture_dir: str | None = None,
):
    """verl's loss function (`set_loss_fn`): the recipe's `policy_loss` on one micro-batch (`micro_batch_loss`)."""
    logps = no_padding_2_padding(model_output["log_probs"], data)  # [b, T]
    entropy = model_output.get("entropy")
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)  # [b, T]
    if spec.needs_entropy and entropy is None:
        raise ConfigError("a loss term needs the entropy: set actor_rollout_ref.actor.calculate_entropy=true")
    names = ["response_mask", "old_log_probs", ADVANTAGE, WEIGHT, IS_ANCHOR, VARIANT]
    names += [k for k in ("ref_log_prob", "rollout_log_probs") if k in data.keys()]
    padded = data.select(*names).to_padded_tensor()
    given = {k: padded[k] for k in names}  # [b, T] or [b]
    fields = dict(given)
    if spec.rollout.tis_cap <= 0:
        fields.pop("rollout_log_probs", None)
    if spec.grpo.beta == 0:
        fields.pop("ref_log_prob", None)
    global_batch_size = int(data["global_batch_size"])
    loss, m = micro_batch_loss(
        spec,
        logps,
        fields,
        dp_size=int(data["dp_size"]),
        batch_num_tokens=float(data["batch_num_tokens"]),
        global_batch_size=global_batch_size,
        max_len=max_len,
        entropy=entropy,
        sampler_on_prompt=sampler_on_prompt,
    )
    if capture_dir is not None and logps.requires_grad:
        _capture_loss(Path(capture_dir), logps, given, loss, data, global_batch_size)
    metrics = {f"actor/regroup/{k}": Metric(value=v.item(), aggregation=AggregationType.MEAN) for k, v in m.items()}
    metrics["actor/pg_loss"] = Metric(value=m["pg_loss"].item(), aggregation=AggregationType.MEAN)
    return loss, metrics


def _capture_loss(folder: Path, logps, fields, loss, data, global_batch_size) -> None:
    """The micro-batch's loss inputs, value and gradient w.r.t. π_θ's log-probs (`regroup.capture_dir`)."""
    (grad,) = torch.autograd.grad(loss, logps, retain_graph=True)
    folder.mkdir(parents=True, exist_ok=True)
    k = len(list(folder.glob("loss-*.pt")))
    record = {
        "logps": logps.detach().clone(),
        "grad": grad.detach().clone(),
        "loss": loss.detach().clone(),
        "fields": {key: value.detach().clone() for key, value in fields.items()},
        "prompts": _rows(data["prompts"]),
        "responses": _rows(data["responses"]),
        "dp_size": int(data["dp_size"]),
        "batch_num_tokens": float(data["batch_num_tokens"]),
        "global_batch_size": global_batch_size,
    }
    torch.save(record, folder / f"loss-{k:04d}.pt")


@register_trainer(NAME)
class RegroupTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer running a regroup recipe (module docstring)."""

    def __init__(self, config: Any):
        self.regroup_config = load_regroup_config(config)
        check_shared_settings(self.regroup_config, lambda key: _plain(OmegaConf.select(config, key)))
        section = OmegaConf.select(config, "regroup")
        self._capture_dir = section.get("capture_dir") if section is not None else None
        self._run_dir = Path(config.trainer.default_local_dir) / "regroup"
        with open_dict(config):  # regroup's reward function, told the recipe's task by the config (not the rows)
            given = _plain(OmegaConf.select(config, "reward.custom_reward_function"))
            config.reward.custom_reward_function = reward_function_settings(self.regroup_config, given)
        super().__init__(config)

    # --- start-up -------------------------------------------------------------------------------------------

    def _init_dataloader(self):
        """The recipe, then verl's dataset from regroup's problems, then verl's dataloader over it."""
        cfg, tokenizer = self.regroup_config, self.tokenizer
        self._run_dir.mkdir(parents=True, exist_ok=True)
        task = get_task(cfg.data.task)
        self.recipe = build_recipe(
            cfg, task, lambda text: encode_response(tokenizer, text), self._run_dir, loss=resolve_loss(cfg)
        )
        self.recipe.check_front_end("verl")
        self.regroup_watch = WatchSignals(SignalWatch.for_recipe(cfg, self.recipe), log.warning)
        names = self.recipe.names
        first, last = names.index("sample"), names.index("reward")
        self._reward_stages = self.recipe.stages[first + 1 : last + 1]
        self._batch_stages = self.recipe.stages[last + 1 :]
        n_variants = self.recipe.n_variants
        self._ctx = StepContext(
            seed=cfg.seed,
            num_generations=cfg.grpo.num_generations,
            samples_multiplier=cfg.grpo.samples_multiplier,
            n_variants=n_variants,
            encode_prompt=lambda question: self._q0_ids[question],
            encode_response=lambda text: encode_response(tokenizer, text),
            warn=log.warning,
        )
        self._q0_ids: dict[str, list[int]] = {}
        problems = training_problems(cfg, task)
        self._problems = {p.id: p for p in problems}
        if len(self._problems) != len(problems):
            raise ValueError("problem ids must be unique: verl's rows find their Problem by id")
        prep = StepBatch(step=0, problems=problems, group_ids=list(range(len(problems))))
        run_stages(self.recipe.stages[:first], prep, self._ctx)
        prompter = build_prompter(cfg.data, tokenizer, builtin_model=False)
        if not prompter.use_chat:
            raise ConfigError("data.chat_template=off: verl's agent loop always applies the chat template")
        rows, dropped = problem_rows(problems, prep.variants, prompter.messages, n_variants)
        if dropped:
            log.warning(
                "%d of %d questions have fewer than ta.n_variants=%d variants", dropped, len(problems), n_variants
            )
        if not rows:
            raise ValueError("no training rows: every question was left out")
        on_q0 = self.recipe.ratio_on_original
        for row in rows:
            row["extra_info"]["regroup_ratio_on_q0"] = on_q0
            row["extra_info"][PROMPTS] = json.dumps(row["extra_info"][PROMPTS])
        path = self._run_dir / "train.parquet"
        import pandas as pd  # verl's own dependency: its dataset reads parquet

        pd.DataFrame(rows).to_parquet(path)
        with open_dict(self.config):
            self.config.data.train_files = str(path)
            self.config.data.val_files = str(path)
            if n_variants:
                self.config.actor_rollout_ref.rollout.agent.default_agent_loop = NAME
        super()._init_dataloader()

    def init(self):
        super().init()
        spec = self.recipe.loss
        self.actor_rollout_wg.set_loss_fn(
            partial(
                regroup_loss,
                spec=spec,
                max_len=int(self.config.data.max_response_length),
                sampler_on_prompt=not self.recipe.ratio_on_original,
                capture_dir=None if self._capture_dir is None else str(Path(self._capture_dir) / "loss"),
            )
        )

    # --- checkpoints ------------------------------------------------------------------------------------------

    def _save_checkpoint(self):
        """verl's checkpoint, plus the recipe's stage states (self-anchor buffer, reference verdicts) beside it."""
        super()._save_checkpoint()
        folder = Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        write_atomic(folder / STAGE_STATES, json.dumps(stage_states(self.recipe.stages)))
        write_atomic(folder / WATCH_STATE, json.dumps(self.regroup_watch.state_dict()))

    def _load_checkpoint(self):
        """verl's resume, then the recipe's stage states and the watch's streaks saved with that checkpoint."""
        super()._load_checkpoint()
        if not self.global_steps:
            return
        resumed = self.config.trainer.get("resume_from_path")
        folder = Path(resumed) if resumed and self.config.trainer.resume_mode == "resume_path" else None
        folder = folder or Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        if (folder / STAGE_STATES).is_file():
            load_stage_states(self.recipe.stages, json.loads((folder / STAGE_STATES).read_text()))
        if (folder / WATCH_STATE).is_file():
            self.regroup_watch.load_state_dict(json.loads((folder / WATCH_STATE).read_text()))

    # --- the step ---------------------------------------------------------------------------------------------

    def _compute_old_log_prob(self, batch, metrics: dict):
        """The recipe's stages from the reward on, then verl's π_old on the rows they leave."""
        self._run_recipe(batch, metrics)
        return super()._compute_old_log_prob(batch, metrics)

    def _compute_advantage(self, batch, metrics: dict):
        """The recipe's advantages (per response) as verl's per-token advantages; verl's estimator is not run."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        mask = data["response_mask"]
        padded = mask.to_padded_tensor(0) if mask.is_nested else mask  # [B, T]
        advantages = torch.tensor([self._advantage_of[key] for key in batch.keys])  # [B] by key: rows may move
        per_token = advantages[:, None] * padded.to(torch.float32)  # [B, T]
        out = TensorDict(
            {"advantages": response_to_nested(per_token, mask), "returns": response_to_nested(per_token, mask)},
            batch_size=len(batch),
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

    def _run_recipe(self, batch, metrics: dict) -> None:
        fields = ["uid", "session_id", "prompts", "responses", "extra_info", "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        prompts, responses = _rows(data["prompts"]), _rows(data["responses"])
        infos, extras = _column(data["extra_info"]), _column(data["extra_fields"])
        uids = _column(data["uid"])
        groups: dict[str, int] = {}
        eos = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        samples = []
        for k in range(len(batch.keys)):
            info, extra = dict(infos[k] or {}), dict(extras[k] or {})
            problem = self._problems[str(info[QUESTION_ID])]
            variant = int(extra.get(VARIANT, 0))
            texts = json.loads(info[PROMPTS])
            ids = responses[k]
            gid = groups.setdefault(str(uids[k]), len(groups))
            samples.append(
                Sample(
                    group_id=gid,
                    question_id=problem.id,
                    variant=variant,
                    is_anchor=False,
                    prompt_ids=list(extra.get("regroup_own_prompt_ids") or prompts[k]),
                    ratio_prompt_ids=prompts[k],
                    response_ids=ids,
                    response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    truncated=not ids or ids[-1] not in eos,
                    problem=problem,
                    question_text=texts[variant][-1]["content"] if variant else None,
                )
            )
        self._q0_ids = {s.problem.question: s.ratio_prompt_ids for s in samples if s.variant == 0}
        by_group: dict[int, Any] = {}
        for s in samples:
            by_group.setdefault(s.group_id, s.problem)
        step = StepBatch(
            step=int(self.global_steps),
            problems=list(by_group.values()),
            group_ids=list(by_group),
            samples=list(samples),
        )
        regroup_metrics = run_stages(self._reward_stages, step, self._ctx)
        regroup_metrics.update(run_stages(self._batch_stages, step, self._ctx))
        regroup_metrics.update(reward_diagnostics(step.samples))
        if step.advantages is None:  # the recipe's advantages stage sets them on every non-empty batch
            raise RuntimeError("internal: the recipe's stages left the step without advantages")
        rows = rows_after_stages(samples, step.samples)
        held = [step.samples[j] for j in rows]
        n = len(held)
        self._advantages = step.advantages[rows].to(torch.float32)  # [B]
        self._advantage_of = dict(zip(batch.keys, self._advantages.tolist(), strict=True))
        weights = step.weights[rows] if step.weights is not None else torch.ones(n)
        out = TensorDict(
            {
                ADVANTAGE: self._advantages,
                WEIGHT: weights.to(torch.float32),
                IS_ANCHOR: torch.tensor([s.is_anchor for s in held]),
                SCORE: torch.tensor([math.nan if s.score is None else float(s.score) for s in held]),
                REWARD: torch.tensor([math.nan if s.reward is None else float(s.reward) for s in held]),
                GROUP: torch.tensor([s.group_id for s in held]),
                VARIANT: torch.tensor([s.variant for s in held]),
            },
            batch_size=n,
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
        anchors = [k for k, s in enumerate(held) if s.is_anchor]
        if anchors:
            self._write_anchor_rows(batch, [batch.keys[k] for k in anchors], [held[k] for k in anchors])
        self._write_scores(batch, held)
        for key, value in regroup_metrics.items():
            metrics[f"regroup/{key}"] = float(value)
        self.regroup_watch.after_step(int(self.global_steps) - 1, regroup_metrics)  # it names the 1-based step
        if self._capture_dir is not None:
            self._capture_step(batch.keys, held)

    def _write_anchor_rows(self, batch, keys: list[str], anchors: list[Sample]) -> None:
        """An anchor takes the row of the on-policy sample it replaced: q0's prompt and the anchor's tokens."""
        rows = []
        for s in anchors:
            prompt = torch.tensor(s.ratio_prompt_ids, dtype=torch.int64)
            response = torch.tensor(s.response_ids, dtype=torch.int64)
            input_ids = torch.cat([prompt, response])
            ones = torch.ones(len(response), dtype=torch.int64)
            rows.append(
                {
                    "prompts": prompt,
                    "responses": response,
                    "input_ids": input_ids,
                    "attention_mask": torch.ones_like(input_ids),
                    "position_ids": torch.arange(len(input_ids), dtype=torch.int64),
                    "response_mask": ones,
                    "loss_mask": ones,
                    "rollout_log_probs": torch.zeros(len(response), dtype=torch.float32),
                }
            )
        fields = {name: torch.nested.as_nested_tensor([r[name] for r in rows], layout=torch.jagged) for name in rows[0]}
        tq.kv_batch_put(keys=keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(rows)))

    def _write_scores(self, batch, held: list[Sample]) -> None:
        """verl's `rm_scores` (the reward on each response's last token) from the recipe's reward, for verl's
        reward metrics."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
        lengths = [len(r) for r in _rows(data["responses"])]
        scores = []
        for s, length in zip(held, lengths, strict=True):
            row = torch.zeros(length, dtype=torch.float32)
            if length:
                row[-1] = 0.0 if s.reward is None else float(s.reward)
            scores.append(row)
        rm = torch.nested.as_nested_tensor(scores, layout=torch.jagged)
        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict({"rm_scores": rm}, batch_size=len(held))
        )

    def _capture_step(self, keys: list[str], held: list[Sample]) -> None:
        """The step's rows after the stages (`regroup.capture_dir`): what the harness and the equality test read."""
        assert self._capture_dir is not None  # called only when capture_dir is set
        folder = Path(self._capture_dir) / "steps"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "step": int(self.global_steps),
            "keys": list(keys),
            "advantages": self._advantages.tolist(),
            "samples": [
                {
                    "group_id": s.group_id,
                    "question_id": s.question_id,
                    "variant": s.variant,
                    "is_anchor": s.is_anchor,
                    "reward": s.reward,
                    "score": s.score,
                    "prompt_ids": s.prompt_ids,
                    "ratio_prompt_ids": s.ratio_prompt_ids,
                    "response_ids": s.response_ids,
                    "response_text": s.response_text,
                    "truncated": s.truncated,
                }
                for s in held
            ],
        }
        (folder / f"step-{int(self.global_steps):04d}.json").write_text(json.dumps(record))


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python (dicts, lists), scalars unchanged."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _rows(tensor: Any) -> list[list[int]]:
    """A nested [B, *] tensor (or a padded one) as one list per row."""
    if getattr(tensor, "is_nested", False):
        return [t.tolist() for t in tensor.unbind()]
    return [t.tolist() for t in tensor]


def _column(value: Any) -> list:
    """A TensorDict column of non-tensor values as a Python list."""
    if hasattr(value, "tolist"):
        out = value.tolist()
    else:
        out = list(value)
    return [getattr(v, "data", v) for v in out]

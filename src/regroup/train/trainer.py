"""The training loop, and only the loop: draw → the recipe's stages → update with the recipe's loss spec →
hooks → log → checkpoint. Which stages run is the recipe's business (`regroup.train.recipes`), which
diagnostics and evaluations run the hooks' (`regroup.diagnostics.hooks`); the trainer never asks which
algorithm it runs and never names a variant's metrics. It builds nothing: `regroup.train.build.build_trainer`
hands it its parts and recipe.

Data parallelism (accelerate): every process draws the same global batch of questions and samples its
own contiguous slice of whole groups; stages that need the whole batch (advantages, dynamic sampling)
gather through the step context; loss normalisers are global totals and each rank's loss is multiplied
by the world size (DDP averages gradients), so the update equals the single-process one. Only rank 0
writes logs and checkpoints.
"""

from __future__ import annotations

import math
import shutil
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import gather, gather_object, pad_across_processes, reduce

from regroup.algo.loss_inputs import Mean, build_loss_inputs
from regroup.algo.losses import LossTotals, policy_loss, rows_with_gradient
from regroup.batch import RolloutBatch, collate
from regroup.diagnostics import logprob_gap
from regroup.diagnostics.hooks import UpdateHook, hook_states, load_hook_states
from regroup.models.logprobs import prompt_order, response_logps, use_shared_prefix
from regroup.models.prompting import encode_prompt, encode_response
from regroup.rollout.base import SamplingParams
from regroup.rollout.producer import build_producer
from regroup.runtime.checkpoint import (
    CheckpointError,
    CheckpointRefused,
    check_resume_config,
    check_resume_steps,
    checkpoint_step,
    latest_valid_checkpoint,
    load_model_weights,
    load_run_config,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from regroup.runtime.metrics import MetricsLogger, tracker_names
from regroup.runtime.sample_log import SampleLog
from regroup.runtime.sharded import (
    TRAINING_STATE_DIR,
    full_state_dict,
    is_sharded,
    load_training_state,
    save_training_state,
    write_hf_weights,
)
from regroup.stages.base import StepBatch, StepContext, load_stage_states, merge_rounds, run_stages, stage_states
from regroup.train.data_stream import QuestionStream
from regroup.train.row_balance import forwarded_rows
from regroup.train.run_config import save_config

PROMPT_CACHE_SIZE = 8192


@dataclass
class RowTensors:
    """Per-row tensors of one update, in the update's row order: advantages [B], sample weights [B] (None: all 1),
    and π_old / π_ref log-probs [B, T] when they were computed (None: not needed)."""

    advantages: torch.Tensor
    weights: torch.Tensor | None = None
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None


def add_means(sums: dict[str, list[float]], metrics: dict[str, Mean]) -> None:
    """Add one micro-batch's loss metrics (`Mean`s: a sum and a count each) to the step's running [sum, count]."""
    for name, mean in metrics.items():
        total = sums.setdefault(name, [0.0, 0.0])
        total[0] += float(mean.total)
        total[1] += float(mean.n)


def finish_means(sums: dict[str, list[float]]) -> dict[str, float]:
    """The step's value of each loss metric: Σ sum / Σ count over its micro-batches (0 when it counted nothing)."""
    return {name: total / max(count, 1.0) for name, (total, count) in sums.items()}


def _implements(hook, method: str) -> bool:
    """Whether `hook` has a `method` of its own: one that leaves UpdateHook's no-op in place is not called."""
    return getattr(type(hook), method, None) not in (None, getattr(UpdateHook, method))


class Trainer:
    """`Trainer(parts, recipe, run_dir)`: parts from `regroup.train.build.build_parts`, recipe from
    `regroup.train.recipes.build_recipe`; `regroup.train.build.build_trainer(cfg, run_dir)` builds all three."""

    def __init__(self, parts, recipe, run_dir: str | Path, *, resume: bool = False, log=print):
        cfg = self.cfg = parts.cfg
        self.parts, self.recipe = parts, recipe
        self.run_dir = Path(run_dir)
        self.log = log
        self.acc = parts.accelerator
        self.model, self.tokenizer, self.reference = parts.model, parts.tokenizer, parts.reference
        self.optimizer, self.scheduler, self.sampler = parts.optimizer, parts.scheduler, parts.sampler
        self.task, self.problems = parts.task, parts.problems
        self.prompter = parts.prompter  # None: the plain one-turn prompt (`models.prompting.encode_prompt`)
        self.is_main = self.acc.is_main_process
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        if cfg.grpo.prompts_per_step % self.world:
            raise ValueError(
                f"grpo.prompts_per_step ({cfg.grpo.prompts_per_step}) must divide by the {self.world} processes"
            )
        self.pad_id = self.tokenizer.pad_token_id
        self.stream = QuestionStream(self.problems, cfg.data.seed + cfg.seed)
        self.total_steps = parts.total_steps
        self.update_hooks = list(parts.update_hooks)  # diagnostics, evaluation (regroup.diagnostics.hooks), run blind
        self.shared_prefix = use_shared_prefix(cfg.grpo.shared_prefix, self.acc.device)
        self._prompt_ids: dict[str, list[int]] = {}
        self.skipped_long = 0
        self.ctx = self._context()
        self.producer = build_producer(self) if cfg.rollout.async_steps else None  # async: where batches come from
        # pi_old is the engine's own log-probs where it scored its tokens (async, the behaviour correction)
        self.old_from_sampler = self.producer is not None and cfg.rollout.async_correction == "behaviour"
        self.step = 0
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = MetricsLogger(
            self.run_dir,
            cfg.to_dict(),
            enabled=self.is_main,
            warn=log,
            accelerator=self.acc,
            trackers=tracker_names(cfg.train),
        )
        self.sample_log = SampleLog(
            self.run_dir, cfg.train.sample_every, enabled=self.is_main, tb_writer=self.logger.tensorboard_writer()
        )
        resumed = self._resume() if resume else None
        if self.is_main:  # after the resume's checks: a refused resume leaves the folder's config.yaml as it was
            save_config(cfg, self.run_dir / "config.yaml")
        if resumed:
            self.log(resumed)

    # ------------------------------------------------------------------------------------------ context
    def _encode(self, text: str) -> list[int]:
        """Prompt ids of a question, remembered for the recent questions (bounded: a long run over a large
        data set would otherwise keep every prompt it ever saw)."""
        ids = self._prompt_ids.pop(text, None)
        if ids is None:
            ids = self.prompter.encode(text) if self.prompter is not None else encode_prompt(self.tokenizer, text)
        self._prompt_ids[text] = ids  # most recent last
        if len(self._prompt_ids) > PROMPT_CACHE_SIZE:
            del self._prompt_ids[next(iter(self._prompt_ids))]
        return ids

    def _context(self) -> StepContext:
        cfg = self.cfg
        return StepContext(
            seed=cfg.seed,
            num_generations=cfg.grpo.num_generations,
            samples_multiplier=cfg.grpo.samples_multiplier,
            n_variants=self.recipe.n_variants,
            world=self.world,
            rank=self.rank,
            sampler=self.sampler,
            sampling_params=SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens, n=1),
            encode_prompt=self._encode,
            encode_response=partial(encode_response, self.tokenizer),
            gather=self._gather,
            global_sum=self._global_sum,
            warn=self.log,
        )

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor across processes (variable lengths allowed), rank order."""
        if self.world == 1:
            return tensor
        lengths = gather(torch.tensor([tensor.numel()], device=self.acc.device))
        padded = gather(pad_across_processes(tensor.to(self.acc.device), dim=0))
        size = padded.numel() // self.world
        return torch.cat([padded[r * size : r * size + int(n)] for r, n in enumerate(lengths.tolist())]).cpu()

    def _global_sum(self, value: float) -> float:
        if self.world == 1:
            return value
        return float(reduce(torch.tensor([value], dtype=torch.float64, device=self.acc.device), reduction="sum"))

    def _global_max(self, value: float) -> float:
        if self.world == 1:
            return value
        return float(gather(torch.tensor([value], dtype=torch.float64, device=self.acc.device)).max())

    # ------------------------------------------------------------------------------------------ collect
    def _draw(self, step: int, round_: int) -> StepBatch:
        """This process's slice of the next global batch of questions; group ids unique within the step."""
        pps = self.cfg.grpo.prompts_per_step
        questions = [p for p in self.stream.next_batch(pps) if self._prompt_fits(p)]
        drawn = pps
        while len(questions) < pps:  # every process draws the same stream, so all skip the same questions
            if drawn >= 100 * pps:
                raise ValueError(
                    f"{drawn - len(questions)} of {drawn} questions in a row are longer than "
                    f"data.max_prompt_tokens={self.cfg.data.max_prompt_tokens}: raise the limit or check the data"
                )
            questions += [p for p in self.stream.next_batch(1) if self._prompt_fits(p)]
            drawn += 1
        self.skipped_long += drawn - pps
        per_rank = pps // self.world
        first = self.rank * per_rank
        base = (step * self.recipe.features.draw_rounds + round_) * pps
        return StepBatch(
            step=step,
            problems=questions[first : first + per_rank],
            group_ids=[base + first + i for i in range(per_rank)],
        )

    MAX_CHARS_PER_TOKEN = 64
    """A question longer than max_prompt_tokens x this many characters is too long without tokenizing it."""

    def _prompt_fits(self, problem) -> bool:
        """Whether the question's prompt is within `data.max_prompt_tokens` (an over-long one is skipped and
        counted as `data/skipped_long`, never sampled: one 50 MB question once took 18.9 GB before dying)."""
        limit = self.cfg.data.max_prompt_tokens
        if len(problem.question) > limit * self.MAX_CHARS_PER_TOKEN:
            return False
        return len(self._encode(problem.question)) <= limit

    def collect(self, step: int) -> tuple[StepBatch, dict]:
        """Run the recipe's stages for `step`: sample, reward, and whatever the recipe adds, up to masks."""
        extra_rounds: list[dict] = []

        def refill(round_: int) -> StepBatch:  # dynamic sampling draws more questions through the same stages
            extra = self._draw(step, round_)
            extra_rounds.append(run_stages(self.recipe.collect_stages(), extra, self.ctx))
            return extra

        self.ctx.refill = refill
        batch = self._draw(step, 0)
        metrics: dict[str, float] = {}
        for stage in self.recipe.stages:
            metrics.update(stage(batch, self.ctx) or {})
        if extra_rounds:  # what the refill rounds cost counts too
            metrics = merge_rounds(self.recipe.stages, metrics, extra_rounds)
        metrics["data/skipped_long"] = float(self.skipped_long)  # since the start of the run
        return batch, metrics

    # ------------------------------------------------------------------------------------------- update
    def _logps_no_grad(self, model_fn, batch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor:
        """Log-probs [B, T] of the rows `rows` under `model_fn(mb)` (0 elsewhere: those rows are never read)."""
        out = torch.zeros(batch.completion_mask.shape, device=batch.completion_mask.device)  # [B, T]
        with torch.no_grad():
            for mb in rows.split(self.cfg.grpo.micro_batch_size):
                out[mb] = model_fn(batch.select(mb)).float()
        return out

    def _mini_batches(self, n: int) -> list[range]:
        """`grpo.mini_batches` contiguous row ranges, one optimizer step each (advantages were computed over
        whole groups before the split, so a group may span two mini-batches)."""
        k = self.cfg.grpo.mini_batches
        return [range(round(i * n / k), round((i + 1) * n / k)) for i in range(k)]

    def update(self, step_batch: StepBatch) -> dict:
        """Train on one rollout (SPEC §1): order its rows, compute π_old and π_ref once, then per pass
        (`grpo.num_iterations`) and mini-batch: each micro-batch's loss inputs → loss → backward, and one optimizer
        step per mini-batch. The loss's metrics of the first pass are averaged over the step, whatever they are."""
        g, samples = self.cfg.grpo, step_batch.samples
        if self._global_sum(float(len(samples))) == 0:
            self.log(f"step {step_batch.step + 1}: no samples left to train on (every group filtered); update skipped")
            return {"skipped_empty": 1.0}
        if not samples:  # another process has samples: join its collectives with a zero-weight row
            return self._empty_update()
        if step_batch.advantages is None:  # the recipe's advantages stage sets them on every non-empty step
            raise RuntimeError("update: the step batch has no advantages (no advantages stage ran)")
        # Rows of one prompt side by side, so a micro-batch shares few prompt forwards (anchors join their group).
        order = prompt_order(samples) if self.shared_prefix else list(range(len(samples)))
        batch = self._to_device(collate([samples[i] for i in order], self.pad_id))
        rows = RowTensors(
            advantages=step_batch.advantages[order].to(self.acc.device),  # [B]
            weights=None if step_batch.weights is None else step_batch.weights[order].to(self.acc.device),  # [B]
        )
        metrics = self._before_update(batch, rows, step_batch.step)
        self._gap_sums: dict = {}  # the sampler's log-probs against the learner's (`diagnostics.logprob_gap`)
        minis = self._mini_batches(len(batch))
        forwarded = self._forwarded_rows(minis, rows)  # [n] row indices per mini-batch
        metrics["update/forwarded_frac"] = sum(map(len, forwarded)) / len(batch)
        # π_old once per rollout, before the first update, whenever it can differ from π_θ (else the loss inputs take
        # π_θ detached, as TRL does); π_ref once when the loss has a KL term.
        all_forwarded = torch.cat(forwarded)  # [N]
        if g.num_iterations > 1 or g.mini_batches > 1:
            rows.old_logps = self._logps_no_grad(lambda mb: self._score(self.model, mb), batch, all_forwarded)
        if self.reference:
            score_ref = lambda mb: self.reference(lambda m: self._score(m, mb))
            rows.ref_logps = self._logps_no_grad(score_ref, batch, all_forwarded)
        sums: dict[str, list[float]] = {}
        for iteration in range(g.num_iterations):
            for mini, mini_forwarded in zip(minis, forwarded):
                totals = self._totals(batch, mini)  # normalisers count every row of the mini-batch, forwarded or not
                micro = mini_forwarded.split(g.micro_batch_size)  # row indices [<= micro_batch_size] each
                loss_total = 0.0
                for k, mb in enumerate(micro):
                    loss, loss_metrics = self._micro_step(
                        batch.select(mb), rows, mb, totals, iteration, k + 1 == len(micro)
                    )
                    loss_total += loss
                    if iteration == 0:
                        add_means(sums, loss_metrics)
                metrics.update(self._optimizer_step(loss_total))
        metrics.update(finish_means(sums))
        metrics.update(logprob_gap.finish(self._gap_sums))
        return metrics

    def _score(self, model, mb: RolloutBatch) -> torch.Tensor:
        """Log-probs [b, T] of a micro-batch's response tokens under `model`, at the sampling temperature."""
        return response_logps(model, mb, self.cfg.rollout.temperature, shared_prefix=self.shared_prefix)[0]

    def _before_update(self, batch: RolloutBatch, rows: RowTensors, step: int) -> dict:
        """The update hooks' `before_update` metrics (the diagnostics that read the step's batch first)."""
        metrics: dict = {}
        for hook in self.update_hooks:
            if _implements(hook, "before_update"):
                model = self.acc.unwrap_model(self.model)
                metrics.update(hook.before_update(model, batch, rows.advantages, step))
        return metrics

    def _forwarded_rows(self, minis: list[range], rows: RowTensors) -> list[torch.Tensor]:
        """Each mini-batch's rows that can move a weight (`rows_with_gradient`; every row without
        `grpo.skip_zero_gradient_rows`), the same count on every process."""
        spec = self.recipe.loss
        if self.cfg.grpo.skip_zero_gradient_rows:
            carries = rows_with_gradient(rows.advantages, rows.weights, spec.moves_every_row)  # [B]
        else:
            carries = torch.ones(len(rows.advantages), dtype=torch.bool)  # [B]
        return [forwarded_rows(mini, carries.cpu(), self._global_max) for mini in minis]

    def _totals(self, batch: RolloutBatch, mini: range) -> LossTotals:
        """The loss normalisers of one mini-batch: its loss tokens and rows summed over every process."""
        mask = batch.completion_mask[mini.start : mini.stop]  # [R, T]
        return LossTotals(
            total_tokens=self._global_sum(float(mask.sum())),
            total_sequences=int(self._global_sum(float(len(mask)))),
            max_completion_length=self.cfg.rollout.max_new_tokens,
        )

    def _micro_step(
        self, part: RolloutBatch, rows: RowTensors, mb: torch.Tensor, totals: LossTotals, iteration: int, last: bool
    ) -> tuple[float, dict]:
        """Forward one micro-batch, build its loss inputs, compute the recipe's loss and backward it; returns the
        loss's value and metrics. DDP all-reduces the gradients on the mini-batch's last micro-batch only."""
        spec = self.recipe.loss
        with self.acc.no_sync(self.model) if (not last and self.world > 1) else nullcontext():
            logps, entropy = response_logps(
                self.model,
                part,
                self.cfg.rollout.temperature,
                with_entropy=iteration == 0,
                shared_prefix=self.shared_prefix,
                entropy_grad=spec.needs_entropy,
            )  # [b, T] x2
            old, inputs = build_loss_inputs(
                spec,
                logps,
                rows.advantages[mb],
                part.completion_mask,
                old_logps=None if rows.old_logps is None else rows.old_logps[mb],
                sampler_logps=part.behaviour_logps,
                sampler_rows=part.behaviour_rows,
                sampled_mask=part.sampled_mask,
                old_from_sampler=self.old_from_sampler,
                ref_logps=None if rows.ref_logps is None else rows.ref_logps[mb],
                sample_weight=None if rows.weights is None else rows.weights[mb],
                entropy=entropy,
            )
            loss, metrics = policy_loss(logps, old, inputs, spec, totals)
            self.acc.backward(loss * self.world)  # DDP averages over ranks; normalisers are global
        if iteration == 0:
            logprob_gap.accumulate(self._gap_sums, part, logps.detach())  # sampler vs learner, on the trained tokens
        return float(loss.detach()), metrics

    def _empty_update(self) -> dict:
        """This process kept no sample (dynamic sampling): it joins the collectives the others make, in
        their order — each mini-batch's forwarded-row count, then per optimizer step the two normaliser
        sums and a zero-loss forward/backward on a two-token row — so DDP's all-reduce and the schedule
        stay in step."""
        g = self.cfg.grpo
        row = torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.acc.device)
        metrics: dict = {}
        for _ in range(g.mini_batches):
            self._global_max(0.0)
        for _ in range(g.num_iterations * g.mini_batches):
            self._global_sum(0.0)  # total_tokens
            self._global_sum(0.0)  # total_sequences
            logits = self.model(input_ids=row, attention_mask=torch.ones_like(row), use_cache=False).logits
            self.acc.backward(logits.float().sum() * 0.0)
            metrics = self._optimizer_step(0.0)
        return metrics

    def _optimizer_step(self, loss_total: float) -> dict:
        """Clip, then step unless the loss or the gradient is not finite (then the weights stay as they were)."""
        grad_norm = self.acc.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
        grad_norm = float(grad_norm) if grad_norm is not None else math.nan
        finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped step still advances the schedule, on purpose
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        return {
            "loss": loss_total,
            "grad_norm": grad_norm,
            "skipped_nonfinite": float(not finite),
            "lr": self.scheduler.get_last_lr()[0],
        }

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        if self.acc.device.type == "cpu":
            return batch
        return RolloutBatch(**{k: v.to(self.acc.device) for k, v in batch.__dict__.items()})

    # ------------------------------------------------------------------------------------------- loop
    def train_step(self, step: int) -> dict:
        t0 = time.perf_counter()
        model = self.acc.unwrap_model(self.model)
        batch, metrics = self.producer.take(step, model) if self.producer else self.collect(step)
        for hook in self.update_hooks:
            if _implements(hook, "after_collect"):
                metrics.update(hook.after_collect(batch))
        self.sample_log.maybe_log(step + 1, batch)
        t1 = time.perf_counter()
        metrics.update(self.update(batch))
        t2 = time.perf_counter()
        if self.producer is not None:
            self.producer.publish(step + 1, model)  # a snapshot; the engine loads it when a batch needs it
        else:
            self.sampler.sync_weights(model)
        metrics["time/sync"] = time.perf_counter() - t2  # weight push to the sampler (0 for the HF loop)
        metrics["time/update"] = time.perf_counter() - t1
        metrics["time/step"] = time.perf_counter() - t0
        metrics = self._reduce_metrics(metrics)
        for hook in self.update_hooks:  # on the step's reduced metrics: held-out evaluation, the signal watch
            if _implements(hook, "after_step"):
                metrics.update(hook.after_step(step, metrics))
        return metrics

    def _reduce_metrics(self, metrics: dict) -> dict:
        """One record of the step's metrics, the same on every process.

        `loss` is summed: each rank's loss is its share of a loss normalised by global totals, so the sum
        is the single-process loss. Every other metric is the mean over the processes that reported it
        (counts are per-process means). Keys may differ between ranks (a loss modifier reports only where
        it acted), so the key set is agreed first: reducing tensors of different lengths
        hangs the collective. A non-finite value on any rank stays non-finite (logged as null).
        """
        if self.world == 1:
            return metrics
        summed = {"loss"}  # a rank's share of a global quantity
        keys = sorted(set(gather_object(list(metrics))))
        values = [float(metrics.get(k, 0.0)) for k in keys]
        present = [float(k in metrics) for k in keys]
        both = torch.tensor([values, present], dtype=torch.float64, device=self.acc.device)  # [2, K]
        totals, counts = reduce(both, reduction="sum").cpu().tolist()
        return {k: total if k in summed else total / count for k, total, count in zip(keys, totals, counts)}

    def _finished(self) -> bool:
        return self.step >= self.total_steps

    def train(self, on_step=None) -> dict:
        """Run to `train.steps` (or `train.epochs` passes over the questions); returns the last step's metrics.
        However it ends (done, an error, Ctrl-C), the producer stops and the sampler's files go (`close`)."""
        try:
            return self._train(on_step)
        finally:
            try:
                if self.producer is not None:
                    self.producer.close()
            finally:
                close = getattr(self.sampler, "close", None)  # the server sampler's weight folders
                if close is not None:
                    close()

    def _train(self, on_step) -> dict:
        metrics: dict = {}
        every = self.cfg.train.checkpoint_every
        while not self._finished():
            metrics = self.train_step(self.step)
            self.step += 1
            self.logger.log(self.step, metrics)
            if on_step is not None and self.is_main:
                on_step(self.step, metrics)
            if (every and self.step % every == 0) or self._finished():
                self.save()
        self.logger.close()
        self.sample_log.close()
        return metrics

    # ------------------------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "stream": self.stream.state_dict(),
            "stages": stage_states(self.recipe.stages),
            "hooks": hook_states(self.update_hooks),
            "async": self.producer.state_dict() if self.producer is not None else None,
        }

    def save(self) -> Path | None:
        pause = self.producer.paused(self.step) if self.producer is not None else nullcontext()
        with pause:  # async: the producer holds still at a batch boundary while its state is written
            return self._save()

    def _save(self) -> Path | None:
        self.acc.wait_for_everyone()
        if is_sharded(self.acc):
            return self._save_sharded()
        path = None
        if self.is_main:
            path = save_checkpoint(
                self.run_dir,
                self.step,
                self.acc.unwrap_model(self.model),
                self.tokenizer,
                self.state(),
                keep=self.cfg.train.keep_checkpoints,
                config=self.cfg.to_dict(),
            )
        self.acc.wait_for_everyone()
        return path

    def _save_sharded(self) -> Path | None:
        """FSDP / ZeRO-3: every process joins the weight gather and writes its optimizer shards; rank 0 then
        writes the checkpoint (full HF weights + those shards + trainer state) atomically as usual."""
        weights = full_state_dict(self.acc, self.model)  # collective; the full tensors on rank 0
        staging = self.run_dir / "checkpoints" / f".sharded-step-{self.step:06d}"
        save_training_state(self.acc, staging)  # collective: each process its own shards
        path = None
        if self.is_main:
            assert weights is not None, "full_state_dict returns the full weights on rank 0"

            def write_weights(folder: Path) -> None:
                write_hf_weights(self.acc.unwrap_model(self.model), weights, folder)
                self.tokenizer.save_pretrained(folder)
                (staging / TRAINING_STATE_DIR).rename(folder / TRAINING_STATE_DIR)

            state = self.state()
            state["optimizer"] = None  # sharded: restored from accelerate_state/ on every process
            path = save_checkpoint(
                self.run_dir,
                self.step,
                self.acc.unwrap_model(self.model),
                self.tokenizer,
                state,
                keep=self.cfg.train.keep_checkpoints,
                write_weights=write_weights,
                config=self.cfg.to_dict(),
            )
            shutil.rmtree(staging, ignore_errors=True)
        self.acc.wait_for_everyone()
        return path

    def _resume(self) -> str:
        """Restore the newest valid checkpoint; returns the line saying where the run goes on from."""
        path = latest_valid_checkpoint(self.run_dir, warn=self.log)
        if path is None:
            self.logger.truncate_after(0)  # steps logged before the crash are logged again
            self.sample_log.truncate_after(0)
            return f"no checkpoint in {self.run_dir}; starting from step 0"
        check_resume_config(path, load_run_config(path), self.cfg.to_dict(), f"{self.run_dir / 'config.yaml'}")
        check_resume_steps(path, self.total_steps, "train.epochs" if self.cfg.train.epochs else "train.steps")
        state = load_trainer_state(path)
        if "stages" not in state or "hooks" not in state:
            raise CheckpointRefused(
                f"{path} was written by an older regroup (its trainer state has no stage and hook states); a resume "
                "needs a checkpoint written by this version (its weights are safe to use: model.path=PATH)"
            )
        if state.get("step") != checkpoint_step(path) or isinstance(state.get("step"), bool):
            raise CheckpointError(
                f"{path}: its trainer state is of step {state.get('step')!r}, not {checkpoint_step(path)}"
            )
        if self.producer is not None:  # checked before any state is restored: a refusal leaves the run as it was
            vocab = self.acc.unwrap_model(self.model).get_input_embeddings().num_embeddings
            try:
                self.producer.load_state_dict(state.get("async"), state["step"], vocab)
            except CheckpointError as e:
                raise CheckpointError(f"{path}: {e}") from None
        if state.get("optimizer") is None:  # a sharded run's checkpoint: weights and optimizer shards
            load_training_state(self.acc, path)
        else:
            load_model_weights(self.acc.unwrap_model(self.model), path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        load_stage_states(self.recipe.stages, state["stages"])
        load_hook_states(self.update_hooks, state["hooks"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        if self.producer is None:  # async: the engine loads this step's weights before its first batch
            self.sampler.sync_weights(self.acc.unwrap_model(self.model))
        self.logger.truncate_after(self.step)
        self.sample_log.truncate_after(self.step)
        return f"resumed from {path} at step {self.step}"

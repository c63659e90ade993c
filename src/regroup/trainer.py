"""The training loop, and only the loop: collect → reward → (anchors) → advantages → (masks) → update →
log → checkpoint. Which pieces run is the recipe's business (`regroup.recipes`), decided at start-up.

Data parallelism (accelerate): every process draws the same global batch of questions and samples its
own contiguous slice of whole groups; rewards are gathered so advantages are those of one process;
loss normalisers are global totals and each rank's loss is multiplied by the world size (DDP averages
gradients), so the update equals the single-process one. Only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

from regroup.algo.advantages import group_advantages
from regroup.algo.losses import policy_loss
from regroup.algo.ratios import truncated_is_weight
from regroup.batch import RolloutBatch, Sample, collate
from regroup.checkpoint import (
    latest_valid_checkpoint, load_model_weights, load_trainer_state, rng_state, save_checkpoint, set_rng_state,
)
from regroup.config import RunConfig, save_config
from regroup.data_stream import QuestionStream
from regroup.logprobs import response_logps
from regroup.metrics import MetricsLogger
from regroup.models.prompting import encode_response
from regroup.recipes import build_recipe
from regroup.rollout.base import SamplingParams
from regroup.stages.diagnostics import build_embedder, group_diversity, reward_diagnostics
from regroup.stages.grad_conflict import gradient_conflict
from regroup.stages.groups import expand_groups, sampling_seed


PROMPT_CACHE_SIZE = 8192


def lr_lambda(warmup_steps: int, total_steps: int, schedule: str, min_ratio: float):
    """Linear warm-up from lr/(warmup+1) (never a step at lr 0), then cosine to min_ratio·lr or constant."""

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, accelerator=None, log=print):
        from regroup.setup import build_run

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.log = log
        parts = build_run(cfg, self.run_dir, accelerator=accelerator, log=log)
        self.acc = parts.accelerator
        self.model, self.tokenizer, self.reference = parts.model, parts.tokenizer, parts.reference
        self.optimizer, self.scheduler, self.sampler = parts.optimizer, parts.scheduler, parts.sampler
        self.task, self.problems = parts.task, parts.problems
        self.prompter = parts.prompter
        self.is_main = self.acc.is_main_process
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        if cfg.grpo.prompts_per_step % self.world:
            raise ValueError(f"grpo.prompts_per_step ({cfg.grpo.prompts_per_step}) must divide by the {self.world} processes")
        self.pad_id = self.tokenizer.pad_token_id
        self.recipe = build_recipe(cfg, self.task, lambda text: encode_response(self.tokenizer, text), self.run_dir)
        self.stream = QuestionStream(self.problems, cfg.data.seed + cfg.seed)
        self.embedder = build_embedder(cfg.diagnostics.embedder) if cfg.diagnostics.diversity_every else None
        self._prompt_ids: dict[str, list[int]] = {}
        self.step = 0
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.yaml")
        self.logger = MetricsLogger(self.run_dir, cfg.train.tensorboard, cfg.train.wandb, cfg.to_dict(), enabled=self.is_main)
        if resume:
            self._resume()

    # ------------------------------------------------------------------------------------------ rollout
    def _encode(self, text: str) -> list[int]:
        """Prompt ids of a question, remembered for the recent questions (bounded: a long run over a large
        data set would otherwise keep every prompt it ever saw)."""
        ids = self._prompt_ids.pop(text, None)
        if ids is None:
            ids = self.prompter.encode(text)
        self._prompt_ids[text] = ids  # most recent last
        if len(self._prompt_ids) > PROMPT_CACHE_SIZE:
            del self._prompt_ids[next(iter(self._prompt_ids))]
        return ids

    def collect(self, step: int) -> tuple[list[Sample], dict]:
        """Sample this process's groups for `step` and reward them; anchors join here."""
        cfg, recipe = self.cfg, self.recipe
        questions = self.stream.next_batch(cfg.grpo.prompts_per_step)
        per_rank = len(questions) // self.world
        first = self.rank * per_rank
        local = questions[first : first + per_rank]
        group_ids = [step * cfg.grpo.prompts_per_step + first + i for i in range(per_rank)]
        variants = recipe.variants.variants(local) if recipe.variants else None
        reserved = recipe.anchors.reserved_slots(local) if recipe.anchors else None
        slots = expand_groups([p.question for p in local], variants, group_ids, cfg.grpo.num_generations,
                              cfg.grpo.samples_multiplier, reserved)
        rows = [(slot, j) for slot in slots for j in range(slot.num_samples)]
        seeds = [sampling_seed(cfg.seed, step, s.group_id, s.variant) * 64 + j for s, j in rows]
        params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens, n=1)

        t0 = time.perf_counter()
        completions = self.sampler.generate([self._encode(s.text) for s, _ in rows], params, seed=seeds)
        t1 = time.perf_counter()
        samples = []
        for (slot, _), c in zip(rows, completions):
            problem = local[slot.question_index]
            own_prompt = self._encode(slot.text)
            samples.append(Sample(
                group_id=slot.group_id, question_id=problem.id, variant=slot.variant, is_anchor=False,
                prompt_ids=own_prompt,
                ratio_prompt_ids=self._encode(problem.question) if recipe.ratio_on_original else own_prompt,
                response_ids=c.token_ids, response_text=c.text, behaviour_logps=c.logps, truncated=c.truncated,
                reward=recipe.reward_fn(c.text, problem), problem=problem,
            ))
        metrics = {}
        if recipe.anchors:
            samples, anchor_metrics = recipe.anchors.inject(samples, local, group_ids, [self._encode(p.question) for p in local])
            recipe.anchors.observe(samples)
            metrics.update(anchor_metrics)
        t2 = time.perf_counter()
        generated = sum(len(c.token_ids) for c in completions)
        metrics.update({"time/rollout": t1 - t0, "time/reward": t2 - t1, "tokens/generated": float(generated),
                        "tokens_per_s": generated / max(t1 - t0, 1e-9)})
        return samples, metrics

    # ------------------------------------------------------------------------------------------- update
    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor across processes (variable lengths allowed), rank order."""
        if self.world == 1:
            return tensor
        from accelerate.utils import gather, pad_across_processes

        lengths = gather(torch.tensor([tensor.numel()], device=self.acc.device))
        padded = gather(pad_across_processes(tensor.to(self.acc.device), dim=0))
        size = padded.numel() // self.world
        return torch.cat([padded[r * size : r * size + int(n)] for r, n in enumerate(lengths.tolist())]).cpu()

    def _global_sum(self, value: float) -> float:
        if self.world == 1:
            return value
        from accelerate.utils import reduce

        return float(reduce(torch.tensor([value], dtype=torch.float64, device=self.acc.device), reduction="sum"))

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """SPEC §1 advantages over the whole (all-process) batch, this process's rows."""
        all_rewards, all_groups = self._gather(batch.rewards), self._gather(batch.group_ids)
        adv = group_advantages(all_rewards, all_groups, self.cfg.grpo.adv_scale, self.cfg.grpo.adv_eps)  # [B_all]
        offsets = self._gather(torch.tensor([len(batch)])).tolist()
        start = sum(offsets[: self.rank])
        return adv[start : start + len(batch)]

    def _micro_batches(self, n: int) -> list[slice]:
        size = self.cfg.grpo.micro_batch_size
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _logps_no_grad(self, model_fn, batch: RolloutBatch) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([model_fn(batch.select(mb)) for mb in self._micro_batches(len(batch))])  # [B, T]

    def update(self, samples: list[Sample]) -> dict:
        cfg, g = self.cfg, self.cfg.grpo
        batch = collate(samples, self.pad_id)
        advantages = self.advantages(batch)  # [B]
        metrics = {"adv/abs_mean": float(advantages.abs().mean())}
        sample_weight = None
        if self.recipe.masker:  # SPEC §2a: masks after advantages, over G_mix
            keep, mask_metrics = self.recipe.masker(samples, advantages, batch.group_ids)
            sample_weight = keep.float()  # [B]
            metrics.update(mask_metrics)
        if batch.is_anchor.any():
            anchor_adv = advantages[batch.is_anchor]
            metrics["anchor/adv_mean"] = float(anchor_adv.mean())
        batch = self._to_device(batch)
        d = cfg.diagnostics
        conflict_every = d.grad_conflict_every if d.grad_conflict_every is not None else (10 if cfg.model.path is None else 0)
        if conflict_every and self.step % conflict_every == 0:
            metrics.update(gradient_conflict(
                self.acc.unwrap_model(self.model), batch, advantages.to(self.acc.device),
                param_pattern=d.grad_conflict_params, max_samples=d.grad_conflict_samples, temperature=cfg.rollout.temperature))
        advantages = advantages.to(self.acc.device)
        sample_weight = sample_weight.to(self.acc.device) if sample_weight is not None else None
        anchor_tokens = batch.completion_mask.bool() & ~batch.sampled_mask  # [B, T] forced (off-policy) tokens
        total_tokens = self._global_sum(float(batch.completion_mask.sum()))
        total_sequences = int(self._global_sum(float(len(batch))))
        temperature = cfg.rollout.temperature

        def score(model, mb):
            return response_logps(model, mb, temperature)[0]

        old_logps = self._logps_no_grad(lambda mb: score(self.model, mb), batch) if g.num_iterations > 1 else None
        ref_logps = self._logps_no_grad(lambda mb: self.reference(lambda m: score(m, mb)), batch) if self.reference else None

        sums: dict[str, float] = {}
        for iteration in range(g.num_iterations):
            micro = self._micro_batches(len(batch))
            loss_total = 0.0
            for k, mb in enumerate(micro):
                part = batch.select(mb)
                sync = k == len(micro) - 1
                context = self.acc.no_sync(self.model) if (not sync and self.world > 1) else nullcontext()
                with context:
                    logps, entropy = response_logps(self.model, part, temperature, with_entropy=iteration == 0)
                    old = logps.detach() if old_logps is None else old_logps[mb]  # mu = 1: ratio is 1 (TRL)
                    is_weight = None
                    if cfg.rollout.tis_cap > 0 and bool(part.has_behaviour_logps.all()):
                        is_weight = truncated_is_weight(old, part.behaviour_logps, cfg.rollout.tis_cap)
                    loss, loss_metrics = policy_loss(
                        logps, old, advantages[mb], part.completion_mask,
                        ref_logps=None if ref_logps is None else ref_logps[mb], beta=g.beta,
                        eps_low=g.eps_low, eps_high=g.eps_high, agg=g.loss_agg,
                        total_tokens=total_tokens, total_sequences=total_sequences,
                        max_completion_length=cfg.rollout.max_new_tokens,
                        sample_weight=None if sample_weight is None else sample_weight[mb],
                        anchor_token_mask=anchor_tokens[mb] if bool(anchor_tokens[mb].any()) else None,
                        anchor_ratio=cfg.anchors.ratio, shaping_gamma=cfg.anchors.gamma, is_weight=is_weight,
                        kl_ratio_correction=g.kl_ratio_correction,
                    )
                    self.acc.backward(loss * self.world)  # DDP averages over ranks; normalisers are global
                loss_total += float(loss.detach())
                if iteration == 0:
                    self._accumulate(sums, part, entropy, loss_metrics, anchor_tokens[mb], logps.detach())
            metrics.update(self._optimizer_step(loss_total))
        metrics.update(self._finish_sums(sums))
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
        return {"loss": loss_total, "grad_norm": grad_norm, "skipped_nonfinite": float(not finite),
                "lr": self.scheduler.get_last_lr()[0]}

    @staticmethod
    def _accumulate(sums, part, entropy, loss_metrics, anchor_tokens, logps) -> None:
        on_policy = part.completion_mask.bool() & ~anchor_tokens  # [b, T]
        n_tok = float(on_policy.sum())
        sums["tok"] = sums.get("tok", 0.0) + n_tok
        if entropy is not None:
            sums["entropy"] = sums.get("entropy", 0.0) + float((entropy * on_policy).sum())
        for src, key in (("clip_low_frac", "clip/low_frac"), ("clip_high_frac", "clip/high_frac"), ("kl_mean", "kl")):
            if src in loss_metrics:
                sums[key] = sums.get(key, 0.0) + float(loss_metrics[src]) * n_tok
        if anchor_tokens.any():
            sums["anchor_tok"] = sums.get("anchor_tok", 0.0) + float(anchor_tokens.sum())
            sums["anchor_logp"] = sums.get("anchor_logp", 0.0) + float((logps * anchor_tokens).sum())

    @staticmethod
    def _finish_sums(sums) -> dict:
        out = {}
        tok = max(sums.get("tok", 0.0), 1.0)
        for key in ("entropy", "clip/low_frac", "clip/high_frac", "kl"):
            if key in sums:
                out[key] = sums[key] / tok
        if sums.get("anchor_tok"):
            out["anchor/logp_mean"] = sums["anchor_logp"] / sums["anchor_tok"]
        return out

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        if self.acc.device.type == "cpu":
            return batch
        return RolloutBatch(**{k: v.to(self.acc.device) for k, v in batch.__dict__.items()})

    # ------------------------------------------------------------------------------------------- loop
    def train_step(self, step: int) -> dict:
        t0 = time.perf_counter()
        samples, metrics = self.collect(step)
        metrics.update(reward_diagnostics(samples))
        every = self.cfg.diagnostics.diversity_every
        if self.embedder is not None and every and (step + 1) % every == 0:  # logged steps K, 2K, ...
            metrics["diversity"] = group_diversity(samples, self.embedder)
        t1 = time.perf_counter()
        metrics.update(self.update(samples))
        self.sampler.sync_weights(self.acc.unwrap_model(self.model))
        metrics["time/update"] = time.perf_counter() - t1
        metrics["time/step"] = time.perf_counter() - t0
        return self._reduce_metrics(metrics)

    def _reduce_metrics(self, metrics: dict) -> dict:
        """One record of the step's metrics, the same on every process.

        `loss` is summed: each rank's loss is its share of a loss normalised by global totals, so the sum
        is the single-process loss. Every other metric is the mean over the processes that reported it
        (counts are per-process means). Keys may differ between ranks (anchor metrics exist only where
        an anchor was injected), so the key set is agreed first: reducing tensors of different lengths
        hangs the collective. A non-finite value on any rank stays non-finite (logged as null).
        """
        if self.world == 1:
            return metrics
        from accelerate.utils import gather_object, reduce

        summed = {"loss"}  # a rank's share of a global quantity
        keys = sorted(set(gather_object(list(metrics))))
        values = [float(metrics.get(k, 0.0)) for k in keys]
        present = [float(k in metrics) for k in keys]
        both = torch.tensor([values, present], dtype=torch.float64, device=self.acc.device)  # [2, K]
        totals, counts = reduce(both, reduction="sum").cpu().tolist()
        return {k: total if k in summed else total / count for k, total, count in zip(keys, totals, counts)}

    def train(self, on_step=None) -> dict:
        """Run to cfg.train.steps; returns the last step's metrics."""
        metrics: dict = {}
        every = self.cfg.train.checkpoint_every
        while self.step < self.cfg.train.steps:
            metrics = self.train_step(self.step)
            self.step += 1
            self.logger.log(self.step, metrics)
            if on_step is not None and self.is_main:
                on_step(self.step, metrics)
            if (every and self.step % every == 0) or self.step == self.cfg.train.steps:
                self.save()
        self.logger.close()
        return metrics

    # ------------------------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "stream": self.stream.state_dict(),
            "anchors": self.recipe.anchors.state_dict() if self.recipe.anchors else None,
        }

    def save(self) -> Path | None:
        self.acc.wait_for_everyone()
        path = None
        if self.is_main:
            path = save_checkpoint(self.run_dir, self.step, self.acc.unwrap_model(self.model), self.tokenizer,
                                   self.state(), keep=self.cfg.train.keep_checkpoints)
        self.acc.wait_for_everyone()
        return path

    def _resume(self) -> None:
        path = latest_valid_checkpoint(self.run_dir, warn=self.log)
        if path is None:
            self.log(f"no checkpoint in {self.run_dir}; starting from step 0")
            self.logger.truncate_after(0)  # steps logged before the crash are logged again
            return
        state = load_trainer_state(path)
        load_model_weights(self.acc.unwrap_model(self.model), path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        if self.recipe.anchors and state.get("anchors"):
            self.recipe.anchors.load_state_dict(state["anchors"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.sampler.sync_weights(self.acc.unwrap_model(self.model))
        self.logger.truncate_after(self.step)
        self.log(f"resumed from {path} at step {self.step}")

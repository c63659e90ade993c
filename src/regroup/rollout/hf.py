"""Sampling with the HF model itself: a lean KV-cached loop (faster than `generate` for small models).

`generate()` of transformers runs a stack of logits processors, stopping criteria and cache bookkeeping
per token; for a ~1M-parameter model on CPU that overhead is larger than the forward pass. This loop
does only what sampling needs: one forward per token over the batch's unfinished rows with a
DynamicCache, temperature, top-p, EOS stop. `benchmarks/rollout_speed.py` measures both.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from regroup.rollout.base import Completion, SamplingParams
from regroup.rollout.fast_decode import FastDecoder
from regroup.rollout.fast_decode import supports as fast_supports


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf the logits outside the smallest set whose probability reaches top_p (nucleus)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)  # [N, V]
    cumulative = sorted_logits.softmax(-1).cumsum(-1)  # [N, V]
    drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def distinct_prompt_rows(prompts: list[list[int]], share: bool = True) -> tuple[list[list[int]], list[int]]:
    """(distinct prompts in order of first appearance, index into them of every row). The trainer asks
    for one sample per row (its own seed), so a group's G rows repeat one prompt: it is prefilled once
    and its KV cache copied to the G rows. `share=False` keeps one prefill row per row."""
    if not share:
        return [list(p) for p in prompts], list(range(len(prompts)))
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], rows


DROP_FINISHED_AT = 0.75  # compact the decode batch once at most this share of its rows is still running


class HFSampler:
    """Samples from an HF causal LM with a lean KV-cached loop; shares the training model's weights."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 256,
        use_fast: bool = True,
        shared_prefill: bool = True,
        drop_finished: bool = True,
    ):
        self.model: Any = None  # set by sync_weights below
        self.use_fast = use_fast
        self.shared_prefill = shared_prefill
        """Prefill each distinct prompt of a chunk once and copy its KV cache to its rows."""
        self.drop_finished = drop_finished
        """Drop rows that have ended from the decode batch (same samples; `tests/rollout/test_fast_decode.py`)."""
        self._fast: FastDecoder | None = None
        self.owns_weights = False
        """The model is this sampler's own copy, which the learner's updates do not reach (`build_sampler`
        under async rollouts): versions are loaded into it (`rollout.versions`)."""
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.sync_weights(model)

    def sync_weights(self, model) -> None:
        """Sample from `model`. The lean decoder is chosen here, when the model object is new, not at every
        weight push: it holds views of the weights, which each `generate` re-reads (`FastDecoder.refresh`)."""
        if model is not self.model:
            self._fast = FastDecoder(model) if self.use_fast and fast_supports(model) else None
        self.model = model

    def _decoder(self) -> FastDecoder | None:
        """The lean decoder over the model's own weights when it supports the architecture, else None."""
        if self._fast is not None:
            self._fast.refresh()
        return self._fast

    def _hf_start(self, input_ids, attention, positions, prompt_of_row):
        """Prefill the distinct prompts [U, P] with the HF forward and a DynamicCache, expand it to the rows
        (prompt_of_row [N]); returns (logits [N, V], advance fn)."""
        from transformers import DynamicCache  # heavy (transformers): only the HF-forward path builds a cache

        cache = DynamicCache()
        # transformers >= 5.x calls the KV cache `cache`; older releases `past_key_values`.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # peft
        cache_kw = "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
        box = {"attention": attention}

        def forward(ids, pos):
            return self.model(
                input_ids=ids,
                attention_mask=box["attention"],
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{cache_kw: cache},
            ).logits[:, -1, :]

        logits = forward(input_ids, positions)  # [U, V]
        if len(prompt_of_row) != len(input_ids):
            cache.batch_select_indices(prompt_of_row)
        box["attention"] = attention[prompt_of_row]  # [N, P]

        def advance(next_tok, step_pos):
            ones = torch.ones((box["attention"].shape[0], 1), dtype=box["attention"].dtype, device=next_tok.device)
            box["attention"] = torch.cat([box["attention"], ones], dim=1)
            return forward(next_tok[:, None], step_pos)

        def keep_rows(keep):
            cache.batch_select_indices(keep)
            box["attention"] = box["attention"][keep]  # [A', S]

        return logits[prompt_of_row], advance, keep_rows

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | list[int] | None = None
    ) -> list[Completion]:
        """n completions per prompt (prompt-major).

        `seed` is one int (prompt i then gets seed·1000003 + i) or one seed per prompt. Each prompt's n
        rows draw their noise from that prompt's own generator, so a prompt's completions do not depend
        on which other prompts share the batch, on `batch_size`, or on the process that samples it —
        what makes a 2-process run sample exactly what a 1-process run samples.
        """
        device = next(self.model.parameters()).device
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, (1,)))
        seeds = [seed * 1000003 + i for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
        if len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        expanded = [(i, p) for i, p in enumerate(prompts) for _ in range(params.n)]
        out: list[Completion] = []
        # Chunks hold whole prompts, so one prompt's rows share one generator stream.
        per_chunk = max(1, self.batch_size // params.n) * params.n
        for start in range(0, len(expanded), per_chunk):
            chunk = expanded[start : start + per_chunk]
            gens = {
                i: torch.Generator(device=device).manual_seed(seeds[i] % (2**63))
                for i in dict.fromkeys(i for i, _ in chunk)
            }
            out.extend(self._generate_chunk(chunk, params, gens, device))
        return out

    @staticmethod
    def _gumbel(gens: dict, rows_per_prompt: list[tuple[int, int]], vocab: int, device) -> torch.Tensor:
        """Gumbel noise [N, V], each prompt's rows from that prompt's generator."""
        parts = [torch.rand((n, vocab), generator=gens[i], device=device) for i, n in rows_per_prompt]
        uniform = torch.cat(parts).clamp_(min=1e-20, max=1.0 - 1e-7)  # [N, V]
        return -torch.log(-torch.log(uniform))

    def _generate_chunk(self, chunk, params: SamplingParams, gens, device) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        batch = len(chunk)
        distinct, row_prompts = distinct_prompt_rows([p for _, p in chunk], self.shared_prefill)
        prompt_len = max(len(p) for p in distinct)
        input_ids = torch.full((len(distinct), prompt_len), self.pad_id, dtype=torch.long)  # [U, P], left-padded
        attention = torch.zeros((len(distinct), prompt_len), dtype=torch.long)  # [U, P]
        for row, p in enumerate(distinct):
            input_ids[row, prompt_len - len(p) :] = torch.tensor(p)
            attention[row, prompt_len - len(p) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [U, P]
        prompt_of_row = torch.tensor(row_prompts, device=device)  # [N]

        rows_per_prompt = [(i, sum(1 for j, _ in chunk if j == i)) for i in dict.fromkeys(i for i, _ in chunk)]
        decoder = self._decoder()
        if decoder is not None:
            logits, state = decoder.start(input_ids, attention, positions, params.max_new_tokens, rows=prompt_of_row)

            def advance(next_tok, step_pos):
                return decoder.step(next_tok, step_pos[:, 0], state)

            def keep_rows(keep):
                decoder.keep_rows(state, keep)
        else:
            logits, advance, keep_rows = self._hf_start(input_ids, attention, positions, prompt_of_row)
        positions = positions[prompt_of_row]  # [N, P]
        tokens = torch.full((batch, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)  # [N, T]
        logps = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)  # [N, T]
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [N]
        lengths = torch.full((batch,), params.max_new_tokens, dtype=torch.long, device=device)  # [N]
        active = torch.arange(batch, device=device)  # [A] the rows still in the decode batch
        step_pos = positions[:, -1:]  # [A, 1]
        for t in range(params.max_new_tokens):
            logits = logits.float()  # [A, V]
            if params.temperature > 0:
                scaled = logits / params.temperature
                log_probs = scaled.log_softmax(-1)  # [A, V] behaviour distribution (before top-p, as TRL scores it)
                # Gumbel-max: argmax(logits + Gumbel) is a sample of softmax(logits). Every row of the chunk
                # draws its noise, decoded or not, so dropping finished rows never shifts a prompt's stream.
                noise = self._gumbel(gens, rows_per_prompt, scaled.shape[-1], device)[active]  # [A, V]
                next_tok = (_top_p_filter(scaled, params.top_p) + noise).argmax(-1)  # [A]
            else:
                log_probs = logits.log_softmax(-1)
                next_tok = logits.argmax(-1)
            done = finished[active]  # [A]
            next_tok = torch.where(done, torch.full_like(next_tok, self.pad_id), next_tok)
            tokens[active, t] = next_tok
            logps[active, t] = log_probs.gather(-1, next_tok[:, None]).squeeze(-1).masked_fill(done, 0.0)
            just_ended = (next_tok == self.eos_id) & ~done  # [A]
            lengths[active[just_ended]] = t + 1
            finished[active[just_ended]] = True
            if bool(finished.all()) or t == params.max_new_tokens - 1:
                break
            step_pos = step_pos + 1
            running = ~finished[active]  # [A]
            if self.drop_finished and int(running.sum()) <= DROP_FINISHED_AT * len(active):
                # What vLLM's continuous batching does: stop computing rows that have ended. Compacting only
                # once a quarter of the batch has ended bounds the KV-cache copies to ~log_{4/3} N per chunk.
                keep = running.nonzero().squeeze(-1)  # [A']
                active, step_pos, next_tok = active[keep], step_pos[keep], next_tok[keep]
                keep_rows(keep)
            logits = advance(next_tok, step_pos)
        if was_training:
            self.model.train()

        tokens_cpu, logps_cpu, lengths_cpu, finished_cpu = tokens.cpu(), logps.cpu(), lengths.cpu(), finished.cpu()
        completions = []
        for row, (prompt_index, _) in enumerate(chunk):
            n_tok = int(lengths_cpu[row])
            ids = tokens_cpu[row, :n_tok].tolist()
            completions.append(
                Completion(
                    prompt_index=prompt_index,
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logps=logps_cpu[row, :n_tok].tolist(),
                    truncated=not bool(finished_cpu[row]),
                )
            )
        return completions


class HFGenerateSampler(HFSampler):
    """The same interface through `model.generate` (kept as the measured baseline and for exotic models)."""

    @torch.no_grad()
    def _generate_chunk(self, chunk, params: SamplingParams, gens, device) -> list[Completion]:
        first = next(iter(gens.values()))
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=first)))
        was_training = self.model.training
        self.model.eval()
        batch = self.tokenizer.pad({"input_ids": [p for _, p in chunk]}, return_tensors="pt", padding_side="left")
        sampling = params.temperature > 0
        out = self.model.generate(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            temperature=params.temperature if sampling else None,
            top_p=params.top_p if sampling else None,
            top_k=0 if sampling else None,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
        )
        if was_training:
            self.model.train()
        new = out[:, batch["input_ids"].shape[1] :].cpu()
        completions = []
        for row, (prompt_index, _) in enumerate(chunk):
            ids = new[row].tolist()
            ended = self.eos_id in ids
            ids = ids[: ids.index(self.eos_id) + 1] if ended else ids
            completions.append(
                Completion(prompt_index, ids, self.tokenizer.decode(ids, skip_special_tokens=True), None, not ended)
            )
        return completions

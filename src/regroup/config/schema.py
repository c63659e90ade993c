"""The sections of a run config and their cross-field rules.

A setting is `name: type = F(default, "help", ge=/gt=/le=/lt=)` in a `Section` (`regroup.config.fields`, as the
pieces' knobs are), its help as the docstring under it when it does not fit on the line; every int / float setting
has bounds (a test checks it), and choices are its `Literal` type. A leaf: it imports only `config.fields` and
`regroup.errors` (tests/test_structure.py). "SPEC §N" in this package means section N of docs/spec.md.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import model_validator

from regroup.config import fields
from regroup.config.fields import Bounds, F, Section, check, did_you_mean, parse_override, short
from regroup.errors import ConfigError

INT32 = 2**31 - 1
SEED = Bounds(ge=0, le=INT32)  # numpy seeds must be < 2**32, and seeds are summed (data.seed + seed)
COUNT = Bounds(ge=1, le=INT32)
EVERY = Bounds(ge=0, le=INT32)  # "every K steps", 0: off
MAX_TOKENS = 131072  # longer than any model's context today; stops a typo (1e8) from allocating gigabytes
MAX_GROUP = 1024  # samples per question; beyond it one step's batch no longer fits any accelerator


class LoraConfig(Section):
    """LoRA adapters through peft (real models)."""

    enabled: bool = F(False, "Train LoRA adapters instead of all weights.")
    r: int = F(16, "Adapter rank.", **COUNT)
    alpha: int = F(32, "Adapter scaling numerator (scale = alpha / r).", **COUNT)
    dropout: float = F(0.0, "Dropout on the adapter input.", ge=0.0, lt=1.0)
    target_modules: list[str] = F(["q_proj", "k_proj", "v_proj", "o_proj"], "Module names that get adapters.")


class ModelConfig(Section):
    """Which policy to train."""

    path: Optional[str] = F(None, path=True)
    """A local HF causal-LM directory. None: the built-in tiny model, warmed up (and cached) first."""
    warmup_dir: str = F("runs/warmup", path=True)
    """Where the built-in tiny model's warm-up is cached (used when `path` is None)."""
    gguf_file: Optional[str] = F(None)
    """A GGUF file name inside `path`: loaded dequantized to `dtype`; checkpoints are saved as HF safetensors."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = F("float32")
    """Parameter dtype. bfloat16 on GPUs for real models; float32 for the tiny model on CPU."""
    gradient_checkpointing: bool = F(False, "Recompute activations in the backward pass to save memory.")
    lora: LoraConfig = F(LoraConfig)


class DataConfig(Section):
    """Where training questions come from."""

    task: str = F("arithmetic")
    """Task providing the grader, step scorer and rule rephrasings (a registered task name, or "pkg.mod:obj")."""
    train_file: Optional[str] = F(None, path=True)
    """JSONL / JSON / Parquet / CSV file, HF dataset folder, or hf:NAME[:CONFIG][@SPLIT]. None: generate from the
    task."""
    num_train: int = F(20000, "Questions to generate when `train_file` is None.", ge=1, le=10**8)
    question_field: str = F("question", "Column holding the question.")
    answer_field: str = F("answer", "Column holding the final answer.")
    solution_field: str = F("solution", "Column holding the reference solution (DaGRPO anchors, judge reference).")
    skip_bad_rows: bool = F(False, "Skip and count malformed rows instead of failing on the first one.")
    seed: int = F(1234, "Seed of the generated training set.", **SEED)
    eval_seed: int = F(999, "Seed of the generated held-out set.", **SEED)
    eval_file: Optional[str] = F(None, path=True)
    """Held-out questions for `train.eval_every` (same formats and field mapping as `train_file`)."""
    system_prompt: Optional[str] = F(None, "System message put before every question (chat-template models).")
    prompt_template: Optional[str] = F(None)
    """Template with `{question}` applied to q0 and every rephrasing alike, e.g. "{question}\\nPut the final answer in
    \\boxed{}."."""
    chat_template: Literal["auto", "on", "off"] = F("auto")
    """Wrap prompts with the tokenizer's chat template: auto = when the tokenizer has one (never for the built-in
    task)."""
    max_prompt_tokens: int = F(4096, ge=1, le=MAX_TOKENS)
    """Longest prompt in tokens; a longer question is skipped and counted."""


class RolloutConfig(Section):
    """How responses are sampled."""

    backend: Literal["hf", "hf_generate", "vllm", "vllm_server"] = F("hf")
    """hf: lean KV-cached loop over the HF model; hf_generate: `model.generate`; vllm: colocated vLLM engine;
    vllm_server: a vLLM OpenAI server started separately (`regroup vllm-serve`), over HTTP."""
    temperature: float = F(1.0, gt=0.0, le=100.0)  # 0 would divide the logits by zero
    """Sampling temperature (log-probs for the loss use the same temperature, as TRL does)."""
    top_p: float = F(1.0, "Nucleus sampling threshold.", gt=0.0, le=1.0)
    max_new_tokens: int = F(48, "Longest response; longer ones are truncated (and counted).", ge=1, le=MAX_TOKENS)
    batch_size: int = F(256, "Sequences decoded together.", ge=1, le=65536)
    tis_cap: float = F(0.0, ge=0.0)
    """Importance-sampling cap for sampler/learner mismatch (vLLM): the upper bound of `is_mode`'s weight (truncated) or
    of the ratios kept (masked); 0 disables the correction."""
    is_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = F("token_truncate")
    """How the sampler IS correction weighs the loss (TRL's vllm_importance_sampling_mode): per token or per response
    (the product of its token ratios), truncated at the bounds or zeroed outside them."""
    is_min: float = F(0.0, ge=0.0)
    """Lower bound of the IS correction (TRL's vllm_importance_sampling_clip_min); 0: none."""
    vllm_gpu_memory_utilization: float = F(0.3, gt=0.0, le=1.0)
    """Fraction of GPU memory the colocated vLLM engine may take."""
    vllm_max_model_len: int = F(0, "vLLM engine max model length (0: prompt limit + max_new_tokens).", **EVERY)
    vllm_enable_sleep_mode: bool = F(False, "Let the colocated vLLM engine release GPU memory between rollouts.")
    vllm_tensor_parallel_size: int = F(1, "vLLM tensor-parallel size.", ge=1, le=1024)
    vllm_server_url: str = F("http://127.0.0.1:8000", url=True, resume=True)
    """Root URL of the vLLM server (backend=vllm_server), without /v1."""
    vllm_server_api_key_env: Optional[str] = F(None, resume=True)
    """NAME of the variable holding the server's --api-key; None or "": the server has no key."""
    vllm_server_timeout_s: float = F(600.0, gt=0.0, le=86400.0, resume=True)
    """Deadline of one server request (a prompt's n samples, or a weight sync), in seconds."""
    vllm_server_sync: Literal["reload", "nccl"] = F("reload")
    """Weight sync: reload (learner writes safetensors to vllm_server_sync_dir, server reloads; any device) or nccl
    (vLLM's NCCL weight-transfer API; GPUs only)."""
    vllm_server_sync_dir: Optional[str] = F(None, path=True, resume=True)
    """Folder both learner and server can read (reload sync). None: a temporary folder on this machine."""
    async_steps: int = F(0, ge=0, le=8)
    """Asynchronous rollouts: the engine draws batch t with the policy of k = async_steps updates before (exactly t - k)
    while the learner trains on t - 1; 0: synchronous (sample, then update). Needs an engine with its own weights:
    backend=vllm_server or hf (docs/vllm_server.md, Asynchronous rollouts)."""
    async_correction: Literal["decoupled", "behaviour"] = F("decoupled")
    """pi_old of the loss under async_steps: decoupled (AReaL): the learner's own log-probs before the update (the
    proximal policy) clip the ratio, and tis_cap / is_mode / is_min weigh pi_prox/pi_behaviour; behaviour: the
    engine's log-probs are pi_old (PPO ratio against the sampler itself; tis_cap must be 0)."""
    async_timeout_s: float = F(1800.0, gt=0.0, le=86400.0, resume=True)
    """Async: the longest the learner waits for the engine's next batch (or a checkpoint for it) before it stops with
    one line."""
    logprob_gap_warn: float = F(1.0, gt=0.0, le=1000.0)
    """Warn when the sampler's log-probs differ from the learner's by more than this many nats per trained token on
    average (rollout/logprob_gap_mean): the engine is not running the learner's weights."""
    logprob_gap_stop_steps: int = F(5, ge=0, le=1000000)
    """Stop the run after this many steps in a row with that gap or with missing / NaN behaviour log-probs (0: warn
    only)."""


class GRPOConfig(Section):
    """The GRPO core (SPEC §1)."""

    num_generations: int = F(8, "G: on-policy samples per question (per variant, for TA-GRPO).", ge=1, le=MAX_GROUP)
    prompts_per_step: int = F(16, "Questions per optimizer step.", ge=1, le=65536)
    num_iterations: int = F(1, ge=1, le=1000)
    """mu: updates per rollout batch; pi_old log-probs are computed once before the first."""
    micro_batch_size: int = F(64, ge=1, le=65536)
    """Sequences per forward/backward; gradients are accumulated over the step's batch."""
    eps_low: float = F(0.2, "Lower clip range: ratio >= 1 - eps_low.", ge=0.0, lt=1.0)  # the floor must stay > 0
    eps_high: float = F(0.2, "Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher when > eps_low).", ge=0.0)
    beta: float = F(0.0, "k3 KL coefficient against a frozen reference; the reference is loaded only when > 0.", ge=0.0)
    kl_ratio_correction: bool = F(False)
    """Multiply the k3 term by pi_theta/pi_old (TRL's use_bias_correction_kl, its default); SPEC §1 is plain k3."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_sum_constant"] = F("token_mean")
    """token_mean (TRL dapo), seq_mean_token_mean (TRL grpo), seq_sum_constant (Dr. GRPO)."""
    advantage_estimator: str = F("grpo")
    """The advantage estimator: grpo (group-std normalised), dr_grpo (unscaled, Dr. GRPO), or a
    'package.module:function' (docs/extending.md)."""
    advantage_estimator_args: dict[str, Any] = F(dict)
    """Knobs of grpo.advantage_estimator, e.g. {scale: batch, eps: 1.0e-6} for grpo (docs/losses.md)."""
    samples_multiplier: int = F(1, ge=1, le=1000)
    """Samples of the original question = multiplier x G (grpo_matched uses N+1 to match TA-GRPO)."""
    mini_batches: int = F(1, **COUNT)
    """Optimizer steps per rollout batch: the batch is split into this many mini-batches (TA-GRPO's scripts: 2)."""
    policy_loss: str = F("ppo_clip")
    """The policy-gradient term: ppo_clip, gspo, cispo, sapo, gmpo, vespo, luspo, or a 'package.module:function'
    (docs/losses.md)."""
    policy_loss_args: dict[str, Any] = F(dict)
    """Knobs of grpo.policy_loss, e.g. {clip_max: 5} for cispo or {delta: 4} for ppo_clip (docs/losses.md); checked
    against the loss's own Args before any model loads."""
    kl_estimator: str = F("k3")
    """The KL(pi_theta || pi_ref) estimator beta multiplies: k1, k2, k3 or low_var_kl (verl's clamped k3), or a
    'package.module:function'."""
    kl_estimator_args: dict[str, Any] = F(dict, "Knobs of grpo.kl_estimator (the built-ins have none).")
    entropy_coef: float = F(0.0, ge=0.0)
    """Entropy bonus: minus this times the mean per-token entropy (TRL's entropy_coef); 0: off."""
    loss_terms: list[str] = F([])
    """Extra loss terms, each 'name' or 'name*coefficient' (a built-in such as entropy, or a 'package.module:function'
    returning a per-token term [B, T]; docs/extending.md)."""
    loss_term_args: dict[str, Any] = F(dict)
    """Knobs of the loss terms, by term name: {'my.mod:term': {knob: value}} (docs/extending.md)."""
    off_policy_mask_threshold: Optional[float] = F(None, gt=0.0, le=1e3)
    """OPSM (DeepSeek-V3.2 eq. 9; TRL's off_policy_mask_threshold): drop the policy term of a response with A < 0 whose
    mean KL(sampler || pi_theta) exceeds this, e.g. 0.5; null: off."""
    shared_prefix: Literal["auto", True, False] = F("auto")
    """Forward each distinct prompt once per micro-batch and its responses on that cache (exact). auto: on a CPU only;
    on an accelerator the extra forward's kernel launches cost more than the prompt positions saved
    (`logprobs.use_shared_prefix`, BENCHMARKS.md); true keeps it on for its lower peak memory."""
    skip_zero_gradient_rows: bool = F(True)
    """Leave out of the update's forward the rows that add nothing to the gradient: advantage 0 with beta = 0 (uniform
    groups) or a DaGRPO mask weight of 0 (`algo.losses.rows_with_gradient`). Exact: the loss normalisers still count
    them. `entropy`, `clip/*` and `kl` are then means over the rows forwarded (`update/forwarded_frac`); false
    forwards every row."""


class OptimConfig(Section):
    """AdamW with warm-up and cosine decay."""

    lr: float = F(1e-4, "Peak learning rate.", gt=0.0, le=1.0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0.0, le=1.0)
    beta1: float = F(0.9, "Adam beta1.", ge=0.0, lt=1.0)
    beta2: float = F(0.99, "Adam beta2.", ge=0.0, lt=1.0)
    warmup_steps: int = F(10, **EVERY)
    """Linear warm-up steps (the first full-lr Adam step is what damages a small model)."""
    schedule: Literal["cosine", "constant"] = F("cosine", "Decay after warm-up.")
    min_lr_ratio: float = F(0.1, "Cosine floor as a fraction of lr.", ge=0.0, le=1.0)
    max_grad_norm: float = F(1.0, gt=0.0)
    """Gradient clipping threshold (the norm before clipping is logged); <= 0 would freeze or reverse the update."""


class TAConfig(Section):
    """TA-GRPO: rephrasings pooled into one group (SPEC §3)."""

    enabled: bool = F(False, "Expand each question into N+1 variants whose responses share one group.")
    n_variants: int = F(3, "N: rephrasings per question.", ge=1, le=1000)
    rephraser: str = F("rules")
    """Where variants come from: rules (the task's), dataset (the data's variants), openai (an LLM rewriter), or
    "pkg.mod:obj"."""
    ratio_anchor: Literal["original", "own"] = F("original")
    """original: every ratio on (q0, o) as the paper; own: each response on its own prompt."""
    base_url: str = F("http://127.0.0.1:8000/v1", url=True, resume=True)
    """OpenAI-compatible endpoint of the LLM rewriter (rephraser=openai)."""
    model: str = F("gpt-4-turbo", "Rewriter model name.")
    api_key_env: Optional[str] = F("OPENAI_API_KEY", resume=True)
    """Name of the environment variable holding the rewriter's API key; null or "" for a server without
    authentication."""


class ScorerConfig(Section):
    """Fine-grained scorer for DaGRPO masks."""

    name: str = F("step", "step | judge | similarity (the registered scorers) | a dotted path pkg.mod:obj.")
    base_url: str = F("http://127.0.0.1:8000/v1", "OpenAI-compatible endpoint (judge).", url=True, resume=True)
    model: str = F("gpt-4o", "Judge model name.")
    api_key_env: Optional[str] = F("OPENAI_API_KEY", resume=True)
    """Name of the environment variable holding the API key (the key itself never goes in a config); null or "" for a
    server without authentication."""
    concurrency: int = F(32, "Concurrent judge requests.", ge=1, le=4096)
    timeout_s: float = F(60.0, gt=0.0)
    """Seconds per judge request in all: every attempt, backoff and Retry-After wait included."""
    max_retries: int = F(4, "Retries per request before it is recorded as failed.", ge=0, le=100)
    cache_dir: Optional[str] = F(None, "Disk cache of scores. None: RUN_DIR/cache.", path=True)
    question: Literal["own", "original"] = F("own")
    """Question shown to the judge for a rephrased response: the one it answered (own) or q0 (original)."""
    structured: Literal["json_schema", "choice", "none"] = F("json_schema")
    """How the judge is held to the form the scorer parses: json_schema (OpenAI response_format; OpenAI and vLLM),
    choice (vLLM structured_outputs "1".."10"), none (free text ending SCORE: n, the paper's setup)."""
    max_tokens: int = F(0, ge=0, le=MAX_TOKENS)
    """Judge reply length limit; 0: by mode (json_schema 48, choice 4, none: not sent, the server's own)."""


class MaskConfig(Section):
    """DaGRPO sequence-level gradient rectification (SPEC §2a)."""

    enabled: bool = F(False, "Mask samples whose score does not stand apart from the other side of the group.")
    delta: float = F(3.0, "Margin on the 1-10 score scale.", ge=0.0)
    unit: Literal["sample", "pair"] = F("sample")
    """sample: drop a whole sample not delta clear of the other side; pair: drop only the pairwise advantage terms (A_i
    - A_j)/G of pairs not delta apart (algo.distinctiveness.pair_masked_advantages)."""
    scorer: ScorerConfig = F(ScorerConfig)


class AnchorConfig(Section):
    """DaGRPO off-policy anchors (SPEC §2b)."""

    enabled: bool = F(False, "Inject verified-correct off-policy solutions into groups.")
    count: int = F(1, "Anchors per question.", **COUNT)
    mode: Literal["replace", "add"] = F("replace")
    """replace one on-policy sample per anchor (7+1 for G=8), or add to the group."""
    when: Literal["always", "no_correct"] = F("always")
    """Inject always, or only when no on-policy sample of the question is correct."""
    ratio: Literal["shaped", "plain"] = F("shaped")
    """shaped: A * p/(p+gamma), no clipping (LUFFY); plain: pi_old := stop_grad(pi_theta)."""
    gamma: float = F(0.1, "Policy-shaping gamma.", gt=0.0)
    source: Literal["reference", "self", "both"] = F("reference")
    """reference: the data's solution; self: the policy's own earlier verified responses; both."""
    buffer_size: int = F(4, "Self-bootstrapped anchors kept per question.", **COUNT)
    max_tokens: int = F(0, ge=0, le=MAX_TOKENS)
    """Longest anchor in tokens; a longer reference is not injected and is counted (0: rollout.max_new_tokens)."""

    @model_validator(mode="after")
    def _count_within_source(self) -> AnchorConfig:
        # A question has one reference solution and at most buffer_size self anchors: a larger count would
        # inject fewer anchors than asked, silently (stages/anchors.py takes what there is).
        most = {"reference": 1, "self": self.buffer_size, "both": 1 + self.buffer_size}[self.source]
        if self.enabled and self.count > most:
            has = {
                "reference": "one reference solution",
                "self": f"at most anchors.buffer_size={self.buffer_size} earlier answers",
                "both": f"one reference and at most anchors.buffer_size={self.buffer_size} earlier answers",
            }[self.source]
            fix = (
                "set anchors.count=1, or anchors.source=both (the reference and the policy's own verified answers)"
                if self.source == "reference"
                else "lower anchors.count or raise anchors.buffer_size"
            )
            raise ValueError(
                f"count={self.count} with source={self.source}: a question has {has}, so at most {most} "
                f"anchor{'s' if most > 1 else ''} per question would be injected; {fix}"
            )
        return self


class DynamicSamplingConfig(Section):
    """DAPO dynamic sampling: drop uniform-reward groups and sample more questions until the batch is full."""

    enabled: bool = F(False, "Drop groups whose rewards are all equal and refill the batch with new questions.")
    max_rounds: int = F(3, "Extra sampling rounds per step before training on a batch that is not full.", ge=0, le=1000)


class OverlongConfig(Section):
    """DAPO overlong handling of responses cut at rollout.max_new_tokens."""

    filter: bool = F(False, "Drop truncated responses from the loss (their advantages still count in their group).")
    soft_punish: bool = F(False, "Subtract a linear length penalty in the last `buffer` tokens before max_new_tokens.")
    buffer: int = F(16, "Length of the soft-punishment zone in tokens.", **COUNT)
    penalty: float = F(1.0, "Penalty at max_new_tokens (linear from 0 at max_new_tokens - buffer).", ge=0.0)


class RewardsConfig(Section):
    """Verifiable rewards. A plain list (`rewards=[math]`) sets `functions`."""

    functions: list[str] = F(["task"])
    """task (the task's grader), math (math-verify), or pkg.mod:fn; name*weight to weight; several are summed."""
    correct_threshold: float = F(1.0, finite=True)
    """A response is verified correct when its reward >= this (anchors, self-anchors, eval, the TRL adapter)."""
    workers: int = F(1, ge=1, le=1024, resume=True)
    """Processes grading answers in parallel: the math checker's, and each user reward's (pkg.mod:obj) worker processes,
    that many calls at once."""
    timeout_s: float = F(30.0, ge=0.0, le=86400.0)
    """Deadline per call of a user reward (pkg.mod:obj, any callable), run in a worker process: past it the worker and
    the processes it started are killed and the call scores None, counted as unscored (reward/timeout,
    reward/timeout_frac; a warning when timeouts keep happening). 0: run it in-process, with no deadline."""
    worker_memory_mb: int = F(4096, ge=0, le=2**24, resume=True)
    """Address space of each reward worker process (user rewards, math checker), MiB: a call that allocates beyond it
    fails instead of taking the machine's memory. 0: no limit (a reward using CUDA in its worker needs 0)."""


class DiagnosticsConfig(Section):
    """Costly diagnostics, run every K steps."""

    diversity_every: int = F(10, **EVERY)
    """Mean pairwise cosine distance of response embeddings within a group, every K steps (0: off)."""
    embedder: str = F("auto", "auto | minilm | char-ngram | a local sentence-transformers path.")
    grad_conflict_every: Optional[int] = F(None, **EVERY)
    """Cosine between positive and negative samples' gradients, every K steps (0: off; None: every 10 steps when the
    measured parameters hold <= 5M elements, as on the built-in tiny model, else off: the diagnostic copies their
    gradients, gigabytes for a 7B model's lm_head)."""
    grad_conflict_samples: int = F(32, "Sub-batch size for the gradient-conflict measure.", ge=2, le=INT32)
    grad_conflict_params: str = F("lm_head|embed_tokens|lora_B")
    """Regex of parameter names the gradient conflict is measured on."""


class StagesConfig(Section):
    """User stages added to the recipe by dotted path (docs/extending.md)."""

    extra: list[str] = F([])
    """Stages to add: "[before:NAME=|after:NAME=]pkg.mod:Stage", NAME a stage the recipe runs (`regroup config
    --stages`); without a position at the end. Stage: a class (built with no arguments) or an instance with `name`
    and `__call__(batch, ctx)`."""


class TrainConfig(Section):
    """The loop."""

    steps: int = F(100, "Optimizer steps.", **COUNT, resume=True)
    checkpoint_every: int = F(25, "Save a checkpoint every K steps (and at the end).", **EVERY, resume=True)
    keep_checkpoints: int = F(2, "Checkpoints kept on disk (older ones are deleted).", **COUNT, resume=True)
    progress: bool = F(True, "Show a progress bar.", resume=True)
    threads: int = F(0, "torch CPU threads (0: leave torch's default).", ge=0, le=4096, resume=True)
    collective_timeout_s: float = F(600.0, gt=0.0, le=7 * 86400.0, resume=True)
    """Seconds a process waits in a collective (all-reduce, gather, barrier) for the others before it stops with an
    error naming a frozen or dead process (torch's default: 1800). Raise it when one process legitimately works alone
    for long."""
    keep_cpu_memory: bool = F(True, resume=True)
    """On a CPU with glibc, keep freed buffers in the process instead of returning them to the OS
    (`regroup.runtime.cpu_memory`: 8x fewer page faults, a 0-12 % shorter tiny-model step)."""
    eval_every: int = F(0, **EVERY, resume=True)
    """Evaluate on held-out questions (data.eval_file, else the task's held-out set) every K steps (0: off)."""
    eval_n: int = F(4, **COUNT)
    """Samples per held-out question when evaluating during training (pass@1 and pass@eval_n are logged)."""
    eval_limit: int = F(64, "Held-out questions evaluated during training.", **COUNT)
    epochs: int = F(0, ge=0, le=INT32)
    """Stop after this many passes over the training questions, walked in order per epoch (0: use `steps`)."""
    sample_every: int = F(10, **EVERY, resume=True)
    """Log a few sample completions every K steps (samples.jsonl, TensorBoard text) (0: off)."""
    report_to: list[str] = F([], resume=True)
    """Extra trackers through accelerate: tensorboard, wandb, trackio, ... (metrics.jsonl is always written). Replaces
    the removed train.tensorboard / train.wandb."""


class RunConfig(Section):
    """A whole training run."""

    recipe: str = F("grpo")
    """Name of the recipe (for reports; letters, digits and _ . + - = @); the pieces used are decided by the sections
    below."""
    seed: int = F(0, "Seed of sampling, shuffling and initialisation.", **SEED)
    run_dir: Optional[str] = F(None, "Where the run writes. None: runs/<recipe>-<time>.", path=True)
    rewards: RewardsConfig = F(RewardsConfig)
    model: ModelConfig = F(ModelConfig)
    data: DataConfig = F(DataConfig)
    rollout: RolloutConfig = F(RolloutConfig)
    grpo: GRPOConfig = F(GRPOConfig)
    optim: OptimConfig = F(OptimConfig)
    ta: TAConfig = F(TAConfig)
    mask: MaskConfig = F(MaskConfig)
    anchors: AnchorConfig = F(AnchorConfig)
    dynamic_sampling: DynamicSamplingConfig = F(DynamicSamplingConfig)
    overlong: OverlongConfig = F(OverlongConfig)
    diagnostics: DiagnosticsConfig = F(DiagnosticsConfig)
    stages: StagesConfig = F(StagesConfig)
    train: TrainConfig = F(TrainConfig)

    def to_dict(self) -> dict:
        return self.model_dump()

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        if not RECIPE_NAME.fullmatch(self.recipe):
            raise ValueError(
                f"recipe: {short(self.recipe)} is not a plain name (letters, digits and _ . + - = @, "
                "at most 100): it names run folders and labels plots and reports"
            )
        g = self.grpo
        if g.num_generations < 2 and not self.ta.enabled:
            raise ValueError("grpo.num_generations must be >= 2: a group of one has no advantage signal")
        if self.anchors.enabled and self.anchors.mode == "replace" and self.anchors.count >= g.num_generations:
            raise ValueError(
                f"anchors.count ({self.anchors.count}) must be < grpo.num_generations "
                f"({g.num_generations}) with anchors.mode=replace: no on-policy sample would be left"
            )
        if self.overlong.soft_punish and self.overlong.buffer >= self.rollout.max_new_tokens:
            raise ValueError(
                f"overlong.buffer ({self.overlong.buffer}) must be < rollout.max_new_tokens "
                f"({self.rollout.max_new_tokens}) with overlong.soft_punish"
            )
        for name in self.train.report_to:
            if name not in TRACKERS:
                raise ValueError(
                    f"train.report_to: unknown tracker {short(name)}{did_you_mean(name, TRACKERS)}; "
                    f"known: {', '.join(TRACKERS)}"
                )
        return self


RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=@-]{0,99}")
TRACKERS = ("tensorboard", "wandb", "trackio", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab")
"""The experiment trackers accelerate's tracker API knows (`train.report_to`)."""


# (key, default, help + bounds) of every RunConfig setting: what `regroup config` lists.
field_docs = functools.partial(fields.field_docs, RunConfig)


def get_dotted(cfg: RunConfig, key: str) -> Any:
    """The value of dotted `key` (`rollout.server_url`) in `cfg`."""
    return functools.reduce(getattr, key.split("."), cfg)


def parse_weighted(spec: str, key: str = "rewards") -> tuple[str, float]:
    """`name` or `name*weight` (spaces allowed around both; the name may be `pkg.mod:obj`) -> (name, finite
    weight): a reward of `rewards.functions`, a term of `grpo.loss_terms`. ConfigError naming `key` otherwise."""
    name, star, weight = (part.strip() for part in str(spec).partition("*"))
    if not name or any(c.isspace() for c in name):
        raise ConfigError(f"{key}: {short(spec)} is not 'name' or 'name*weight'")
    try:
        value = float(weight) if star else 1.0
    except ValueError:
        raise ConfigError(
            f"{key}: {short(spec)}: the weight of {short(name)} is not a number: {short(weight)}"
        ) from None
    if not math.isfinite(value):
        raise ConfigError(
            f"{key}: {short(spec)}: the weight of {short(name)} must be a finite number, got {short(weight)}"
        )
    return name, value


RESUME_OVERRIDABLE = tuple(key for key, f, _ in fields.leaves(RunConfig) if fields.extra(f).get("resume"))
"""Keys a `--resume` may change (`F(..., resume=True)`): each is read afresh by the resumed process (the loop's
length and logging, where the servers are and which variable holds their key, how the reward is computed). Any other
key would be written to config.yaml while the restored optimizer, scheduler, data and RNG states go on with the saved
value. `train.steps` may change: the lr schedule keeps its course, then decays over the steps left."""


def check_resume_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    """Refuse a `--resume` override of a key that would not take effect (ConfigError naming it)."""
    for key in (".".join(parse_override(text)[0]) for text in overrides):
        if key not in RESUME_OVERRIDABLE:
            raise ConfigError(
                f"--resume cannot change {key}: a resume goes on with the settings the run was trained with (its "
                f"checkpoint's model, optimizer, data and stage states hold them), so the new value would not "
                f"take effect; start a new run for that (keys a resume may change: {', '.join(RESUME_OVERRIDABLE)})"
            )


def shorthand(data: dict) -> dict:
    """`rewards: [math]` (a list or a comma string) stands for `rewards: {functions: [math]}`."""
    return {**data, "rewards": {"functions": data["rewards"]}} if isinstance(data.get("rewards"), (list, str)) else data


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Set each `dotted.key=value` in the nested mapping `data` (returned); `rewards=[math]` sets rewards.functions."""
    data = shorthand(data)
    for text in overrides:
        keys, value = parse_override(text)
        if keys == ["rewards"] and isinstance(value, (list, str)):
            keys = ["rewards", "functions"]  # `rewards=[math]` keeps the section's other keys
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {short(text)}: {short(k)} is not a section")
        node[keys[-1]] = value
    return data


PACKAGED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
"""The shipped recipes (package data; `configs/` in a checkout links here)."""


def resolve_config_path(path: str | os.PathLike) -> Path:
    """A recipe file: `path` as given when it is a file, else a shipped recipe by name (`grpo`, `grpo.yaml`,
    `paper/dagrpo_both`); a folder of that name in the working directory does not hide the shipped recipe."""
    given = Path(path)
    if given.is_file():
        return given.resolve()
    if given.exists() and not given.is_dir():  # never opened: /dev/zero has no end, a named pipe may never open
        raise ConfigError(f"{path} is not a regular file (a named pipe, a device or a socket); a config is a YAML file")
    for name in (given, given.with_suffix(".yaml"), Path(given.name), Path(given.name).with_suffix(".yaml")):
        if str(path) and (PACKAGED_CONFIGS / name).is_file():
            return PACKAGED_CONFIGS / name
    return given.resolve()  # reported as not found by read_yaml


def read_sections(data: Any, source: str, *names: str) -> dict:
    """Only the top-level sections `names` of a config mapping (e.g. a run's saved config.yaml), each checked as in
    a whole config: {name: section}. Nothing the config names is imported, and none of its files need to exist
    here (an evaluation needs only the prompting and the checker's threshold). ConfigError naming `source`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config must be a mapping, got {type(data).__name__}")
    data = shorthand(data)
    try:
        return {n: check(RunConfig.model_fields[n].annotation, data.get(n) or {}, n + ".") for n in names}
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None

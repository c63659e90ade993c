"""Typed run configuration: dataclasses with a docstring per field, YAML recipes, dotted overrides.

`load_config("configs/grpo.yaml", ["optim.lr=1e-4", "train.steps=20"])` reads the recipe (which may
`extends:` another one), applies the overrides, checks every key and type, and checks the cross-field
rules, all before any model is loaded. An unknown key or a wrong type raises `ConfigError` naming the
dotted key. `to_dict()` of the result is what a run saves as `config.yaml`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, get_args, get_origin

import yaml

from regroup.io import write_atomic  # noqa: F401  (re-exported: config.yaml is written with it)


class ConfigError(ValueError):
    """A configuration problem, found before any compute; the message names the dotted key."""


# ----------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------


@dataclass
class LoraConfig:
    """LoRA adapters through peft (real models)."""

    enabled: bool = False
    """Train LoRA adapters instead of all weights."""
    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Adapter scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get adapters."""


@dataclass
class ModelConfig:
    """Which policy to train."""

    path: Optional[str] = None
    """A local HF causal-LM directory. None: the built-in tiny model, warmed up (and cached) first."""
    warmup_dir: str = "runs/warmup"
    """Where the built-in tiny model's warm-up is cached (used when `path` is None)."""
    gguf_file: Optional[str] = None
    """A GGUF file name inside `path`: loaded dequantized to `dtype`; checkpoints are saved as HF safetensors."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Parameter dtype. bfloat16 on GPUs for real models; float32 for the tiny model on CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""


@dataclass
class DataConfig:
    """Where training questions come from."""

    task: str = "arithmetic"
    """Task providing the grader, step scorer and rule rephrasings ("arithmetic" or "pkg.mod:obj")."""
    train_file: Optional[str] = None
    """JSONL / JSON / Parquet / CSV file, HF dataset folder, or hf:NAME[:CONFIG][@SPLIT]. None: generate from the task."""
    num_train: int = 20000
    """Questions to generate when `train_file` is None."""
    question_field: str = "question"
    """Column holding the question."""
    answer_field: str = "answer"
    """Column holding the final answer."""
    solution_field: str = "solution"
    """Column holding the reference solution (DaGRPO anchors, judge reference)."""
    skip_bad_rows: bool = False
    """Skip and count malformed rows instead of failing on the first one."""
    seed: int = 1234
    """Seed of the generated training set."""
    eval_seed: int = 999
    """Seed of the generated held-out set."""
    eval_file: Optional[str] = None
    """Held-out questions for `train.eval_every` (same formats and field mapping as `train_file`)."""
    system_prompt: Optional[str] = None
    """System message put before every question (chat-template models)."""
    prompt_template: Optional[str] = None
    """Template with `{question}` applied to q0 and every rephrasing alike, e.g. "{question}\\nPut the final answer in \\boxed{}."."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Wrap prompts with the tokenizer's chat template: auto = when the tokenizer has one (never for the built-in task)."""
    max_prompt_tokens: int = 4096
    """Longest prompt in tokens; a longer question is skipped and counted."""


@dataclass
class RolloutConfig:
    """How responses are sampled."""

    backend: Literal["hf", "hf_generate", "vllm", "vllm_server"] = "hf"
    """hf: lean KV-cached loop over the HF model; hf_generate: `model.generate`; vllm: colocated vLLM engine;
    vllm_server: a vLLM OpenAI server started separately (`regroup vllm-serve`), over HTTP."""
    temperature: float = 1.0
    """Sampling temperature (log-probs for the loss use the same temperature, as TRL does)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 48
    """Longest response; longer ones are truncated (and counted)."""
    batch_size: int = 256
    """Sequences decoded together."""
    tis_cap: float = 0.0
    """Truncated importance sampling cap for sampler/learner mismatch (vLLM); 0 disables it."""
    vllm_gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory the colocated vLLM engine may take."""
    vllm_max_model_len: int = 0
    """vLLM engine max model length (0: prompt limit + max_new_tokens)."""
    vllm_enable_sleep_mode: bool = False
    """Let the colocated vLLM engine release GPU memory between rollouts."""
    vllm_tensor_parallel_size: int = 1
    """vLLM tensor-parallel size."""
    vllm_server_url: str = "http://127.0.0.1:8000"
    """Root URL of the vLLM server (backend=vllm_server), without /v1."""
    vllm_server_api_key_env: Optional[str] = None
    """NAME of the variable holding the server's --api-key; None or "": the server has no key."""
    vllm_server_timeout_s: float = 600.0
    """Deadline of one server request (a prompt's n samples, or a weight sync), in seconds."""
    vllm_server_sync: Literal["reload", "nccl"] = "reload"
    """Weight sync: reload (learner writes safetensors to vllm_server_sync_dir, server reloads; any device)
    or nccl (vLLM's NCCL weight-transfer API; GPUs only)."""
    vllm_server_sync_dir: Optional[str] = None
    """Folder both learner and server can read (reload sync). None: a temporary folder on this machine."""


@dataclass
class GRPOConfig:
    """The GRPO core (SPEC §1)."""

    num_generations: int = 8
    """G: on-policy samples per question (per variant, for TA-GRPO)."""
    prompts_per_step: int = 16
    """Questions per optimizer step."""
    num_iterations: int = 1
    """mu: updates per rollout batch; pi_old log-probs are computed once before the first."""
    micro_batch_size: int = 64
    """Sequences per forward/backward; gradients are accumulated over the step's batch."""
    eps_low: float = 0.2
    """Lower clip range: ratio >= 1 - eps_low."""
    eps_high: float = 0.2
    """Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher when > eps_low)."""
    beta: float = 0.0
    """k3 KL coefficient against a frozen reference; the reference is loaded only when > 0."""
    kl_ratio_correction: bool = False
    """Multiply the k3 term by pi_theta/pi_old (TRL's use_bias_correction_kl, its default); SPEC §1 is plain k3."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_sum_constant"] = "token_mean"
    """token_mean (TRL dapo), seq_mean_token_mean (TRL grpo), seq_sum_constant (Dr. GRPO)."""
    adv_scale: Literal["group", "batch", "none"] = "group"
    """Advantage std normalisation: per group, per batch, or none (Dr. GRPO)."""
    adv_eps: float = 1e-4
    """Added to the std before dividing."""
    samples_multiplier: int = 1
    """Samples of the original question = multiplier x G (grpo_matched uses N+1 to match TA-GRPO)."""
    mini_batches: int = 1
    """Optimizer steps per rollout batch: the batch is split into this many mini-batches (TA-GRPO's scripts: 2)."""
    importance_level: Literal["token", "sequence"] = "token"
    """token: PPO per-token ratio; sequence: GSPO's length-normalised sequence ratio and clip."""
    shared_prefix: Literal["auto", True, False] = "auto"
    """Forward each distinct prompt once per micro-batch and run its responses on that cache (exact).
    auto: on on a CPU, off on an accelerator, where the extra forward's kernel launches cost more than
    the prompt positions it saves (`logprobs.use_shared_prefix`, BENCHMARKS.md); true keeps it on there
    for its lower peak memory."""
    skip_zero_gradient_rows: bool = True
    """Leave out of the update's forward the rows that add nothing to the gradient: advantage 0 with
    beta = 0 (uniform groups) or a DaGRPO mask weight of 0 (`algo.losses.rows_with_gradient`). Exact:
    the loss normalisers still count them. `entropy`, `clip/*` and `kl` are then means over the rows
    forwarded (`update/forwarded_frac`); false forwards every row."""


@dataclass
class OptimConfig:
    """AdamW with warm-up and cosine decay."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.99
    """Adam beta2."""
    warmup_steps: int = 10
    """Linear warm-up steps (the first full-lr Adam step is what damages a small model)."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """Decay after warm-up."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of lr."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (the norm before clipping is logged)."""


@dataclass
class TAConfig:
    """TA-GRPO: rephrasings pooled into one group (SPEC §3)."""

    enabled: bool = False
    """Expand each question into N+1 variants whose responses share one group."""
    n_variants: int = 3
    """N: rephrasings per question."""
    rephraser: Literal["rules", "dataset", "openai"] = "rules"
    """Where variants come from: the task's rules, the data's variants, or an LLM rewriter."""
    ratio_anchor: Literal["original", "own"] = "original"
    """original: every ratio on (q0, o) as the paper; own: each response on its own prompt."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI-compatible endpoint of the LLM rewriter (rephraser=openai)."""
    model: str = "gpt-4-turbo"
    """Rewriter model name."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the rewriter's API key."""


@dataclass
class ScorerConfig:
    """Fine-grained scorer for DaGRPO masks."""

    name: str = "step"
    """step | judge | similarity | a dotted path pkg.mod:obj."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI-compatible endpoint (judge)."""
    model: str = "gpt-4o"
    """Judge model name."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself never goes in a config)."""
    concurrency: int = 32
    """Concurrent judge requests."""
    timeout_s: float = 60.0
    """Seconds per judge request in all: every attempt, backoff and Retry-After wait included."""
    max_retries: int = 4
    """Retries per request before it is recorded as failed."""
    cache_dir: Optional[str] = None
    """Disk cache of scores. None: RUN_DIR/cache."""
    question: Literal["own", "original"] = "own"
    """Question shown to the judge for a rephrased response: the one it answered (own) or q0 (original)."""
    structured: Literal["json_schema", "choice", "none"] = "json_schema"
    """How the judge is held to the form the scorer parses: json_schema (OpenAI response_format; OpenAI and
    vLLM), choice (vLLM structured_outputs "1".."10"), none (free text ending SCORE: n, the paper's setup)."""
    max_tokens: int = 0
    """Judge reply length limit; 0: by mode (json_schema 48, choice 4, none: not sent, the server's own)."""


@dataclass
class MaskConfig:
    """DaGRPO sequence-level gradient rectification (SPEC §2a)."""

    enabled: bool = False
    """Mask samples whose score does not stand apart from the other side of the group."""
    delta: float = 3.0
    """Margin on the 1-10 score scale."""
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    """Which scorer gives the fine-grained scores."""


@dataclass
class AnchorConfig:
    """DaGRPO off-policy anchors (SPEC §2b)."""

    enabled: bool = False
    """Inject verified-correct off-policy solutions into groups."""
    count: int = 1
    """Anchors per question."""
    mode: Literal["replace", "add"] = "replace"
    """replace one on-policy sample per anchor (7+1 for G=8), or add to the group."""
    when: Literal["always", "no_correct"] = "always"
    """Inject always, or only when no on-policy sample of the question is correct."""
    ratio: Literal["shaped", "plain"] = "shaped"
    """shaped: A * p/(p+gamma), no clipping (LUFFY); plain: pi_old := stop_grad(pi_theta)."""
    gamma: float = 0.1
    """Policy-shaping gamma."""
    source: Literal["reference", "self", "both"] = "reference"
    """reference: the data's solution; self: the policy's own earlier verified responses; both."""
    buffer_size: int = 4
    """Self-bootstrapped anchors kept per question."""
    max_tokens: int = 0
    """Longest anchor in tokens; a longer reference is not injected and is counted (0: rollout.max_new_tokens)."""


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling: drop uniform-reward groups and sample more questions until the batch is full."""

    enabled: bool = False
    """Drop groups whose rewards are all equal and refill the batch with new questions."""
    max_rounds: int = 3
    """Extra sampling rounds per step before training on a batch that is not full."""


@dataclass
class OverlongConfig:
    """DAPO overlong handling of responses cut at rollout.max_new_tokens."""

    filter: bool = False
    """Drop truncated responses from the loss (their advantages still count in their group)."""
    soft_punish: bool = False
    """Subtract a linear length penalty in the last `buffer` tokens before max_new_tokens."""
    buffer: int = 16
    """Length of the soft-punishment zone in tokens."""
    penalty: float = 1.0
    """Penalty at max_new_tokens (linear from 0 at max_new_tokens - buffer)."""


@dataclass
class RewardsConfig:
    """Verifiable rewards. A plain list (`rewards=[math]`) sets `functions`."""

    functions: list[str] = field(default_factory=lambda: ["task"])
    """task (the task's grader), math (math-verify), or pkg.mod:fn; name*weight to weight; several are summed."""
    correct_threshold: float = 1.0
    """A response is verified correct when its reward >= this (anchors, self-anchors, eval, the TRL adapter)."""
    workers: int = 1
    """Processes grading answers in parallel (math checker)."""


@dataclass
class DiagnosticsConfig:
    """Costly diagnostics, run every K steps."""

    diversity_every: int = 10
    """Mean pairwise cosine distance of response embeddings within a group, every K steps (0: off)."""
    embedder: str = "auto"
    """auto | minilm | char-ngram | a local sentence-transformers path."""
    grad_conflict_every: Optional[int] = None
    """Cosine between positive and negative samples' gradients, every K steps (0: off; None: every 10 steps
    when the measured parameters hold <= 5M elements, as on the built-in tiny model, else off: the
    diagnostic copies their gradients, gigabytes for a 7B model's lm_head)."""
    grad_conflict_samples: int = 32
    """Sub-batch size for the gradient-conflict measure."""
    grad_conflict_params: str = "lm_head|embed_tokens|lora_B"
    """Regex of parameter names the gradient conflict is measured on."""


@dataclass
class TrainConfig:
    """The loop."""

    steps: int = 100
    """Optimizer steps."""
    checkpoint_every: int = 25
    """Save a checkpoint every K steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted)."""
    tensorboard: bool = False
    """Also log to TensorBoard in RUN_DIR/tb."""
    wandb: bool = False
    """Also log to Weights & Biases (project `regroup`)."""
    progress: bool = True
    """Show a progress bar."""
    threads: int = 0
    """torch CPU threads (0: leave torch's default)."""
    keep_cpu_memory: bool = True
    """On a CPU with glibc, keep freed buffers in the process instead of returning them to the OS and
    faulting them in again every micro-batch (`regroup.cpu_memory`: 8x fewer page faults, a 0-12 %
    shorter tiny-model step in paired runs)."""
    eval_every: int = 0
    """Evaluate on held-out questions (data.eval_file, else the task's held-out set) every K steps (0: off)."""
    eval_n: int = 4
    """Samples per held-out question when evaluating during training (pass@1 and pass@eval_n are logged)."""
    eval_limit: int = 64
    """Held-out questions evaluated during training."""
    epochs: int = 0
    """Stop after this many passes over the training questions, walked in order per epoch (0: use `steps`)."""
    sample_every: int = 10
    """Log a few sample completions every K steps (samples.jsonl, TensorBoard text) (0: off)."""
    report_to: list[str] = field(default_factory=list)
    """Extra trackers through accelerate: tensorboard, wandb, trackio, ... (metrics.jsonl is always written)."""


@dataclass
class RunConfig:
    """A whole training run."""

    recipe: str = "grpo"
    """Name of the recipe (for reports); the pieces used are decided by the sections below."""
    seed: int = 0
    """Seed of sampling, shuffling and initialisation."""
    run_dir: Optional[str] = None
    """Where the run writes. None: runs/<recipe>-<time>."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """Reward functions and what counts as correct."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ta: TAConfig = field(default_factory=TAConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Every numeric field against its rule in NUMERIC_RULES, then the cross-field rules, then the
        named pieces (rewards, scorer, rephraser) and the files the run will read. No model is touched."""
        for key, rule in NUMERIC_RULES.items():
            rule.check(key, get_dotted(self, key))
        g = self.grpo
        if g.num_generations < 2 and not self.ta.enabled:
            raise ConfigError("grpo.num_generations must be >= 2: a group of one has no advantage signal")
        if self.anchors.enabled and self.anchors.mode == "replace" and self.anchors.count >= g.num_generations:
            raise ConfigError(
                f"anchors.count ({self.anchors.count}) must be < grpo.num_generations ({g.num_generations}) "
                "with anchors.mode=replace: no on-policy sample would be left"
            )
        if self.overlong.soft_punish and self.overlong.buffer >= self.rollout.max_new_tokens:
            raise ConfigError(f"overlong.buffer ({self.overlong.buffer}) must be < rollout.max_new_tokens "
                              f"({self.rollout.max_new_tokens}) with overlong.soft_punish")
        check_pieces(self)
        for key in ("data.train_file", "data.eval_file"):
            check_readable(key, get_dotted(self, key))
        if self.model.path is not None and not os.path.isdir(self.model.path):
            raise ConfigError(f"model.path: no such model folder: {self.model.path}")
        from regroup.net.redact import check_key_env_name  # a key pasted where its variable's name goes

        check_key_env_name(self.ta.api_key_env, "ta.api_key_env")
        check_key_env_name(self.mask.scorer.api_key_env, "mask.scorer.api_key_env")
        check_key_env_name(self.rollout.vllm_server_api_key_env, "rollout.vllm_server_api_key_env")
        for name in self.train.report_to:
            if name not in TRACKERS:
                raise ConfigError(f"train.report_to: unknown tracker {name!r}{_did_you_mean(name, TRACKERS)}; "
                                  f"known: {', '.join(TRACKERS)}")
        if self.rollout.tis_cap > 0 and self.ta.enabled and self.ta.ratio_anchor == "original":
            raise ConfigError(
                "rollout.tis_cap > 0 with ta.ratio_anchor=original would divide pi_old(o|q0) by the sampler's "
                "pi(o|q_n), a ratio of two different prompts; set rollout.tis_cap=0 or ta.ratio_anchor=own")


# ----------------------------------------------------------------------------------------------------
# Rules: one per numeric field (a test fails when a new int/float field has none)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NumericRule:
    """A finite number in [low, high] (an end is open when `*_open`); None means unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "a finite number " + " and ".join(parts) if parts else "a finite number"

    def ok(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def check(self, key: str, value) -> None:
        if value is not None and not self.ok(value):
            raise ConfigError(f"{key} must be {self.describe()}, got {value!r}")


def at_least(low: float, high: float | None = None) -> NumericRule:
    return NumericRule(low=low, high=high)


def above(low: float, high: float | None = None) -> NumericRule:
    return NumericRule(low=low, high=high, low_open=True)


FINITE = NumericRule()
FRACTION = NumericRule(0.0, 1.0)
SEED = at_least(0, 2**31 - 1)  # numpy seeds must be < 2**32, and seeds are summed (data.seed + seed)
COUNT = at_least(1, 2**31 - 1)
EVERY = at_least(0, 2**31 - 1)  # "every K steps", 0: off

NUMERIC_RULES: dict[str, NumericRule] = {
    "seed": SEED,
    "model.lora.r": COUNT,
    "model.lora.alpha": COUNT,
    "model.lora.dropout": NumericRule(0.0, 1.0, high_open=True),
    "data.num_train": COUNT,
    "data.seed": SEED,
    "data.eval_seed": SEED,
    "data.max_prompt_tokens": COUNT,
    "rollout.temperature": above(0.0, 100.0),  # 0 would divide the logits by zero
    "rollout.top_p": NumericRule(0.0, 1.0, low_open=True),
    "rollout.max_new_tokens": COUNT,
    "rollout.batch_size": COUNT,
    "rollout.tis_cap": at_least(0.0),
    "rollout.vllm_gpu_memory_utilization": NumericRule(0.0, 1.0, low_open=True),
    "rollout.vllm_max_model_len": at_least(0, 2**31 - 1),
    "rollout.vllm_tensor_parallel_size": at_least(1, 1024),
    "rollout.vllm_server_timeout_s": above(0.0),
    "grpo.num_generations": COUNT,
    "grpo.prompts_per_step": COUNT,
    "grpo.num_iterations": at_least(1, 1000),
    "grpo.micro_batch_size": COUNT,
    "grpo.eps_low": NumericRule(0.0, 1.0, high_open=True),  # the clip floor 1 - eps_low must stay > 0
    "grpo.eps_high": at_least(0.0),
    "grpo.beta": at_least(0.0),
    "grpo.adv_eps": above(0.0),  # a uniform group has std 0: the division needs a positive epsilon
    "grpo.samples_multiplier": at_least(1, 1000),
    "grpo.mini_batches": COUNT,
    "optim.lr": above(0.0, 1.0),
    "optim.weight_decay": FRACTION,
    "optim.beta1": NumericRule(0.0, 1.0, high_open=True),
    "optim.beta2": NumericRule(0.0, 1.0, high_open=True),
    "optim.warmup_steps": at_least(0, 2**31 - 1),
    "optim.min_lr_ratio": FRACTION,
    "optim.max_grad_norm": above(0.0),  # <= 0 freezes (0) or reverses (< 0) the update
    "ta.n_variants": at_least(1, 1000),
    "mask.delta": at_least(0.0),
    "mask.scorer.concurrency": at_least(1, 4096),
    "mask.scorer.timeout_s": above(0.0),
    "mask.scorer.max_tokens": at_least(0, 2**31 - 1),
    "mask.scorer.max_retries": at_least(0, 100),
    "anchors.count": COUNT,
    "anchors.gamma": above(0.0),
    "anchors.buffer_size": COUNT,
    "anchors.max_tokens": at_least(0, 2**31 - 1),
    "dynamic_sampling.max_rounds": at_least(0, 1000),
    "overlong.buffer": COUNT,
    "overlong.penalty": at_least(0.0),
    "rewards.correct_threshold": FINITE,
    "rewards.workers": at_least(1, 1024),
    "diagnostics.diversity_every": EVERY,
    "diagnostics.grad_conflict_every": EVERY,
    "diagnostics.grad_conflict_samples": at_least(2, 2**31 - 1),
    "train.steps": COUNT,
    "train.checkpoint_every": EVERY,
    "train.keep_checkpoints": COUNT,
    "train.threads": at_least(0, 4096),
    "train.eval_every": EVERY,
    "train.epochs": at_least(0, 2**31 - 1),
    "train.sample_every": EVERY,
    "train.eval_n": COUNT,
    "train.eval_limit": COUNT,
}


def get_dotted(cfg, key: str):
    """The value of dotted `key` in a config object."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def numeric_keys(cls=None, prefix: str = "") -> list[str]:
    """Dotted keys of every int / float (optional or not) field, recursively."""
    cls = cls or RunConfig
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            keys += numeric_keys(hint, prefix + f.name + ".")
            continue
        args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (typing.Union, types.UnionType) else [hint]
        if any(a in (int, float) for a in args):
            keys.append(prefix + f.name)
    return keys


# ----------------------------------------------------------------------------------------------------
# Named pieces and files, checked before any model loads
# ----------------------------------------------------------------------------------------------------

BUILTIN_REWARDS = ("task", "math")
BUILTIN_SCORERS = ("step", "judge", "similarity")
BUILTIN_TASK_NAMES = ("arithmetic",)
TRACKERS = ("tensorboard", "wandb", "trackio", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab")
"""The experiment trackers accelerate's tracker API knows (`train.report_to`)."""


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _import_callable(key: str, path: str) -> None:
    """Import a dotted `pkg.mod:obj` and check it is callable; ConfigError naming `key` otherwise."""
    from regroup.registry import load_dotted

    try:
        obj = load_dotted(path)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    except Exception as e:  # the user's module failed while importing
        raise ConfigError(f"{key}: importing {path!r} failed: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise ConfigError(f"{key}: {path!r} is a {type(obj).__name__}, not callable")


def parse_reward_spec(spec: str) -> tuple[str, float]:
    """`name` or `name*weight` -> (name, finite weight); ConfigError otherwise."""
    name, star, weight = spec.partition("*")
    name = name.strip()
    if not star:
        return name, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise ConfigError(f"rewards: weight of {name!r} is not a number: {weight!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"rewards: weight of {name!r} must be a finite number, got {weight!r}")
    return name, value


def check_pieces(cfg: "RunConfig") -> None:
    """Reward, scorer, rephraser and task names exist (dotted paths import), and the pieces bound to the
    built-in task are not used on external data it does not describe."""
    task = cfg.data.task
    user_task = ":" in task
    if not user_task and task not in BUILTIN_TASK_NAMES:
        raise ConfigError(f"data.task: unknown task {task!r}; known: {', '.join(BUILTIN_TASK_NAMES)} or "
                          f"'package.module:object'{_did_you_mean(task, BUILTIN_TASK_NAMES)}")
    if user_task:
        _import_task(task)
    # External data that the task does not own: the task's grader, step scorer and rules know only its format.
    foreign = cfg.data.train_file is not None and not user_task
    if not cfg.rewards.functions:
        raise ConfigError("rewards: no reward function; give at least one, e.g. rewards=[math]")
    for spec in cfg.rewards.functions:
        name, _ = parse_reward_spec(spec)
        if ":" in name:
            _import_callable(f"rewards: {name!r}", name)
        elif name not in BUILTIN_REWARDS:
            raise ConfigError(f"rewards: unknown reward {name!r}; known: {', '.join(BUILTIN_REWARDS)} or "
                              f"'package.module:function'{_did_you_mean(name, BUILTIN_REWARDS)}")
        elif name == "task" and foreign:
            raise ConfigError(f"rewards: 'task' grades the built-in {task} task's answers and cannot grade "
                              f"data.train_file; use rewards=[math] (or a 'package.module:function')")
    scorer = cfg.mask.scorer.name
    if ":" not in scorer and scorer not in BUILTIN_SCORERS:
        raise ConfigError(f"mask.scorer.name: unknown scorer {scorer!r}; known: {', '.join(BUILTIN_SCORERS)} or "
                          f"'package.module:object'{_did_you_mean(scorer, BUILTIN_SCORERS)}")
    if cfg.mask.enabled:
        if ":" in scorer:
            _import_callable("mask.scorer.name", scorer)
        elif scorer == "step" and foreign:
            raise ConfigError(f"mask.scorer.name: 'step' scores the built-in {task} task's steps and would score "
                              "every response of data.train_file alike; use mask.scorer.name=judge or similarity")
    if cfg.ta.enabled:
        if cfg.ta.rephraser == "rules" and foreign:
            raise ConfigError(f"ta.rephraser: 'rules' rewrites the built-in {task} task's questions only; with "
                              "data.train_file use ta.rephraser=openai, or dataset (variants stored in the data)")
        if cfg.ta.rephraser == "dataset":
            _check_variants(cfg)


def _import_task(task: str) -> None:
    from regroup.registry import load_dotted

    try:
        load_dotted(task)
    except ValueError as e:
        raise ConfigError(f"data.task: {e}") from None
    except Exception as e:
        raise ConfigError(f"data.task: importing {task!r} failed: {type(e).__name__}: {e}") from None


def _check_variants(cfg: "RunConfig") -> None:
    """ta.rephraser=dataset needs data that stores variants (a `variants` column or index/sub_index rows)."""
    if cfg.data.train_file is None:
        raise ConfigError("ta.rephraser: 'dataset' takes the variants stored in data.train_file, and none is set "
                          "(generated questions have no stored variants); use ta.rephraser=rules")
    if str(cfg.data.train_file).startswith("hf:"):
        return  # a hub data set: its columns are checked when it loads, before the model does
    check_readable("data.train_file", cfg.data.train_file)
    from regroup.data import DataError, peek_columns

    try:
        columns = peek_columns(cfg.data.train_file)
    except DataError as e:
        raise ConfigError(f"data.train_file: {e}") from None
    if "variants" not in columns and not {"index", "sub_index"} <= columns:
        raise ConfigError(f"ta.rephraser: 'dataset' needs stored variants, but {cfg.data.train_file} has no "
                          f"'variants' column and no index/sub_index rows (columns: {', '.join(sorted(columns))}); "
                          "add them with `regroup rephrase`, or use ta.rephraser=openai")


def check_readable(key: str, path: str | None) -> None:
    """A data file (or datasets folder) that exists and can be read; `hf:` specs are read by `datasets`."""
    if path is None or str(path).startswith("hf:"):
        return
    if not os.path.exists(path):
        raise ConfigError(f"{key}: no such file or folder: {path}")
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"{key}: folder {path} is not readable")
        return
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path}: {e.strerror or e}") from None


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------


def _check_value(value: Any, hint: Any, key: str) -> Any:
    """Check (and minimally coerce) one value against a type hint; raise ConfigError naming `key`."""
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section (mapping), got {type(value).__name__}")
        return _build(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            if type(None) in get_args(hint):
                return None
            raise ConfigError(f"{key}: must not be null")
        return _check_value(value, args[0], key)
    if origin is Literal:
        choices = get_args(hint)
        if not any(value == c and type(value) is type(c) for c in choices):  # 1 is not True
            hint_text = _did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
            raise ConfigError(f"{key}: must be one of {', '.join(map(repr, choices))}; got {value!r}{hint_text}")
        return value
    if origin is list:
        (item,) = get_args(hint)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return [_check_value(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _build(cls, data: dict, prefix: str = ""):
    if cls is RunConfig and isinstance(data.get("rewards"), (list, str)):
        data = {**data, "rewards": {"functions": data["rewards"]}}  # `rewards=[math]` shorthand
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known under {prefix or 'top level'}: {', '.join(sorted(names))})")
    kwargs = {name: _check_value(value, hints[name], prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path, seen: tuple = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: 'extends' loop")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = data.pop("extends", None)
    if parent:
        data = _merge(_read_yaml((path.parent / parent).resolve(), seen + (path,)), data)
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Set each `dotted.key=value` in the nested mapping `data` (in place; also returned)."""
    for text in overrides:
        keys, value = parse_override(text)
        if isinstance(data.get("rewards"), (list, str)) and (keys[0] == "rewards" and len(keys) > 1):
            data["rewards"] = {"functions": data["rewards"]}  # the `rewards: [..]` shorthand, now with a sub-key
        if keys == ["rewards"] and isinstance(value, (list, str)) and isinstance(data.get("rewards"), dict):
            keys = ["rewards", "functions"]  # `rewards=[math]` keeps the section's other keys
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    return data


RESUME_OVERRIDABLE = ("train.steps", "train.checkpoint_every", "train.keep_checkpoints", "train.progress",
                      "train.threads", "train.keep_cpu_memory", "train.eval_every", "train.sample_every", "train.tensorboard", "train.wandb",
                      "train.report_to",
                      # where the vLLM server is: a restarted server may listen elsewhere (weights are pushed on resume)
                      "rollout.vllm_server_url", "rollout.vllm_server_api_key_env", "rollout.vllm_server_timeout_s",
                      "rollout.vllm_server_sync_dir")
"""Keys a `--resume` may change: each is read afresh by the resumed process. Any other key would be written
to config.yaml while the restored optimizer, scheduler, data and RNG states go on with the saved value."""


def check_resume_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    """Refuse a `--resume` override of a key that would not take effect (ConfigError naming it)."""
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        if key not in RESUME_OVERRIDABLE:
            raise ConfigError(f"--resume cannot change {key}: the run's saved optimizer, scheduler and data state "
                              f"would go on with its old value; start a new run for that (keys a resume may change: "
                              f"{', '.join(RESUME_OVERRIDABLE)})")


PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
"""The shipped recipes (package data; `configs/` in a checkout links here)."""


def resolve_config_path(path: str | os.PathLike) -> Path:
    """A recipe file: `path` as given, else a shipped recipe by name (`grpo`, `grpo.yaml`, `paper/dagrpo_both`)."""
    given = Path(path)
    if given.exists():
        return given.resolve()
    for candidate in (PACKAGED_CONFIGS / given, PACKAGED_CONFIGS / given.with_suffix(".yaml"),
                      PACKAGED_CONFIGS / given.name, PACKAGED_CONFIGS / Path(given.name).with_suffix(".yaml")):
        if str(path) and candidate.is_file():
            return candidate
    return given.resolve()  # reported as not found by _read_yaml


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a YAML recipe (a file, or a shipped recipe's name), apply dotted overrides, type-check, validate.
    No model is touched."""
    data = apply_overrides(_read_yaml(resolve_config_path(path)) if path else {}, overrides)
    cfg = _build(RunConfig, data)
    cfg.validate()
    return cfg


def config_from_dict(data: dict) -> RunConfig:
    """Rebuild a saved config (e.g. RUN_DIR/config.yaml) with the same checks."""
    if not isinstance(data, dict):
        raise ConfigError(f"a saved config must be a mapping, got {type(data).__name__}")
    cfg = _build(RunConfig, data)
    cfg.validate()
    return cfg


def save_config(cfg: RunConfig, path: str | os.PathLike) -> None:
    write_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def field_docs(cls=RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every field, read from the attribute docstrings above."""
    source = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = source.body[0].body
    for node, nxt in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(field_docs(hints[f.name], prefix + f.name + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, repr(default), docs.get(f.name, "")))
    return rows

"""Checks before any weights load: what would otherwise fail (or silently learn nothing) only after the
model is in memory. Each refusal is one `ConfigError` line (exit 2); each warning one log line.

- `check_world`: the batch divides over the processes.
- `check_api_keys`: a judge's / rewriter's `api_key_env` variable is set (null or "": no key is sent), to a value
  an HTTP header can carry (no line break, only ASCII); the keys are known to `regroup.net.redact` from then on
  (a reward's error quoting one is printed without it).
- `announce_keys`: one line per remote client that will send a key: the variable's name and the host it
  goes to (a saved config or a shared recipe chooses both; the terminal says so before the first request).
- `check_eval_file`: `data.eval_file` loads (else the first evaluation would fail mid-run).
- `check_prompts`: a sample of questions fits `data.max_prompt_tokens`.
- `check_user_rewards`: a user reward returns numbers (not strings, not beyond float32), and not every
  call times out.
- `check_references`: a sample of the reference solutions passes the reward and the anchor length limit,
  and the reward returns numbers (anchors on).
- `check_train_memory`: a training step's estimate (`models.memory`) against the memory free now (a
  10^8-token limit asked for 25.6 GB before this check).
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from regroup.config.schema import RunConfig, get_dotted, parse_weighted
from regroup.data.heldout import eval_problems
from regroup.data.load import DataError
from regroup.errors import ConfigError
from regroup.models.memory import builtin_shape, check_memory, estimate_memory, model_shape
from regroup.models.prompting import encode_response
from regroup.net.redact import KEY_FIX, key_value_problem, remember_secret
from regroup.rewards import pop_counts, score_many
from regroup.rewards.build import reward_fn_from_config
from regroup.stages.anchors import is_verified
from regroup.stages.groups import samples_per_question
from regroup.stages.rewarding import checked_rewards
from regroup.train.recipes import features

SAMPLE = 64
"""Problems drawn for the data checks (a bounded cost, whatever the data set's size)."""


def check_world(cfg: RunConfig, world: int) -> None:
    pps = cfg.grpo.prompts_per_step
    if pps % world:
        raise ConfigError(
            f"grpo.prompts_per_step={pps} does not divide over the {world} processes: "
            f"use a multiple of {world} (each process samples whole groups)"
        )


def _key_users(cfg: RunConfig) -> list[tuple[str, str | None]]:
    """(config key, environment variable) of every remote client the run will build; None: a server without
    authentication."""
    out: list[tuple[str, str | None]] = []
    on = features(cfg)
    if on.judge:
        out.append(("mask.scorer.api_key_env", cfg.mask.scorer.api_key_env))
    if on.remote_rephraser:
        out.append(("ta.api_key_env", cfg.ta.api_key_env))
    return out


def check_api_keys(cfg: RunConfig, environ=os.environ) -> None:
    for *_, variable in key_destinations(cfg):  # known to `redact` before the first check that may print (a reward's)
        remember_secret(environ.get(variable))
    for key, name in _key_users(cfg):
        if name and not environ.get(name):
            raise ConfigError(
                f"{key}={name}: the environment variable {name} is not set (export it, or set "
                f"{key}=null for a server without authentication)"
            )
        if name and (problem := key_value_problem(environ[name])):
            raise ConfigError(f"{key}={name}: the environment variable {name} {problem} ({KEY_FIX})")


def key_destinations(cfg: RunConfig) -> list[tuple[str, str, str, str]]:
    """(client, URL key, key-variable key, environment variable) of every remote client that will send a key."""
    out = []
    on = features(cfg)
    if on.judge:
        out.append(("the judge", "mask.scorer.base_url", "mask.scorer.api_key_env", cfg.mask.scorer.api_key_env))
    if on.remote_rephraser:
        out.append(("the rewriter", "ta.base_url", "ta.api_key_env", cfg.ta.api_key_env))
    if cfg.rollout.backend == "vllm_server":
        out.append(
            (
                "the vLLM server client",
                "rollout.vllm_server_url",
                "rollout.vllm_server_api_key_env",
                cfg.rollout.vllm_server_api_key_env,
            )
        )
    return [(who, url_key, env_key, name) for who, url_key, env_key, name in out if name]


def _host(url: str) -> str:
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else str(url)


def announce_keys(cfg: RunConfig, log=print) -> list[str]:
    """One line per client that will send a key, naming the variable and the host, before any request: the
    config (a saved run's config.yaml, a shared recipe) chose both. Returns the lines."""
    lines = []
    for who, url_key, env_key, name in key_destinations(cfg):
        host = _host(get_dotted(cfg, url_key))
        lines.append(f"{who} sends the value of ${name} as its key to {host} ({env_key}, {url_key})")
    for line in lines:
        log(line)
    return lines


def check_eval_file(cfg: RunConfig) -> None:
    if not (cfg.data.eval_file and cfg.train.eval_every):
        return
    try:
        problems = eval_problems(cfg, None, [])
    except (OSError, ValueError) as e:
        if isinstance(e, (DataError, ConfigError)):
            raise ConfigError(f"data.eval_file: {e}") from None
        raise ConfigError(f"data.eval_file={cfg.data.eval_file}: {e}") from None
    if not problems:
        raise ConfigError(f"data.eval_file={cfg.data.eval_file}: no usable questions to evaluate on")


def _sample(problems: list, seed: int, n: int = SAMPLE) -> list:
    if len(problems) <= n:
        return list(problems)
    return random.Random(seed).sample(problems, n)


def check_prompts(cfg: RunConfig, problems: list, encode, log=print) -> int:
    """Refuse when no sampled question fits `data.max_prompt_tokens`; warn when some do not (they are skipped).
    Returns the longest fitting prompt of the sample in tokens (what the memory estimate uses)."""
    limit = cfg.data.max_prompt_tokens
    sample = _sample(problems, cfg.seed)
    if not sample:
        return 0
    lengths = [limit + 1 if len(p.question) > 64 * limit else len(encode(p.question)) for p in sample]
    too_long = sum(n > limit for n in lengths)
    if too_long == len(sample):
        raise ConfigError(
            f"all {len(sample)} sampled questions are longer than data.max_prompt_tokens={limit} "
            "tokens (prompt template included): raise data.max_prompt_tokens or shorten the questions"
        )
    if too_long:
        log(
            f"warning: {too_long} of {len(sample)} sampled questions are longer than data.max_prompt_tokens={limit}; "
            "such questions are skipped (data/skipped_long)"
        )
    return max(n for n in lengths if n <= limit)


@dataclass
class ReferenceCheck:
    checked: int = 0
    ok: int = 0
    missing: int = 0
    too_long: int = 0
    unverified: int = 0
    example: str = ""
    """The end of one reference the reward refused (what a user should look at)."""

    @property
    def verify(self) -> bool | None:
        """Whether references can be anchors (None: no reference to check)."""
        return None if self.checked == self.missing else self.ok > 0


def check_references(cfg: RunConfig, problems: list, task, encode_response, log=print) -> ReferenceCheck | None:
    """With anchors from references, verify a sample of them under the run's reward and length limit:
    refuse when none can be an anchor (`anchors.source=reference`), warn with counts otherwise."""
    a = cfg.anchors
    if not features(cfg).reference_anchors:
        return None
    sample = _sample(problems, cfg.seed)
    result = ReferenceCheck(checked=len(sample))
    max_tokens = a.max_tokens or cfg.rollout.max_new_tokens
    todo = []
    for p in sample:
        if not getattr(p, "solution", None):
            result.missing += 1
        elif len(encode_response(p.solution)) > max_tokens:
            result.too_long += 1
        else:
            todo.append(p)
    reward_fn = reward_fn_from_config(cfg.rewards, task)
    try:
        rewards, _ = checked_rewards(score_many(reward_fn, [p.solution for p in todo], todo), reward_fn)
    finally:
        close = getattr(reward_fn, "close", None)
        if callable(close):
            close()
    for p, r in zip(todo, rewards):
        if is_verified(r, cfg.rewards.correct_threshold):
            result.ok += 1
        else:
            result.unverified += 1
            result.example = result.example or p.solution.strip()[-60:]
    if result.verify is None:
        if a.source == "reference":
            raise ConfigError(
                f"anchors.source=reference but none of {len(sample)} sampled problems has a reference "
                f"solution (data.solution_field={cfg.data.solution_field!r}): set the field, or use "
                "anchors.source=self|both"
            )
        return result
    rewards_text = "rewards=[" + ",".join(cfg.rewards.functions) + "]"
    counts = (
        f"{result.ok} of {result.checked} sampled reference solutions can be anchors ({result.unverified} fail "
        f"{rewards_text}, {result.too_long} are longer than anchors.max_tokens={max_tokens}, "
        f"{result.missing} missing)"
    )
    fix = []
    if result.unverified:
        fix.append(
            f"make the solutions end in an answer {rewards_text} reads (one refused ends {result.example!r}"
            + (r"; the math checker reads the last \boxed{...}" if "math" in cfg.rewards.functions else "")
            + ")"
        )
    if result.unverified and not cfg.data.train_file and "task" not in cfg.rewards.functions:
        fix.append(
            "or add the task's grader, which reads the built-in references' '#### N' (rewards=[task] or [task,math])"
        )
    if result.too_long:
        fix.append("raise anchors.max_tokens")
    if result.ok == 0 and a.source == "reference":
        raise ConfigError(
            f"DaGRPO would get zero anchors: {counts}. Fix: " + "; ".join(fix + ["or use anchors.source=self|both"])
        )
    if result.ok < result.checked - result.missing:
        log(f"warning: {counts}. " + ("Fix: " + "; ".join(fix) if fix else ""))
    return result


def check_train_memory(
    cfg: RunConfig, model_path: str | None, world: int, device: str, log=print, prompt_tokens: int | None = None
) -> None:
    shape = model_shape(model_path) if model_path else builtin_shape()
    if shape is None:
        return
    g, r, on = cfg.grpo, cfg.rollout, features(cfg)
    per_question = samples_per_question(g.num_generations, g.samples_multiplier, on.n_variants, on.anchor_count)
    samples = g.prompts_per_step // max(world, 1) * per_question
    rows = min(samples, max(r.batch_size, per_question))
    prompt = cfg.data.max_prompt_tokens if prompt_tokens is None else prompt_tokens
    lora = on.lora
    est = estimate_memory(
        shape,
        rows_at_once=rows,
        total_samples=samples,
        prompt_tokens=prompt,
        new_tokens=r.max_new_tokens,
        update_rows=min(g.micro_batch_size, samples),
        training=not lora,  # LoRA: gradients and AdamW state for the adapters only
        reference=g.beta > 0 and not lora,
    )
    if r.backend == "vllm":  # vLLM sizes its own KV cache (gpu_memory_utilization / VLLM_CPU_KVCACHE_SPACE)
        for part in ("KV cache", "token buffers", "sampling logits"):
            est.parts[part] = 0
    check_memory(
        est,
        device,
        f"a training step ({samples} samples of up to {r.max_new_tokens} new tokens per process)",
        f"lower rollout.max_new_tokens, grpo.num_generations, grpo.prompts_per_step, rollout.batch_size or "
        f"grpo.micro_batch_size (largest part: {est.largest()})",
        log,
    )


def check_user_rewards(cfg: RunConfig, problems: list, task) -> None:
    """A user reward (`pkg.mod:obj`) returns a number or None: called on a few sampled problems' reference
    solutions (else their answers) before any model loads, so a reward returning a string, or a number
    beyond float32 (10**400), is one line now, not a traceback after the weights load; and a reward whose
    every call times out is refused (it would score nothing). Built-in rewards are known to return numbers."""
    if not any(":" in parse_weighted(spec)[0] for spec in cfg.rewards.functions):
        return
    sample = _sample(problems, cfg.seed)[:4]
    texts = [getattr(p, "solution", None) or str(getattr(p, "answer", "")) for p in sample]
    reward_fn = reward_fn_from_config(cfg.rewards, task)
    pop_counts(reward_fn)  # only this check's calls count
    try:
        _, out_of_range = checked_rewards(score_many(reward_fn, texts, sample), reward_fn)
        counts = pop_counts(reward_fn)
    finally:
        close = getattr(reward_fn, "close", None)
        if callable(close):
            close()
    rewards_text = "rewards=[" + ",".join(cfg.rewards.functions) + "]"
    if out_of_range:
        raise ConfigError(
            f"{rewards_text} returned a number beyond float32 (|r| > 3.4e38) for {out_of_range} of {len(texts)} "
            "sampled reference answers: such a reward cannot be trained on; scale it into a small range (e.g. 0..1)"
        )
    checked, timeouts = counts.get("checked", 0), counts.get("timeout", 0)
    if checked and timeouts >= checked:
        raise ConfigError(
            f"{rewards_text}: every call ({timeouts} of {checked}) on the sampled reference answers timed out at "
            f"rewards.timeout_s={cfg.rewards.timeout_s:g}: the run would score nothing and wait the whole deadline "
            "for each response; make the reward faster or raise rewards.timeout_s"
        )


def before_weights_load(
    cfg: RunConfig,
    problems: list,
    task,
    tokenizer,
    model_path: str | None,
    world: int,
    device: str,
    encode_prompt,
    log=print,
) -> ReferenceCheck | None:
    """Every pre-load check of a training run, in order; returns the reference check (None: not run)."""
    check_api_keys(cfg)
    announce_keys(cfg, log)
    check_eval_file(cfg)
    longest_prompt = check_prompts(cfg, problems, encode_prompt, log)
    check_train_memory(cfg, model_path, world, device, log, prompt_tokens=longest_prompt)
    check_user_rewards(cfg, problems, task)
    return check_references(cfg, problems, task, lambda text: encode_response(tokenizer, text), log)


def collective_timeout_line(exc: BaseException) -> str | None:
    """The one line for a collective that timed out (a frozen, dead or far slower process), else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not re.search(r"timed out|timeout", text, re.IGNORECASE):
        return None
    if not re.search(r"gloo|nccl|watchdog|collective|ProcessGroup|store", text, re.IGNORECASE):
        return None
    detail = re.sub(r"^\[[^\]]*\]\s*", "", text.strip().splitlines()[0])[:160]
    return (
        "error: a collective timed out (train.collective_timeout_s): another process stopped answering "
        f"(frozen, killed or far slower); check its log, or raise the timeout if it works alone that long ({detail})"
    )

"""Rollouts from a vLLM engine colocated with the learner (same process, same GPU), as TRL's
`vllm_mode="colocate"` does.

Install with `pip install 'regroup-rl[vllm]'`. The engine runs in-process
(`distributed_executor_backend="external_launcher"`), so pushing the learner's weights after each
update is a `load_weights` call on the engine's model: no copy through another process. With sleep
mode the engine frees its GPU memory while the learner updates: level 2 drops weights and KV cache
(the current weights are pushed again on wake-up anyway), so the update has the GPU to itself.

Behaviour log-probs are vLLM's `logprobs=0` sampled-token log-probs with
`logprobs_mode="processed_logprobs"`: after temperature, before top-k/top-p, the same distribution the
HF sampler reports and the learner scores. vLLM's kernels still differ slightly from the learner's
forward; set `rollout.tis_cap` (e.g. 2) so the loss corrects for that (truncated importance sampling).
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Iterable

from regroup.rollout.base import Completion, SamplingParams
from regroup.sharded import full_parameters

INSTALL_HINT = "pip install 'regroup-rl[vllm]'"


def import_vllm():
    """The `vllm` module, or an ImportError that says how to install it."""
    try:
        import vllm  # optional (vllm): the vllm backend only
    except ImportError as e:
        raise ImportError(f"rollout.backend=vllm needs vLLM, which is not installed: {INSTALL_HINT} ({e})") from e
    return vllm


def request_seeds(num_prompts: int, seed: int | list[int] | None) -> list[int | None]:
    """One seed per prompt, the HF sampler's convention: an int gives prompt i the seed seed·1000003 + i;
    a list is used as is; None leaves sampling unseeded."""
    if seed is None:
        return [None] * num_prompts
    seeds = [seed * 1000003 + i for i in range(num_prompts)] if isinstance(seed, int) else list(seed)
    if len(seeds) != num_prompts:
        raise ValueError(f"got {len(seeds)} seeds for {num_prompts} prompts")
    return [s % (2**63) for s in seeds]


def vllm_param_name(name: str) -> str | None:
    """The name vLLM's `load_weights` expects for an HF/peft parameter, or None for a LoRA-only tensor
    (adapters are merged into the base weights before pushing)."""
    if ".lora_" in name or "original_module" in name:
        return None
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    return name.replace("modules_to_save.default.", "").replace("_checkpoint_wrapped_module.", "")


def push_weights(model, load: Callable[[Iterable], object]) -> int:
    """Feed `model`'s current weights to `load([(name, tensor)])` one tensor at a time (no full copy);
    LoRA adapters are merged for the push and unmerged afterwards. Under FSDP / ZeRO-3 each parameter
    is gathered whole first (`sharded.full_parameters`; every process pushes, so the gathers line up).
    Returns the number pushed."""
    is_peft = hasattr(model, "peft_config") and hasattr(model, "merge_adapter")
    if is_peft:
        model.merge_adapter()
    try:
        pushed = 0
        for name, tensor in full_parameters(model):
            target = vllm_param_name(name)
            if target is None:
                continue
            load([(target, tensor)])
            pushed += 1
        return pushed
    finally:
        if is_peft:
            model.unmerge_adapter()


# Where the in-process engine keeps its model, newest vLLM first: V1's worker wrapper, then V0's runner.
_IN_PROCESS_MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),
)


def engine_weight_loader(llm) -> Callable[[Iterable], object]:
    """How to hand weights to the colocated engine: the in-process model's `load_weights` (zero-copy;
    what TRL's colocate mode calls), else the public `LLM.apply_model` (runs a function on the
    engine's model; documented since vLLM 0.9).

    vLLM's documented weight-transfer API (`init_weight_transfer_engine` / `start_weight_update` /
    `update_weights` / `finish_weight_update`, NCCL or CUDA-IPC backends) moves weights from a trainer
    in *another* process into the engine; with the engine in this process (external_launcher) the
    model's own `load_weights` is the same update without serialising handles, so it is not used here.
    """
    for path in _IN_PROCESS_MODEL_PATHS:
        target = llm
        for attr in path:
            target = getattr(target, attr, None)
            if target is None:
                break
        if target is not None and callable(getattr(target, "load_weights", None)):
            return target.load_weights
    if not hasattr(llm, "apply_model"):
        raise RuntimeError("this vLLM version exposes neither the in-process model (driver_worker.[worker.]model_runner"
                           ".model) nor LLM.apply_model: cannot push weights into the engine")

    def load(weights):
        weights = list(weights)
        return llm.apply_model(lambda model: model.load_weights(weights))

    return load


def _base_path(model) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    path = getattr(base, "name_or_path", None) or getattr(getattr(base, "config", None), "_name_or_path", None)
    if not path or not os.path.isdir(path):
        raise ValueError(f"the vLLM backend loads the model folder the policy came from; got {path!r}")
    return path


def _set_launcher_env() -> None:
    """vLLM's external_launcher reads the torch.distributed variables; fill them for a 1-process run."""
    import torch.distributed as dist  # only the colocated engine's process group needs it

    if dist.is_available() and dist.is_initialized():
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def engine_kwargs(model, rollout_cfg, sleep_mode: bool, max_prompt_tokens: int | None = None) -> dict:
    """`vllm.LLM(...)` arguments for a colocated engine over the policy's folder."""
    if rollout_cfg.vllm_tensor_parallel_size != 1:
        # external_launcher makes the processes of a tensor-parallel group one engine, which needs the
        # same requests from each of them; regroup gives each process its own groups and does not yet
        # gather them across the group, so the engine would hang or answer the wrong prompts.
        raise ValueError(f"rollout.vllm_tensor_parallel_size={rollout_cfg.vllm_tensor_parallel_size}: the colocated "
                         "vLLM engine supports 1 only (each process samples its own groups)")
    kwargs = dict(
        model=_base_path(model),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
        enable_sleep_mode=sleep_mode,
        tensor_parallel_size=rollout_cfg.vllm_tensor_parallel_size,
        distributed_executor_backend="external_launcher",  # the engine lives in this process
        logprobs_mode="processed_logprobs",  # after temperature, as the learner scores
        seed=int(os.environ.get("RANK", "0")),
    )
    max_len = rollout_cfg.vllm_max_model_len
    if not max_len and max_prompt_tokens:
        max_len = max_prompt_tokens + rollout_cfg.max_new_tokens
    if max_len:
        kwargs["max_model_len"] = int(max_len)
    return kwargs


class VLLMSampler:
    """The Sampler seam over a colocated `vllm.LLM`.

    Engine settings come from the rollout config: `vllm_gpu_memory_utilization`, `vllm_max_model_len`
    (0: `max_prompt_tokens + max_new_tokens` when `max_prompt_tokens` is given, else the model's own
    limit), `vllm_enable_sleep_mode` and `vllm_tensor_parallel_size`. `enable_sleep_mode` None means
    the config's value. `llm` is for tests: an engine to use instead of building one.
    """

    def __init__(self, model, tokenizer, rollout_cfg, *, enable_sleep_mode: bool | None = None, llm=None,
                 max_prompt_tokens: int | None = None):
        vllm = import_vllm()
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        if enable_sleep_mode is None:
            enable_sleep_mode = rollout_cfg.vllm_enable_sleep_mode
        self.sleep_mode = bool(enable_sleep_mode)
        if llm is None:
            _set_launcher_env()
            llm = vllm.LLM(**engine_kwargs(model, rollout_cfg, self.sleep_mode, max_prompt_tokens))
        self.llm = llm
        self._load = engine_weight_loader(llm)
        # Level-2 sleep drops the weights: they are pushed again on every wake-up.
        self._asleep = False
        if self.sleep_mode:
            self.llm.sleep(level=2)
            self._asleep = True

    # ----------------------------------------------------------------------------------- weights
    def _push(self) -> None:
        push_weights(self.model, self._load)
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    def sync_weights(self, model) -> None:
        """Sample from `model`'s weights from now on. Asleep, the push waits for the next wake-up."""
        self.model = model
        if not self._asleep:
            self._push()

    # ---------------------------------------------------------------------------------- sampling
    def build_requests(self, prompts: list[list[int]], params: SamplingParams, seed) -> tuple[list, list]:
        """(vLLM prompts, one vLLM SamplingParams per prompt) for `generate`."""
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        sampling = [
            self._vllm.SamplingParams(
                n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                logprobs=0, seed=s, stop_token_ids=[self.eos_id],
                detokenize=False,  # text comes from our tokenizer (to_completion); saves vLLM the work
            )
            for s in request_seeds(len(prompts), seed)
        ]
        return inputs, sampling

    def to_completion(self, prompt_index: int, output) -> Completion:
        """One vLLM CompletionOutput as a Completion (EOS kept in the tokens, as the HF sampler does)."""
        ids = list(output.token_ids)
        logps = [_sampled_logp(entry, tok) for entry, tok in zip(output.logprobs or [], ids)]
        if len(logps) != len(ids):
            logps = None  # no per-token log-probs: the loss runs without TIS for this batch
        truncated = output.finish_reason == "length"
        if not truncated and (not ids or ids[-1] != self.eos_id):
            # Stopped on EOS but vLLM left it out: the learner must see the EOS to learn to stop.
            ids.append(self.eos_id)
            if logps is not None:
                logps.append(math.nan)  # unknown: its IS weight is 1 (ratios.truncated_is_weight)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(prompt_index, ids, text, logps, truncated)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | list[int] | None = None) -> list[Completion]:
        """n completions per prompt (prompt-major), each with its behaviour log-probs."""
        inputs, sampling = self.build_requests(prompts, params, seed)
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._push()
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        outputs = self.llm.generate(inputs, sampling_params=sampling, use_tqdm=False)
        if self.sleep_mode:
            self.llm.sleep(level=2)  # hand the GPU memory back to the update
            self._asleep = True
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(prompts)} prompts")
        completions = []
        for i, request in enumerate(outputs):
            if len(request.outputs) != params.n:
                raise RuntimeError(f"vLLM returned {len(request.outputs)} completions for prompt {i}, expected {params.n}")
            completions.extend(self.to_completion(i, o) for o in sorted(request.outputs, key=lambda o: o.index))
        return completions


def _sampled_logp(entry, token_id: int) -> float:
    """The sampled token's log-prob from one position's {token_id: Logprob} (NaN when absent)."""
    if not entry or token_id not in entry:
        return math.nan
    value = entry[token_id]
    value = getattr(value, "logprob", value)
    return float(value)

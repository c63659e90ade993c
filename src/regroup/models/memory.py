"""Memory estimates from a model's config.json, checked against the memory free now, before weights load.

`estimate_memory` counts the KV cache, token buffers, logits and optimizer state of a step; `check_memory` refuses
(one `ConfigError` line) when the estimate exceeds what is free and warns above 80 % of it. `check_eval_memory` is
an evaluation's check; a training step's is `train.preflight.check_train_memory`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from regroup.errors import ConfigError
from regroup.models.tiny import TinyModelConfig


@dataclass
class MemoryEstimate:
    parts: dict[str, int]
    """What -> bytes."""

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def largest(self) -> str:
        return max(self.parts, key=self.parts.__getitem__)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def model_shape(model_path: str | None) -> dict | None:
    """Layers, KV heads, head size, vocabulary and weight bytes from an HF folder's config.json (None: unknown)."""
    if not model_path:
        return None
    folder = Path(model_path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    heads = int(config.get("num_attention_heads") or 1)
    hidden = int(config.get("hidden_size") or 0)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors")) or sum(
        f.stat().st_size for f in folder.glob("*.bin")
    )
    return {
        "layers": int(config.get("num_hidden_layers") or 0),
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or (hidden // heads if heads else 0)),
        "vocab": int(config.get("vocab_size") or 0),
        "weight_bytes": int(weights),
        "dtype_bytes": 2 if str(config.get("dtype") or config.get("torch_dtype")) in ("bfloat16", "float16") else 4,
    }


def builtin_shape() -> dict:
    """The built-in tiny model's shape (the warm-up's default TinyModelConfig), without warming it up."""
    m = TinyModelConfig()
    params = m.num_layers * (4 * m.hidden_size**2 + 3 * m.hidden_size * m.intermediate_size) + 128 * m.hidden_size
    return {
        "layers": m.num_layers,
        "kv_heads": m.num_heads,
        "head_dim": m.hidden_size // m.num_heads,
        "vocab": 128,
        "weight_bytes": 4 * params,
        "dtype_bytes": 4,
    }


def estimate_memory(
    shape: dict,
    *,
    rows_at_once: int,
    total_samples: int,
    prompt_tokens: int,
    new_tokens: int,
    update_rows: int = 0,
    training: bool = False,
    reference: bool = False,
) -> MemoryEstimate:
    """Peak bytes of a generation batch of `rows_at_once` sequences (KV cache [L, 2, rows, kv, P+T, D], token
    and log-prob buffers [rows, T], logits and sampling noise [rows, V]), the step's `total_samples`
    responses held at full length (ids + log-probs), an update micro-batch of `update_rows` (float32
    logits [rows, T, V] of the response tokens), and the weights (x4 when training: gradients and AdamW's
    two moments; + a reference copy). A lower bound on purpose (activations are left out): it refuses only
    what cannot fit."""
    seq = prompt_tokens + new_tokens
    kv = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * shape["dtype_bytes"]
    parts = {
        "KV cache": rows_at_once * seq * kv,
        "token buffers": rows_at_once * new_tokens * 16,  # ids int64 + log-probs fp32 + lengths/mask
        "sampling logits": rows_at_once * shape["vocab"] * 4 * 3,
        "responses kept": total_samples * (new_tokens * 12 + 2048),  # ids + log-probs + a Sample object
        "update logits": update_rows * new_tokens * shape["vocab"] * 4,
        "weights": shape["weight_bytes"] * ((4 if training else 1) + (1 if reference else 0)),
    }
    return MemoryEstimate(parts)


def available_memory(device: str = "cpu") -> int | None:
    """Bytes free now: the GPU's free memory, else MemAvailable (bounded by a cgroup limit); None if unknown."""
    if device.startswith("cuda"):
        try:
            return int(torch.cuda.mem_get_info()[0])
        except Exception:
            return None
    free: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            room = int(limit) - used
            free = room if free is None else min(free, room)
    except (OSError, ValueError):
        pass
    return free


def check_memory(estimate: MemoryEstimate, device: str, what: str, fix: str, log=print) -> None:
    """Refuse when the estimate exceeds the memory free now; warn above 80 % of it."""
    free = available_memory(device)
    if free is None:
        return
    total = estimate.total
    detail = ", ".join(f"{k} {_gib(v)}" for k, v in sorted(estimate.parts.items(), key=lambda kv: -kv[1])[:3])
    if total > free:
        raise ConfigError(f"{what} needs about {_gib(total)} ({detail}) but {_gib(free)} is free on {device}: {fix}")
    if total > 0.8 * free:
        log(f"warning: {what} needs about {_gib(total)} of the {_gib(free)} free on {device} ({detail})")


def check_eval_memory(
    model_path: str, *, n: int, batch_size: int, max_new_tokens: int, problems: int, device: str | None, log=print
) -> None:
    shape = model_shape(model_path)
    if shape is None:
        return
    rows = max(1, batch_size // max(n, 1)) * max(n, 1)
    est = estimate_memory(shape, rows_at_once=rows, total_samples=0, prompt_tokens=0, new_tokens=max_new_tokens)
    dev = device or ("cuda" if _cuda() else "cpu")
    check_memory(
        est,
        dev,
        f"evaluation ({rows} sequences of up to {max_new_tokens} new tokens at once)",
        f"lower --max-new-tokens or --batch-size (largest part: {est.largest()})",
        log,
    )


def _cuda() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False

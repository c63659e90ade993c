"""A lean decoder for Llama / Qwen2 / Qwen3-style causal LMs that reads the HF model's own weights.

Why: for small models the per-token cost of an HF forward is dominated by Python and dispatch overhead
(~1,100 profiler events per decode step for the 4-layer tiny model: mask construction, cache objects,
attention-interface dispatch). This module runs the same computation with ~15 tensor ops per layer over a
preallocated KV cache. It holds no copy of the weights (only views, re-read at `refresh()`), so after an
optimizer step it samples from the updated policy. `tests/rollout/test_fast_decode.py` checks its logits against
the HF forward; unsupported configurations (rope scaling, sliding windows, biases other than Qwen2's
q/k/v bias, ...) are refused by `supports()` and the sampler falls back to the HF forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED = {"llama", "qwen2", "qwen3", "mistral"}


def supports(model) -> bool:
    """True when this decoder reproduces `model`'s forward exactly."""
    model_config = getattr(model, "config", None)
    if model_config is None or getattr(model_config, "model_type", None) not in SUPPORTED:
        return False
    if hasattr(model, "peft_config"):
        return False  # LoRA-wrapped: weights are not plain Linear layers
    rope = getattr(model_config, "rope_scaling", None) or {}
    if rope and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return False
    params = getattr(model_config, "rope_parameters", None) or {}
    if params and params.get("rope_type", "default") != "default":
        return False
    if getattr(model_config, "sliding_window", None) and getattr(model_config, "use_sliding_window", False):
        return False
    if getattr(model_config, "hidden_act", "silu") != "silu" or getattr(model_config, "mlp_bias", False):
        return False
    if getattr(model_config, "model_type", None) == "llama" and getattr(model_config, "attention_bias", False):
        return False
    return True


def _rope_theta(model_config) -> float:
    """The rotary base of a transformers model config (`rope_parameters` in recent versions, `rope_theta` before)."""
    params = getattr(model_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(model_config, "rope_theta", 10000.0)))


class FastDecoder:
    def __init__(self, model):
        if not supports(model):
            raise ValueError(f"FastDecoder does not support {type(model).__name__}")
        self.model = model
        model_config = model.config
        self.num_heads = model_config.num_attention_heads
        self.num_kv_heads = getattr(model_config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // self.num_heads
        self.eps = model_config.rms_norm_eps
        self.qk_norm = model_config.model_type == "qwen3"
        self.scale = self.head_dim**-0.5
        self.theta = _rope_theta(model_config)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the weights (views of the live parameters; after `load_state_dict` objects may change)."""
        base = self.model.model
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.lm_head = self.model.lm_head.weight
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                {
                    "in_norm": layer.input_layernorm.weight,
                    "post_norm": layer.post_attention_layernorm.weight,
                    "q": a.q_proj.weight,
                    "k": a.k_proj.weight,
                    "v": a.v_proj.weight,
                    "o": a.o_proj.weight,
                    "q_b": a.q_proj.bias,
                    "k_b": a.k_proj.bias,
                    "v_b": a.v_proj.bias,
                    "q_norm": a.q_norm.weight if self.qk_norm else None,
                    "k_norm": a.k_norm.weight if self.qk_norm else None,
                    "gate": m.gate_proj.weight,
                    "up": m.up_proj.weight,
                    "down": m.down_proj.weight,
                }
            )
        device = self.embed.device
        self.inv_freq = 1.0 / (
            self.theta ** (torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim)
        )

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # HF RMSNorm: normalise in float32, multiply by the weight in the input dtype.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(dtype)

    def _rope(self, positions: torch.Tensor, dtype):
        freqs = positions.float()[..., None] * self.inv_freq  # [B, S, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [B, S, D]
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, S, D]

    @staticmethod
    def _rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    def start(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        max_new_tokens: int,
        rows: torch.Tensor | None = None,
    ):
        """Prefill a left-padded prompt batch [U, P]; returns last-position logits [N, V] and the decode
        state of N sequences. `rows` [N] (default: one per prompt) names each sequence's prompt: a prompt
        is prefilled once and its cache copied to its sequences."""
        if rows is not None and len(rows) != len(input_ids):
            logits, state = self.start(input_ids, attention_mask, positions, max_new_tokens)
            for key in ("k", "v"):
                state[key] = state[key][:, rows]  # [L, N, kv, S, D]
            state["valid"] = state["valid"][rows]  # [N, S]
            return logits[rows], state
        b, p = input_ids.shape
        dtype = self.embed.dtype
        total = p + max_new_tokens
        kv_shape = (len(self.layers), b, self.num_kv_heads, total, self.head_dim)
        state = {
            "k": torch.empty(kv_shape, dtype=dtype, device=input_ids.device),
            "v": torch.empty(kv_shape, dtype=dtype, device=input_ids.device),
            "valid": torch.zeros((b, total), dtype=torch.bool, device=input_ids.device),  # [B, S] key is real
            "length": p,
        }
        state["valid"][:, :p] = attention_mask.bool()
        causal = torch.ones((p, p), dtype=torch.bool, device=input_ids.device).tril()  # [P, P]
        mask = causal[None, None] & state["valid"][:, None, None, :p]  # [B, 1, P, P]
        # A fully padded query row (left padding) would be all -inf: let it see itself.
        mask = mask | torch.eye(p, dtype=torch.bool, device=input_ids.device)[None, None]
        logits = self._forward(input_ids, positions, state, 0, mask)
        return logits[:, -1], state

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, state) -> torch.Tensor:
        """One decode step for tokens [B] at positions [B]; returns logits [B, V]."""
        at = state["length"]
        state["valid"][:, at] = True
        mask = state["valid"][:, None, None, : at + 1]  # [B, 1, 1, S]
        logits = self._forward(tokens[:, None], positions[:, None], state, at, mask)
        state["length"] = at + 1
        return logits[:, -1]

    @staticmethod
    def keep_rows(state, keep: torch.Tensor) -> None:
        """Keep only the sequences `keep` [A'] of the decode state (rows that ended are dropped)."""
        for key in ("k", "v"):
            state[key] = state[key][:, keep]  # [L, A', kv, S, D]
        state["valid"] = state["valid"][keep]  # [A', S]

    def _forward(self, ids, positions, state, at: int, mask) -> torch.Tensor:
        b, s = ids.shape
        h = F.embedding(ids, self.embed)  # [B, S, H]
        cos, sin = self._rope(positions, h.dtype)
        end = at + s
        groups = self.num_heads // self.num_kv_heads
        for i, w in enumerate(self.layers):
            x = self._norm(h, w["in_norm"])
            q = F.linear(x, w["q"], w["q_b"]).view(b, s, self.num_heads, self.head_dim)
            k = F.linear(x, w["k"], w["k_b"]).view(b, s, self.num_kv_heads, self.head_dim)
            v = F.linear(x, w["v"], w["v_b"]).view(b, s, self.num_kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = self._norm(q, w["q_norm"]), self._norm(k, w["k_norm"])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, S, D]
            q = q * cos + self._rotate(q) * sin
            k = k * cos + self._rotate(k) * sin
            state["k"][i, :, :, at:end] = k
            state["v"][i, :, :, at:end] = v
            keys, values = state["k"][i, :, :, :end], state["v"][i, :, :, :end]  # [B, kv, S_all, D]
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                values = values.repeat_interleave(groups, dim=1)
            if s == 1:
                # One query: two batched matmuls beat the CPU flash kernel (which tiles for long queries).
                scores = (q @ keys.transpose(-1, -2)) * self.scale  # [B, h, 1, S_all]
                scores = scores.float().masked_fill(~mask, float("-inf"))
                attn = scores.softmax(-1).to(values.dtype) @ values  # [B, h, 1, D]
            else:
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)  # [B, h, S, D]
            h = h + F.linear(attn.transpose(1, 2).reshape(b, s, -1), w["o"])
            x = self._norm(h, w["post_norm"])
            h = h + F.linear(F.silu(F.linear(x, w["gate"])) * F.linear(x, w["up"]), w["down"])
        h = self._norm(h[:, -1:], self.final_norm)
        return F.linear(h, self.lm_head)  # [B, 1, V]

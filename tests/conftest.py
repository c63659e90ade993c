"""Shared fixtures: a tiny random model saved in HF format (no warm-up needed for plumbing tests)."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny Qwen3 model + char tokenizer, saved with save_pretrained."""
    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)

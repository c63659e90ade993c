"""Helpers shared by the benchmarks: the model to measure on, and a median."""

from __future__ import annotations

import statistics
from pathlib import Path


def benchmark_model_dir(tmp: Path) -> tuple[str, str]:
    """The warmed-up tiny model if `make warmup` / the demo made one, else a random tiny model.
    Returns (path, description)."""
    warm = Path("runs/warmup")
    if (warm / "config.json").exists():
        return str(warm), "warmed-up tiny model (runs/warmup)"
    from regroup.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return str(tmp), "random tiny model (no runs/warmup found)"


def median(values: list[float]) -> float:
    return statistics.median(values)

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


def honour_shared_prefix_switch(cfg) -> None:
    """Until the trainer is wired for issue 15, do here what it will do: pass `grpo.shared_prefix` to
    `response_logps`, and (shared prefix on) order the update's samples by prompt
    (`logprobs.order_by_prompt`) so micro-batches keep a group's rows, anchors included, together."""
    import functools

    import regroup.trainer
    from regroup.logprobs import order_by_prompt, response_logps

    regroup.trainer.response_logps = functools.partial(response_logps, shared_prefix=cfg.grpo.shared_prefix)
    trainer_cls = regroup.trainer.Trainer
    original = getattr(trainer_cls, "_update_before_issue15", trainer_cls.update)
    trainer_cls._update_before_issue15 = original
    if cfg.grpo.shared_prefix:
        trainer_cls.update = lambda self, samples: original(self, order_by_prompt(samples))
    else:
        trainer_cls.update = original

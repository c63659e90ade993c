"""One process of the multi-process equality test (`tests/distributed/test_ddp.py`).

Run by `accelerate launch ... tests/_dist_worker.py MODEL_DIR RUN_DIR OUT_DIR [overrides ...]` (or
imported, for the 1-process reference). Trains a few steps with the Trainer and writes
`OUT_DIR/rank{r}.json`: the world size and backend it really ran with, each step's metrics before and
after the cross-process reduction, and a probe of `_reduce_metrics` with keys present on one rank only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def digit_reward(response: str, problem) -> float:
    """Fraction of the response's characters that are digits: a reward a random model already varies
    on, so groups are mixed and every step makes a real update (the task grader gives all zeros)."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def make_config(model_dir: str, run_dir: str, recipe: str = "grpo.yaml", overrides: tuple[str, ...] = ()):
    """The small run both the 1- and the 2-process side train (4 groups of 4, 12 tokens, 3 steps)."""
    from regroup.train.run_config import load_config

    return load_config(
        CONFIGS / recipe,
        [
            f"model.path={model_dir}",
            f"run_dir={run_dir}",
            "data.num_train=64",
            "grpo.prompts_per_step=4",
            "grpo.num_generations=4",
            "rollout.max_new_tokens=12",
            "train.steps=3",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "optim.warmup_steps=1",
            "optim.lr=1e-3",
            "rewards=[_dist_worker:digit_reward]",
            "train.threads=1",
            *overrides,
        ],
    )


def main(argv: list[str]) -> None:
    model_dir, run_dir, out_dir, recipe, *overrides = argv
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # so `_dist_worker:digit_reward` imports
    from regroup.train.build import build_trainer

    trainer = build_trainer(make_config(model_dir, run_dir, recipe, tuple(overrides)), run_dir, log=lambda m: None)
    local, reduced = [], []
    reduce = trainer._reduce_metrics

    def recording(metrics: dict) -> dict:
        local.append(dict(metrics))
        out = reduce(metrics)
        reduced.append(dict(out))
        return out

    trainer._reduce_metrics = recording
    trainer.train()
    # A metric only one rank has (e.g. anchor metrics when only that rank's groups got an anchor).
    probe = {"shared": float(trainer.rank + 1)}
    if trainer.rank == trainer.world - 1:
        probe["last_rank_only"] = 7.0
    probe_out = reduce(probe)
    acc = trainer.acc
    record = {
        "rank": trainer.rank,
        "world": trainer.world,
        "distributed_type": str(acc.distributed_type),
        "backend": str(getattr(acc.state, "backend", None)),
        "logger_enabled": trainer.logger.enabled,
        "local": local,
        "reduced": reduced,
        "probe": probe_out,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank{trainer.rank}.json").write_text(json.dumps(record))
    acc.wait_for_everyone()
    acc.end_training()  # destroys the process group


if __name__ == "__main__":
    main(sys.argv[1:])
    # Everything is written. Skip the C++ teardown: under pytest, rank 0 intermittently aborted at exit
    # ("terminate called without an active exception") after all work had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

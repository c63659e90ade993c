"""Where regroup's step goes on the vs_trl reference config (4 prompts x 8 x 32 new tokens, beta 0).

    python benchmarks/profile_step.py [--steps 6 --threads 1] [overrides ...]

Runs the steps under cProfile after one warm-up step and prints the share of the step spent in the
rollout (sampler), the update's forward (`response_logps`), its backward, the optimizer step and the
rest, from cProfile's cumulative times of those functions.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARTS = {  # label: (file suffix, function name) whose cumulative time is the part
    "rollout (sampler.generate)": ("rollout/hf.py", "generate"),
    "update forward (response_logps)": ("regroup/models/logprobs.py", "response_logps"),
    "update backward (accelerator.backward)": ("accelerate/accelerator.py", "backward"),
    "optimizer step + clip": ("regroup/train/trainer.py", "_optimizer_step"),
    "whole step (train_step)": ("regroup/train/trainer.py", "train_step"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    tmp = Path(tempfile.mkdtemp(prefix="regroup-profile-"))
    model_dir, desc = benchmark_model_dir(tmp / "model")
    cfg = load_config(
        ROOT / "configs" / "grpo.yaml",
        [
            f"model.path={model_dir}",
            f"run_dir={tmp / 'run'}",
            "grpo.prompts_per_step=4",
            "grpo.num_generations=8",
            "rollout.max_new_tokens=32",
            "grpo.micro_batch_size=32",
            "grpo.beta=0.0",
            "grpo.loss_agg=token_mean",
            "optim.lr=1e-4",
            f"train.steps={args.steps + 1}",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "data.num_train=2000",
            f"train.threads={args.threads}",
            *args.overrides,
        ],
    )
    trainer = build_trainer(cfg, tmp / "run", log=lambda m: None)
    trainer.train_step(0)
    profiler = cProfile.Profile()
    profiler.enable()
    for step in range(1, args.steps + 1):
        trainer.train_step(step)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    cumulative = {}
    for (filename, _, name), (_, _, _, ct, _) in stats.items():
        for label, (suffix, fn) in PARTS.items():
            if name == fn and filename.endswith(suffix):
                cumulative[label] = cumulative.get(label, 0.0) + ct
    total = cumulative.get("whole step (train_step)", 0.0)
    print(f"model: {desc}; {args.steps} profiled steps, {args.threads} threads, shared_prefix={cfg.grpo.shared_prefix}")
    for label in PARTS:
        seconds = cumulative.get(label, 0.0) / args.steps
        print(f"  {label:42s} {seconds:7.3f} s/step  {100 * seconds * args.steps / max(total, 1e-9):5.1f} %")


if __name__ == "__main__":
    main()

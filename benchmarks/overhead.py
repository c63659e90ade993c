"""Cost of the variants at equal samples: step time per generated token, alternated in one run.

    python benchmarks/overhead.py                 # ta_grpo vs grpo_matched, dagrpo (step scorer) vs grpo
    python benchmarks/overhead.py --judge         # also: judge scorer throughput against a local server

Each pair is built from the same model, with the same number of samples per step (128), and the two
trainers take turns step by step so both see the same machine state. The ratio is
median(step seconds / generated tokens) of the variant over that of its baseline (target <= 1.10).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_model_dir, median  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [("ta_grpo", "grpo_matched"), ("dagrpo", "grpo")]


def trainer_for(recipe: str, model_dir: str, run_dir: Path, steps: int, extra: list[str]):
    from regroup.experiments.demo import DemoSettings, recipe_overrides
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    overrides = recipe_overrides(recipe, DemoSettings(steps=steps, samples_per_step=128)) + [
        f"model.path={model_dir}",
        f"run_dir={run_dir}",
        "train.checkpoint_every=0",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "data.num_train=4000",
        *extra,
    ]
    return build_trainer(load_config(ROOT / "configs" / f"{recipe}.yaml", overrides), run_dir, log=lambda m: None)


def compare(variant: str, baseline: str, model_dir: str, tmp: Path, steps: int, skip: int, extra: list[str]) -> float:
    trainers = {name: trainer_for(name, model_dir, tmp / name, steps + skip, extra) for name in (variant, baseline)}
    per_token = {variant: [], baseline: []}
    per_step = {variant: [], baseline: []}
    phases = {variant: {}, baseline: {}}  # name -> time/* metric -> seconds per measured step
    tokens = {variant: [], baseline: []}
    for step in range(steps + skip):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            m = trainer.train_step(step)
            seconds = time.perf_counter() - t0
            if step >= skip:
                per_token[name].append(seconds / max(m["tokens/generated"], 1.0))
                per_step[name].append(seconds)
                tokens[name].append(m["tokens/generated"])
                for key, value in m.items():
                    if (key.startswith("time/") and key != "time/step") or key == "update/forwarded_frac":
                        phases[name].setdefault(key, []).append(value)
    ratio = median(per_token[variant]) / median(per_token[baseline])
    for name in (variant, baseline):
        # Where the step goes: the median of each timed phase; the rest is the trainer's own bookkeeping.
        parts = ", ".join(f"{key.split('/')[1]} {median(v):.3f}" for key, v in sorted(phases[name].items()))
        print(
            f"  {name:14s} median {1e3 * median(per_token[name]):.3f} ms per generated token, "
            f"{median(per_step[name]):.3f} s per step of 128 samples, "
            f"{median(tokens[name]):.0f} generated tokens; phases (s) and share of rows the update forwarded: {parts}"
        )
    print(
        f"ratio {variant}/{baseline} = {ratio:.3f} per generated token, "
        f"{median(per_step[variant]) / median(per_step[baseline]):.3f} per step"
    )
    return ratio


def judge_throughput(requests: int = 512, concurrency: int = 32) -> float:
    sys.path.insert(0, str(ROOT / "tests"))
    import os

    from fake_openai import FakeOpenAI  # the tests' OpenAI-compatible server

    from regroup.scorers import ScoreItem, build_scorer

    os.environ["REGROUP_BENCH_KEY"] = "sk-bench"
    with FakeOpenAI(api_key="sk-bench", responder=lambda body: "The steps are valid.\nSCORE: 7") as server:
        scorer = build_scorer(
            "judge", base_url=server.base_url, model="judge", api_key_env="REGROUP_BENCH_KEY", concurrency=concurrency
        )
        items = [ScoreItem(question=f"q{i}", response=f"r{i}", reference="ref") for i in range(requests)]
        t0 = time.perf_counter()
        scores = scorer.score_batch(items)
        seconds = time.perf_counter() - t0
    assert all(s == 7.0 for s in scores)
    rate = requests / seconds
    print(
        f"judge scorer: {requests} responses at {concurrency} concurrent requests in {seconds:.2f} s = {rate:.0f} scored/s"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the medians")
    parser.add_argument("--judge", action="store_true")
    parser.add_argument("--pairs", default=",".join(f"{a}:{b}" for a, b in PAIRS))
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for every trainer")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a machine other jobs load)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="regroup-overhead-"))
    model_dir, desc = benchmark_model_dir(tmp / "model")
    print(f"model: {desc}; 128 samples per step; {args.steps} measured steps after {args.skip}")
    for pair in args.pairs.split(","):
        variant, baseline = pair.split(":")
        compare(
            variant, baseline, model_dir, tmp, args.steps, args.skip, [f"train.threads={args.threads}", *args.overrides]
        )
    if args.judge:
        judge_throughput()


if __name__ == "__main__":
    main()

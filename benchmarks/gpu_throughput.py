"""Rollout and training throughput (tokens/s, MFU) of GRPO and TA-GRPO steps on a Qwen3-0.6B-shaped model.

    python benchmarks/gpu_throughput.py --out runs/bench/gpu_throughput.json          # one GPU, bf16
    python benchmarks/gpu_throughput.py --size tiny --out /tmp/tiny.json              # CPU smoke, seconds

The model is built from a config with random weights (hidden 1024, 28 layers, 16 heads, 8 KV heads,
head_dim 128, FFN 3072, vocab 151936, tied embeddings: ~0.6B parameters), saved, and trained by the real
Trainer (`model.path` points at it). Prompts come from the arithmetic task through the tiny character
tokenizer, whose ids all lie inside the model's vocabulary. A random model rarely emits EOS, so
responses run to `max_new_tokens`: the numbers are for full-length rollouts.

Counting (stated in the JSON as well):
  rollout FLOPs = 2 · params · (prompt + generated tokens)                     (forward only)
  update  FLOPs = 6 · params · tokens fed to the update (+ 2 · params · tokens for the frozen reference
                  forward when beta > 0, e.g. TA-GRPO's beta = 0.001)
  MFU = FLOPs / seconds / peak. Peak: H200 bf16 dense 989 TFLOP/s (`--peak-tflops` to change it; no MFU
  on CPU unless a peak is given). Attention's sequence-length term is left out (it is small at these
  lengths), so MFU is slightly understated.
Each recipe runs `--warmup-steps` untimed steps then `--steps` timed ones; medians are reported.
`--shared-prefix on,off` runs every recipe with the shared-prefix update (grpo.shared_prefix) on, then
off. Train tokens/s and MFU count the tokens the update scores (prompt + response per sample), so with
the shared prefix on they are effective rates: the update computes each distinct prompt once.
With vLLM installed (and CUDA), the colocated vLLM sampler is timed once, on the first recipe's prompts.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py
H200_BF16_DENSE_TFLOPS = 989.0


@dataclass
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype: str
    samples_per_step: int
    generations: int
    max_new_tokens: int
    micro_batch_size: int


SIZES = {
    # Qwen3-0.6B's shape; 128 samples x 256 new tokens per step.
    "full": Size(1024, 28, 16, 8, 128, 3072, 151936, "bfloat16", 128, 8, 256, 16),
    # The same code path in seconds on a CPU.
    "tiny": Size(64, 2, 4, 2, 16, 128, 512, "float32", 16, 4, 16, 16),
}
RECIPES = {"grpo": 0, "ta_grpo": 3}  # recipe -> rephrasings per question (the group is (N+1)·G)


def build_model_dir(size: Size, out: Path, device: str) -> int:
    """Save a random Qwen3 model of `size` plus the tiny char tokenizer to `out`; returns the parameter count."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from regroup.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        intermediate_size=size.ffn,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        rope_theta=1_000_000.0,
        dtype=size.dtype,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.6B parameters on the GPU takes seconds, on a CPU a minute
        model = Qwen3ForCausalLM(config).to(getattr(torch, size.dtype))
    params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return params


def make_trainer(recipe: str, rephrasings: int, size: Size, model_dir: Path, run_dir: Path, shared_prefix: bool = True):

    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    per_question = size.generations * (rephrasings + 1)
    overrides = [
        f"model.path={model_dir}",
        f"model.dtype={size.dtype}",
        f"run_dir={run_dir}",
        "data.num_train=2000",
        f"grpo.prompts_per_step={max(1, size.samples_per_step // per_question)}",
        f"grpo.num_generations={size.generations}",
        f"grpo.micro_batch_size={size.micro_batch_size}",
        f"rollout.max_new_tokens={size.max_new_tokens}",
        f"rollout.batch_size={size.samples_per_step}",
        "train.steps=1000",
        "train.checkpoint_every=0",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "diagnostics.grad_conflict_every=0",
        f"grpo.shared_prefix={shared_prefix}",
    ]
    return build_trainer(load_config(ROOT / "configs" / f"{recipe}.yaml", overrides), run_dir, log=lambda m: None)


def measure_recipe(
    recipe: str,
    rephrasings: int,
    size: Size,
    model_dir: Path,
    run_dir: Path,
    params: int,
    steps: int,
    warmup: int,
    peak_flops: float | None,
    with_vllm: bool,
    shared_prefix: bool = True,
) -> dict:
    """Median rollout and update throughput over `steps` timed Trainer steps."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = make_trainer(recipe, rephrasings, size, model_dir, run_dir, shared_prefix)
    beta = trainer.cfg.grpo.beta
    seen: dict = {}
    update = trainer.update

    def counting_update(batch):
        samples = batch.samples
        seen["update_tokens"] = sum(len(s.ratio_prompt_ids) + len(s.response_ids) for s in samples)
        seen["prompt_tokens"] = sum(len(s.prompt_ids) for s in samples)
        seen["prompts"] = [s.prompt_ids for s in samples]
        return update(batch)

    trainer.update = counting_update
    rows = []
    for step in range(warmup + steps):
        m = trainer.train_step(step)
        if step >= warmup:
            rows.append(
                {
                    "rollout_s": m["time/rollout"],
                    "update_s": m["time/update"],
                    "generated": m["tokens/generated"],
                    "prompt_tokens": seen["prompt_tokens"],
                    "update_tokens": seen["update_tokens"],
                }
            )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    rollout_flops = 2 * params * (med["prompt_tokens"] + med["generated"])
    update_flops = (6 + (2 if beta > 0 else 0)) * params * med["update_tokens"]
    result = {
        "recipe": recipe,
        "samples_per_step": len(seen["prompts"]),
        "beta": beta,
        "shared_prefix": shared_prefix,
        **med,
        "rollout_backend": trainer.cfg.rollout.backend,
        "rollout_tokens_per_s": med["generated"] / med["rollout_s"],
        "rollout_tflops": rollout_flops / med["rollout_s"] / 1e12,
        "train_tokens_per_s": med["update_tokens"] / med["update_s"],
        "train_tflops": update_flops / med["update_s"] / 1e12,
        "step_s": med["rollout_s"] + med["update_s"],
        # weights, optimizer state, (reference,) activations and the rollout's KV cache together
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    result["rollout_mfu"] = result["rollout_tflops"] * 1e12 / peak_flops if peak_flops else None
    result["train_mfu"] = result["train_tflops"] * 1e12 / peak_flops if peak_flops else None
    if with_vllm:
        result["vllm"] = measure_vllm(trainer, seen["prompts"], size, params, peak_flops)
    del trainer
    return result


def measure_vllm(trainer, prompts: list[list[int]], size: Size, params: int, peak_flops: float | None) -> dict:
    """The colocated vLLM sampler on the step's prompts: one warm-up call, then one timed call."""
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm import VLLMSampler

    sampler = VLLMSampler(
        trainer.acc.unwrap_model(trainer.model), trainer.tokenizer, trainer.cfg.rollout, enable_sleep_mode=False
    )
    sampler.sync_weights(trainer.acc.unwrap_model(trainer.model))
    params_s = SamplingParams(trainer.cfg.rollout.temperature, trainer.cfg.rollout.top_p, size.max_new_tokens, n=1)
    sampler.generate(prompts, params_s, seed=1)
    t0 = time.perf_counter()
    out = sampler.generate(prompts, params_s, seed=2)
    seconds = time.perf_counter() - t0
    generated = sum(len(c.token_ids) for c in out)
    del sampler
    gc.collect()
    tflops = 2 * params * (sum(map(len, prompts)) + generated) / seconds / 1e12
    return {
        "rollout_s": seconds,
        "generated": generated,
        "rollout_tokens_per_s": generated / seconds,
        "rollout_tflops": tflops,
        "rollout_mfu": tflops * 1e12 / peak_flops if peak_flops else None,
    }


def _vllm_usable() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def format_table(report: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"{'recipe':8s} {'sampler':8s} {'prefix':6s} {'rollout tok/s':>14s} {'rollout MFU':>12s} "
        f"{'train tok/s':>12s} {'train MFU':>10s} {'step s':>8s} {'peak GiB':>9s}"
    ]
    for r in report["results"]:
        prefix = "shared" if r.get("shared_prefix", True) else "padded"
        lines.append(
            f"{r['recipe']:8s} {r['rollout_backend']:8s} {prefix:6s} {r['rollout_tokens_per_s']:14,.0f} "
            f"{pct(r['rollout_mfu']):>12s} {r['train_tokens_per_s']:12,.0f} {pct(r['train_mfu']):>10s} {r['step_s']:8.2f} "
            + ("        -" if r.get("peak_memory_gib") is None else f"{r['peak_memory_gib']:9.1f}")
        )
        if "vllm" in r:
            v = r["vllm"]
            lines.append(
                f"{r['recipe']:8s} {'vllm':8s} {'-':6s} {v['rollout_tokens_per_s']:14,.0f} {pct(v['rollout_mfu']):>12s}"
            )
    peak = report["peak_tflops"]
    lines.append(
        f"params {report['params'] / 1e6:.1f}M, {report['dtype']} on {report['device']}; "
        + (f"MFU against a peak of {peak:g} TFLOP/s" if peak else "no MFU (no peak given for this device)")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", required=True, help="where to write the JSON report")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per recipe")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps per recipe first")
    parser.add_argument("--recipes", default="grpo,ta_grpo")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"peak for MFU (default: {H200_BF16_DENSE_TFLOPS:g}, H200 bf16 dense, on CUDA; none on CPU)",
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM sampler even if installed")
    parser.add_argument(
        "--shared-prefix", default="on", help="on | off | on,off: the update's shared prefix (grpo.shared_prefix)"
    )
    args = parser.parse_args(argv)
    prefix_modes = [{"on": True, "off": False}[m] for m in args.shared_prefix.split(",")]

    size = SIZES[args.size]
    cuda = torch.cuda.is_available()
    if args.size == "full" and not cuda:
        parser.error("--size full needs a GPU (use --size tiny on a CPU)")
    peak = args.peak_tflops if args.peak_tflops is not None else (H200_BF16_DENSE_TFLOPS if cuda else None)
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {sorted(RECIPES)}")
    with_vllm = not args.no_vllm and _vllm_usable()

    start = time.perf_counter()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        params = build_model_dir(size, model_dir, "cuda" if cuda else "cpu")
        results = []
        runs = [(recipe, shared) for recipe in recipes for shared in prefix_modes]
        for i, (recipe, shared) in enumerate(runs):
            # vLLM once: its rollout speed does not depend on the recipe, and a second engine in the same
            # process may not find the GPU memory the first one still holds.
            results.append(
                measure_recipe(
                    recipe,
                    RECIPES[recipe],
                    size,
                    model_dir,
                    Path(tmp) / f"{recipe}-{i}",
                    params,
                    args.steps,
                    args.warmup_steps,
                    peak * 1e12 if peak else None,
                    with_vllm and i == 0,
                    shared,
                )
            )
            if cuda:
                torch.cuda.empty_cache()
            # after every run, so a run cut off by a time limit still leaves the finished ones
            report = _report(args, size, params, peak, cuda, with_vllm, results, start)
            out_path.write_text(json.dumps(report, indent=2))
            print(format_table(report) if i == len(runs) - 1 else f"done: {recipe}, shared prefix {shared}", flush=True)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    return report


def _report(
    args, size: Size, params: int, peak: float | None, cuda: bool, with_vllm: bool, results: list[dict], start: float
) -> dict:
    return {
        "size": args.size,
        "shape": asdict(size),
        "params": params,
        "dtype": size.dtype,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "peak_tflops": peak,
        "flops": {
            "rollout": "2*params*(prompt+generated tokens)",
            "update": "6*params*update tokens (+2*params*update tokens for the reference forward when beta>0)",
        },
        "vllm": "measured" if with_vllm else "not measured (vLLM not installed, no CUDA, or --no-vllm)",
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "results": results,
        "wall_s": time.perf_counter() - start,
    }


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()

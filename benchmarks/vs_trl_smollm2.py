"""regroup against TRL's GRPOTrainer on a real model, SmolLM2-135M-Instruct, then rollout speed.

    python benchmarks/vs_trl.py --model smollm2 [--finetune lora,full --steps 3 --warmup-steps 1
        --prompts 2 --generations 4 --new-tokens 32 --threads 2 --model-dir models/smollm2
        --vllm-python .venv-vllm/bin/python]

1. The race. For each fine-tuning mode (LoRA r 16 / alpha 32 on q,k,v,o — regroup's defaults, given
   to TRL as a peft LoraConfig — and full), TRL and then regroup each run in a process of their own,
   with the same settings: P prompts x G samples x N new tokens, T = 1, top-p 1, beta 0, token-mean
   loss (TRL loss_type="dapo"), one micro-batch, lr 1e-5, fp32, `--threads` torch threads, the built-in
   arithmetic questions. Each reports its median step time after the warm-up steps, its mean response
   length and its peak RSS (ru_maxrss: model load included, the same model on both sides).
2. Rollout speed on the same prompt token ids (P prompts x G samples, one row per sample with its own
   seed, as the trainer samples): regroup's built-in sampler (`rollout.backend=hf`) in this venv; the
   vLLM engine in-process in the vLLM venv (`--vllm-python`; CPU: OpenMP bound to `--threads` cores,
   eager mode); and the same engine behind its OpenAI server through `rollout.backend=vllm_server`.
   Tokens/s = generated tokens / seconds, median over `--rollout-repeats` after one warm-up call.

Sequential, not alternated: the machine may be shared, so `uptime`'s load is printed beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LR = 1e-5


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse(argv):
    p = argparse.ArgumentParser(prog="vs_trl.py --model smollm2")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--model-dir", default=os.environ.get("REGROUP_SMOLLM2_DIR", "models/smollm2"))
    p.add_argument("--finetune", default="lora,full", help="comma list of lora, full")
    p.add_argument("--steps", type=int, default=3, help="measured steps per side")
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vllm-python", default=os.environ.get("REGROUP_VLLM_PYTHON", str(REPO / ".venv-vllm/bin/python")))
    p.add_argument("--rollout-repeats", type=int, default=3)
    p.add_argument("--skip-race", action="store_true")
    p.add_argument("--skip-rollout", action="store_true")
    p.add_argument("--child", choices=["trl", "regroup", "builtin", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--finetune-one", help=argparse.SUPPRESS)
    p.add_argument("--prompt-file", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------- the race
def questions(n: int, seed: int = 1234):
    from regroup.tasks import get_task

    task = get_task("arithmetic")
    return task, task.generate(n, seed=seed)


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    task, problems = questions(2000)
    by_question = {p.question: p for p in problems}

    def reward(completions, prompts=None, **kw):
        out = []
        for prompt, completion in zip(prompts, completions):
            question = prompt[-1]["content"] if isinstance(prompt, list) else prompt
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            out.append(task.grade(text, by_question[question]))
        return out

    batch = args.prompts * args.generations
    trl_args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-smollm2-"),
        per_device_train_batch_size=batch,
        num_generations=args.generations,
        gradient_accumulation_steps=1,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        loss_type="dapo",
        learning_rate=LR,
        max_steps=args.steps + args.warmup_steps,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    peft_config = None
    if args.finetune_one == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p.question}]} for p in problems])
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=trl_args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(args.model_dir),
        peft_config=peft_config,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    trainer.add_callback(Timer())
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"step_s": times, "mean_length": sum(lengths) / max(1, len(lengths))}


def child_regroup(args) -> dict:
    import torch

    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    torch.set_num_threads(args.threads)
    run = Path(tempfile.mkdtemp(prefix="regroup-smollm2-"))
    cfg = load_config(
        REPO / "configs" / "grpo.yaml",
        [
            f"model.path={args.model_dir}",
            f"model.lora.enabled={'true' if args.finetune_one == 'lora' else 'false'}",
            f"run_dir={run}",
            f"grpo.prompts_per_step={args.prompts}",
            f"grpo.num_generations={args.generations}",
            f"rollout.max_new_tokens={args.new_tokens}",
            "rollout.backend=hf",
            f"grpo.micro_batch_size={args.prompts * args.generations}",
            "grpo.beta=0.0",
            "grpo.loss_agg=token_mean",
            f"optim.lr={LR}",
            "optim.warmup_steps=0",
            f"train.steps={args.steps + args.warmup_steps}",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "data.num_train=2000",
            f"train.threads={args.threads}",
        ],
    )
    trainer = build_trainer(cfg, run, log=lambda m: None)
    times, lengths = [], []
    for step in range(args.steps + args.warmup_steps):
        t0 = time.perf_counter()
        metrics = trainer.train_step(trainer.step)
        trainer.step += 1
        times.append(time.perf_counter() - t0)
        lengths.append(metrics["length/mean"])
    return {"step_s": times, "mean_length": sum(lengths) / len(lengths)}


# ------------------------------------------------------------------------------------- rollout speed
def child_builtin(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from regroup.rollout.base import SamplingParams
    from regroup.rollout.hf import HFSampler

    torch.set_num_threads(args.threads)
    rows, seeds = json.loads(Path(args.prompt_file).read_text())
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    sampler = HFSampler(model, AutoTokenizer.from_pretrained(args.model_dir))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    return _timed(
        lambda r: [len(c.token_ids) for c in sampler.generate(rows, params, seed=[s + r for s in seeds])],
        args.rollout_repeats,
    )


def child_vllm(args) -> dict:
    """Runs under the vLLM venv's Python."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm

    rows, seeds = json.loads(Path(args.prompt_file).read_text())
    llm = vllm.LLM(model=args.model_dir, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)

    def once(r):
        params = [
            vllm.SamplingParams(
                n=1, temperature=1.0, top_p=1.0, max_tokens=args.new_tokens, seed=s + r, detokenize=False
            )
            for s in seeds
        ]
        outs = llm.generate([{"prompt_token_ids": p} for p in rows], sampling_params=params, use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outs]

    result = _timed(once, args.rollout_repeats)
    result["vllm"] = vllm.__version__
    return result


def _timed(generate, repeats: int) -> dict:
    """Tokens/s of `generate(repeat) -> [tokens per row]`: one warm-up call, then `repeats` timed ones."""
    generate(-1)
    rates, tokens = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        counts = generate(r)
        seconds = time.perf_counter() - t0
        rates.append(sum(counts) / seconds)
        tokens.append(sum(counts) / len(counts))
    return {"tokens_per_s": rates, "mean_length": sum(tokens) / len(tokens)}


def server_rollout(args, rows, seeds) -> dict:
    """The same rows through rollout.backend=vllm_server (HTTP to a vLLM server started here)."""
    import types

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm_server import LocalServer, VLLMServerSampler

    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    with LocalServer(args.model_dir, python=args.vllm_python, env=env) as server:
        cfg = types.SimpleNamespace(
            vllm_server_url=server.url,
            vllm_server_api_key_env=None,
            vllm_server_timeout_s=600.0,
            vllm_server_sync="reload",
            vllm_server_sync_dir=None,
        )
        sampler = VLLMServerSampler(model, tokenizer, cfg)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
        result = _timed(
            lambda r: [len(c.token_ids) for c in sampler.generate(rows, params, seed=[s + r for s in seeds])],
            args.rollout_repeats,
        )
        for _ in range(2):
            sampler.sync_weights(model)
        result["sync_s"] = sampler.sync_times
        result["start_s"] = server.start_seconds
        sampler.close()
    return result


# ------------------------------------------------------------------------------------------- driver
def run_child(args, python: str, child: str, extra: list[str], env: dict | None = None) -> dict:
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--child",
        child,
        "--model-dir",
        args.model_dir,
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup_steps),
        "--prompts",
        str(args.prompts),
        "--generations",
        str(args.generations),
        "--new-tokens",
        str(args.new_tokens),
        "--threads",
        str(args.threads),
        "--rollout-repeats",
        str(args.rollout_repeats),
        *extra,
    ]
    load_before = load_average()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"{child} child failed ({done.returncode}):\n{tail}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(load_before=load_before, load_after=load_average(), wall_s=time.perf_counter() - t0)
    return result


def median(values):
    import statistics

    return statistics.median(values)


def main(argv) -> None:
    args = parse(argv)
    if args.child:
        out = {"trl": child_trl, "regroup": child_regroup, "builtin": child_builtin, "vllm": child_vllm}[args.child](
            args
        )
        out["peak_rss_mib"] = peak_rss_mib()
        print(json.dumps(out))
        return
    if not Path(args.model_dir, "config.json").is_file():
        raise SystemExit(
            f"--model-dir {args.model_dir}: no SmolLM2 folder (regroup model fetch smollm2 --out models/smollm2)"
        )
    src = str(REPO / "src")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
    }
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; SmolLM2-135M-Instruct ({args.model_dir}); "
        f"{args.prompts} prompts x {args.generations} samples x {args.new_tokens} new tokens; {args.threads} threads"
    )
    if not args.skip_race:
        print(
            "\n| fine-tuning | side | median step s | steps | mean response tokens | peak RSS MiB | load before / after |"
        )
        print("|---|---|---|---|---|---|---|")
        for mode in args.finetune.split(","):
            medians = {}
            for side in ("trl", "regroup"):
                r = run_child(args, sys.executable, side, ["--finetune-one", mode], env)
                measured = r["step_s"][args.warmup_steps :]
                medians[side] = median(measured)
                print(
                    f"| {mode} | {side} | {medians[side]:.2f} | {len(measured)} | {r['mean_length']:.1f} | "
                    f"{r['peak_rss_mib']:.0f} | {r['load_before']} / {r['load_after']} |",
                    flush=True,
                )
            print(f"| {mode} | regroup/TRL | {medians['regroup'] / medians['trl']:.2f} | | | | |", flush=True)
    if args.skip_rollout:
        return
    from transformers import AutoTokenizer

    from regroup.models.prompting import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    _, problems = questions(args.prompts, seed=7)
    prompts = [encode_prompt(tokenizer, p.question) for p in problems]
    rows = [p for p in prompts for _ in range(args.generations)]
    seeds = list(range(len(rows)))
    prompt_file = Path(tempfile.mkdtemp(prefix="rollout-")) / "rows.json"
    prompt_file.write_text(json.dumps([rows, seeds]))
    print(
        f"\nrollout: {len(rows)} rows ({args.prompts} prompts x {args.generations}), <= {args.new_tokens} new tokens, T = 1"
    )
    print("| sampler | median tokens/s | repeats | mean response tokens | peak RSS MiB | load before / after |")
    print("|---|---|---|---|---|---|")
    results = {}
    for name, python, child in (
        ("regroup built-in (hf)", sys.executable, "builtin"),
        ("vLLM-CPU in-process", args.vllm_python, "vllm"),
    ):
        if child == "vllm" and not Path(python).is_file():
            print(f"| {name} | not run: no {python} | | | | |")
            continue
        r = run_child(args, python, child, ["--prompt-file", str(prompt_file)], env)
        results[child] = median(r["tokens_per_s"])
        label = f"{name} {r.get('vllm', '')}".strip()
        print(
            f"| {label} | {results[child]:.1f} | {len(r['tokens_per_s'])} | {r['mean_length']:.1f} | "
            f"{r['peak_rss_mib']:.0f} | {r['load_before']} / {r['load_after']} |",
            flush=True,
        )
    if Path(args.vllm_python).is_file():
        load_before = load_average()
        r = server_rollout(args, rows, seeds)
        results["server"] = median(r["tokens_per_s"])
        print(
            f"| vLLM server via rollout.backend=vllm_server | {results['server']:.1f} | {len(r['tokens_per_s'])} | "
            f"{r['mean_length']:.1f} | (server: another process) | {load_before} / {load_average()} |"
        )
        print(
            f"server start {r['start_s']:.0f} s; weight sync (reload) s: {', '.join(f'{t:.2f}' for t in r['sync_s'])}"
        )
    if "builtin" in results and "vllm" in results:
        faster = "vLLM-CPU" if results["vllm"] > results["builtin"] else "the built-in sampler"
        print(f"\n{faster} is faster here: vLLM/built-in tokens/s = {results['vllm'] / results['builtin']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])

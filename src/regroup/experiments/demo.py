"""`regroup demo`: the main job on the built-in task.

Warm-start the tiny model (cached), evaluate it, then train every recipe from that same start with the
same seed and the same budget of generated samples, evaluate each on the same held-out problems, and
write `runs/demo-<time>/report.html` (and `report.md`).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from regroup.io import write_atomic
from regroup.runtime.rundir import claim_run_dir, new_run_dir

RECIPES = ["grpo", "grpo_matched", "ta_grpo", "dagrpo", "dagrpo_ta"]
"""The recipes a demo trains (read by `regroup demo --recipes` while parsing: this module imports torch,
transformers and matplotlib only inside the functions that use them)."""
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # package data: found from a wheel install too


@dataclass
class DemoSettings:
    """What one demo runs. `samples_per_step` is held equal across recipes (prompts × samples each)."""

    steps: int = 50
    """RL steps per recipe."""
    samples_per_step: int = 128
    """Generated samples per step, the same for every recipe."""
    eval_problems: int = 200
    """Held-out problems (the same for every recipe and the starting model)."""
    eval_samples: int = 8
    """Samples per held-out problem at temperature 1 (pass@1 = mean@8, pass@8)."""
    warmup_dir: str = "runs/warmup"
    """The cached warmed-up model."""
    warmup_steps: int | None = None
    """Override the warm-up's SFT steps (quick mode)."""
    overrides: list[str] = field(default_factory=list)
    """Extra dotted overrides for every recipe."""


QUICK = DemoSettings(
    steps=3,
    samples_per_step=32,
    eval_problems=32,
    eval_samples=4,
    warmup_dir="runs/warmup-quick",
    warmup_steps=120,
    overrides=["rollout.max_new_tokens=40", "diagnostics.diversity_every=1"],
)


def recipe_overrides(recipe: str, settings: DemoSettings) -> list[str]:
    """Prompts per step so that every recipe generates `samples_per_step` samples."""
    from regroup.stages.groups import samples_per_question  # lazy: heavy, only when this runs
    from regroup.train.recipes import features  # lazy: heavy, only when this runs
    from regroup.train.run_config import load_config  # lazy: heavy, only when this runs

    cfg = load_config(CONFIG_DIR / f"{recipe}.yaml")
    on = features(cfg)
    per_question = samples_per_question(
        cfg.grpo.num_generations, cfg.grpo.samples_multiplier, on.n_variants, on.added_anchors
    )
    prompts = max(1, settings.samples_per_step // per_question)
    return [
        f"grpo.prompts_per_step={prompts}",
        f"train.steps={settings.steps}",
        f"train.checkpoint_every={settings.steps}",
        f"model.warmup_dir={settings.warmup_dir}",
    ]


def evaluate_model(
    model_path: str,
    problems,
    out_dir: Path,
    settings: DemoSettings,
    seed: int,
    ks: list[int] | None = None,
    device: str | None = None,
) -> dict:
    """pass@1 / pass@k / mean@n / greedy / by difficulty of a saved model on `problems` (`ks`: default 1, 4, n;
    `device`: where the model samples, default the CPU)."""
    from transformers import AutoModelForCausalLM  # heavy (transformers): only when a model is loaded

    from regroup.eval.runner import evaluate  # lazy: heavy, only when this runs
    from regroup.models.load import load_tokenizer  # lazy: heavy, only when this runs
    from regroup.tasks import get_task  # lazy: heavy, only when this runs

    task = get_task("arithmetic")
    model = AutoModelForCausalLM.from_pretrained(model_path)
    if device is not None:
        model = model.to(device)  # type: ignore[arg-type]  # typeshed's functools.wraps result does not bind self
    tokenizer = load_tokenizer(model_path)
    ks = ks or sorted({1, settings.eval_samples} | ({4} if settings.eval_samples >= 4 else set()))
    result = evaluate(
        model,
        tokenizer,
        problems,
        task.grade,
        n=settings.eval_samples,
        ks=ks,
        temperature=1.0,
        max_new_tokens=48,
        greedy=True,
        batch_size=256,
        seed=seed,
        progress=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "summary.json", json.dumps(result.summary, indent=2))
    write_atomic(out_dir / "per_problem.jsonl", "".join(json.dumps(r) + "\n" for r in result.to_dict()["problems"]))
    return result.summary


def smoke_note(settings: DemoSettings) -> str:
    """What the quick demo's report says first: it is a smoke run, and what would be a comparison."""
    steps = f"{settings.steps} RL step{'' if settings.steps == 1 else 's'}"
    start = (
        f"a {settings.warmup_steps}-step warm-up" if settings.warmup_steps else f"the warm-up in {settings.warmup_dir}"
    )
    return (
        f"A smoke run (regroup demo --quick): {steps} of {settings.samples_per_step} samples per recipe from "
        f"{start}, evaluated on {settings.eval_problems} problems × {settings.eval_samples} samples. It shows "
        "that every recipe trains, evaluates and reports; its numbers do not compare the recipes (changes this "
        "small are within noise, often exactly 0). `regroup demo` is the comparison."
    )


def warmup_config(settings: DemoSettings):
    """The warm-up the demo trains when `settings.warmup_dir` holds none (the default one, or the quick one)."""
    from regroup.train.warmup import WarmupConfig  # heavy (torch): only when the demo runs

    cfg = WarmupConfig()
    if settings.warmup_steps:
        cfg.steps = settings.warmup_steps
        cfg.schedule_steps = max(cfg.schedule_steps, settings.warmup_steps)
        cfg.num_eval = settings.eval_problems
        cfg.eval_samples = settings.eval_samples
    return cfg


def run_demo(
    quick: bool = False,
    seeds: int = 1,
    out_root: str = "runs",
    recipes: str | None = None,
    log=print,
    settings: DemoSettings | None = None,
) -> Path:
    from tqdm.auto import tqdm  # the heavy imports below: only when a demo runs (see RECIPES)

    from regroup.data.heldout import heldout_problems  # lazy: heavy, only when this runs
    from regroup.report import build_report  # lazy: heavy, only when this runs
    from regroup.runtime.checkpoint import list_checkpoints  # lazy: heavy, only when this runs
    from regroup.tasks import get_task  # lazy: heavy, only when this runs
    from regroup.train.build import build_trainer  # lazy: heavy, only when this runs
    from regroup.train.run_config import load_config  # lazy: heavy, only when this runs
    from regroup.train.warmup import differences, read_finished, warmup  # lazy: heavy, only when this runs

    settings = settings or (QUICK if quick else DemoSettings())
    names = recipes.split(",") if recipes else RECIPES
    unknown = [n for n in names if not (CONFIG_DIR / f"{n}.yaml").exists()]
    if unknown:
        raise ValueError(f"unknown recipe(s) {unknown}; available: {RECIPES}")
    demo_dir = new_run_dir(out_root, "demo")  # exclusive: two demos started in the same second get two folders
    started = time.perf_counter()

    warm = Path(settings.warmup_dir)
    wanted = warmup_config(settings)
    cached = read_finished(warm)
    if cached is None:
        bar = tqdm(total=wanted.steps, desc="warm-up SFT", dynamic_ncols=True)
        note = (
            "expected with --quick: its short warm-up is a smoke start; the full demo's warm-up lands in the band"
            if quick
            else None
        )
        warmup(
            warm,
            wanted,
            log=log,
            progress=lambda s, t, loss: (bar.update(1), bar.set_postfix(loss=f"{loss:.3f}")),
            out_of_band_note=note,
        )
        bar.close()
    else:
        changed = differences(cached, wanted)
        log(
            f"using the cached warmed-up model in {warm}"
            + (f" (warning: warmed up with other settings than this demo's: {'; '.join(changed)})" if changed else "")
        )

    task = get_task("arithmetic")
    base = load_config(CONFIG_DIR / "grpo.yaml")
    train_problems = task.generate(base.data.num_train, seed=base.data.seed)
    problems = heldout_problems(task, settings.eval_problems, base.data.eval_seed, train_problems)
    log(f"evaluating the starting model on {len(problems)} held-out problems")
    start_summary = evaluate_model(str(warm), problems, demo_dir / "start" / "eval", settings, seed=0)

    run_dirs = []
    jobs = [(name, seed) for seed in range(seeds) for name in names]
    overall = tqdm(total=len(jobs) * settings.steps, desc="demo", dynamic_ncols=True, position=0)
    for name, seed in jobs:
        run_dir = demo_dir / f"{name}-s{seed}"
        overrides = (
            recipe_overrides(name, settings)
            + settings.overrides
            + [f"seed={seed}", f"run_dir={run_dir}", "train.progress=false"]
        )
        cfg = load_config(CONFIG_DIR / f"{name}.yaml", overrides)
        t0 = time.perf_counter()

        def on_step(step, m, name=name):
            overall.update(1)
            overall.set_postfix_str(f"{name} step {step} reward {m.get('reward/mean', float('nan')):.2f}")

        with claim_run_dir(run_dir, "fresh", log=log) or contextlib.nullcontext():  # None only with lock=False
            trainer = build_trainer(cfg, run_dir, log=log)
            trainer.train(on_step=on_step)
        train_seconds = time.perf_counter() - t0
        final = list_checkpoints(run_dir)[-1]
        summary = evaluate_model(str(final), problems, run_dir / "eval", settings, seed=0)
        (run_dir / "eval_before").mkdir(exist_ok=True)
        for name_ in ("summary.json", "per_problem.jsonl"):  # per-problem results allow a paired SE
            write_atomic(run_dir / "eval_before" / name_, (demo_dir / "start" / "eval" / name_).read_bytes())
        write_atomic(run_dir / "timing.json", json.dumps({"train_seconds": train_seconds}))
        log(
            f"{name} (seed {seed}): pass@1 {start_summary['mean@n']:.3f} -> {summary['mean@n']:.3f} "
            f"in {train_seconds:.0f} s of training"
        )
        run_dirs.append(str(run_dir))
    overall.close()
    html, _ = build_report(
        run_dirs,
        str(demo_dir),
        title="regroup demo: GRPO variants on the built-in task" + (" (smoke run)" if quick else ""),
        notes=[smoke_note(settings)] if quick else (),
    )
    write_atomic(
        demo_dir / "demo.json",
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "quick": quick,
                "seeds": seeds,
                "recipes": names,
                "settings": settings.__dict__,
                "start": start_summary,
            },
            indent=2,
            default=str,
        ),
    )
    return Path(html)

"""`regroup demo` end to end at a toy size: every recipe from one start, evaluated, two seeds, a report."""

from __future__ import annotations

import json
import shutil

from regroup.experiments.demo import DemoSettings, recipe_overrides, run_demo


def test_every_recipe_gets_the_same_sample_budget():
    settings = DemoSettings(samples_per_step=128)
    prompts = {
        name: int(
            next(o for o in recipe_overrides(name, settings) if o.startswith("grpo.prompts_per_step")).split("=")[1]
        )
        for name in ["grpo", "grpo_matched", "ta_grpo", "dagrpo", "dagrpo_ta"]
    }
    # grpo: 16 x 8; matched: 4 x 32 of q0; TA: 4 x (3 + 1) x 8
    assert prompts == {"grpo": 16, "grpo_matched": 4, "ta_grpo": 4, "dagrpo": 16, "dagrpo_ta": 4}


def test_demo_runs_two_recipes_over_two_seeds_and_reports(tiny_model_dir, tmp_path):
    warm = tmp_path / "warm"
    shutil.copytree(tiny_model_dir, warm)
    (warm / "warmup_metrics.json").write_text("{}")  # a cached warm-up: the demo must reuse it
    settings = DemoSettings(
        steps=1,
        samples_per_step=8,
        eval_problems=4,
        eval_samples=2,
        warmup_dir=str(warm),
        overrides=[
            "rollout.max_new_tokens=6",
            "diagnostics.diversity_every=1",
            "data.num_train=32",
            "grpo.num_generations=2",
        ],
    )
    logged: list[str] = []
    html = run_demo(
        quick=True,  # with these toy settings: the quick demo's report must say it is a smoke run
        seeds=2,
        out_root=str(tmp_path / "runs"),
        recipes="grpo,ta_grpo",
        log=logged.append,
        settings=settings,
    )
    assert f"using the cached warmed-up model in {warm}" in logged  # "{}" records no settings to differ
    demo_dir = html.parent
    runs = sorted(p.name for p in demo_dir.iterdir() if p.is_dir() and p.name not in ("plots", "start"))
    assert runs == ["grpo-s0", "grpo-s1", "ta_grpo-s0", "ta_grpo-s1"]
    for name in runs:
        summary = json.loads((demo_dir / name / "eval" / "summary.json").read_text())
        before = json.loads((demo_dir / name / "eval_before" / "summary.json").read_text())
        assert summary["num_problems"] == before["num_problems"] == 4
    text = (demo_dir / "report.md").read_text()
    assert "grpo" in text and "ta_grpo" in text and (demo_dir / "report.html").exists()
    first = text.split("## What the results show")[0]  # said before any number
    assert "(smoke run)" in first
    assert (
        f"> **A smoke run (regroup demo --quick): 1 RL step of 8 samples per recipe from the warm-up in {warm}, "
        "evaluated on 4 problems × 2 samples. It shows that every recipe trains, evaluates and reports; its "
        "numbers do not compare the recipes"
    ) in first
    assert "A smoke run" in (demo_dir / "report.html").read_text()
    assert json.loads((demo_dir / "demo.json").read_text())["seeds"] == 2

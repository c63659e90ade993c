"""The `regroup` command line: each subcommand wired to its piece, config errors before any compute."""

from __future__ import annotations

import json
from pathlib import Path

from regroup.cli import main
from regroup.data.load import save_problems
from regroup.tasks import get_task

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_config_lists_every_key(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "grpo.loss_agg" in out and "ta.ratio_anchor" in out and "anchors.when" in out


def test_bad_config_fails_before_loading_anything(tmp_path, capsys, monkeypatch):
    import regroup.train.trainer

    def boom(*a, **k):
        raise AssertionError("the trainer must not be built for a bad config")

    monkeypatch.setattr(regroup.train.trainer, "Trainer", boom)
    code = main(["train", "--config", str(CONFIGS / "grpo.yaml"), "grpo.num_generations=two"])
    assert code == 2
    assert "grpo.num_generations" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2  # no config.yaml there


def test_train_and_resume_from_the_command_line(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "--config",
        str(CONFIGS / "grpo.yaml"),
        f"model.path={tiny_model_dir}",
        f"run_dir={run}",
        "data.num_train=32",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=2",
        "rollout.max_new_tokens=8",
        "train.steps=2",
        "train.progress=false",
        "diagnostics.diversity_every=0",
    ]
    assert main(args) == 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # resume with a longer budget continues from step 2
    assert main(["train", "--resume", str(run), "train.steps=3"]) == 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_rephrase_and_eval_commands(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "p.jsonl"
    save_problems(get_task("arithmetic").generate(4, seed=2), data)
    assert main(["rephrase", "--data", str(data), "--out", str(tmp_path / "ta.jsonl"), "--n", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "ta.jsonl").read_text().splitlines()]
    assert all(len(r["variants"]) == 2 for r in rows)
    assert (
        main(
            [
                "eval",
                "--model",
                tiny_model_dir,
                "--data",
                str(data),
                "--n",
                "2",
                "--k",
                "1,2",
                "--max-new-tokens",
                "6",
                "--checker",
                "task",
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    assert "average" in capsys.readouterr().out
    assert (tmp_path / "ev" / "summary.json").exists()


def test_config_stages_prints_the_recipe(capsys):
    root = Path(__file__).resolve().parents[1] / "configs"
    assert main(["config", "--stages", "--config", str(root / "dagrpo.yaml"), "overlong.filter=true"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("anchor_slots → sample → reward → anchors → advantages → mask → overlong_filter → loss[")
    assert "agg seq_sum_constant" in out

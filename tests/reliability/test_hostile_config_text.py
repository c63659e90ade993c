"""Config text built to hurt the parser (30,000 nested brackets, a 5,000-digit number, a duplicate key), as an
override, in a config file, in a saved config or in a checkpoint's run_config.json: one line each, never a
traceback or a hang."""

from __future__ import annotations

import pytest
import reliability_helpers as h

from regroup.cli import main

pytestmark = pytest.mark.reliability


@pytest.mark.parametrize(
    "override, words",
    [
        ("optim.lr=" + "[" * 30000, "nested more than 32 levels"),
        ("optim.lr=" + "9" * 5000, "out of range"),
        ("optim.lr=" + "9" * 4000, "optim.lr: a 4000-digit number is out of range"),
        ("train.steps=" + "9" * 4000, "train.steps: a 4000-digit integer is out of range"),
        ("optim={lr: 1, lr: 0.5}", "key 'lr' appears twice"),
    ],
)
def test_hostile_overrides_are_one_line(override, words, tmp_path, capsys, no_compute):
    assert main(["train", "--config", str(h.CONFIGS / "grpo.yaml"), f"run_dir={tmp_path / 'r'}", override]) == 2
    line = h.one_line(capsys)
    assert words in line and len(line) < 400


@pytest.mark.parametrize(
    "text, words",
    [
        ("recipe: grpo\noptim: " + "[" * 30000 + "\n", "nested more than 32 levels"),
        ("recipe: grpo\nseed: " + "9" * 5000 + "\n", "out of range"),
        (
            "recipe: grpo\noptim:\n  lr: 1.0e-4\ntrain:\n  steps: 2\noptim:\n  lr: 0.5\n",
            "key 'optim' appears twice (lines 2 and 6)",
        ),
    ],
)
def test_hostile_config_files_are_one_line(text, words, tmp_path, capsys, no_compute):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    assert main(["train", "--config", str(recipe), f"run_dir={tmp_path / 'r'}"]) == 2
    line = h.one_line(capsys)
    assert words in line and str(recipe) in line and len(line) < 400


def test_a_duplicate_key_in_a_saved_config_is_one_line(run_copy, capsys, no_compute):
    saved = run_copy / "config.yaml"
    saved.write_text(saved.read_text() + "optim:\n  lr: 0.5\n")
    assert main(["train", "--resume", str(run_copy)]) == 2
    line = h.one_line(capsys)
    assert "key 'optim' appears twice" in line and str(saved) in line


def test_a_deep_run_config_json_is_a_checkpoint_error(tmp_path):
    from regroup.runtime.checkpoint import CheckpointError, load_run_config

    (tmp_path / "run_config.json").write_text("[" * 30000)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_run_config(tmp_path)

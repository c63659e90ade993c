"""The `regroup` command line: each subcommand wired to its piece, config errors before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------------------------------------- help


def _subcommands(parser, prefix=()):
    """(command words, parser) of every subcommand, nested ones (`data prepare`) included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _subcommands(sub, (*prefix, name))


def test_every_option_of_every_command_has_help():
    import argparse

    from regroup.cli import build_parser

    missing = []
    for words, sub in _subcommands(build_parser()):
        if words[0] == "study":  # leaving the package with the study harness; its parser is not this one's
            continue
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(words)} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help: {missing}"


def test_warmup_help_states_the_defaults_it_has(capsys):
    from regroup.train.warmup import WarmupConfig

    with pytest.raises(SystemExit):
        main(["warmup", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    default = WarmupConfig()
    for value in (default.steps, default.schedule_steps, default.num_eval):
        assert f"the default, {value})" in text, value


def test_help_and_argument_parsing_do_not_import_torch():
    """`regroup --help` took 12.7 s on a loaded machine, importing torch and transformers to print text."""
    import subprocess
    import sys

    probe = (
        "import contextlib, io, sys\n"
        "from regroup.cli import build_parser\n"
        "parser = build_parser()\n"
        "for argv in ([], ['train'], ['eval'], ['warmup'], ['demo'], ['report'], ['rephrase'], ['config'],\n"
        "             ['vllm-serve'], ['data', 'prepare'], ['model', 'fetch']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            parser.parse_args([*argv, '--help'])\n"
        "        except SystemExit:\n"
        "            pass\n"
        "for argv in (['train', '--config', 'grpo', 'optim.lr=1e-4'], ['demo', '--recipes', 'grpo,dagrpo'],\n"
        "             ['rephrase', '--data', 'a', '--out', 'b', '--rewriter', 'rules'], ['report', 'runs/x'],\n"
        "             ['eval', '--model', 'm', '--data', 'd', '--k', '1,4']):\n"
        "    parser.parse_args(argv)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    # the entry point itself, as a user runs it: nothing imports torch on the way to the help text
    shown = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "regroup", "--help"], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0 and "usage: regroup" in shown.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in shown.stderr.splitlines() if "|" in line}
    assert "regroup.cli" in imported and not imported & {"torch", "transformers"}


# -------------------------------------------------------------------------------------- user errors


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


def test_a_missing_recipe_names_the_path_typed_and_the_shipped_recipes(capsys, monkeypatch):
    monkeypatch.chdir(CONFIGS.parent)  # configs/ there links to the package's recipes
    assert main(["train", "--config", "configs/nope.yaml"]) == 2
    line = _one_line(capsys)
    assert line.startswith("config error: config file not found: configs/nope.yaml (")
    assert "src/regroup/configs/nope.yaml" not in line
    assert "shipped recipes: dagrpo, dagrpo_mask_only, dagrpo_ta, grpo, grpo_matched, ta_grpo;" in line
    assert "paper/dagrpo_base" in line
    assert main(["train", "--config", "grpoo"]) == 2
    assert "did you mean 'grpo'?" in _one_line(capsys)


def test_a_folder_named_as_the_config_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert main(["train", "--config", "mine"]) == 2
    assert _one_line(capsys).startswith("config error: config file not found: mine (a folder, not a file, ")


def test_resume_of_a_missing_folder_says_the_folder_is_missing(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert _one_line(capsys) == f"config error: --resume {tmp_path / 'nope'}: no such run folder"
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no config.yaml there" in _one_line(capsys)


def test_an_error_inside_a_recipe_file_names_the_file_and_an_override_error_does_not(tmp_path, capsys):
    from regroup.train.run_config import load_config

    typo = tmp_path / "mine.yaml"
    typo.write_text("extends: " + str(CONFIGS / "grpo.yaml") + "\noptim:\n  lrr: 1.0e-4\n")
    assert main(["train", "--config", str(typo)]) == 2
    assert _one_line(capsys).startswith(f"config error: {typo}: unknown config key optim.lrr (did you mean 'lr'?)")
    bounds = tmp_path / "bounds.yaml"
    bounds.write_text("optim:\n  lr: -1\n")
    assert main(["train", "--config", str(bounds)]) == 2
    assert _one_line(capsys).startswith(f"config error: {bounds}: optim.lr must be")
    # the file is fine, the override is not: the key is named, not the file
    assert main(["train", "--config", str(CONFIGS / "grpo.yaml"), "train.steps=0"]) == 2
    assert _one_line(capsys).startswith("config error: train.steps must be")
    # an override that fixes the file's value is used
    assert load_config(bounds, ["optim.lr=1e-4"]).optim.lr == 1e-4


def test_a_module_in_the_current_folder_is_named_with_the_pythonpath_fix(tmp_path, capsys, monkeypatch):
    """The installed `regroup` command (unlike `python -m`) does not put the current folder on the import path."""
    import os
    import sys

    from regroup.train.run_config import load_config

    (tmp_path / "beside_me_reward.py").write_text("def reward(response, problem):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    here = os.getcwd()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != here])
    assert main(["train", "--config", "grpo", "rewards=[beside_me_reward:reward]"]) == 2
    line = _one_line(capsys)
    assert "No module named 'beside_me_reward'" in line
    assert "beside_me_reward is in the current folder, which is not on Python's import path" in line
    assert "PYTHONPATH=." in line
    assert main(["train", "--config", "grpo", "rewards=[nowhere_reward:reward]"]) == 2
    assert "put the folder that holds it on PYTHONPATH" in _one_line(capsys)
    monkeypatch.syspath_prepend(str(tmp_path))  # what PYTHONPATH=. does
    assert load_config("grpo", ["rewards=[beside_me_reward:reward]"]).rewards.functions == ["beside_me_reward:reward"]


def test_a_run_refused_at_preflight_leaves_no_run_folder(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused = ["--config", str(CONFIGS / "grpo.yaml"), f"model.path={tiny_model_dir}", "rewards=[_user_rewards:raises]"]
    assert main(["train", *refused, f"run_dir={tmp_path / 'named'}", "train.progress=false"]) == 2
    assert "_user_rewards:raises" in capsys.readouterr().err
    assert not (tmp_path / "named").exists()
    assert main(["train", *refused, "train.progress=false"]) == 2  # the default runs/grpo-TIME folder
    assert not (tmp_path / "runs").exists()  # runs/ too: the command made it
    # a folder the user made stays, empty as it was
    (tmp_path / "mine").mkdir()
    assert main(["train", *refused, f"run_dir={tmp_path / 'mine'}", "train.progress=false"]) == 2
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []


# --------------------------------------------------------------------------------- warm-up, Ctrl-C


def test_warmup_reuses_a_finished_one_with_the_same_settings_and_never_trains_over_one(tmp_path, capsys, monkeypatch):
    import dataclasses

    import regroup.train.warmup as warmup_module

    trained = []
    monkeypatch.setattr(warmup_module, "warmup", lambda out, cfg, **kw: trained.append(cfg) or {"heldout_pass1": 0.1})
    out = tmp_path / "warm"
    out.mkdir()
    finished = {"heldout_pass1": 0.47, "config": dataclasses.asdict(warmup_module.WarmupConfig())}
    (out / "warmup_metrics.json").write_text(json.dumps(finished))
    stamp = (out / "warmup_metrics.json").stat().st_mtime_ns

    assert main(["warmup", "--out", str(out)]) == 0  # what the demo left there: the same default settings
    captured = capsys.readouterr()
    assert json.loads(captured.out)["heldout_pass1"] == 0.47 and "reusing it" in captured.err
    assert trained == [] and (out / "warmup_metrics.json").stat().st_mtime_ns == stamp

    assert main(["warmup", "--out", str(out), "--steps", "100"]) == 2
    line = _one_line(capsys)
    assert "holds a finished warm-up with other settings (steps 620 (asked 100))" in line and "--overwrite" in line
    assert trained == [] and (out / "warmup_metrics.json").stat().st_mtime_ns == stamp

    assert main(["warmup", "--out", str(out), "--steps", "100", "--overwrite"]) == 0
    assert [cfg.steps for cfg in trained] == [100]


def _small_run(tiny_model_dir, run_dir, steps: int = 4) -> list[str]:
    return [
        "train",
        "--config",
        str(CONFIGS / "grpo.yaml"),
        f"model.path={tiny_model_dir}",
        f"run_dir={run_dir}",
        "data.num_train=32",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=2",
        "rollout.max_new_tokens=8",
        f"train.steps={steps}",
        "train.checkpoint_every=1",
        "train.progress=false",
        "train.threads=1",
        "diagnostics.diversity_every=0",
        "optim.lr=1e-3",
    ]


def _final_weights(run_dir):
    from safetensors.torch import load_file

    from regroup.runtime.checkpoint import list_checkpoints

    return load_file(list_checkpoints(run_dir)[-1] / "model.safetensors")


def test_ctrl_c_is_one_line_with_the_resume_command_and_the_resume_is_exact(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    import torch

    import regroup.cli as cli

    assert main(_small_run(tiny_model_dir, tmp_path / "whole")) == 0
    capsys.readouterr()
    real = cli.progress_callback

    def interrupting(*args, **kwargs):  # Ctrl-C lands after the second step's metrics, before its checkpoint
        bar, on_step = real(*args, **kwargs)

        def on_step_then_interrupt(step, metrics):
            on_step(step, metrics)
            if step == 2:
                raise KeyboardInterrupt

        return bar, on_step_then_interrupt

    monkeypatch.setattr(cli, "progress_callback", interrupting)
    run = tmp_path / "stopped"
    try:
        code = main(_small_run(tiny_model_dir, run))
    except KeyboardInterrupt:  # escaped main: caught here so that it fails this test, not the whole session
        code = "KeyboardInterrupt escaped main()"
    assert code == 130
    err = capsys.readouterr().err  # model loading's progress bars, then the one line
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == (
        f"interrupted at step 2 (newest checkpoint: step 1; later steps run again); "
        f"continue with: regroup train --resume {run}"
    )
    monkeypatch.setattr(cli, "progress_callback", real)
    assert main(["train", "--resume", str(run)]) == 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    whole, resumed = _final_weights(tmp_path / "whole"), _final_weights(run)
    assert [k for k in whole if not torch.equal(whole[k], resumed[k])] == []


@pytest.mark.slow  # three regroup processes, each importing torch: ~60 s on a loaded 2-core machine
def test_sigint_to_a_training_process_is_one_line_and_its_resume_is_bit_identical(tiny_model_dir, tmp_path):
    """A real `python -m regroup train`, sent SIGINT (what Ctrl-C sends) once it has logged 3 of 6 steps."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import torch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}

    def regroup(argv, name):  # stderr to a file: a pipe nobody reads until the end could fill and block
        with open(tmp_path / f"{name}.err", "w") as err:
            return subprocess.Popen([sys.executable, "-m", "regroup", *argv], stderr=err, env=env)

    def stderr_of(name):
        return (tmp_path / f"{name}.err").read_text()

    whole = regroup(_small_run(tiny_model_dir, tmp_path / "whole", steps=6), "whole")
    run = tmp_path / "stopped"
    stopped = regroup(_small_run(tiny_model_dir, run, steps=6), "stopped")
    metrics = run / "metrics.jsonl"
    # Wait for the event, not a time: 3 logged steps, or the child's own end (a 6-step run), whichever comes first.
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert stopped.poll() is None, stderr_of("stopped")[-2000:]
        time.sleep(0.05)
    stopped.send_signal(signal.SIGINT)
    assert stopped.wait(timeout=300) == 130, stderr_of("stopped")[-2000:]
    err = stderr_of("stopped")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted at step ") and last.endswith(f"; continue with: regroup train --resume {run}")
    at = int(last.split()[3])
    assert at >= 3, last
    # the checkpoint of the step it stopped at, or of the one before (SIGINT came before that step's save)
    assert f"(newest checkpoint: step {at}; " in last or f"(newest checkpoint: step {at - 1}; " in last, last

    resumed = regroup(["train", "--resume", str(run)], "resumed")
    assert resumed.wait(timeout=600) == 0, stderr_of("resumed")[-2000:]
    assert whole.wait(timeout=600) == 0, stderr_of("whole")[-2000:]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    a, b = _final_weights(tmp_path / "whole"), _final_weights(run)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []

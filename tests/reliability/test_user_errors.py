"""User errors end in one clear line and a non-zero exit, before any compute (no silent wrong training, no
late tracebacks): out-of-range values, unknown pieces, --config with --resume, resume
overrides that would not take effect, data errors, an unwritable run folder, a full disk, and bad
arguments of the subcommands. A traceback appears only with --debug."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.errors import ConfigError
from regroup.runtime.checkpoint import is_disk_full, list_checkpoints

pytestmark = pytest.mark.reliability


@pytest.mark.parametrize(
    "override, key",
    [
        # silent wrong training (exit 0 before)
        ("optim.max_grad_norm=-1", "optim.max_grad_norm"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm"),
        ("optim.min_lr_ratio=-5", "optim.min_lr_ratio"),
        ("optim.lr=.inf", "optim.lr"),
        ("rollout.temperature=0", "rollout.temperature"),
        # late tracebacks (after the model loaded, before)
        ("optim.lr=.nan", "optim.lr"),
        ("seed=-1", "seed"),
        ("train.threads=-3", "train.threads"),
        ("rewards=[]", "rewards"),
        ("rewards=[nosuch]", "rewards"),
        ("rewards=[task*nan]", "rewards"),
        ("mask.delta=.nan", "mask.delta"),
        ("anchors.gamma=-0.1", "anchors.gamma"),
    ],
)
def test_bad_values_are_one_line_before_compute(tmp_path, capsys, no_compute, override, key):
    code = main(["train", "--config", str(h.CONFIGS / "grpo.yaml"), f"run_dir={tmp_path / 'run'}", override])
    assert code == 2
    line = h.one_line(capsys)
    assert line.startswith("config error: ") and key in line
    assert not (tmp_path / "run").exists()  # nothing written either


def test_debug_shows_the_traceback(tmp_path, no_compute):
    with pytest.raises(ConfigError, match="optim.lr"):
        main(["--debug", "train", "--config", str(h.CONFIGS / "grpo.yaml"), "optim.lr=.nan"])
    with pytest.raises(ConfigError, match="optim.lr"):
        main(["train", "--debug", "--config", str(h.CONFIGS / "grpo.yaml"), "optim.lr=.nan"])


# ----------------------------------------------------------------------------------------- resume


def test_config_with_resume_is_an_error(run_copy, capsys, no_compute):
    assert main(["train", "--resume", str(run_copy), "--config", str(h.CONFIGS / "dagrpo.yaml")]) == 2
    assert "--config and --resume cannot be combined" in h.one_line(capsys)


def test_resume_refuses_an_override_that_would_not_take_effect(run_copy, capsys, no_compute):
    before = (run_copy / "config.yaml").read_text()
    assert main(["train", "--resume", str(run_copy), "optim.lr=0.5"]) == 2
    line = h.one_line(capsys)
    assert "--resume cannot change optim.lr" in line
    assert (run_copy / "config.yaml").read_text() == before  # config.yaml never claims what the run does not do


def test_resume_override_that_takes_effect_is_used_and_recorded(run_copy, capsys):
    assert main(["train", "--resume", str(run_copy), "train.steps=4", "train.keep_checkpoints=1"]) == 0
    saved = yaml.safe_load((run_copy / "config.yaml").read_text())
    assert saved["train"]["steps"] == 4 and saved["train"]["keep_checkpoints"] == 1
    assert [json.loads(x)["step"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert [p.name for p in list_checkpoints(run_copy)] == ["step-000004"]  # keep_checkpoints=1 was applied


# ------------------------------------------------------------------------------------- data, folders


def test_a_bad_data_row_is_one_line_naming_file_row_and_field(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "", "answer": "3"}\n')
    argv = h.train_args(tiny_model_dir, tmp_path / "run", "grpo.yaml", f"data.train_file={data}", "rewards=[math]")
    assert main(argv) == 2
    line = h.one_line(capsys)
    assert line.startswith("data error: ") and f"{data} row 2 field 'question'" in line


def _read_only_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes through permission bits; /sys is a read-only file system for it
        return Path("/sys/fs/regroup-test-no-write")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "run"


def test_an_unwritable_run_folder_is_one_line(tiny_model_dir, tmp_path, capsys):
    run = _read_only_dir(tmp_path)
    assert main(h.train_args(tiny_model_dir, run, "grpo.yaml")) == 2
    line = h.one_line(capsys)
    assert f"cannot write to run folder {run}" in line


def test_a_full_disk_is_named_while_saving_a_checkpoint(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """torch's zip writer reports a full disk as `[enforce fail at inline_container.cc...]`."""
    import regroup.runtime.checkpoint

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3200 vs 3136")

    monkeypatch.setattr(regroup.runtime.checkpoint.torch, "save", full)
    run = tmp_path / "run"
    assert main(h.train_args(tiny_model_dir, run, "grpo.yaml", "train.steps=1")) == 2
    line = h.one_line(capsys)
    assert line == f"error: no space left on device while writing {run / 'checkpoints' / 'step-000001'}"
    assert h.tmp_folders(run) == []  # the half checkpoint was removed, its space given back


def test_a_full_disk_while_writing_the_config_leaves_no_temporary_file(run_copy, capsys, monkeypatch):
    import regroup.io

    real_fsync = os.fsync

    def full(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".config.yaml.") and name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(regroup.io.os, "fsync", full)
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    assert h.one_line(capsys) == f"error: no space left on device while writing {run_copy / 'config.yaml'}"
    assert [p.name for p in run_copy.iterdir() if ".tmp" in p.name] == []


def test_real_enospc_is_recognised():
    """/dev/full fails every write with ENOSPC: the classifier sees a real one, not only a made-up one."""
    import stat

    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("no /dev/full device here")  # (opening a missing one for writing would create a file)
    with pytest.raises(OSError) as err:
        with open("/dev/full", "w") as f:
            f.write("x")
            f.flush()
    assert is_disk_full(err.value)
    assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"))
    assert not is_disk_full(RuntimeError("CUDA error: device-side assert triggered"))


# ------------------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["eval", "--model", "m", "--data", "d.jsonl", "--k", "1,a"],
            "argument --k: expected comma-separated positive integers",
        ),
        (["eval", "--model", "m", "--data", "d.jsonl", "--k", "0"], "argument --k"),
        (["eval", "--model", "m", "--data", "d.jsonl", "--n", "x"], "argument --n"),
        (["demo", "--recipes", "x"], "known recipes: grpo, grpo_matched, ta_grpo, dagrpo, dagrpo_ta"),
        (["demo", "--recipes", "grpo,dagrp"], "did you mean 'dagrpo'?"),
        (["train", "--nosuch"], "unrecognized arguments: --nosuch"),
        (["rephrase", "--data", "x"], "the following arguments are required: --out"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        (
            ["eval", "--model", "m", "--data", "d.jsonl", "--temperature", "-1"],
            "argument --temperature: must be a finite number >= 0",
        ),
        (["eval", "--model", "m", "--data", "d.jsonl", "--top-p", "nan"], "argument --top-p"),
        (["eval", "--model", "m", "--data", "d.jsonl", "--max-new-tokens", "0"], "argument --max-new-tokens"),
        (
            ["rephrase", "--data", "x", "--out", "y", "--rewriter", "rule"],
            "unknown rewriter 'rule' (did you mean 'rules'?)",
        ),
        (["rephrase", "--data", "x", "--out", "y", "--n", "-1"], "argument --n: must be a finite number >= 0"),
        (["rephrase", "--data", "x", "--out", "y", "--concurrency", "0"], "argument --concurrency"),
        (["warmup", "--steps", "-5"], "argument --steps"),
        (["demo", "--seeds", "0"], "argument --seeds"),
    ],
)
def test_bad_arguments_of_every_subcommand_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    line = h.one_line(capsys)
    assert message in line and line.startswith("regroup")


def test_missing_eval_files_are_one_line(tiny_model_dir, tmp_path, capsys):
    code = main(
        [
            "eval",
            "--model",
            tiny_model_dir,
            "--data",
            str(tmp_path / "none.jsonl"),
            "--n",
            "1",
            "--k",
            "1",
            "--out",
            str(tmp_path / "ev"),
        ]
    )
    assert code == 2
    line = h.one_line(capsys)
    assert line.startswith("config error: --data: no such file") and str(tmp_path / "none.jsonl") in line
    assert main(["eval", "--model", str(tmp_path / "nomodel"), "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "--model: no such model folder" in h.one_line(capsys)
    assert main(["eval", "--model", str(tmp_path), "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "has no config.json" in h.one_line(capsys)


def _alias_bomb() -> str:
    """412 bytes whose `rewards.functions[0]` is 10^8 strings once its aliases are expanded."""
    lines = ["rewards:", "  functions:", "  - - &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    - &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefg", "bcdefgh")]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "config, words",
    [
        ("bomb.yaml", "bomb.yaml: more than 100000 values once its aliases (*name) are expanded"),
        ("/dev/zero", "/dev/zero is not a regular file"),
        ("zero_parent.yaml", "/dev/zero is a character device, not a regular file"),
        ("fifo_parent.yaml", "fifo.yaml is a named pipe (FIFO), not a regular file"),
    ],
)
def test_a_hostile_config_file_is_one_line_and_exit_2_without_hanging(tmp_path, config, words):
    """An alias bomb (10^8 values from 412 bytes; its refusal used to repr them all: minutes, gigabytes), /dev/zero
    (read whole: a MemoryError) and a named pipe no one writes to (its open waited forever), as --config or as an
    `extends:` parent: each one line and exit 2, in a real `regroup train` process (the timeout only guards a
    hang)."""
    (tmp_path / "bomb.yaml").write_text(_alias_bomb())
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "zero_parent.yaml").write_text("extends: /dev/zero\n")
    (tmp_path / "fifo_parent.yaml").write_text("extends: fifo.yaml\n")
    path = config if config.startswith("/") else str(tmp_path / config)
    argv = ["train", "--config", path, f"run_dir={tmp_path / 'run'}"]
    proc = h.finish(h.start(argv, tmp_path / "out", "train"), argv, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert lines[0].startswith("config error: ") and words in lines[0] and len(lines[0]) < 300, lines[0]
    assert not (tmp_path / "run").exists()

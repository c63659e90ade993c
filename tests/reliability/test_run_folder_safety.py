"""Nothing executed from a run folder, nothing lost, the config a run uses is the config it shows. Each
test plants one hostile or broken file and checks what regroup does with it."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.io import SymlinkError, write_atomic
from regroup.runtime.checkpoint import (
    MANIFEST,
    CheckpointRefused,
    latest_valid_checkpoint,
    list_checkpoints,
    load_trainer_state,
    rng_state,
    set_rng_state,
    verify_checkpoint,
)
from regroup.runtime.metrics import MetricsLogger
from regroup.runtime.rundir import RUN_OUTPUTS, RunDirError, claim_eval_dir, claim_run_dir, holds_a_run

pytestmark = pytest.mark.reliability


def rehash(checkpoint: Path) -> None:
    """Rewrite the manifest's hashes as an attacker would (it is a checksum, not a signature); files the
    manifest does not list stay unlisted."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def newest(run: Path) -> Path:
    return list_checkpoints(run)[-1]


def fail_if_model_loads(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model was loaded: the check must come before")

    monkeypatch.setattr("regroup.train.build.build_parts", boom)


class Planted:
    """Unpickling this creates `marker` (where an attacker's pickle would call `os.system`)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


# ------------------------------------------------------------------------------- 1. no code, no links


def test_a_pickled_reduce_in_trainer_state_is_not_run(run_copy, tmp_path, capsys):
    marker = tmp_path / "planted-code-ran"
    checkpoint = newest(run_copy)
    state = {"step": 2, "payload": Planted(str(marker))}
    torch.save(state, checkpoint / "trainer_state.pt")
    rehash(checkpoint)
    verify_checkpoint(checkpoint)  # the checksums "verify": the manifest is no signature
    with pytest.raises(CheckpointRefused, match="trainer_state.pt holds objects other than tensors"):
        load_trainer_state(checkpoint)
    assert not marker.exists()

    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists(), "code planted in a checkpoint ran"
    assert "Traceback" not in err
    last = error_lines(err)[-1]
    assert last.startswith("checkpoint error:") and "trainer_state.pt" in last and "not loaded" in last, err
    assert sum(line.startswith("checkpoint error") for line in error_lines(err)) == 1


def test_a_checkpoint_of_the_older_pickled_format_is_refused_in_one_line(run_copy, capsys, monkeypatch):
    checkpoint = newest(run_copy)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    del manifest["format"]  # what every checkpoint written before this change looks like
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    fail_if_model_loads(monkeypatch)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "older regroup" in lines[0] and "not loaded" in lines[0], lines


def test_trainer_state_holds_only_tensors_and_plain_values():
    import io
    import random

    import numpy as np

    buffer = io.BytesIO()
    torch.save({"rng": rng_state()}, buffer)
    buffer.seek(0)
    back = torch.load(buffer, weights_only=True)  # would raise on any numpy or other object
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(back["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_an_unlisted_safetensors_file_is_refused_naming_it(run_copy, capsys, monkeypatch):
    checkpoint = newest(run_copy)
    (checkpoint / "override.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    rehash(checkpoint)  # re-hashing the listed files does not list the new one
    with pytest.raises(CheckpointRefused, match="override.safetensors is not listed"):
        latest_valid_checkpoint(run_copy, warn=lambda m: None)  # refused, not skipped to an older one
    fail_if_model_loads(monkeypatch)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "override.safetensors" in lines[0] and "not listed" in lines[0], lines


def test_a_symlink_inside_a_checkpoint_is_refused(run_copy, tmp_path):
    checkpoint = newest(run_copy)
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(checkpoint / "model.safetensors", outside)
    (checkpoint / "model.safetensors").symlink_to(outside)  # same bytes: the hash would match
    with pytest.raises(CheckpointRefused, match="symbolic link"):
        verify_checkpoint(checkpoint)


def test_a_lock_symlink_does_not_truncate_its_target(tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(RunDirError, match="symbolic link"):
        claim_run_dir(run, "fresh")
    assert target.read_text() == "keep me\n"
    assert main(["train", "--config", str(h.CONFIGS / "grpo.yaml"), f"run_dir={run}", "train.steps=1"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and ".lock is a symbolic link" in lines[0], lines
    assert target.read_text() == "keep me\n"


def test_a_dangling_metrics_link_holds_a_run_and_is_never_followed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "somewhere" / "appended.jsonl"
    (run / "metrics.jsonl").symlink_to(target)
    assert holds_a_run(run)
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics.jsonl\)"):
        claim_run_dir(run, "fresh")
    with pytest.raises(SymlinkError, match="symbolic link"):
        MetricsLogger(run).log(1, {"loss": 1.0})  # a link is refused, not appended through
    assert not os.path.lexists(target)
    with claim_run_dir(run, "overwrite", log=lambda m: None):
        assert not os.path.lexists(run / "metrics.jsonl")  # the link itself removed
    assert not os.path.lexists(target)
    MetricsLogger(run).log(1, {"loss": 1.0})
    assert not (run / "metrics.jsonl").is_symlink() and not os.path.lexists(target)


def test_a_samples_or_config_link_is_not_followed(tmp_path):
    from regroup.errors import ConfigError
    from regroup.runtime.rundir import read_saved_config
    from regroup.runtime.sample_log import SampleLog

    target = tmp_path / "target.txt"
    target.write_text("recipe: grpo\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").symlink_to(target)
    (run / "config.yaml").symlink_to(target)
    with pytest.raises(SymlinkError):
        SampleLog(run, every=1).truncate_after(3)
    with pytest.raises(ConfigError, match="symbolic link"):
        read_saved_config(run / "config.yaml")
    assert target.read_text() == "recipe: grpo\n"


def test_a_saved_config_is_read_only_from_a_regular_file_and_only_up_to_its_size_limit(tmp_path):
    """A run folder's config.yaml that is a named pipe (nothing writes to it: opening it would wait forever) or
    larger than any config is one line naming it; at most MAX_TEXT + 1 characters of it are read."""
    from regroup.config.fields import MAX_TEXT
    from regroup.errors import ConfigError
    from regroup.runtime.rundir import read_saved_config

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "config.yaml")
    with pytest.raises(ConfigError) as e:
        read_saved_config(run / "config.yaml")
    assert str(e.value) == f"{run / 'config.yaml'} is a named pipe (FIFO), not a regular file"
    (run / "config.yaml").unlink()
    (run / "config.yaml").write_text("recipe: " + "x" * (4 * MAX_TEXT))
    with pytest.raises(ConfigError, match=f"config.yaml: over {MAX_TEXT} characters, more than a config may have"):
        read_saved_config(run / "config.yaml")


# --------------------------------------------------------------------------- 3. config it shows


def test_a_hand_edited_config_is_refused_on_resume_naming_the_key(run_copy, capsys, monkeypatch):
    path = run_copy / "config.yaml"
    before = path.read_text()
    path.write_text(before.replace("lr: 0.001", "lr: 0.5", 1))
    assert path.read_text() != before
    fail_if_model_loads(monkeypatch)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "optim.lr is 0.5" in lines[0] and "trained with 0.001" in lines[0], lines


def test_the_trainer_checks_the_config_of_the_checkpoint_it_loads(run_copy):
    from regroup.errors import ConfigError
    from regroup.runtime.checkpoint import check_resume_config, load_run_config
    from regroup.runtime.rundir import read_saved_config
    from regroup.train.run_config import config_from_dict

    checkpoint = newest(run_copy)
    saved = load_run_config(checkpoint)
    cfg = config_from_dict(read_saved_config(run_copy / "config.yaml"))
    assert saved == json.loads(json.dumps(cfg.to_dict(), default=list))  # the resolved config, kept
    check_resume_config(checkpoint, saved, cfg.to_dict(), "config.yaml")  # unchanged: passes
    cfg.train.steps, cfg.train.sample_every = 99, 1  # keys a resume may change
    check_resume_config(checkpoint, saved, cfg.to_dict(), "config.yaml")
    cfg.grpo.num_generations = 8
    with pytest.raises(ConfigError, match="grpo.num_generations is 8"):
        check_resume_config(checkpoint, saved, cfg.to_dict(), "config.yaml")


def test_a_hand_edit_of_a_key_a_resume_may_change_is_used(run_copy, capsys):
    path = run_copy / "config.yaml"
    path.write_text(path.read_text().replace("steps: 2", "steps: 3", 1))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy)]) == 0
    assert [json.loads(x)["step"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_resume_onto_a_differently_shaped_model_is_one_line(run_copy, tmp_path, capsys):
    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

    checkpoint = newest(run_copy)
    other = build_model(
        build_tokenizer(), TinyModelConfig(hidden_size=48, num_layers=2, num_heads=2, intermediate_size=64), seed=0
    )
    other.save_pretrained(tmp_path / "other", safe_serialization=True)
    (checkpoint / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    rehash(checkpoint)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "train.steps=3"]) == 2
    err = capsys.readouterr().err
    last = error_lines(err)[-1]
    assert "Traceback" not in err and "weights do not fit the model" in last and "(101, 48)" in last, err
    assert not (run_copy / "checkpoints" / "step-000003").exists()


@pytest.mark.parametrize("text", ["recipe: [unclosed\n", "- a list\n", "data:\n  max_prompt_tokens: -1\n"])
def test_report_and_eval_of_a_run_with_an_invalid_config_are_one_line(run_copy, tmp_path, capsys, monkeypatch, text):
    (run_copy / "config.yaml").write_text(text)
    capsys.readouterr()
    if text != "data:\n  max_prompt_tokens: -1\n":  # the report reads any mapping (older runs' configs too)
        assert main(["report", str(run_copy), "--out", str(tmp_path / "r")]) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0].startswith("config error:") and "config.yaml" in lines[0], lines
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "1+1", "answer": "2"}) + "\n")
    monkeypatch.setattr("regroup.eval.runner.load_eval_setup", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["eval", "--model", str(newest(run_copy)), "--data", str(data), "--out", str(tmp_path / "e")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("config error:") and "config.yaml" in lines[0], lines


# ------------------------------------------------------------------------------------ 2. nothing lost


def test_samples_are_cut_back_on_resume_like_metrics(run_copy, capsys):
    assert main(["train", "--resume", str(run_copy), "train.steps=3", "train.sample_every=1"]) == 0
    steps = Counter(json.loads(x)["step"] for x in (run_copy / "samples.jsonl").read_text().splitlines())
    assert steps == {1: 4, 3: 4}
    for path in list_checkpoints(run_copy):
        if path.name == "step-000003":
            os.replace(path, run_copy / "lost-step-3")  # a crash after step 3 was logged, before its checkpoint
    assert main(["train", "--resume", str(run_copy), "train.steps=3", "train.sample_every=1"]) == 0
    steps = Counter(json.loads(x)["step"] for x in (run_copy / "samples.jsonl").read_text().splitlines())
    assert steps == {1: 4, 3: 4}  # not 3: 8


def test_overwrite_clears_everything_regroup_writes_and_nothing_else(run_copy, capsys):
    for name in ("eval", "eval_before", "plots", "tb"):
        (run_copy / name).mkdir(exist_ok=True)
        (run_copy / name / "summary.json").write_text('{"mean@n": 0.912}')
    for name in ("timing.json", "report.html", "report.md"):
        (run_copy / name).write_text("old")
    (run_copy / "cache").mkdir()
    (run_copy / "cache" / "judge.sqlite").write_text("answers")
    (run_copy / "notes.txt").write_text("my own file")
    with claim_run_dir(run_copy, "overwrite", log=lambda m: None):
        pass
    left = sorted(p.name for p in run_copy.iterdir())
    assert left == [".lock", "cache", "notes.txt"], left
    assert not holds_a_run(run_copy)
    assert set(RUN_OUTPUTS) >= {
        "eval",
        "eval_before",
        "timing.json",
        "plots",
        "report.html",
        "report.md",
        "samples.jsonl",
        "tb",
        "checkpoints",
        "metrics.jsonl",
        "config.yaml",
    }


def test_a_fresh_run_is_refused_over_a_folder_holding_only_an_old_evaluation(tmp_path):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "summary.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"already holds a run \(eval\)"):
        claim_run_dir(run, "fresh")


def test_eval_refuses_a_used_out_folder_unless_overwrite(tiny_model_dir, tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "1+1", "answer": "2"}) + "\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "eval").mkdir(parents=True)
    (tmp_path / "runs" / "eval" / "summary.json").write_text('{"rows": []}')  # the default --out, used before
    monkeypatch.setattr("regroup.eval.runner.load_eval_setup", lambda *a, **k: pytest.fail("model loaded"))
    capsys.readouterr()
    assert main(["eval", "--model", tiny_model_dir, "--data", str(data)]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert (
        len(lines) == 1 and "runs/eval already holds results (summary.json)" in lines[0] and "--overwrite" in lines[0]
    )
    assert (tmp_path / "runs" / "eval" / "summary.json").read_text() == '{"rows": []}'

    out = tmp_path / "out"
    (out / "bench").mkdir(parents=True)
    for name in ("summary.json", "summary.md", "bench/summary.json", "bench/per_problem.jsonl"):
        (out / name).write_text("old")
    (out / "mine.txt").write_text("a user's file")
    with claim_eval_dir(out, overwrite=True, log=lambda m: None):
        pass
    assert sorted(p.name for p in out.iterdir()) == [".lock", "mine.txt"]


def test_two_evals_into_one_folder_at_once_are_refused(tmp_path):
    with claim_eval_dir(tmp_path / "e"):
        with pytest.raises(RunDirError, match="in use by another run"):
            claim_eval_dir(tmp_path / "e")


def test_the_report_reads_regroup_eval_out_run_eval(tiny_model_dir, run_copy, tmp_path, capsys):
    from regroup.report.summary import summarize_runs

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    checkpoint = newest(run_copy)
    assert (
        main(
            [
                "eval",
                "--model",
                str(checkpoint),
                "--data",
                str(data),
                "--out",
                str(run_copy / "eval"),
                "--n",
                "2",
                "--k",
                "1,2",
                "--max-new-tokens",
                "8",
                "--checker",
                "task",
            ]
        )
        == 0
    )
    top = json.loads((run_copy / "eval" / "summary.json").read_text())
    bench = json.loads((run_copy / "eval" / "d" / "summary.json").read_text())
    [row] = summarize_runs([str(run_copy)])
    assert row["num_evaluated"] == 1 and row["mean@n"] == pytest.approx(bench["mean@n"])
    assert row["mean@n"] == pytest.approx(top["rows"][0]["mean@n"])
    assert row["ks"] == [1, 2]


def test_rephrase_never_writes_over_its_input(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    rows = [json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)]
    data.write_text("\n".join(rows) + "\n")
    before = data.read_bytes()
    for out in (data, tmp_path / "hard-link.jsonl"):
        if out != data:
            os.link(data, out)  # same inode under another name
        capsys.readouterr()
        assert main(["rephrase", "--data", str(data), "--out", str(out), "--n", "1"]) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and "is the input file" in lines[0], lines
        assert data.read_bytes() == before


def test_rephrase_fails_on_a_malformed_row_unless_told_to_skip(tmp_path, capsys):
    from regroup.data.load import save_problems
    from regroup.tasks.arithmetic import generate

    data = tmp_path / "in.jsonl"
    save_problems(generate(3, seed=0), data)  # the rules rewriter's own task
    rows = data.read_text().splitlines()
    data.write_text("\n".join([rows[0], '{"id": "broken"}', *rows[1:]]) + "\n")
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(["rephrase", "--data", str(data), "--out", str(out), "--n", "1"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "row 2" in lines[0] and "--skip-bad-rows" in lines[0], lines
    assert not out.exists()
    assert main(["rephrase", "--data", str(data), "--out", str(out), "--n", "1", "--skip-bad-rows"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "skipped malformed row" in line]
    assert len(warned) == 1 and "row 2" in warned[0]
    assert len(out.read_text().splitlines()) == 3


def _fake_full_disk(monkeypatch, name_part: str):
    """fsync of a file whose name holds `name_part` fails with ENOSPC (as a full disk does)."""
    import regroup.io as io_mod

    real = os.fsync

    def fsync(fd):
        if name_part in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(io_mod.os, "fsync", fsync)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_full_disk_names_the_report_file_and_keeps_the_old_one(run_copy, tmp_path, capsys, monkeypatch):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.html").write_text("the previous report")
    _fake_full_disk(monkeypatch, "report.html")
    capsys.readouterr()
    assert main(["report", str(run_copy), "--out", str(out)]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert lines == [f"error: no space left on device while writing {out / 'report.html'}"], lines
    assert (out / "report.html").read_text() == "the previous report"
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_write_errors_name_the_file(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o500)
    try:
        if os.access(folder, os.W_OK):  # root writes anywhere: use a folder that does not exist instead
            target = tmp_path / "missing" / "x.json"
        else:
            target = folder / "x.json"
        with pytest.raises(OSError, match=f"while writing {target}"):
            write_atomic(target, "{}")
    finally:
        os.chmod(folder, 0o700)


def test_config_yaml_gets_the_umask_default_not_0600(tmp_path):
    from regroup.config.schema import RunConfig
    from regroup.train.run_config import save_config

    old = os.umask(0o022)
    try:
        save_config(RunConfig(), tmp_path / "config.yaml")
        assert stat.S_IMODE(os.stat(tmp_path / "config.yaml").st_mode) == 0o644
        os.chmod(tmp_path / "config.yaml", 0o640)  # a mode the user chose is kept by a rewrite
        save_config(RunConfig(), tmp_path / "config.yaml")
        assert stat.S_IMODE(os.stat(tmp_path / "config.yaml").st_mode) == 0o640
    finally:
        os.umask(old)


def test_report_markdown_escapes_html_from_a_recipe_name(tmp_path):
    from regroup.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text('recipe: "<script>alert(1)</script>"\nseed: 0\n')
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5, "reward/mean": 0.1}) + "\n")
    html, md = build_report([str(run)], str(tmp_path / "out"), baseline=None)
    # report.md also backslash-escapes Markdown's own special characters, the parentheses here
    for path, shown in (
        (html, "&lt;script&gt;alert(1)&lt;/script&gt;"),
        (md, "&lt;script&gt;alert\\(1\\)&lt;/script&gt;"),
    ):
        text = Path(path).read_text()
        assert "<script>alert" not in text and shown in text, path


def test_a_state_weights_only_could_not_read_is_refused_when_written(tmp_path):
    import numpy as np

    from regroup.runtime.checkpoint import CheckpointError, save_checkpoint

    class NoModel:
        def save_pretrained(self, folder, **kw):
            (Path(folder) / "model.safetensors").write_bytes(b"")

    with pytest.raises(CheckpointError, match=r"trainer state.stages.custom.rng is a numpy.ndarray"):
        save_checkpoint(tmp_path, 1, NoModel(), None, {"step": 1, "stages": {"custom": {"rng": np.zeros(3)}}})
    assert list_checkpoints(tmp_path) == []


def test_report_of_a_run_with_a_corrupt_eval_summary_is_one_line(run_copy, tmp_path, capsys):
    (run_copy / "eval").mkdir()
    (run_copy / "eval" / "summary.json").write_text('{"mean@n": 0.5')  # torn
    capsys.readouterr()
    assert main(["report", str(run_copy), "--out", str(tmp_path / "r")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("report error:") and "summary.json is not valid JSON" in lines[0]

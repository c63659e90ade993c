"""`regroup vllm-serve`'s command line (no vLLM needed: the server command is captured, not run): regroup's own
options are read wherever they stand, vLLM's go after `--`, and what would weaken the server is refused in one
line. The real server started this way: tests/real_engine/test_server_guard.py."""

from __future__ import annotations

import pytest

from regroup.cli import main, parse_args

KEY_ENV = "REGROUP_TEST_SERVE_KEY"
KEY = "sk-serve-cli-test-0123456789"


@pytest.fixture()
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.fixture()
def launched(monkeypatch):
    """The (command, environment) `vllm-serve` would replace itself with."""
    seen: list = []

    def execvpe(file, args, env):
        seen.append((list(args), dict(env)))

    monkeypatch.setattr("regroup.cli.os.execvpe", execvpe)
    monkeypatch.setenv(KEY_ENV, KEY)
    return seen


def test_regroup_options_after_model_are_regroups(model_dir, launched):
    """The docs' keyed form, `vllm-serve MODEL --api-key-env NAME`: once handed to vLLM as an unknown
    argument, and `--python` after MODEL ran regroup's own python."""
    argv = ["vllm-serve", model_dir, "--api-key-env", KEY_ENV, "--python", "/venv-vllm/bin/python", "--port", "8123"]
    assert main(argv) == 0
    [(cmd, env)] = launched
    assert cmd[0] == "/venv-vllm/bin/python"
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--model") + 1] == model_dir
    assert "--api-key-env" not in cmd and KEY not in " ".join(cmd)
    assert env["VLLM_API_KEY"] == KEY
    assert cmd[cmd.index("--middleware") + 1] == "regroup.rollout.vllm_guard.KeyOnEveryRoute"


def test_vllm_options_go_after_the_double_dash_and_regroup_options_stand_anywhere(model_dir, launched):
    argv = ["vllm-serve", "--port", "9000", model_dir, "--max-model-len", "512", "--"]
    argv += ["--gpu-memory-utilization", "0.5", "--port-note", "--python"]  # after --: vLLM's, whatever the names
    assert main(argv) == 0
    [(cmd, _)] = launched
    assert cmd[-4:] == ["--gpu-memory-utilization", "0.5", "--port-note", "--python"]
    assert cmd[cmd.index("--port") + 1] == "9000" and cmd[cmd.index("--max-model-len") + 1] == "512"
    assert cmd.count("--port") == 1 and "--" not in cmd
    args = parse_args(argv)
    assert (args.port, args.max_model_len, args.vllm_args[0]) == (9000, 512, "--gpu-memory-utilization")


def test_an_unknown_option_before_the_double_dash_says_where_vllm_options_go(model_dir, launched, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["vllm-serve", model_dir, "--gpu-memory-utilization", "0.5"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and launched == []
    assert len(err.strip().splitlines()) == 1
    assert "--gpu-memory-utilization is not a regroup option" in err
    assert "-- --gpu-memory-utilization ..." in err


def test_a_key_typed_before_the_double_dash_is_not_echoed(model_dir, launched, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["vllm-serve", model_dir, "--api-key", KEY, "--max-num-seqs=4"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and launched == [] and KEY not in err
    assert "use --api-key-env NAME" in err
    with pytest.raises(SystemExit):
        main(["vllm-serve", model_dir, "--hf-token", KEY])
    err = capsys.readouterr().err
    assert "--hf-token is not a regroup option" in err and KEY not in err


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--api-key", KEY], "--api-key would put the key on the command line"),
        (["--api_key=" + KEY], "--api-key would put the key on the command line"),
        (["--port", "1"], "--port is regroup's own option"),
        (["--max_model_len", "9"], "--max-model-len is regroup's own option"),
        (["--logprobs-mode=raw_logprobs"], "--logprobs-mode is set by regroup"),
        (["--worker-extension-cls", "x.Y"], "--worker-extension-cls is set by regroup"),
    ],
)
def test_vllm_options_that_would_undo_regroups_are_refused_in_one_line(model_dir, launched, capsys, extra, says):
    assert main(["vllm-serve", model_dir, "--", *extra]) == 2
    err = capsys.readouterr().err
    assert launched == [] and len(err.strip().splitlines()) == 1 and says in err
    assert KEY not in err


def test_other_commands_keep_a_double_dash_to_themselves():
    args = parse_args(["report", "--out", "x", "--", "runs/a"])
    assert args.runs == ["runs/a"] and not hasattr(args, "vllm_args")

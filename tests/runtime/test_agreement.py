"""regroup.runtime.agreement: what the processes of a distributed run compare at start, and the one line a
difference gives (fast; the real two-machine launch is tests/distributed/test_multinode.py)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from regroup.errors import ConfigError
from regroup.models.tiny import build_tokenizer
from regroup.runtime.agreement import LOCAL_KEYS, check_ranks_agree, code_digest, describe_run, disagreement
from regroup.tasks import get_task
from regroup.train.run_config import load_config

TASK = get_task("arithmetic")


def _cfg(*overrides):
    return load_config("grpo", ["data.num_train=8", *overrides])


def _problems(seed=0):
    return TASK.generate(8, seed)


def test_equal_runs_agree_and_per_machine_keys_may_differ(tmp_path):
    tok = build_tokenizer()
    a = describe_run(_cfg(f"run_dir={tmp_path / 'a'}", "train.threads=1"), _problems(), tok)
    b = describe_run(_cfg(f"run_dir={tmp_path / 'b'}", "train.threads=2"), _problems(), tok)
    assert disagreement([a, a]) is None
    assert disagreement([a, b]) is None  # where each machine keeps its run, and its CPU threads, are its own
    assert {"run_dir", "model.path", "data.train_file", "train.threads"} <= LOCAL_KEYS
    assert "optim.lr" in a["config"] and "run_dir" not in a["config"]


def test_different_training_data_is_one_line_naming_each_side():
    tok, cfg = build_tokenizer(), _cfg()
    mine, theirs = describe_run(cfg, _problems(0), tok), describe_run(cfg, _problems(1), tok)
    line = disagreement([mine, theirs, mine])
    assert "\n" not in line
    assert line.startswith(
        "the 3 processes disagree on what to train: the training data differs (ranks 0,2: 8 problems"
    )
    assert f"rank 1: 8 problems, sha256 {theirs['data']['sha256'][:12]}" in line
    assert "same data.train_file content" in line and line.endswith("nothing was trained")
    shorter = describe_run(cfg, _problems(0)[:7], tok)
    assert "rank 1: 7 problems" in disagreement([mine, shorter])


def test_a_different_config_value_names_the_key_and_each_value():
    tok = build_tokenizer()
    a = describe_run(_cfg("optim.lr=0.001"), _problems(), tok)
    b = describe_run(_cfg("optim.lr=0.5", "grpo.num_generations=4"), _problems(), tok)
    line = disagreement([a, b])
    assert (
        "the config differs in grpo.num_generations (rank 0: 8; rank 1: 4), optim.lr (rank 0: 0.001; rank 1: 0.5)"
        in line
    )


def test_a_changed_plugin_module_changes_the_code_digest(tmp_path, monkeypatch):
    (tmp_path / "agree_plugin.py").write_text("def reward(response, problem):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "agree_plugin", raising=False)
    import agree_plugin  # noqa: F401  (loaded, as the config check loads it)

    config = {"rewards.functions": json.dumps(["agree_plugin:reward*0.5"])}
    before = code_digest(config)
    assert code_digest(config) == before and code_digest({}) != before
    (tmp_path / "agree_plugin.py").write_text("def reward(response, problem):\n    return 0.0\n")
    assert code_digest(config) != before  # another node's copy of the same module


def test_a_changed_tokenizer_is_named():
    cfg, problems = _cfg(), _problems()
    tok = build_tokenizer()
    other = build_tokenizer()
    other.chat_template = "{{ messages[0]['content'] }}"
    line = disagreement([describe_run(cfg, problems, tok), describe_run(cfg, problems, other)])
    assert "the tokenizer differs (check model.path on every machine" in line


def test_check_gathers_only_under_several_processes(monkeypatch):
    import accelerate.utils

    cfg, problems, tok = _cfg(), _problems(), build_tokenizer()
    gathered = []

    def fake_gather(objs):  # this process, then a second one holding other questions
        gathered.append(objs)
        return objs + [describe_run(cfg, _problems(1), tok)]

    monkeypatch.setattr(accelerate.utils, "gather_object", fake_gather)
    check_ranks_agree(types.SimpleNamespace(num_processes=1), cfg, problems, tok)
    assert gathered == []  # one process: nothing gathered
    with pytest.raises(ConfigError, match=r"^the 2 processes disagree on what to train: the training data differs"):
        check_ranks_agree(types.SimpleNamespace(num_processes=2), cfg, problems, tok)
    assert len(gathered) == 1


def test_a_process_accelerate_started_alone_for_a_multi_machine_launch_is_refused():
    """`accelerate launch --num_machines 2 ... --num_processes 2` without --multi_gpu on CPU machines starts one
    lone process per machine (its simple launcher: MASTER_ADDR set, no WORLD_SIZE): each would train alone."""
    one = types.SimpleNamespace(num_processes=1)
    cfg, problems = _cfg(), _problems()
    simple = {"ACCELERATE_USE_CPU": "False", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError, match=r"^accelerate launch was asked for several processes .* add --multi_gpu"):
        check_ranks_agree(one, cfg, problems, environ=simple)
    check_ranks_agree(one, cfg, problems, environ={})  # python -m regroup train
    check_ranks_agree(one, cfg, problems, environ={"ACCELERATE_USE_CPU": "True"})  # accelerate launch, 1 process
    check_ranks_agree(one, cfg, problems, environ={**simple, "WORLD_SIZE": "1"})  # torch.distributed, world 1
    check_ranks_agree(one, cfg, problems, environ={"MASTER_ADDR": "10.0.0.1"})  # a cluster's variable, no accelerate

"""Checks before the weights load (regroup.train.preflight): each late failure becomes one ConfigError line
before compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regroup.errors import ConfigError
from regroup.models import memory
from regroup.tasks import get_task
from regroup.tasks.base import Problem
from regroup.train import preflight
from regroup.train.run_config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TASK = get_task("arithmetic")
SMOLLM2_SHAPE = {
    "layers": 30,
    "kv_heads": 3,
    "head_dim": 64,
    "vocab": 49152,
    "weight_bytes": 538_000_000,
    "dtype_bytes": 4,
}


def cfg_of(*overrides, recipe="grpo.yaml"):
    return load_config(CONFIGS / recipe, ["train.progress=false", *overrides])


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if the policy's weights are loaded."""
    import regroup.models.load as load
    import regroup.train.build as build  # imported first, so its own name is patched (and restored) too

    def refuse(*a, **k):
        raise AssertionError("the weights were loaded before the check")

    monkeypatch.setattr(load, "load_policy", refuse)
    monkeypatch.setattr(build, "load_policy", refuse)


def test_world_must_divide_the_batch():
    preflight.check_world(cfg_of("grpo.prompts_per_step=4"), 2)
    with pytest.raises(ConfigError, match="prompts_per_step=3 does not divide over the 2 processes"):
        preflight.check_world(cfg_of("grpo.prompts_per_step=3"), 2)


def test_unset_api_key_variable_is_refused_before_compute():
    cfg = cfg_of(
        "mask.enabled=true",
        "mask.scorer.name=judge",
        "mask.scorer.base_url=http://127.0.0.1:1/v1",
        "mask.scorer.model=m",
        "mask.scorer.api_key_env=REGROUP_TEST_UNSET_KEY",
        recipe="dagrpo.yaml",
    )
    with pytest.raises(ConfigError, match="REGROUP_TEST_UNSET_KEY is not set"):
        preflight.check_api_keys(cfg, environ={})
    preflight.check_api_keys(cfg, environ={"REGROUP_TEST_UNSET_KEY": "k"})
    cfg.mask.scorer.api_key_env = None  # a server without authentication
    preflight.check_api_keys(cfg, environ={})


def test_a_key_no_header_can_carry_is_refused_before_compute_without_printing_it():
    """A key read from a .env file with Windows line endings ends in "\\r": every judge request would fail (and be
    retried) after the model loaded; refused here, the way an unset variable is."""
    cfg = cfg_of(
        "mask.enabled=true",
        "mask.scorer.name=judge",
        "mask.scorer.model=m",
        "mask.scorer.api_key_env=REGROUP_TEST_CRLF_KEY",
        recipe="dagrpo.yaml",
    )
    bad = (("sk-test-KEY-4711\r", "has a line break"), ("sk-tést-KEY-4711", "has a non-ASCII character"))
    for value, problem in bad:
        with pytest.raises(ConfigError) as e:
            preflight.check_api_keys(cfg, environ={"REGROUP_TEST_CRLF_KEY": value})
        line = str(e.value)
        assert line.startswith(
            f"mask.scorer.api_key_env=REGROUP_TEST_CRLF_KEY: the environment variable "
            f"REGROUP_TEST_CRLF_KEY {problem} (the value is not shown;"
        )
        assert "4711" not in line and "\r" not in line
    preflight.check_api_keys(cfg, environ={"REGROUP_TEST_CRLF_KEY": "sk-test-KEY-4711"})


def test_every_question_too_long_is_refused_some_warned():
    problems = TASK.generate(8, seed=1)
    cfg = cfg_of("data.max_prompt_tokens=16")
    with pytest.raises(ConfigError, match="all 8 sampled questions are longer than data.max_prompt_tokens=16"):
        preflight.check_prompts(cfg, problems, lambda q: [1] * 100)
    said = []
    preflight.check_prompts(cfg, problems, lambda q: [1] * (100 if q == problems[0].question else 4), said.append)
    assert len(said) == 1 and "1 of 8 sampled questions" in said[0]


def test_bad_eval_file_is_refused_at_start(tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"question": "1+1?"\n')
    with pytest.raises(ConfigError, match="data.eval_file"):
        preflight.check_eval_file(cfg_of(f"data.eval_file={bad}", "train.eval_every=2"))
    with pytest.raises(ConfigError, match="data.eval_file"):
        preflight.check_eval_file(cfg_of(f"data.eval_file={tmp_path / 'missing.jsonl'}", "train.eval_every=2"))
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    preflight.check_eval_file(cfg_of(f"data.eval_file={good}", "train.eval_every=2"))


def test_builtin_references_under_math_give_zero_anchors_and_say_why():
    """The built-in task's references end in '#### N' with no \\boxed{}: rewards=[math] verifies none."""
    problems = TASK.generate(16, seed=2)
    cfg = cfg_of("anchors.enabled=true", "rewards.functions=[math]", recipe="dagrpo.yaml")
    with pytest.raises(ConfigError, match=r"zero anchors: 0 of 16 .*16 fail rewards=\[math\].*####.*\\boxed"):
        preflight.check_references(cfg, problems, TASK, lambda t: [1] * len(t))
    ok = preflight.check_references(
        cfg_of("anchors.enabled=true", recipe="dagrpo.yaml"), problems, TASK, lambda t: [1] * len(t)
    )
    assert ok.ok == 16 and ok.verify is True


def test_references_too_long_or_partly_wrong_are_counted():
    problems = TASK.generate(4, seed=3)
    cfg = cfg_of("anchors.enabled=true", "anchors.max_tokens=5", recipe="dagrpo.yaml")
    with pytest.raises(ConfigError, match="4 are longer than anchors.max_tokens=5.*raise anchors.max_tokens"):
        preflight.check_references(cfg, problems, TASK, lambda t: [1] * len(t))
    wrong = [
        Problem(id=p.id, question=p.question, answer=p.answer, solution="#### 999", meta=p.meta) for p in problems[:2]
    ]
    said = []
    got = preflight.check_references(
        cfg_of("anchors.enabled=true", recipe="dagrpo.yaml"),
        wrong + problems[2:],
        TASK,
        lambda t: [1] * len(t),
        said.append,
    )
    assert (got.ok, got.unverified) == (2, 2) and "2 of 4 sampled reference solutions can be anchors" in said[0]
    # source=both still learns from its own answers: a warning, not a refusal
    said = []
    preflight.check_references(
        cfg_of("anchors.enabled=true", "anchors.source=both", "anchors.max_tokens=5", recipe="dagrpo.yaml"),
        problems,
        TASK,
        lambda t: [1] * len(t),
        said.append,
    )
    assert said


def test_a_reward_returning_a_string_is_refused_on_the_reference_sample(monkeypatch):
    def says_yes(response, problem):
        return "yes"

    monkeypatch.setattr(preflight, "reward_fn_from_config", lambda *a, **k: says_yes)
    with pytest.raises(ConfigError, match="reward says_yes returned str 'yes'"):
        preflight.check_references(
            cfg_of("anchors.enabled=true", recipe="dagrpo.yaml"), TASK.generate(2, seed=4), TASK, lambda t: [1]
        )


def test_memory_estimate_hand_computed():
    shape = {"layers": 2, "kv_heads": 1, "head_dim": 4, "vocab": 10, "weight_bytes": 100, "dtype_bytes": 4}
    est = memory.estimate_memory(
        shape,
        rows_at_once=3,
        total_samples=5,
        prompt_tokens=2,
        new_tokens=6,
        update_rows=2,
        training=True,
        reference=True,
    )
    assert est.parts == {
        "KV cache": 3 * 8 * (2 * 2 * 1 * 4 * 4),
        "token buffers": 3 * 6 * 16,
        "sampling logits": 3 * 10 * 12,
        "responses kept": 5 * (6 * 12 + 2048),
        "update logits": 2 * 6 * 10 * 4,
        "weights": 100 * 5,
    }
    assert est.total == sum(est.parts.values())


def test_huge_token_limit_or_group_is_refused_before_compute(monkeypatch):
    monkeypatch.setattr(preflight, "model_shape", lambda path: SMOLLM2_SHAPE)
    monkeypatch.setattr(memory, "model_shape", lambda path: SMOLLM2_SHAPE)
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 16 * 2**30)
    with pytest.raises(
        ConfigError, match=r"needs about .* GiB .* 16.0 GiB is free on cpu: lower rollout.max_new_tokens"
    ):
        preflight.check_train_memory(
            cfg_of("rollout.max_new_tokens=131072"), "m", 1, "cpu"
        )  # 1e8: refused by the config
    with pytest.raises(ConfigError, match=r"16384 samples.*largest part: KV cache"):
        preflight.check_train_memory(cfg_of("grpo.num_generations=1024"), "m", 1, "cpu")
    preflight.check_train_memory(cfg_of(), "m", 1, "cpu", prompt_tokens=200)  # the defaults fit

    with pytest.raises(ConfigError, match="evaluation .* lower --max-new-tokens"):
        memory.check_eval_memory("m", n=8, batch_size=64, max_new_tokens=100000000, problems=10, device="cpu")


def test_model_shape_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 30,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "hidden_size": 576,
                "vocab_size": 49152,
            }
        )
    )
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    assert memory.model_shape(str(tmp_path)) == {
        "layers": 30,
        "kv_heads": 3,
        "head_dim": 64,
        "vocab": 49152,
        "weight_bytes": 10,
        "dtype_bytes": 4,
    }
    assert memory.model_shape(str(tmp_path / "nothing")) is None


def test_trainer_refuses_before_the_weights_load(tiny_model_dir, tmp_path, no_weights):
    from regroup.train.build import build_trainer

    base = [f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "data.num_train=16"]
    monkey_free = memory.available_memory
    assert monkey_free() is None or monkey_free() > 0
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        build_trainer(cfg_of(*base, "rollout.max_new_tokens=100000000000"), tmp_path / "run", log=lambda m: None)
    with pytest.raises(ConfigError, match="data.max_prompt_tokens=2"):
        build_trainer(cfg_of(*base, "data.max_prompt_tokens=2"), tmp_path / "run", log=lambda m: None)
    with pytest.raises(ConfigError, match="zero anchors"):
        build_trainer(
            cfg_of(*base, "anchors.enabled=true", "rewards.functions=[math]", recipe="dagrpo.yaml"),
            tmp_path / "run",
            log=lambda m: None,
        )


def test_collective_timeout_becomes_one_line():
    from regroup.cli import user_error

    exc = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
        "Timed out waiting 5000ms for send operation to complete"
    )
    line = user_error(exc)
    assert line.startswith("error: a collective timed out (train.collective_timeout_s)")
    assert "Timed out waiting 5000ms for send operation" in line and "\n" not in line
    assert user_error(RuntimeError("shape mismatch")) is None


def test_builtin_model_is_checked_before_its_warm_up(tmp_path, monkeypatch):
    """No model.path: the checks run on the char tokenizer before the warm-up would train the model."""
    import regroup.train.build as setup
    from regroup.train.build import build_trainer

    def no_warmup(*a, **k):
        raise AssertionError("the warm-up ran before the check")

    monkeypatch.setattr(setup, "resolve_model_path", no_warmup)
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 16 * 2**30)
    base = [f"run_dir={tmp_path / 'run'}", "data.num_train=16"]
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        build_trainer(cfg_of(*base, "rollout.max_new_tokens=100000000"), tmp_path / "run", log=lambda m: None)
    with pytest.raises(ConfigError, match="zero anchors"):
        build_trainer(
            cfg_of(*base, "anchors.enabled=true", "rewards.functions=[math]", recipe="dagrpo.yaml"),
            tmp_path / "run",
            log=lambda m: None,
        )


def test_eval_with_a_huge_token_limit_is_one_line_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import regroup.eval.runner as runner
    from regroup.cli import main

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(runner, "load_eval_setup", refuse)
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 16 * 2**30)
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    code = main(
        [
            "eval",
            "--model",
            tiny_model_dir,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "ev"),
            "--max-new-tokens",
            "100000000",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "lower --max-new-tokens" in err[0], err


def test_memory_check_leaves_out_what_vllm_and_lora_size_themselves(monkeypatch):
    monkeypatch.setattr(preflight, "model_shape", lambda path: SMOLLM2_SHAPE)
    monkeypatch.setattr(memory, "model_shape", lambda path: SMOLLM2_SHAPE)
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 16 * 2**30)
    # 8192 new tokens x 128 samples of SmolLM2 through the HF sampler: its KV cache alone is over 16 GiB
    with pytest.raises(ConfigError, match="largest part: KV cache"):
        preflight.check_train_memory(
            cfg_of("rollout.max_new_tokens=8192", "grpo.micro_batch_size=1"), "m", 1, "cpu", prompt_tokens=200
        )
    preflight.check_train_memory(
        cfg_of("rollout.max_new_tokens=8192", "grpo.micro_batch_size=1", "rollout.backend=vllm"),
        "m",
        1,
        "cpu",
        prompt_tokens=200,
    )
    # the update's logits [micro-batch, T, V] are materialised in float32: 64 x 8192 x 49152 does not fit
    with pytest.raises(ConfigError, match="largest part: update logits"):
        preflight.check_train_memory(
            cfg_of("rollout.max_new_tokens=8192", "rollout.backend=vllm", "model.lora.enabled=true"),
            "m",
            1,
            "cpu",
            prompt_tokens=200,
        )


@pytest.mark.parametrize("timeout_s", [0, 30])  # in-process, and in the deadline worker
def test_a_user_reward_returning_a_string_is_refused_before_weights_load_without_anchors(
    tmp_path, monkeypatch, timeout_s
):
    (tmp_path / "my_rewards_str.py").write_text(
        "def says_yes(response, problem):\n    return 'yes'\n\ndef fine(response, problem):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the deadline worker imports the module from the working folder
    problems = TASK.generate(4, seed=4)
    cfg = cfg_of("rewards=[my_rewards_str:says_yes]", f"rewards.timeout_s={timeout_s}")
    with pytest.raises(ConfigError, match="says_yes returned str 'yes'"):
        preflight.check_user_rewards(cfg, problems, TASK)
    preflight.check_user_rewards(
        cfg_of("rewards=[my_rewards_str:fine]", f"rewards.timeout_s={timeout_s}"), problems, TASK
    )
    preflight.check_user_rewards(cfg_of(), problems, TASK)  # built-in rewards: nothing to call

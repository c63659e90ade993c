"""rollout.backend=vllm_server against a scripted stand-in for vLLM's HTTP API (fast, no vLLM): what each
request carries, how replies become Completions, the reload weight sync, and failures in one line.
The same paths against a real vLLM server: tests/real_engine/test_server.py (slow)."""

from __future__ import annotations

import math
import types

import pytest
import torch
from fake_vllm import EOS, FakeVLLM, ok_choices

from regroup.rollout.base import SamplingParams
from regroup.rollout.vllm import request_seeds
from regroup.rollout.vllm_server import ServerError, VLLMServerSampler, serve_command, serve_env

KEY_ENV = "REGROUP_TEST_VLLM_KEY"
KEY = "sk-vllm-test-key-123"


class Tok:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == EOS))


def rollout_cfg(url, **kw):
    base = dict(
        vllm_server_url=url,
        vllm_server_api_key_env=None,
        vllm_server_timeout_s=5.0,
        vllm_server_sync="reload",
        vllm_server_sync_dir=None,
    )
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.fixture()
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_requests_carry_token_ids_seeds_and_logprob_options(tiny_model, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeVLLM(api_key=KEY) as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url + "/v1", vllm_server_api_key_env=KEY_ENV))
        srv.requests.clear()
        prompts = [[1, 5, 6], [1, 7], [1, 5, 6]]
        params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3, n=2)
        out = sampler.generate(prompts, params, seed=11)
        sampler.close()
    bodies = sorted((b for p, b, _ in srv.requests if p == "/v1/completions"), key=lambda b: b["seed"])
    assert [b["prompt"] for b in bodies] == prompts  # token ids, never text
    assert [b["seed"] for b in bodies] == request_seeds(3, 11)  # the HF sampler's per-prompt seeds
    for b in bodies:
        assert (b["model"], b["n"], b["temperature"], b["top_p"], b["max_tokens"]) == ("served-model", 2, 0.7, 0.9, 3)
        assert b["logprobs"] == 0 and b["return_token_ids"] is True and b["stop_token_ids"] == [EOS]
    assert all(auth == f"Bearer {KEY}" for _, _, auth in srv.requests)
    # prompt-major, each prompt's n completions in index order, with the per-token log-probs
    assert [c.prompt_index for c in out] == [0, 0, 1, 1, 2, 2]
    assert out[0].token_ids == [10, 11, 12] and out[0].truncated
    assert out[0].logps == pytest.approx([-0.1, -0.2, -0.3])


def test_eos_is_kept_or_added_with_unknown_logprob(tiny_model):
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url))
        srv.mode = "eos"
        kept = sampler.generate([[1]], SamplingParams(max_new_tokens=5), seed=0)[0]
        srv.mode = "stop"
        added = sampler.generate([[1]], SamplingParams(max_new_tokens=5), seed=0)[0]
        sampler.close()
    assert kept.token_ids == [10, 11, EOS] and not kept.truncated and kept.logps == pytest.approx([-0.1, -0.2, -0.3])
    assert added.token_ids == [10, 11, EOS] and not added.truncated
    assert added.logps[:2] == pytest.approx([-0.1, -0.2]) and math.isnan(added.logps[2])
    assert all(auth is None for _, _, auth in srv.requests)  # no key configured: no Authorization header


def test_reload_sync_writes_the_weights_atomically_then_reloads_and_resets_the_cache(tiny_model, tmp_path):
    from safetensors.torch import load_file

    sync_dir = tmp_path / "sync"
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url, vllm_server_sync_dir=str(sync_dir)))
        with torch.no_grad():
            next(tiny_model.parameters()).add_(1.0)
        sampler.sync_weights(tiny_model)
        paths = [p for p, _, _ in srv.requests]
        # the folder the server reloaded from held the complete file, and nothing half-written beside it
        (first, files1), (second, files2) = srv.reload_saw
        saved = load_file(str(second / "model.safetensors"))
        sampler.close()
    assert paths == ["/v1/models", "/collective_rpc", "/reset_prefix_cache", "/collective_rpc", "/reset_prefix_cache"]
    rpc = [b for p, b, _ in srv.requests if p == "/collective_rpc"][-1]
    assert rpc == {"method": "regroup_reload_weights", "kwargs": {"weights_path": str(second), "fingerprint": True}}
    assert files1 == files2 == ["model.safetensors"]
    assert (first.name, second.name) == ("weights-v1", "weights-v2")
    expected = dict(tiny_model.named_parameters())
    assert set(saved) == set(expected)
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name].detach()), name
    assert len(sampler.sync_times) == 2
    assert sorted(p.name for p in sync_dir.iterdir()) == []  # old versions removed, the last one on close


def test_a_server_that_is_down_fails_in_one_line_at_start(tiny_model):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(ServerError) as err:
        VLLMServerSampler(tiny_model, Tok(), rollout_cfg(f"http://127.0.0.1:{port}"))
    message = str(err.value)
    assert "\n" not in message and "connection failed" in message and f":{port}/v1/models" in message


def test_5xx_and_deadline_end_the_step_in_one_line(tiny_model):
    from regroup.cli import user_error

    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url, vllm_server_timeout_s=0.5))
        srv.mode = "500"
        with pytest.raises(ServerError, match="HTTP 500: .*EngineDeadError") as err:
            sampler.generate([[1]], SamplingParams(max_new_tokens=2), seed=0)
        assert user_error(err.value).startswith("error: vLLM server:")  # the CLI's one line, exit 2
        srv.mode = "hang"
        with pytest.raises(ServerError, match="within the 0.5 s deadline"):
            sampler.generate([[1]], SamplingParams(max_new_tokens=2), seed=0)
        sampler.close()


def test_missing_key_variable_and_bad_url_are_refused(tiny_model, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ServerError, match=f"{KEY_ENV}: that environment variable is not set"):
        VLLMServerSampler(tiny_model, Tok(), rollout_cfg("http://127.0.0.1:9", vllm_server_api_key_env=KEY_ENV))
    with pytest.raises(ServerError, match="must start with http"):
        VLLMServerSampler(tiny_model, Tok(), rollout_cfg("127.0.0.1:9"))


def test_serve_command_keeps_the_key_off_the_command_line(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cmd = serve_command("/models/m", python="/venv/bin/python", port=8123, max_model_len=512)
    env = serve_env(KEY_ENV, base={})
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[cmd.index("--worker-extension-cls") + 1] == "regroup.rollout.vllm_worker.WeightReloadExtension"
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--max-model-len") + 1] == "512"
    assert KEY not in " ".join(cmd)
    assert "--no-enable-chunked-prefill" in cmd and "--enforce-eager" in cmd  # CPU
    assert env["VLLM_API_KEY"] == KEY and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_API_KEY" not in serve_env(None, base={})


def test_vllm_serve_cli_refuses_a_missing_model_folder(tmp_path, capsys):
    from regroup.cli import main

    assert main(["vllm-serve", str(tmp_path / "nope")]) == 2
    assert "not a model folder" in capsys.readouterr().err


def test_config_accepts_the_backend_and_refuses_a_key_as_the_variable_name():
    from regroup.errors import ConfigError
    from regroup.train.run_config import config_from_dict

    cfg = config_from_dict({"rollout": {"backend": "vllm_server", "vllm_server_url": "http://10.0.0.2:8000"}})
    assert cfg.rollout.backend == "vllm_server" and cfg.rollout.vllm_server_sync == "reload"
    with pytest.raises(ConfigError, match="rollout.vllm_server_api_key_env"):
        config_from_dict({"rollout": {"vllm_server_api_key_env": "sk-abcdefghijklmnopqrstuvwxyz123456"}})
    with pytest.raises(ConfigError, match="vllm_server_timeout_s"):
        config_from_dict({"rollout": {"vllm_server_timeout_s": 0}})


def test_a_resume_may_point_at_a_restarted_server():
    from regroup.config.schema import check_resume_overrides
    from regroup.errors import ConfigError

    check_resume_overrides(["rollout.vllm_server_url=http://127.0.0.1:9001", "rollout.vllm_server_timeout_s=60"])
    with pytest.raises(ConfigError, match="--resume cannot change rollout.vllm_server_sync"):
        check_resume_overrides(["rollout.vllm_server_sync=nccl"])


def test_several_learner_processes_are_refused(tiny_model, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ServerError, match="one learner process"):
        VLLMServerSampler(tiny_model, Tok(), rollout_cfg("http://127.0.0.1:9"))


# ---- a misbehaving server: every reply is checked before the learner sees it ---------------------------


def _first_choice_with(**changes):
    """A reply function: the well-behaved reply with choice 0's fields replaced by `changes`."""

    def reply(body):
        choices = sorted(ok_choices(body), key=lambda c: c["index"])
        choices[0].update(changes)
        return {"choices": choices}

    return reply


def _lps(values):
    return {"token_logprobs": values}


VOCAB = 101  # the tiny model's embedding rows (regroup.models.tiny's character vocabulary)

# (what the server sends, a reply function for max_tokens=4 / n=2, what the one line must say)
HOSTILE_REPLIES = [
    (
        "id past the vocabulary",
        _first_choice_with(token_ids=[10, VOCAB + 5, 12, 13]),
        r"token id 106, outside .*\[0, 101\)",
    ),
    ("negative id", _first_choice_with(token_ids=[10, -1, 12, 13]), r"token id -1, outside"),
    ("id beyond int64", _first_choice_with(token_ids=[10, 2**70, 12, 13]), r"token id 1180591620717411303424, outside"),
    ("id as a string", _first_choice_with(token_ids=[10, "11", 12, 13]), r"token id '11', outside"),
    ("id as a float", _first_choice_with(token_ids=[10, 11.5, 12, 13]), r"token id 11.5, outside"),
    (
        "too many tokens",
        _first_choice_with(token_ids=[10] * 4000, logprobs=_lps([-0.1] * 4000)),
        r"has 4000 tokens, more than the max_tokens=4",
    ),
    ("a JSON list", lambda body: [{"choices": []}], r"answered a JSON list, not an object with choices"),
    (
        "choices that are strings",
        lambda body: {"choices": ["10 11", "12 13"]},
        r"choice 0 is a JSON string, not an object",
    ),
    ("no choices", lambda body: {"id": "cmpl-1"}, r"answered no choices list"),
    ("token_ids a string", _first_choice_with(token_ids="10 11 12 13"), r"has no token_ids list"),
    (
        "a repeated index",
        lambda body: {"choices": [dict(c, index=0) for c in ok_choices(body)]},
        r"indices \[0, 0\] are not 0..1",
    ),
    (
        "NaN log-prob",
        _first_choice_with(logprobs=_lps([-0.1, float("nan"), -0.1, -0.1])),
        r"log-prob nan: not a finite number <= 0",
    ),
    ("log-prob beyond float", _first_choice_with(logprobs=_lps([-0.1, -(10**400), -0.1, -0.1])), r"log-prob -1000"),
    (
        "log-prob -inf",
        _first_choice_with(logprobs=_lps([-0.1, float("-inf"), -0.1, -0.1])),
        r"log-prob -inf: not a finite",
    ),
    ("null log-prob", _first_choice_with(logprobs=_lps([-0.1, None, -0.1, -0.1])), r"log-prob None: not a finite"),
    (
        "positive log-prob",
        _first_choice_with(logprobs=_lps([-0.1, 2.0, -0.1, -0.1])),
        r"log-prob 2.0: not a finite number <= 0",
    ),
    ("too few log-probs", _first_choice_with(logprobs=_lps([-0.1, -0.2, -0.3])), r"has 3 log-probs for its 4 tokens"),
    (
        "no log-probs",
        _first_choice_with(logprobs=None),
        r"no logprobs.token_logprobs list \(the request asked for logprobs=0\)",
    ),
]


@pytest.mark.parametrize("what,reply,says", HOSTILE_REPLIES, ids=[c[0] for c in HOSTILE_REPLIES])
def test_a_bad_reply_is_one_server_error_line(tiny_model, what, reply, says):
    from regroup.cli import user_error

    assert tiny_model.get_input_embeddings().num_embeddings == VOCAB
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url))
        good = sampler.generate([[1, 5]], SamplingParams(max_new_tokens=4, n=2), seed=0)
        assert [c.token_ids for c in good] == [[10, 11, 12, 13]] * 2  # the same server, well-behaved
        srv.completion_reply = reply
        with pytest.raises(ServerError, match=says) as err:
            sampler.generate([[1, 5]], SamplingParams(max_new_tokens=4, n=2), seed=0)
        sampler.close()
    line = user_error(err.value)
    assert line.startswith("error: vLLM server: ") and "\n" not in line and len(line) < 300
    assert "prompt 0" in line


def test_a_reply_at_the_limits_is_accepted(tiny_model):
    """The edges are not refused: the last id of the vocabulary, exactly max_tokens tokens, log-prob 0,
    and choices indexed past 9 (sorted as numbers, not as text)."""
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url))
        many = sampler.generate([[1, 5]], SamplingParams(max_new_tokens=4, n=12), seed=0)
        assert len(many) == 12 and all(c.token_ids == [10, 11, 12, 13] for c in many)
        srv.completion_reply = _first_choice_with(token_ids=[0, VOCAB - 1, 12, 13], logprobs=_lps([0.0, -50.0, -1, -2]))
        out = sampler.generate([[1, 5]], SamplingParams(max_new_tokens=4, n=2), seed=0)
        sampler.close()
    assert out[0].token_ids == [0, VOCAB - 1, 12, 13] and out[0].logps == [0.0, -50.0, -1.0, -2.0]


def test_redirects_are_refused_and_the_key_never_reaches_the_new_host(tiny_model, monkeypatch):
    """A server answering 302 to another address: one line naming it; the other address receives nothing
    (on the old code, urllib followed it, copying the Authorization header; only an unrelated
    AttributeError on the copied request stopped it)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeVLLM(api_key=KEY) as srv, FakeVLLM() as elsewhere:
        cfg = rollout_cfg(srv.url, vllm_server_api_key_env=KEY_ENV)
        sampler = VLLMServerSampler(tiny_model, Tok(), cfg)
        srv.redirect_to = elsewhere.url
        with pytest.raises(ServerError) as during:
            sampler.generate([[1]], SamplingParams(max_new_tokens=2), seed=0)
        sampler.close()
        with pytest.raises(ServerError) as at_start:
            VLLMServerSampler(tiny_model, Tok(), cfg)
    for err, path in ((during, "/v1/completions"), (at_start, "/v1/models")):
        line = str(err.value)
        assert f"HTTP 302 redirect to {elsewhere.url}{path}: redirects are not followed" in line, line
        assert "\n" not in line and KEY not in line
    assert elsewhere.requests == []


@pytest.mark.parametrize("asynchronous", [False, True])
def test_lora_reloads_send_the_frozen_weights_once_then_only_the_merged_adapters(
    tiny_model_dir, tmp_path, asynchronous
):
    """The first reload sends every weight (the server may hold another run's); later ones, the only weights a
    LoRA update changes: each adapted layer's base + delta. Sync (`sync_weights`) and async (snapshots)."""
    from safetensors.torch import load_file

    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy

    model = load_policy(tiny_model_dir, ModelConfig(lora=LoraConfig(r=2, target_modules=["q_proj"])), lora=True)
    every = {n for n, _ in model.base_model.model.named_parameters() if "lora_" not in n}
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(
            model, Tok(), rollout_cfg(srv.url, vllm_server_sync_dir=str(tmp_path)), sync_on_start=not asynchronous
        )
        if asynchronous:  # the producer's first load, then a snapshot taken after an update
            sampler.load_snapshot(sampler.snapshot_weights(model), 0)
        q_b = next(p for n, p in model.named_parameters() if "q_proj.lora_B" in n)
        with torch.no_grad():
            q_b.fill_(0.1)  # an update: B != 0
        if asynchronous:
            sampler.load_snapshot(sampler.snapshot_weights(model), 1)
        else:
            sampler.sync_weights(model)
        (_, _), (second, _) = srv.reload_saw
        partial = load_file(str(second / "model.safetensors"))
        sampler.close()
    layers = len([n for n in every if n.endswith("q_proj.base_layer.weight")])
    assert sampler.sync_tensors == [len(every), layers]  # all, then the adapted layers only
    assert set(partial) == {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(layers)}
    layer = dict(model.named_modules())["base_model.model.model.layers.0.self_attn.q_proj"]
    merged = layer.base_layer.weight + layer.get_delta_weight("default")
    torch.testing.assert_close(partial["model.layers.0.self_attn.q_proj.weight"], merged.detach())


def test_full_fine_tuning_reloads_every_weight_each_time(tiny_model, tmp_path):
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url, vllm_server_sync_dir=str(tmp_path)))
        sampler.sync_weights(tiny_model)
        sampler.close()
    n = len(list(tiny_model.named_parameters()))
    assert sampler.sync_tensors == [n, n]  # every weight is trainable


# -- weights this run did not push ----------------------------------------------------------------------------------
def test_foreign_weight_changes_by_hand():
    from regroup.rollout.vllm_server import foreign_weight_changes

    last = [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]  # two server workers
    assert foreign_weight_changes(None, last) == []  # the first reload: nothing to compare with
    assert foreign_weight_changes(last, [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]) == []
    assert foreign_weight_changes(last, [{"a": "1", "b": "2"}, {"a": "3", "b": "X"}]) == ["b"]
    assert foreign_weight_changes(last, [{"a": "1"}, {"a": "3", "b": "4", "c": "5"}]) == ["b", "c"]  # gone, new
    assert foreign_weight_changes(last, [{"a": "1", "b": "2"}]) == ["a", "b"]  # another number of workers


def _lora_model(tiny_model_dir):
    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy

    return load_policy(tiny_model_dir, ModelConfig(lora=LoraConfig(r=2, target_modules=["q_proj"])), lora=True)


def _served_equals_learner(srv, model) -> list[str]:
    """Names whose tensor on the (fake) server differs from the learner's weight (LoRA merged)."""
    from regroup.rollout.vllm_server import weights_in_memory

    want = weights_in_memory(model)
    return sorted(n for n in want if not torch.equal(srv.weights[n], want[n]))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_foreign_reload_of_a_frozen_weight_is_named_and_every_weight_reloaded(tiny_model_dir, tmp_path, asynchronous):
    """A LoRA run's later reloads carry the adapted layers only. Another client reloads a frozen MLP weight
    x1.03 in between: the run's next reload sees it in the server's fingerprints, says so in one line, and
    reloads every weight, so the server computes with the learner's weights again."""
    model = _lora_model(tiny_model_dir)
    lines: list[str] = []
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(
            model,
            Tok(),
            rollout_cfg(srv.url, vllm_server_sync_dir=str(tmp_path)),
            sync_on_start=False,
            log=lines.append,
        )

        def push(version):
            if asynchronous:
                sampler.load_snapshot(sampler.snapshot_weights(model), version)
            else:
                sampler.sync_weights(model)

        q_b = next(p for n, p in model.named_parameters() if "q_proj.lora_B" in n)
        push(0)
        with torch.no_grad():
            q_b.fill_(0.1)  # an update
        push(1)
        assert lines == [] and _served_equals_learner(srv, model) == []
        frozen = "model.layers.1.mlp.up_proj.weight"
        srv.foreign_reload(frozen, srv.weights[frozen] * 1.03)
        with torch.no_grad():
            q_b.fill_(0.2)
        assert _served_equals_learner(srv, model) != []
        push(2)
        after_foreign = list(lines)
        with torch.no_grad():
            q_b.fill_(0.3)
        push(3)
        sampler.close()
    every, partial = sampler.sync_tensors[0], sampler.sync_tensors[1]
    assert partial < every
    assert sampler.sync_tensors == [every, partial, partial, every, partial]  # the full reload right after
    assert len(after_foreign) == 1 and lines == after_foreign  # named once; the next reload is clean
    assert frozen in after_foreign[0] and "1 tensor(s)" in after_foreign[0] and "another client" in after_foreign[0]
    assert sampler.foreign_changes == 1
    assert _served_equals_learner(srv, model) == []  # the server holds the learner's weights again


def test_a_restarted_server_is_a_change_too(tiny_model_dir, tmp_path):
    """The same URL, a fresh server (its original weights): the run reloads everything, not the adapters only."""
    model = _lora_model(tiny_model_dir)
    lines: list[str] = []
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(
            model, Tok(), rollout_cfg(srv.url, vllm_server_sync_dir=str(tmp_path)), log=lines.append
        )
        original = {n: t.clone() for n, t in srv.weights.items()}
        srv.weights = {n: t * 0 for n, t in original.items()}  # what a restart from another checkpoint holds
        sampler.sync_weights(model)
        sampler.close()
    assert len(lines) == 1 and f"{len(original)} tensor(s)" in lines[0]
    assert _served_equals_learner(srv, model) == []


def test_a_server_without_the_fingerprints_is_refused_in_one_line(tiny_model, monkeypatch):
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url), sync_on_start=False)
        monkeypatch.setattr(srv, "fingerprints", lambda: None)  # an older worker extension: no fingerprints
        with pytest.raises(ServerError, match="not the weights' fingerprints") as err:
            sampler.sync_weights(tiny_model)
        sampler.close()
    assert "\n" not in str(err.value) and "regroup vllm-serve" in str(err.value)


# -- the sync folder is removed however the sampler ends ------------------------------------------------------------
def test_close_removes_the_temporary_folder_and_a_collected_sampler_removes_it_too(tiny_model, tmp_path, monkeypatch):
    import gc
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url))
        folder = sampler.sync_dir
        assert folder.parent == tmp_path and (folder / "weights-v1" / "model.safetensors").is_file()
        sampler.close()
        sampler.close()  # idempotent
        assert list(tmp_path.iterdir()) == []
        sampler.sync_weights(tiny_model)  # used again after close: the folder comes back, and goes again
        assert (folder / "weights-v2").is_dir()
        sampler.close()
        assert list(tmp_path.iterdir()) == []

        dropped = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url))  # never closed
        assert len(list(tmp_path.iterdir())) == 1
        del dropped
        gc.collect()
        assert list(tmp_path.iterdir()) == []


def test_close_leaves_a_configured_folder_and_other_files_in_it(tiny_model, tmp_path):
    sync_dir = tmp_path / "shared"
    sync_dir.mkdir()
    (sync_dir / "someone-elses").write_text("x")
    with FakeVLLM() as srv:
        sampler = VLLMServerSampler(tiny_model, Tok(), rollout_cfg(srv.url, vllm_server_sync_dir=str(sync_dir)))
        sampler.sync_weights(tiny_model)
        sampler.close()
    assert sorted(p.name for p in sync_dir.iterdir()) == ["someone-elses"]


def test_weight_fingerprints_see_weights_kept_only_inside_a_kernel():
    """vLLM's CPU backend empties a linear layer's `weight` and keeps it in a packed kernel: the fingerprint
    applies the layer's kernel to fixed inputs, so a change there shows; plain tensors are hashed as they are."""
    from regroup.rollout.vllm_worker import weight_fingerprints

    class Packed:  # the layer's quant_method: computes with a copy the module does not show
        def __init__(self, weight):
            self.kernel = weight.clone()

        def apply(self, layer, x):
            return x @ self.kernel.T

    def model(scale_one=1.0):
        torch.manual_seed(0)
        root = torch.nn.Module()
        root.proj = torch.nn.Module()
        w = torch.randn(6, 4)
        w[2, 3] *= scale_one
        root.proj.weight = torch.nn.Parameter(torch.empty(0))  # emptied, as on CPU
        root.proj.quant_method, root.proj.input_size_per_partition = Packed(w), 4
        root.norm = torch.nn.Module()
        root.norm.weight = torch.nn.Parameter(torch.ones(4))
        root.big = torch.nn.Module()
        root.big.weight = torch.nn.Parameter(torch.randn(300, 300))  # over 65,536 values: through a product
        return root

    a, again, changed = weight_fingerprints(model()), weight_fingerprints(model()), weight_fingerprints(model(1.03))
    assert sorted(a) == ["big.weight", "norm.weight", "proj.weight"]
    assert a == again
    assert [n for n in a if a[n] != changed[n]] == ["proj.weight"]
    m = model()
    with torch.no_grad():
        m.big.weight[123, 45] += 1e-3
    assert [n for n, d in weight_fingerprints(m).items() if d != a[n]] == ["big.weight"]

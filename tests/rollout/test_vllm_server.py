"""rollout.backend=vllm_server against a scripted stand-in for vLLM's HTTP API (fast, no vLLM): what each
request carries, how replies become Completions, the reload weight sync, and failures in one line.
The same paths against a real vLLM server: tests/real_engine/test_server.py (slow)."""

from __future__ import annotations

import json
import math
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from regroup.rollout.base import SamplingParams
from regroup.rollout.vllm import request_seeds
from regroup.rollout.vllm_server import ServerError, VLLMServerSampler, serve_command, serve_env

KEY_ENV = "REGROUP_TEST_VLLM_KEY"
KEY = "sk-vllm-test-key-123"
EOS = 2


class FakeVLLM:
    """Answers /v1/models, /v1/completions (token i of a completion = 10 + i, log-prob -0.1·(i+1)),
    /collective_rpc and /reset_prefix_cache; records (path, body, Authorization) of every request.
    `mode`: ok | eos (stop on EOS, which vLLM leaves in) | stop (stopped, EOS left out) | 500 | hang."""

    def __init__(self, api_key=None):
        self.api_key = api_key
        self.mode = "ok"
        self.requests = []
        self.reload_saw = []  # (folder, its files at the time of the reload call)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, body):
                fake.requests.append((self.path, body, self.headers.get("Authorization")))
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    return self._reply(401, {"error": "bad key"})
                if self.path == "/v1/models":
                    return self._reply(200, {"data": [{"id": "served-model"}]})
                if self.path in ("/collective_rpc", "/reset_prefix_cache"):
                    if self.path == "/collective_rpc":
                        from pathlib import Path

                        folder = Path(body["kwargs"]["weights_path"])
                        fake.reload_saw.append((folder, sorted(p.name for p in folder.iterdir())))
                    return self._reply(200, {"results": [1]} if self.path == "/collective_rpc" else {})
                if fake.mode == "500":
                    return self._reply(500, {"error": "EngineDeadError: the engine died"})
                if fake.mode == "hang":
                    time.sleep(3.0)
                    return
                n, k = body["n"], body["max_tokens"]
                choices = []
                for c in range(n):
                    ids = [10 + i for i in range(k)]
                    finish = "length"
                    if fake.mode in ("eos", "stop"):
                        ids = ids[:2] + ([EOS] if fake.mode == "eos" else [])
                        finish = "stop"
                    lps = [-0.1 * (i + 1) for i in range(len(ids))]
                    choices.append(
                        {
                            "index": n - 1 - c,
                            "token_ids": ids,
                            "finish_reason": finish,  # out of order
                            "logprobs": {"token_logprobs": lps},
                        }
                    )
                return self._reply(200, {"choices": choices})

            def do_GET(self):
                self._handle(None)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self._handle(json.loads(self.rfile.read(length) or b"null"))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


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
    assert rpc == {"method": "regroup_reload_weights", "kwargs": {"weights_path": str(second)}}
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

"""Numbered weight snapshots (async rollouts): the HF sampler's own copy takes exactly the snapshot's
weights, a sampler that shares the learner's weights is refused, and the vLLM server client writes a
snapshot as a folder and asks the server to reload it, between requests (a loopback stand-in for vLLM's
HTTP API; the real server: tests/real_engine/test_async.py)."""

from __future__ import annotations

import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer
from regroup.rollout.base import SamplingParams
from regroup.rollout.factory import build_sampler
from regroup.rollout.versions import AsyncRolloutError, VersionedEngine
from regroup.rollout.vllm_server import VLLMServerSampler


def tiny():
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0
    )
    return model, tokenizer


def test_the_hf_sampler_under_async_samples_from_its_own_copy_at_the_snapshots_version():
    model, tokenizer = tiny()
    cfg = types.SimpleNamespace(backend="hf", batch_size=8, async_steps=1)
    engine = VersionedEngine(build_sampler(cfg, model, tokenizer))
    assert engine.sampler.model is not model
    engine.load(engine.snapshot(model, 0))
    prompt = [[5, 6, 7]]
    params = SamplingParams(1.0, 1.0, max_new_tokens=6, n=1)
    before = engine.generate(prompt, params, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))  # the learner moves on: the copy must not see it
    assert engine.generate(prompt, params, seed=3)[0].token_ids == before[0].token_ids
    engine.load(engine.snapshot(model, 1))
    copy_state, learner_state = engine.sampler.model.state_dict(), model.state_dict()
    assert all(torch.equal(copy_state[k], learner_state[k]) for k in learner_state)
    after = engine.generate(prompt, params, seed=3)
    assert after[0].policy_version == 1 and before[0].policy_version == 0


def test_a_sampler_that_shares_the_learners_weights_is_refused():
    model, tokenizer = tiny()
    cfg = types.SimpleNamespace(backend="hf", batch_size=8, async_steps=0)
    with pytest.raises(AsyncRolloutError, match="shares the learner's weights"):
        VersionedEngine(build_sampler(cfg, model, tokenizer))


class ReloadServer:
    """/v1/models, /collective_rpc (records the folder and its files) and /reset_prefix_cache."""

    def __init__(self):
        self.calls = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._reply({"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/collective_rpc":
                    folder = Path(body["kwargs"]["weights_path"])
                    server.calls.append((self.path, folder.name, sorted(p.name for p in folder.iterdir())))
                    return self._reply({"results": [{"refreshed": 0, "before": {}, "after": {}}]})  # fingerprints: none
                server.calls.append((self.path, None, None))
                self._reply({})

            def _reply(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_the_server_client_loads_a_snapshot_as_a_folder_and_reloads_between_requests(tmp_path):
    model, tokenizer = tiny()
    server = ReloadServer()
    cfg = types.SimpleNamespace(
        vllm_server_url=server.url,
        vllm_server_api_key_env=None,
        vllm_server_timeout_s=30.0,
        vllm_server_sync="reload",
        vllm_server_sync_dir=str(tmp_path / "sync"),
    )
    sampler = VLLMServerSampler(model, tokenizer, cfg, sync_on_start=False)
    assert server.calls == []  # async: the producer loads version 0 itself
    engine = VersionedEngine(sampler)
    snap = engine.snapshot(model, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # the learner moves on after the snapshot: the server must get the snapshot's weights
    engine.load(snap)
    engine.load(engine.snapshot(model, 1))
    assert [c[0] for c in server.calls] == ["/collective_rpc", "/reset_prefix_cache"] * 2
    assert server.calls[0][2] == ["model.safetensors"]
    assert sampler.served_version == 1 and engine.switches == [0, 1]
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == [server.calls[2][1]]  # the older folder is gone
    from safetensors.torch import load_file

    written = load_file(str(tmp_path / "sync" / server.calls[2][1] / "model.safetensors"))
    assert all(float(t.abs().sum()) == 0.0 for t in written.values())  # version 1: the zeroed weights
    assert snap.payload and any(float(t.abs().sum()) > 0 for t in snap.payload.values())  # version 0 kept its own
    sampler.close()


def test_an_own_copy_the_lean_decoder_cannot_run_samples_twice_on_one_version():
    """A LoRA model (peft) falls back to the HF forward; two batches on one version (k = 1: batches 0 and 1)
    once failed on the second call with AttributeError: 'bool' object has no attribute 'model'."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny()
    model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    cfg = types.SimpleNamespace(backend="hf", batch_size=8, async_steps=1)
    engine = VersionedEngine(build_sampler(cfg, model, tokenizer))
    engine.load(engine.snapshot(model, 0))
    params = SamplingParams(1.0, 1.0, max_new_tokens=4, n=1)
    first = engine.generate([[5, 6, 7]], params, seed=1)
    second = engine.generate([[5, 6, 7]], params, seed=1)
    assert first[0].token_ids == second[0].token_ids and second[0].policy_version == 0

"""The real vLLM server (slow): started by `regroup vllm-serve` in the docs' keyed form, SmolLM2-135M-Instruct
on loopback, the server bound to one core. Checks what a second client and a run's own exit can do to it:

- every route needs the key (vLLM's own check guards /v1 only; the dev routes regroup turns on were open);
- `vllm-serve MODEL --api-key-env NAME --python PY ...`: regroup's options after MODEL are regroup's;
- a second client's reload of frozen weights during a LoRA run is found by the next reload's fingerprints,
  named, and undone by a full reload; the log-prob gap's jump is named on the step that sampled from it;
- a run, sync or async, leaves nothing in its TMPDIR (it left `regroup-vllm-sync-*/weights-vN`); a run killed
  with SIGKILL leaves its folder to the next run, which removes it.

Figures go to "real-engine figures" (conftest.py).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "REGROUP_TEST_GUARD_KEY"
MAX_MODEL_LEN = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, method="GET", body=None, key=None, timeout=300) -> tuple[int, bytes]:
    """(status, body) of one request; an HTTP error status is returned, not raised."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory, figures):
    """`regroup vllm-serve MODEL --api-key-env NAME --python PY --port P ...` (options after MODEL, as the docs
    write it), with a generated key; (url, key). Stopped at teardown, also on failure."""
    key = secrets.token_hex(16)
    port = _free_port()
    log = tmp_path_factory.mktemp("guarded-server") / "server.log"
    env = {
        **os.environ,
        KEY_ENV: key,
        "PYTHONPATH": str(ROOT / "src"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", str(max(os.sched_getaffinity(0)))),
    }
    argv = [sys.executable, "-m", "regroup", "vllm-serve", smollm2_dir, "--api-key-env", KEY_ENV]
    argv += ["--python", sys.executable, "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN)]
    argv += ["--dtype", "float32"]
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not _ready(url, port, key):
            if proc.poll() is not None:
                pytest.fail(f"vllm-serve exited with {proc.returncode}: {log.read_text()[-3000:]}")
            if time.monotonic() - start > 900:
                pytest.fail(f"vllm-serve not ready in 900 s: {log.read_text()[-3000:]}")
            time.sleep(1.0)
        figures["guarded server: vllm-serve ready, s"] = round(time.monotonic() - start, 1)
        os.environ[KEY_ENV] = key  # the runs below read the key from here, as a user's shell would hold it
        yield types.SimpleNamespace(url=url, key=key, log=log)
    finally:
        os.environ.pop(KEY_ENV, None)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=30)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def _ready(url, port, key) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return False
    try:
        return http(url + "/v1/models", key=key, timeout=5)[0] == 200
    except OSError:
        return False


# -- every route needs the key -------------------------------------------------------------------------------------
def test_every_route_of_a_keyed_server_refuses_a_request_without_the_key(server, figures):
    status, spec = http(server.url + "/openapi.json", key=server.key)
    assert status == 200
    routes = sorted(
        (path.replace("{response_id}", "x"), method.upper())
        for path, methods in json.loads(spec)["paths"].items()
        for method in methods
    )
    assert ("/collective_rpc", "POST") in routes and ("/sleep", "POST") in routes  # dev mode is on
    # what the trial did keyless, the routes outside the schema, and a path that does not exist
    bodies = {
        "/collective_rpc": {"method": "save_sharded_state", "kwargs": {"path": "/tmp"}},
        "/sleep": {},
    }
    extra = [("/collective_rpc", "POST"), ("/save_sharded_state", "POST"), ("/docs", "GET"), ("/no/such", "GET")]
    answered = {}
    for path, method in routes + extra:
        body = bodies.get(path, {}) if method in ("POST", "PUT", "PATCH") else None
        for key in (None, "wrong-" + server.key):
            answered[(path, method, bool(key))] = http(server.url + path, method, body, key=key, timeout=60)[0]
    refused = sum(status == 401 for status in answered.values())
    figures["guarded server: keyless or wrong-key requests answered 401 / sent"] = f"{refused} / {len(answered)}"
    assert {k: v for k, v in answered.items() if v != 401} == {}  # each one: 401, before any route runs
    # the engine still serves: it was not put to sleep, and keyed requests work
    assert http(server.url + "/is_sleeping", key=server.key)[1] == b'{"is_sleeping":false}'
    assert http(server.url + "/v1/models", key=server.key)[0] == 200
    assert http(server.url + "/health", key=server.key)[0] == 200


# -- weights this run did not push ---------------------------------------------------------------------------------
def _cfg(server, sync_dir=None):
    return types.SimpleNamespace(
        vllm_server_url=server.url,
        vllm_server_api_key_env=KEY_ENV,
        vllm_server_timeout_s=600.0,
        vllm_server_sync="reload",
        vllm_server_sync_dir=sync_dir,
    )


def _prompts(tokenizer):
    out = []
    for a, b in [(3, 4), (17, 25), (40, 2), (8, 9)]:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True
        )
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


@torch.no_grad()
def _gap(model, prompts, completions, temperature):
    """Mean |learner - server| log-prob over the sampled tokens the server scored."""
    gaps = []
    for c in completions:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        logits = model(ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1] / temperature  # [T, V]
        mine = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]  # [T]
        theirs = torch.tensor(c.logps)
        known = ~torch.isnan(theirs)
        gaps.append((mine[known] - theirs[known]).abs())
    return float(torch.cat(gaps).mean())


def foreign_mlp_reload(server, model_dir, folder: Path, scale=1.03) -> int:
    """A second client: every MLP weight of the base model x `scale`, reloaded with vLLM's own
    `reload_weights` (the key is all it needs). Returns the number of tensors it sent."""
    from safetensors.torch import load_file, save_file

    base = load_file(str(Path(model_dir) / "model.safetensors"))
    mlp = {n: (t.float() * scale).to(t.dtype).contiguous() for n, t in base.items() if ".mlp." in n}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(mlp, str(folder / "model.safetensors"), metadata={"format": "pt"})
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    status, reply = http(server.url + "/collective_rpc", "POST", body, key=server.key)
    assert status == 200, reply[:300]
    return len(mlp)


def test_a_second_clients_reload_of_frozen_weights_is_found_named_and_undone(
    server, smollm2_dir, tmp_path, own_tmpdir, figures
):
    from transformers import AutoTokenizer

    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm_server import VLLMServerSampler

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = load_policy(smollm2_dir, ModelConfig(lora=LoraConfig(r=4)), lora=True).eval()
    lines: list[str] = []
    sampler = VLLMServerSampler(model, tokenizer, _cfg(server), log=lines.append)  # the first push: every weight
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=16, n=2)
    gen = torch.Generator().manual_seed(0)

    def train_a_little():
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.add_(0.02 * torch.randn(p.shape, generator=gen))

    try:
        for _ in range(2):  # clean partial reloads: the fingerprints of the untouched layers repeat exactly
            train_a_little()
            sampler.sync_weights(model)
        assert lines == [] and sampler.sync_tensors[1:] == [4 * model.config.num_hidden_layers] * 2
        clean = _gap(model, prompts, sampler.generate(prompts, params, seed=1), 0.8)

        sent = foreign_mlp_reload(server, smollm2_dir, tmp_path / "foreign")
        foreign = _gap(model, prompts, sampler.generate(prompts, params, seed=1), 0.8)

        train_a_little()
        sampler.sync_weights(model)  # partial: it would have left the foreign MLP weights in place
        restored = _gap(model, prompts, sampler.generate(prompts, params, seed=1), 0.8)
    finally:
        sampler.close()
    figures["foreign MLP x1.03 reload: log-prob gap clean / foreign / after the next reload"] = [
        round(clean, 5),
        round(foreign, 4),
        round(restored, 5),
    ]
    assert clean < 1e-3 and foreign > 0.05  # what the run sampled with, in between, was not its weights
    assert len(lines) == 1 and f"{sent // 3 * 2} tensor(s)" in lines[0]  # gate_up and down per layer
    assert "mlp" in lines[0] and "another client" in lines[0] and "every weight is reloaded" in lines[0]
    assert sampler.foreign_changes == 1 and sampler.sync_tensors[-1] == sampler.sync_tensors[0]
    assert restored < 1e-3  # the server computes with the learner's weights again


def _train_args(smollm2_dir, server, run, *extra):
    return [
        "train",
        "--config",
        str(ROOT / "configs" / "grpo.yaml"),
        f"model.path={smollm2_dir}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "data.num_train=16",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=2",
        "rollout.max_new_tokens=8",
        "rollout.backend=vllm_server",
        f"rollout.vllm_server_url={server.url}",
        f"rollout.vllm_server_api_key_env={KEY_ENV}",
        "train.checkpoint_every=0",
        "train.threads=1",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "diagnostics.grad_conflict_every=0",
        "optim.warmup_steps=0",
        "optim.lr=1e-3",
        "rewards=[plugins:varied_reward]",
        f"run_dir={run}",
        *extra,
    ]


@pytest.fixture()
def own_tmpdir(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def test_a_lora_run_with_a_foreign_reload_names_it_twice_and_leaves_nothing(
    server, smollm2_dir, tmp_path, own_tmpdir, monkeypatch, capsys, figures
):
    """Six synchronous steps; before step 5 samples, a second client reloads the MLP weights x1.03. Step 5's
    gap jumps against the run's baseline (a warning, far below rollout.logprob_gap_warn=1), and the reload
    after step 5 finds the change in the fingerprints, says so and reloads every weight. Exit 0, and the
    run's TMPDIR is empty."""
    from regroup.cli import main
    from regroup.train.trainer import Trainer

    collect = Trainer.collect

    def collect_with_a_second_client(self, step):
        if step == 4:
            foreign_mlp_reload(server, smollm2_dir, tmp_path / "foreign")
        return collect(self, step)

    monkeypatch.setattr(Trainer, "collect", collect_with_a_second_client)
    run = tmp_path / "run"
    assert main(_train_args(smollm2_dir, server, run, "train.steps=6")) == 0
    err = capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logprob_gap_mean"] for r in records]
    figures["LoRA run, foreign MLP x1.03 before step 5: gap per step"] = [round(g, 4) for g in gaps]
    jumps = [line for line in err.splitlines() if "moved away from the learner's" in line]
    found = [line for line in err.splitlines() if "weights changed after this run's last reload" in line]
    assert [j.split(":")[1].strip() for j in jumps] == ["step 5"], err[-3000:]
    assert len(found) == 1, err[-3000:]
    assert max(gaps[:4]) < 1e-3 and gaps[4] > 0.05 and gaps[5] < 1e-3
    assert list(own_tmpdir.iterdir()) == []


def test_an_async_run_leaves_nothing_in_tmpdir(server, smollm2_dir, tmp_path, own_tmpdir, capsys):
    from regroup.cli import main

    run = tmp_path / "run"
    assert main(_train_args(smollm2_dir, server, run, "train.steps=3", "rollout.async_steps=1")) == 0, (
        capsys.readouterr().err[-3000:]
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/policy_lag"] for r in records] == [0.0, 1.0, 1.0]
    assert list(own_tmpdir.iterdir()) == []


def test_a_run_killed_on_the_server_leaves_its_folder_to_the_next_run(
    server, smollm2_dir, tmp_path, own_tmpdir, capsys
):
    """`regroup train` in a process of its own, SIGKILLed once a step is logged: its sync folder (the weights
    it pushed) stays, since nothing of it runs any more; the next run in that TMPDIR removes it, then its own."""
    from regroup.cli import main

    killed = tmp_path / "killed"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])  # tests/plugins.py: the reward
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TMPDIR": str(own_tmpdir)}
    argv = [sys.executable, "-m", "regroup", *_train_args(smollm2_dir, server, killed, "train.steps=1000")]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        metrics = killed / "metrics.jsonl"
        # Wait for the event, not a time: the first logged step, or the child's own end (an error exits it).
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.5)
        proc.kill()
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = list(own_tmpdir.iterdir())
    assert len(left) == 1 and any(p.name.startswith("weights-v") for p in left[0].iterdir())
    assert json.loads((left[0] / "owner.json").read_text())["pid"] == proc.pid
    assert main(_train_args(smollm2_dir, server, tmp_path / "next", "train.steps=1")) == 0
    out = capsys.readouterr()
    assert (out.out + out.err).count("removed 1 weight-sync folder(s)") == 1
    assert list(own_tmpdir.iterdir()) == []

